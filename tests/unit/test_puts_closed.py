"""PendingPuts after close(): nothing is recorded, so no future is left unresolved."""
from __future__ import annotations

import pytest

import bmq
from bmq._stats import QueueCounters
from bmq._puts import Completion, PendingPuts


class _Queue:
    state = "open"
    uri = "bmq://bmq.test.mem.priority/q"
    queue_id = 0

    def __init__(self) -> None:
        self.counters = QueueCounters()


def test_track_after_close_raises_and_records_nothing():
    puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), None)
    puts.close()
    with pytest.raises(bmq.SessionClosedError):
        puts.track_and_send(_Queue(), b"g" * 16, [b"x"], [None], True, 0, [b"event"], Completion.FUTURES)
    assert len(puts) == 0


def test_close_settles_what_was_tracked_before_as_not_connected():
    puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), None)
    queue = _Queue()
    queue.state = "pending"  # not sent: no transport needed
    batch = puts.track_and_send(queue, b"g" * 16, [b"x"], [None], True, 0, [b"event"], Completion.FUTURES)
    assert not batch.futures[0].done()
    puts.close()
    assert batch.futures[0].result(0).status is bmq.AckStatus.NOT_CONNECTED
