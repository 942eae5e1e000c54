"""bmq.compat's poster alone (``bmq.compat._ext.Poster``), with a fake queue: batches keep the
order of the posts, a batch that bmq refuses is retried message by message, and a message
refused on its own still gets its ``on_ack``, in its turn, with a failed status."""
from __future__ import annotations

import threading
from typing import Any, List

import pytest

import bmq
from bmq.compat._ext import Poster, QueueRecord

pytestmark = pytest.mark.timeout(30)


class FakeQueue:
    """Accepts every payload but b"bad" (refused as bmq refuses a property it cannot encode) and
    answers each batch at once, through ``call_soon`` (as bmq calls back on its dispatcher)."""

    suspended = False

    def __init__(self, call_soon: Any = None) -> None:
        self.sent: List[bytes] = []
        self._call_soon = call_soon

    def post_many_callback(self, payloads: List[bytes], on_done: Any, properties: Any = None, *,
                           property_types: Any = None) -> None:
        if b"bad" in payloads:
            raise bmq.PropertyError("cannot encode")
        self.sent.extend(payloads)
        self._call_soon(on_done, [bmq.Ack(bmq.AckStatus.SUCCESS, bytes(16), "bmq://d/q") for _ in payloads])


def test_acks_come_in_post_order_and_a_refused_message_gets_a_failed_ack():
    seen: List[Any] = []
    done = threading.Event()

    def call_soon(fn: Any, *args: Any) -> None:  # the test's dispatcher: this very thread
        fn(*args)
        if len(seen) == 4:
            done.set()

    queue = FakeQueue(call_soon)
    record = QueueRecord("bmq://d/q", queue, False, True, (1000, 1, 0, False))  # type: ignore[arg-type]

    poster = Poster("test-poster", 1.0, call_soon)
    try:
        for payload in (b"a", b"bad", b"b", b"c"):
            record.ack_expected()
            poster.add((record, payload, None, None, lambda ack, p=payload: seen.append((p, ack.status))))
        assert done.wait(10)
    finally:
        poster.close()
        poster.end_acks()
    assert seen == [(b"a", bmq.AckStatus.SUCCESS), (b"bad", bmq.AckStatus.INVALID_ARGUMENT),
                    (b"b", bmq.AckStatus.SUCCESS), (b"c", bmq.AckStatus.SUCCESS)]
    assert queue.sent == [b"a", b"b", b"c"] and record.acks_pending == 0 and record.acks_done.is_set()


def test_posts_after_close_are_refused():
    poster = Poster("test-poster", 1.0, lambda fn, *args: fn(*args))
    poster.close()
    poster.end_acks()
    record = QueueRecord("bmq://d/q", FakeQueue(), False, True, (1000, 1, 0, False))  # type: ignore[arg-type]
    with pytest.raises(bmq.compat.Error, match="stopped"):
        poster.add((record, b"x", None, None, None))
