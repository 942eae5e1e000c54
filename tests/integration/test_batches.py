"""Consuming in batches (``open_queue(batches=True)`` + ``Queue.get_batch``), on both brokers."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import bmq
from support import drain, fresh_uri as fresh

pytestmark = pytest.mark.timeout(60)


def take_all(queue: bmq.Queue, count: int, **limits: int) -> list:
    """Batches from ``queue`` until ``count`` messages came (fails after 10 s without one)."""
    batches, got = [], 0
    while got < count:
        batch = queue.get_batch(timeout=10.0, **limits)
        assert batch is not None, f"only {got} of {count} messages arrived"
        batches.append(batch)
        got += len(batch)
    return batches


def test_batches_carry_payloads_guids_and_properties_in_order(session, broker_address):
    uri = fresh()
    writer = session.open_queue(uri, write=True)
    acks = writer.post_many([b"m%d" % i for i in range(300)])
    writer.post(b"typed", properties={"n": 7, "tag": "x", "raw": b"\x00\x01"})
    writer.post(b"z" * 5000, compression="zlib")
    with bmq.Session(broker_address) as consumer:
        queue = consumer.open_queue(uri, read=True, batches=True)
        batch = bmq.MessageBatch.join(take_all(queue, 302))
        assert len(batch) == 302 and batch.queue_uri == uri
        assert [batch.payload(i) for i in range(302)] == [b"m%d" % i for i in range(300)] + [b"typed", b"z" * 5000]
        assert batch.payloads == b"".join(b"m%d" % i for i in range(300)) + b"typed" + b"z" * 5000
        assert batch.offsets[0] == 0 and batch.offsets[-1] == len(batch.payloads) and len(batch.offsets) == 303
        assert [batch.guid(i) for i in range(300)] == [ack.guid for ack in acks]
        assert batch.has_properties
        assert batch.properties(300) == {"n": 7, "tag": "x", "raw": b"\x00\x01"}
        assert batch.properties(0) == {} and batch.all_properties()[300] == batch.properties(300)
        messages = batch.messages()
        assert messages[300].data == b"typed" and messages[300].guid == batch.guid(300)
        assert messages[-1].properties == {} and messages[-1].data == b"z" * 5000
        with pytest.raises(IndexError):
            batch.payload(302)
        batch.confirm()
        stats = consumer.stats().queues[uri]
        assert (stats.pushed, stats.confirmed) == (302, 302)
    with bmq.Session(broker_address) as again:
        queue = again.open_queue(uri, read=True, batches=True)
        assert queue.get_batch(timeout=0.3) is None, "a confirmed batch is not redelivered"


def test_get_batch_keeps_to_its_limits_and_loses_nothing(session):
    uri = fresh()
    queue = session.open_queue(uri, read=True, write=True, batches=True,
                               options=bmq.QueueOptions(max_unconfirmed_messages=1001))
    queue.post_many([b"%04d" % i for i in range(1000)])
    batches = take_all(queue, 100, max_messages=10) + take_all(queue, 900, max_messages=1000, max_bytes=401)
    assert all(len(batch) <= 10 for batch in batches[:10])
    assert all(len(batch.payloads) <= 401 for batch in batches)
    everything = bmq.MessageBatch.join(batches)
    assert [everything.payload(i) for i in range(1000)] == [b"%04d" % i for i in range(1000)]
    assert len(set(everything.guid(i) for i in range(1000))) == 1000
    assert queue.get_batch(timeout=0.2) is None
    # A single message larger than max_bytes still comes, on its own.
    queue.post(b"x" * 1000)
    (big,) = take_all(queue, 1, max_bytes=10)
    assert big.payloads == b"x" * 1000


def test_unconfirmed_batches_are_redelivered_to_the_next_consumer(session, broker_address):
    uri = fresh()
    session.open_queue(uri, write=True).post_many([b"1", b"2", b"3"])
    with bmq.Session(broker_address) as first:
        (batch,) = take_all(first.open_queue(uri, read=True, batches=True), 3, max_messages=3)
        batch.messages()[1].confirm()  # a message of a batch is confirmable on its own
    with bmq.Session(broker_address) as second:
        redelivered = drain(second.open_queue(uri, read=True), 2)
        assert sorted(m.data for m in redelivered) == [b"1", b"3"]


def test_a_batch_reader_and_single_message_readers_share_a_session(session):
    batched, single, pushed = fresh(), fresh(), fresh()
    got, arrived = [], threading.Event()

    def on_message(message: bmq.Message) -> None:
        got.append(message.data)
        arrived.set()

    queue = session.open_queue(batched, read=True, write=True, batches=True)
    reader = session.open_queue(single, read=True, write=True)
    session.open_queue(pushed, read=True, write=True, on_message=on_message).post(b"p1")
    queue.post_many([b"b1", b"b2"])
    reader.post_many([b"s1", b"s2"])
    assert [m.data for m in drain(reader, 2)] == [b"s1", b"s2"]
    (batch,) = take_all(queue, 2, max_messages=2)
    assert batch.payloads == b"b1b2"
    assert arrived.wait(10.0) and got == [b"p1"]


def test_batches_misuse_is_refused_with_a_clear_error(session):
    uri = fresh()
    with pytest.raises(bmq.InvalidArgumentError, match="batches=True needs read=True"):
        session.open_queue(uri, write=True, batches=True)
    with pytest.raises(bmq.InvalidArgumentError, match="no on_message"):
        session.open_queue(uri, read=True, batches=True, on_message=print)
    plain = session.open_queue(uri, read=True)
    with pytest.raises(bmq.QueueStateError, match="batches=True"):
        plain.get_batch(timeout=0)
    batched = session.open_queue(fresh(), read=True, batches=True)
    with pytest.raises(bmq.QueueStateError, match="get_batch"):
        batched.get(timeout=0)
    with pytest.raises(bmq.QueueStateError, match="get_batch"):
        next(batched.messages(timeout=0))
    with pytest.raises(bmq.InvalidArgumentError, match="positive"):
        batched.get_batch(0)
    with pytest.raises(ValueError, match="different queues"):
        bmq.MessageBatch.join([_batch(plain), _batch(batched)])
    batched.close()
    with pytest.raises(bmq.QueueStateError, match="closed"):
        batched.get_batch(timeout=0)


def _batch(queue: bmq.Queue) -> bmq.MessageBatch:
    return bmq.MessageBatch(queue, b"\x01" * 16, b"x", b"\x00\x00\x00\x00\x01\x00\x00\x00", None)


def _held_by_another_thread(lock: Any) -> bool:
    """Whether another thread holds ``lock`` (an RLock: locked() only from 3.14 on)."""
    if lock.acquire(False):
        lock.release()
        return False
    return True


def test_a_second_taker_keeps_its_timeout_while_another_waits(session):
    queue = session.open_queue(fresh(), read=True, write=True, batches=True)
    waiting = threading.Thread(target=queue.get_batch, kwargs={"timeout": 5.0})
    waiting.start()
    poll, deadline = threading.Event(), time.monotonic() + 10.0
    while not _held_by_another_thread(queue._take_lock) and time.monotonic() < deadline:  # the first taker waits
        poll.wait(0.005)
    assert _held_by_another_thread(queue._take_lock)
    started = time.monotonic()
    assert queue.get_batch(timeout=0.2) is None  # not stuck behind the first taker's wait
    assert time.monotonic() - started < 3.0
    queue.post(b"wake")
    waiting.join(10.0)
    assert not waiting.is_alive()
