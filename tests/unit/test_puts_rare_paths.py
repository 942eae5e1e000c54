"""The PUT path on its rare paths: a reconnect racing with posts and with the ACK timer, an
outbox that fails while answers are settled, a post refused after its records were written.

Each interleaving is driven by a hook (a spy lock, a wrapped builder, a failing outbox), not by
timing: the test lets the other thread run until it either finishes or blocks on the PUT
path's lock, and only then goes on."""
from __future__ import annotations

import threading
from typing import Any, List, Optional

import pytest

import bmq
from bmq import _codec
from bmq import _puts
from bmq._dispatch import thread_condition
from bmq._outbox import Outbox
from bmq._puts import Completion, PendingPuts, PostRequest
from bmq._stats import QueueCounters
from bmq._types import QueueState
from support import interrupted_at


class _Queue:
    state = QueueState.OPEN
    uri = "bmq://bmq.test.mem.priority/rare"
    queue_id = 1

    def __init__(self) -> None:
        self.counters = QueueCounters()


class _Wire:
    """A transport that records the payloads of every PUT handed to it, in order."""

    def __init__(self) -> None:
        self.payloads: List[bytes] = []

    def _record(self, data: bytes) -> None:
        self.payloads += [message[-1] for message in _codec.iter_put_messages(data)]

    def send(self, data: bytes, timeout: float, coalesce: bool = False) -> None:
        self._record(data)

    def send_control(self, data: bytes) -> None:
        self._record(data)

    def wait_for(self, latch: Any, timeout: float) -> bool:
        return bool(latch.wait(timeout))


class _SpyLock:
    """A lock that says when a thread had to wait for it (``contended`` is set)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.contended = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        self.contended.set()
        return self._lock.acquire(True, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc_info: Any) -> None:
        self.release()


def _spy_on_lock(puts: PendingPuts) -> _SpyLock:
    spy = _SpyLock()
    puts._lock = spy  # type: ignore[assignment]
    puts._room = threading.Condition(spy)  # type: ignore[arg-type]
    return spy


def _run_until_done_or_blocked(spy: _SpyLock, fn: Any) -> threading.Thread:
    """Run ``fn`` in a thread and return once it has finished or waits for the PUT path's lock."""
    settled = threading.Event()
    spy.contended.clear()

    def run() -> None:
        try:
            fn()
        finally:
            settled.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while not (settled.wait(0.01) or spy.contended.is_set()):
        pass
    return thread


def _post(puts: PendingPuts, queue: _Queue, payloads: List[bytes], asynchronous: bool = True) -> Any:
    completion = Completion.FUTURES if asynchronous else Completion.LATCH
    return puts.post(PostRequest(queue, payloads, completion), _codec.GuidGenerator(7), True, 0)


def _hook_first_build(monkeypatch: pytest.MonkeyPatch, action: Any) -> None:
    """Run ``action`` once, as the restore builds its first re-send."""
    build = _puts._build
    done: List[bool] = []

    def hooked(*args: Any, **kwargs: Any) -> Any:
        if not done and not kwargs.get("check_only"):
            done.append(True)
            action()
        return build(*args, **kwargs)

    monkeypatch.setattr(_puts, "_build", hooked)


def test_posts_made_while_the_reconnect_restores_go_out_after_the_re_sends(monkeypatch):
    puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), None)
    queue = _Queue()
    for i in range(3):
        _post(puts, queue, [b"old%d" % i])  # disconnected: kept for the restore
    wire = _Wire()
    spy = _spy_on_lock(puts)
    posters: List[threading.Thread] = []
    _hook_first_build(monkeypatch, lambda: posters.append(
        _run_until_done_or_blocked(spy, lambda: _post(puts, queue, [b"new"]))))
    puts.restore(wire)  # type: ignore[arg-type]
    posters[0].join(10)
    assert wire.payloads == [b"old0", b"old1", b"old2", b"new"]


def test_the_ack_timer_expiring_posts_while_the_reconnect_re_sends_them(monkeypatch):
    monkeypatch.setattr(_puts, "_RETRANSMIT_CHUNK", 1)  # one re-send event per message
    puts = PendingPuts(bmq.SessionOptions(ack_timeout=0.001), lambda fn, *args: fn(*args), None)
    queue = _Queue()
    futures = [_post(puts, queue, [b"m%d" % i]) for i in range(2)]
    for future in futures:  # all expired: the timer would settle them as TIMEOUT
        future.deadline = 0.0
    wire = _Wire()
    spy = _spy_on_lock(puts)
    timers: List[threading.Thread] = []
    _hook_first_build(monkeypatch, lambda: timers.append(_run_until_done_or_blocked(spy, puts.expire)))
    puts.restore(wire)  # type: ignore[arg-type]  # raised TypeError on main
    timers[0].join(10)
    assert wire.payloads == [b"m0", b"m1"]
    assert [future.result(0).status for future in futures] == [bmq.AckStatus.TIMEOUT] * 2


