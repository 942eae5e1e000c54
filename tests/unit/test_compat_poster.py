"""bmq.compat's poster alone (``bmq.compat._ext.Poster``), with a fake queue: batches keep the
order of the posts, a batch that bmq refuses is retried message by message, and a message
refused on its own still gets its ``on_ack``, in its turn, with a failed status."""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, List, Optional

import pytest

import bmq
from bmq.compat._ext import Poster, QueueRecord

pytestmark = pytest.mark.timeout(30)


class FakeQueue:
    """Accepts every payload but b"bad" (refused as bmq refuses a property it cannot encode)."""

    suspended = False

    def __init__(self) -> None:
        self.sent: List[bytes] = []

    def post_many_async(self, payloads: List[bytes], properties: Any = None, *, property_types: Any = None,
                        guids: Optional[bytes] = None) -> "List[Future[bmq.Ack]]":
        if b"bad" in payloads:
            raise bmq.PropertyError("cannot encode")
        self.sent.extend(payloads)
        futures = []
        for i in range(len(payloads)):
            future: "Future[bmq.Ack]" = Future()
            guid = guids[16 * i:16 * i + 16] if guids else bytes(16)
            future.set_result(bmq.Ack(bmq.AckStatus.SUCCESS, guid, "bmq://d/q"))
            futures.append(future)
        return futures


def test_acks_come_in_post_order_and_a_refused_message_gets_a_failed_ack():
    queue = FakeQueue()
    record = QueueRecord("bmq://d/q", queue, False, True, (1000, 1, 0, False))  # type: ignore[arg-type]
    seen: List[Any] = []
    done = threading.Event()

    def call_soon(fn: Any, *args: Any) -> None:  # the test's dispatcher: this very thread
        fn(*args)
        if len(seen) == 4:
            done.set()

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
