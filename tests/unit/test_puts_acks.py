"""PendingPuts.handle_acks: every ACK settles its own message, however the broker groups them.

A post call's ACKs usually come back together and in order (settled as one run, by slices);
they may also come out of order, split over events, mixed with other calls' ACKs, or mixed
with GUIDs nobody is waiting for. Each way must give every message its own answer."""
from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
from typing import Any, List

import bmq
from bmq import _codec
from bmq._puts import Completion, PendingPuts, PostRequest
from bmq._stats import QueueCounters
from bmq._types import QueueState

SUCCESS, LIMIT_MESSAGES = 0, 1


class _Transport:
    def send(self, data: bytes, timeout: float, coalesce: bool = False) -> None:
        pass

    def wait_for(self, latch: Any, timeout: float) -> bool:
        return bool(latch.wait(timeout))


class _Queue:
    state = QueueState.OPEN
    uri = "bmq://bmq.test.mem.priority/acks"
    queue_id = 1

    def __init__(self) -> None:
        self.counters = QueueCounters()


def _puts(options: Any = None) -> PendingPuts:
    """A PendingPuts whose on_ack callbacks run at once (the dispatcher's job), already connected."""
    puts = PendingPuts(options or bmq.SessionOptions(), lambda fn, *args: fn(*args), None)
    puts._transport = _Transport()  # type: ignore[assignment]
    return puts


def _post(puts: PendingPuts, queue: _Queue, count: int, asynchronous: bool, on_ack: Any = None) -> Any:
    payloads = [b"m%d" % i for i in range(count)]
    completion = Completion.futures(on_ack) if asynchronous else Completion.LATCH
    return puts.post(PostRequest(queue, payloads, completion), _codec.GuidGenerator(7), True, 0)


def _keys(batch: Any) -> List[bytes]:
    return list(batch.keys)


def _ack_event(guids: List[bytes], status: int = SUCCESS) -> bytes:
    return _codec.build_ack_event([(status, 0, guid, 1) for guid in guids])


def _answer(puts: PendingPuts, events: List[bytes]) -> None:
    """Hand ``events`` to ``puts`` as the reader thread does, then wake the blocking posters."""
    for latch in puts.handle_acks(events):
        latch.set()


def test_a_blocking_posters_latch_is_left_for_the_reader_to_set():
    """The reader wakes a blocking poster only once it has let go of the interpreter lock:
    handle_acks settles the post but returns its latch rather than setting it."""
    puts, queue = _puts(), _Queue()
    batch = _post(puts, queue, 3, asynchronous=False)
    woken = puts.handle_acks([_ack_event(_keys(batch))])
    assert woken == [batch.finished] and not batch.finished.is_set()
    assert batch.remaining == 0 and len(puts) == 0
    asynchronous = _post(puts, queue, 2, asynchronous=True)
    assert puts.handle_acks([_ack_event(_keys(asynchronous))]) == []


def test_a_post_calls_acks_in_one_event_settle_it_in_order():
    puts, queue = _puts(), _Queue()
    batch = _post(puts, queue, 50, asynchronous=False)
    keys = _keys(batch)
    _answer(puts, [_ack_event(keys)])
    acks = batch.wait(0)
    assert [ack.guid for ack in acks] == keys
    assert {ack.status for ack in acks} == {bmq.AckStatus.SUCCESS}
    assert {ack.queue_uri for ack in acks} == {queue.uri}
    assert len(puts) == 0 and puts._bytes == 0
    assert queue.counters.broker_answers[SUCCESS] == 50


def test_acks_out_of_order_still_reach_their_own_message():
    puts, queue = _puts(), _Queue()
    batch = _post(puts, queue, 20, asynchronous=False)
    keys = _keys(batch)
    order = keys[::-1][:10] + keys[:10][::-1]
    statuses = {key: (LIMIT_MESSAGES if i % 3 == 0 else SUCCESS) for i, key in enumerate(keys)}
    event = _codec.build_ack_event([(statuses[key], 0, key, 1) for key in order])
    _answer(puts, [event])
    acks = batch.wait(0)
    assert [ack.guid for ack in acks] == keys
    assert [ack.status for ack in acks] == [
        bmq.AckStatus.LIMIT_MESSAGES if statuses[key] else bmq.AckStatus.SUCCESS for key in keys]
    assert queue.counters.broker_answers[LIMIT_MESSAGES] == 7
    assert queue.counters.broker_answers[SUCCESS] == 13
    assert puts._bytes == 0


def test_acks_split_over_events_and_calls_settle_once_each():
    puts, queue = _puts(), _Queue()
    batch = _post(puts, queue, 30, asynchronous=False)
    keys = _keys(batch)
    _answer(puts, [_ack_event(keys[:10]), _ack_event(keys[10:12])])
    assert batch.remaining == 18 and len(puts) == 18
    assert not batch.finished.is_set()  # not all answered yet
    _answer(puts, [_ack_event(keys[12:]), _ack_event(keys[:3])])  # repeated ACKs are ignored
    assert [ack.guid for ack in batch.wait(0)] == keys
    assert len(puts) == 0 and puts._bytes == 0


def test_several_calls_and_unknown_guids_in_one_event():
    puts, queue = _puts(), _Queue()
    first, second = _post(puts, queue, 5, asynchronous=False), _post(puts, queue, 5, asynchronous=True)
    a, b = _keys(first), _keys(second)
    unknown = [b"\x40" + bytes(15)]
    _answer(puts, [_ack_event(a[:2] + b[:2] + unknown + a[2:] + b[2:])])
    assert [ack.guid for ack in first.wait(0)] == a
    assert [future.result(0).guid for future in second.futures] == b
    assert len(puts) == 0


