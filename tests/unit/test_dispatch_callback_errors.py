"""What a callback raises is reported once and the dispatcher thread goes on (issue 37; issue 43's
defect 7: a callback's SystemExit used to end the dispatcher thread silently, and every later
callback then piled up in its queue)."""
from __future__ import annotations

import logging
import threading
from typing import Iterator

import pytest

from bmq._dispatch import Dispatcher, logging_configured


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    running = Dispatcher("bmq-dispatcher-test", 1_000_000, 0, lambda slow: None)
    running.start()
    yield running
    running.stop()
    running.thread.join(10)


def raising(exc: BaseException) -> None:
    raise exc


@pytest.mark.parametrize("exc", [ValueError("boom"), SystemExit(3), KeyboardInterrupt()], ids=type)
def test_the_dispatcher_survives_what_a_callback_raises(dispatcher, caplog, exc):
    later = threading.Event()
    with caplog.at_level(logging.ERROR, logger="bmq._dispatch"):
        dispatcher.submit(raising, exc)
        dispatcher.submit(later.set)
        assert later.wait(10), "the callback after the raising one never ran"
    assert dispatcher.thread.is_alive()
    (record,) = [r for r in caplog.records if r.name == "bmq._dispatch"]
    assert record.levelno == logging.ERROR and record.exc_info[1] is exc
    assert "raising" in record.getMessage() and "the session goes on" in record.getMessage()
    if not isinstance(exc, Exception):
        assert "does not end the program" in record.getMessage()


def test_logging_counts_as_configured_only_with_a_real_handler_on_the_way_up():
    # A detached tree (not under the root logger, which pytest gives handlers).
    top = logging.Logger("top")
    child = logging.Logger("top.child")
    child.parent = top
    top.addHandler(logging.NullHandler())
    assert not logging_configured(child)
    top.addHandler(logging.StreamHandler())
    assert logging_configured(child)
    child.propagate = False
    assert not logging_configured(child)
    child.addHandler(logging.StreamHandler())
    assert logging_configured(child)