class _FailingOutbox(Outbox):
    """An outbox whose removals fail as a full disk makes them."""

    def remove(self, guids: Any) -> None:
        raise OSError(28, "No space left on device")


def test_an_outbox_failing_on_the_ack_path_still_answers_every_future(tmp_path):
    puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), _FailingOutbox(str(tmp_path)))
    puts._transport = _Wire()  # type: ignore[assignment]
    queue = _Queue()
    futures = _post(puts, queue, [b"a", b"b"]).futures
    keys = list(puts._pending)
    with pytest.raises(OSError):
        puts.handle_acks([_codec.build_ack_event([(0, 0, guid, 1) for guid in keys])])
    assert [future.result(0).status for future in futures] == [bmq.AckStatus.SUCCESS] * 2
    assert not puts._pending


def test_an_outbox_failing_as_posts_are_cancelled_still_answers_them(tmp_path):
    puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), _FailingOutbox(str(tmp_path)))
    queue = _Queue()
    futures = _post(puts, queue, [b"a", b"b"]).futures
    with pytest.raises(OSError):
        puts.cancel_queue(queue, bmq.AckStatus.CANCELED)  # type: ignore[arg-type]
    assert [future.result(0).status for future in futures] == [bmq.AckStatus.CANCELED] * 2


def test_a_post_refused_for_a_repeated_guid_leaves_nothing_in_the_outbox(tmp_path):
    outbox = Outbox(str(tmp_path))
    puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), outbox)
    guid = _codec.GuidGenerator(7).generate(1)
    with pytest.raises(bmq.InvalidArgumentError, match="twice"):
        puts.post(PostRequest(_Queue(), [b"x", b"y"], Completion.FUTURES, guids=guid * 2), None, True, 0)
    assert len(outbox) == 0
    outbox.close()
    assert Outbox(str(tmp_path)).pending() == []  # a next process re-sends nothing


class _InterruptingRing:
    """A latency ring whose first append raises KeyboardInterrupt (as a signal handler would
    in a main thread reading in the reader's place)."""

    def __init__(self) -> None:
        self.fired = False

    def append(self, sample: float) -> None:
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt


def test_an_interrupt_while_single_posts_are_settled_leaves_the_byte_and_hand_over_counts_whole():
    """ACKs of single posts are settled after the table's lock: an exception there must not
    leave their bytes counted against max_pending_bytes, nor flush() waiting for a hand-over."""
    puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), None)
    puts._transport = _Wire()  # type: ignore[assignment]
    queue = _Queue()
    queue.counters.latencies = _InterruptingRing()  # type: ignore[assignment]
    for payload in (b"a", b"bc"):
        _post(puts, queue, [payload])
    assert puts._bytes == 3
    with pytest.raises(KeyboardInterrupt):
        puts.handle_acks([_codec.build_ack_event([(0, 0, guid, 1) for guid in list(puts._pending)])])
    assert (puts._bytes, puts._handing_over, puts.flush(0)) == (0, 0, 0)


# The settling steps an interrupt can land in (a KeyboardInterrupt in a main thread that reads
# in the reader's place, or closes a queue): every line of these is tried in turn.
_SETTLING = {"handle_acks", "_sole_batch", "_settle_run", "_settle_each", "_settle", "_complete", "_matching",
             "answer", "position", "answers", "_hand_over", "_notify", "resolve_futures"}


def _interrupted(action: Any, at: int) -> str:
    """``action`` interrupted at the ``at``-th settling line; where, if it was."""
    return interrupted_at(action, at, _SETTLING)


def _read_all_acks(puts: PendingPuts) -> Any:
    """Answer every pending message SUCCESS in one read, as the reader would."""
    event = _codec.build_ack_event([(0, 0, guid, 1) for guid in list(puts._pending)])
    return lambda: _codec.set_latches(puts.handle_acks([event]))  # set once the reader lets go of the GIL