def test_a_run_of_asynchronous_posts_resolves_every_future_and_callback():
    puts, queue = _puts(), _Queue()
    seen: List[Any] = []
    batch = _post(puts, queue, 40, asynchronous=True, on_ack=seen.append)
    keys = _keys(batch)
    _answer(puts, [_ack_event(keys)])
    assert [future.result(0).guid for future in batch.futures] == keys
    assert [ack.guid for ack in seen] == keys
    assert len(puts) == 0


def test_acks_free_room_for_a_poster_waiting_on_max_pending_bytes():
    puts, queue = _puts(bmq.SessionOptions(max_pending_bytes=100)), _Queue()
    batch = puts.post(PostRequest(queue, [b"x" * 50, b"y" * 50], Completion.FUTURES), _codec.GuidGenerator(7), True, 0)
    posted = threading.Event()

    def post_more() -> None:
        puts.post(PostRequest(queue, [b"z" * 60], Completion.FUTURES), _codec.GuidGenerator(8), True, 0)
        posted.set()

    poster = threading.Thread(target=post_more)
    poster.start()
    assert not posted.wait(0.05)  # no room yet (100 bytes pending)
    _answer(puts, [_ack_event(_keys(batch))])
    assert posted.wait(5)
    poster.join(5)


def test_an_ack_out_of_order_then_a_run_including_it_again():
    """Once a message was answered out of order, a later event that repeats it among the
    others must not settle it twice (nor fail): each message keeps its first answer."""
    puts, queue = _puts(), _Queue()
    batch = _post(puts, queue, 5, asynchronous=True)
    k = _keys(batch)
    _answer(puts, [_codec.build_ack_event([(LIMIT_MESSAGES, 0, k[2], 1)])])
    _answer(puts, [_ack_event([k[0], k[1], k[2], k[3]])])
    _answer(puts, [_ack_event([k[4]]), _ack_event([k[4]])])
    assert [f.result(0).status for f in batch.futures] == [
        bmq.AckStatus.SUCCESS, bmq.AckStatus.SUCCESS, bmq.AckStatus.LIMIT_MESSAGES, bmq.AckStatus.SUCCESS,
        bmq.AckStatus.SUCCESS]
    assert len(puts) == 0 and puts._bytes == 0 and batch.remaining == 0
    assert sum(queue.counters.broker_answers) == 5


def test_a_post_async_is_its_own_future_and_lets_go_of_its_message_once_answered():
    """One post_async message is one object, its pending record and its future (issue 29's
    memory bound): it behaves as a standard future (wait, done callbacks), and once answered
    keeps neither payload nor properties for a caller that holds on to it."""
    puts, queue = _puts(), _Queue()
    payload, guid = b"p" * 100, bytes(range(16))
    references = sys.getrefcount(payload)
    future = puts.post(PostRequest(queue, [payload], Completion.FUTURES, {"n": 1}, guids=guid, single=True), None, True, 0)
    assert isinstance(future, cf.Future) and future.running() and not future.cancel()
    assert future.payload_at(0) is payload and future.properties_at(0)  # kept for a retransmission
    called = []
    future.add_done_callback(lambda f: called.append(f.result().status))
    with cf.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(cf.wait, [future], 5.0)
        _answer(puts, [_ack_event([guid])])
        assert waiting.result(5.0).done == {future}
    assert future.result(0) == bmq.Ack(bmq.AckStatus.SUCCESS, guid, queue.uri)
    assert called == [bmq.AckStatus.SUCCESS]
    assert sys.getrefcount(payload) == references and future.properties_at(0) is None


def test_flush_returns_only_once_every_answered_posts_on_ack_is_queued():
    """An answered post's on_ack is queued on the dispatcher after the pending table's lock is
    let go; flush() must wait for that too, so that a call_soon() made after it runs after the
    on_ack (with the GIL off, the reader thread was seen queuing it after flush() returned).
    The hook: the dispatcher's submit, held until released, as a descheduled reader would be."""
    entered, release = threading.Event(), threading.Event()
    queued: List[Any] = []

    def submit(fn: Any, *args: Any) -> None:
        entered.set()
        assert release.wait(30)
        queued.append(args)

    puts = PendingPuts(bmq.SessionOptions(), submit, None)
    puts._transport = _Transport()  # type: ignore[assignment]
    future = _post(puts, _Queue(), 1, asynchronous=True, on_ack=lambda ack: None)
    (guid,) = puts._pending
    reader = threading.Thread(target=_answer, args=(puts, [_ack_event([guid])]), name="reader",
                              daemon=True)
    reader.start()
    assert entered.wait(30)  # the reader settled the post and is queuing its on_ack
    assert len(puts) == 0 and future.done()  # answered, no longer pending...
    assert puts.flush(0) == 1  # ...but its on_ack is not queued yet: not flushed
    flushed: List[Any] = []
    flusher = threading.Thread(target=lambda: flushed.append((puts.flush(30), len(queued))), name="flusher",
                               daemon=True)
    flusher.start()
    release.set()
    reader.join(30)
    flusher.join(30)
    assert flushed == [(0, 1)]  # flush() returned with the on_ack queued
    assert puts.flush(0) == 0 and puts._handing_over == 0
