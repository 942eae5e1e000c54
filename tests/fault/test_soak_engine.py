"""The soak engine's own failure paths (``tests/endurance.py``, ``tests/faulthost.py``): a soak
that hangs on a failure, or reads it as an empty answer, hides the failure it exists to report.
"""
from __future__ import annotations

from concurrent.futures import Future

import pytest

import bmq
from endurance import SoakConfig, _AsyncPoster, _Soak
from faulthost import FaultHost


def test_a_post_async_failed_with_an_exception_leaves_the_window_and_is_an_error():
    soak = _Soak(SoakConfig(), "tcp://127.0.0.1:1")  # no session is opened here
    poster = _AsyncPoster(soak, "bmq://bmq.test.mem.priority/soak-engine", rate=100.0, window=1)
    poster._in_flight = 1  # one post_async in the window, as work() leaves it
    failed: Future = Future()
    failed.set_exception(bmq.ConnectionLost("gone"))
    poster._done(failed, 0, 0.0)  # the reader thread's callback
    poster.drain()  # raised TimeoutError after 60 s when the exception skipped the window's release
    assert [where for _, where, _ in soak.errors] == ["post_async"]
    assert poster.stream.acked.count == 0


def test_a_broker_side_process_that_exits_is_an_error_not_an_empty_answer():
    host = FaultHost(None)
    try:
        with pytest.raises(RuntimeError, match="exited"):
            host.do("no-such-command")  # the child fails on the unknown command and exits
    finally:
        host.close()