@pytest.mark.parametrize("shape", ["single posts", "one post_many", "a blocking post_many",
                                   "several post calls", "callbacks"])
def test_an_interrupt_anywhere_in_settling_a_read_leaves_no_message_unanswered(shape):
    """Whatever line of the settling an interrupt stops, every message of the read is answered
    with the broker's status (futures resolved, a blocking poster's latch set), once, and the
    byte and hand-over counts come back to 0: out of the table, nothing else would answer
    them (not re-sent, never TIMEOUT)."""
    at = 0
    while True:
        acks: List[Any] = []
        puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), None)
        puts._transport = _Wire()  # type: ignore[assignment]
        queue = _Queue()
        futures: List[Any] = []
        latches: List[Any] = []
        if shape == "single posts":
            futures = [_post(puts, queue, [payload]).futures[0] for payload in (b"a", b"bc", b"def")]
        elif shape == "one post_many":
            futures = list(_post(puts, queue, [b"a", b"bc", b"def"]).futures)
        elif shape == "a blocking post_many":
            latches = [_post(puts, queue, [b"a", b"bc", b"def"], asynchronous=False)]
        elif shape == "several post calls":
            futures = list(_post(puts, queue, [b"a", b"bc"]).futures) + [_post(puts, queue, [b"def"]).futures[0]]
        else:
            request = PostRequest(queue, [b"a", b"bc"], Completion.callback(acks.extend))
            puts.post(request, _codec.GuidGenerator(7), True, 0)
            on_ack = Completion.futures(acks.append)
            futures = [puts.post(PostRequest(queue, [b"def"], on_ack), _codec.GuidGenerator(8), True, 0).futures[0]]
        pending = len(puts._pending)
        fired = _interrupted(_read_all_acks(puts), at)
        where = f"interrupted {fired}" if fired else "not interrupted"
        if len(puts._pending) == pending and fired:  # it came before the read took any: all still pending
            assert not any(future.done() for future in futures) and puts._handing_over == 0, where
            at += 1
            continue
        assert [future.result(0).status for future in futures] == [bmq.AckStatus.SUCCESS] * len(futures), where
        for batch in latches:
            assert [ack.status for ack in batch.wait(0)] == [bmq.AckStatus.SUCCESS] * 3, where
        assert (len(puts._pending), puts._bytes, puts._handing_over, puts.flush(0)) == (0, 0, 0, 0), where
        assert not puts._lock.locked() and not thread_condition()._is_owned(), where  # type: ignore[attr-defined]
        if shape == "callbacks":
            # None twice; the callbacks of the one entry whose queuing the interrupt stopped
            # may be lost (documented), none without an interrupt.
            assert len({ack.guid for ack in acks}) == len(acks) and len(acks) >= (1 if fired else 3), where
        if not fired:
            break
        at += 1
    assert at > 5  # the settling was interrupted at every point a signal handler could run


@pytest.mark.parametrize("asynchronous", [True, False], ids=["futures", "blocking"])
def test_an_interrupt_anywhere_in_cancelling_a_queues_posts_leaves_none_unanswered(asynchronous):
    """Closing a queue (or stopping the session) in the main thread settles its posts there: a
    Ctrl-C at any line of it still leaves every one of them answered, once."""
    at = 0
    while True:
        puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), None)
        puts._transport = _Wire()  # type: ignore[assignment]
        queue = _Queue()
        batch = _post(puts, queue, [b"a", b"bc"], asynchronous)
        single = _post(puts, queue, [b"def"])
        fired = _interrupted(lambda: puts.cancel_queue(queue, bmq.AckStatus.CANCELED), at)  # type: ignore[arg-type]
        where = f"interrupted {fired}" if fired else "not interrupted"
        if len(puts._pending) == 3 and fired:  # it came before the call took any: all still pending, whole
            assert puts._bytes == 6 and not single.done() and puts._handing_over == 0, where
            at += 1
            continue
        acks = list(batch.futures) + [single] if asynchronous else batch.wait(0) + [single.result(0)]
        statuses = [ack.result(0).status if asynchronous else ack.status for ack in acks]
        assert statuses == [bmq.AckStatus.CANCELED] * 3, where
        assert (len(puts._pending), puts._bytes, puts._handing_over, puts.flush(0)) == (0, 0, 0, 0), where
        assert not puts._lock.locked() and not thread_condition()._is_owned(), where  # type: ignore[attr-defined]
        if not fired:
            break
        at += 1
    assert at > 5
