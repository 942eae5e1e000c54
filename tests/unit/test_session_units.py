"""The session's units without a socket: QueueHandles (request sequences), Deliveries (PUSH in,
CONFIRM out), EventQueue and Recovery (connection loss → reconnect → reopen → retransmit), each
driven through fakes of what it talks to."""
from __future__ import annotations

import array
import queue as stdqueue
import threading
from types import SimpleNamespace
from typing import Any, Dict, List

import pytest

import bmq
from bmq import _codec
from bmq import events as ev
from bmq._connection import BrokerAddresses
from bmq._deliveries import Deliveries
from bmq._dispatch import EventQueue
from bmq._handles import QueueHandles
from bmq import _queue as _queue_module
from bmq._queue import Queue
from bmq._recovery import SessionServices
from bmq._registry import QueueRegistry
from bmq._state import ConnectionState
from bmq._types import QueueState
from support import interrupted_at


class FakeBroker:
    """Answers the control requests QueueHandles sends; refuses the ones named in ``refuse``."""

    def __init__(self, refuse: tuple = ()) -> None:
        self.sent: List[Dict[str, Any]] = []
        self.refuse = refuse

    def call(self, body: Dict[str, Any], timeout: float, what: str, **kwargs: Any) -> Dict[str, Any]:
        self.sent.append(body)
        kind = next(iter(body))
        if kind in self.refuse:
            raise bmq.BrokerError(f"{what}: refused", "E_REFUSED", -1)
        return {kind + "Response": {}}

    def kinds(self) -> List[str]:
        return [next(iter(body)) for body in self.sent]


def _owner() -> Any:
    """What a Queue asks of its session (QueueServices) and what Deliveries compares: one fake."""
    owner = SimpleNamespace(dispatch=lambda fn, *args: fn(*args))
    owner.session = owner
    return owner


def _queue(registry: QueueRegistry, owner: Any, uri: str, *, read: bool = False, write: bool = False,
           options: bmq.QueueOptions = bmq.QueueOptions(), on_message: Any = None, batches: bool = False) -> Queue:
    queue = Queue(owner, bmq.parse_uri(uri), read=read, write=write, options=options, on_message=on_message,
                  queue_id=-1, sub_id=0, batches=batches)
    registry.register(queue)
    queue.state = QueueState.OPEN
    return queue


@pytest.fixture
def registry() -> QueueRegistry:
    return QueueRegistry()


def test_opening_a_reader_configures_it_and_routes_its_subscriptions(registry):
    broker = FakeBroker()
    handles = QueueHandles(broker.call, threading.RLock(), registry)
    own = bmq.Subscription('y == "a"', consumer_priority=3, max_unconfirmed_bytes=99)
    options = bmq.QueueOptions(subscriptions=["x > 1", own], max_unconfirmed_messages=7)
    queue = _queue(registry, None, "bmq://bmq.test.mem.priority/q", read=True, options=options)
    handles.open(queue, 5.0, buffered=True)
    assert broker.kinds() == ["openQueue", "configureStream"]
    params = broker.sent[1]["configureStream"]["streamParameters"]
    sids = [s["sId"] for s in params["subscriptions"]]
    assert [s["expression"]["text"] for s in params["subscriptions"]] == ["x > 1", 'y == "a"']
    consumers = [s["consumers"] for s in params["subscriptions"]]
    assert consumers == [
        [{"maxUnconfirmedMessages": 7, "maxUnconfirmedBytes": 32 << 20, "consumerPriority": 0, "consumerPriorityCount": 1}],
        [{"maxUnconfirmedMessages": 7, "maxUnconfirmedBytes": 99, "consumerPriority": 3, "consumerPriorityCount": 1}],
    ]
    assert queue.subscription_ids == sids
    assert queue.subscription_of == {sids[0]: "x > 1", sids[1]: own}
    assert all(registry.readers[(queue.queue_id, sid)] is queue for sid in sids)


def test_a_refused_configure_closes_the_opened_handle_and_routes_nothing(registry):
    broker = FakeBroker(refuse=("configureStream",))
    handles = QueueHandles(broker.call, threading.RLock(), registry)
    queue = _queue(registry, None, "bmq://bmq.test.mem.priority/q", read=True)
    with pytest.raises(bmq.BrokerError):
        handles.open(queue, 5.0, buffered=True)
    assert broker.kinds() == ["openQueue", "configureStream", "closeQueue"]
    assert broker.sent[2]["closeQueue"]["isFinal"] is True
    assert registry.readers == {}


def test_closing_one_handle_of_a_shared_qid_is_not_final(registry):
    broker = FakeBroker()
    handles = QueueHandles(broker.call, threading.RLock(), registry)
    writer = _queue(registry, None, "bmq://bmq.test.mem.fanout/q", write=True)
    reader = _queue(registry, None, "bmq://bmq.test.mem.fanout/q?id=foo", read=True)
    handles.open(reader, 5.0, buffered=True)
    broker.sent.clear()
    handles.close(reader, 5.0)
    # The reader is deconfigured (no subscription) before its non-final close.
    assert broker.kinds() == ["configureStream", "closeQueue"]
    assert broker.sent[0]["configureStream"]["streamParameters"]["subscriptions"] == []
    assert broker.sent[1]["closeQueue"]["isFinal"] is False
    registry.forget(reader)
    assert handles.close_request(writer)["closeQueue"]["isFinal"] is True


def test_bad_host_health_suspends_only_queues_that_asked_and_resumes_them(registry):
    broker = FakeBroker()
    handles = QueueHandles(broker.call, threading.RLock(), registry)
    suspending = bmq.QueueOptions(suspends_on_bad_host_health=True)
    reader = _queue(registry, None, "bmq://bmq.test.mem.priority/r", read=True, options=suspending)
    writer = _queue(registry, None, "bmq://bmq.test.mem.priority/w", write=True, options=suspending)
    _queue(registry, None, "bmq://bmq.test.mem.priority/other", read=True)
    outcomes = handles.apply_host_health(False, 5.0)
    assert {q.uri for q, error in outcomes if error is None} == {reader.uri, writer.uri}
    assert reader.suspended and writer.suspended and reader.subscription_ids == []
    assert broker.kinds() == ["configureStream"]  # only the reader is deconfigured
    # A queue opened while unhealthy opens suspended (an empty configure).
    late = _queue(registry, None, "bmq://bmq.test.mem.priority/late", read=True, options=suspending)
    handles.open(late, 5.0, buffered=True)
    assert late.suspended and late.subscription_ids == []
    outcomes = handles.apply_host_health(True, 5.0)
    assert {q.uri for q, _ in outcomes} == {reader.uri, writer.uri, late.uri}
    assert not any(q.suspended for q, _ in outcomes) and len(reader.subscription_ids) == 1


@pytest.mark.parametrize("by_columns", [False, True], ids=["per message", "by columns (a batch queue is open)"])
def test_a_push_reaches_its_subscription_and_one_for_an_unknown_queue_is_dropped(registry, caplog, by_columns):
    delivered: List[bmq.Message] = []
    owner = _owner()
    handles = QueueHandles(FakeBroker().call, threading.RLock(), registry)
    if by_columns:
        batched = _queue(registry, owner, "bmq://bmq.test.mem.priority/batched", read=True, batches=True)
        assert registry.batch_queues == 1
    pulled = _queue(registry, owner, "bmq://bmq.test.mem.priority/a", read=True)
    pushed = _queue(registry, owner, "bmq://bmq.test.mem.priority/b", read=True, on_message=delivered.append)
    handles.open(pulled, 5.0, buffered=True)
    handles.open(pushed, 5.0, buffered=True)
    deliveries = Deliveries(owner, registry, threading.RLock(), 5.0)
    guids = [bytes([i]) * 16 for i in range(3)]
    events = _codec.build_push_events([
        (pulled.queue_id, guids[0], [pulled.subscription_ids[0]], b"one", 0, 0, 0),
        (pushed.queue_id, guids[1], [pushed.subscription_ids[0]], b"two", 0, 0, 0),
        (pushed.queue_id, guids[2], [999], b"three", 0, 0, 0),  # an unknown sId on a sole reader's qId
        (77, guids[2], [999], b"lost", 0, 0, 0),
    ])
    for event in events:
        deliveries.handle_push(event)
    message = pulled.get(timeout=0)
    assert (message.data, message.guid) == (b"one", guids[0])
    # An older broker may name no known subscription: the only reader of that qId takes it.
    assert [m.data for m in delivered] == [b"two", b"three"]
    assert pushed.counters.pushed == 2 and pulled.counters.pushed == 1
    assert "PUSH for unknown queue 77 / subscription 999 dropped" in caplog.text
    if by_columns:  # once no batch queue is open, PUSH events are decoded per message again
        registry.forget(batched)
        assert registry.batch_queues == 0


class _Transport:
    def __init__(self) -> None:
        self.events: List[bytes] = []

    def send(self, data: bytes, timeout: float, coalesce: bool = False) -> None:
        self.events.append(bytes(data))


def test_confirms_go_out_in_chunks_and_are_counted_per_queue(registry, monkeypatch):
    import bmq._deliveries as deliveries_module
    monkeypatch.setattr(deliveries_module, "_CONFIRM_CHUNK", 4)
    owner = _owner()
    a = _queue(registry, owner, "bmq://bmq.test.mem.priority/a", read=True)
    b = _queue(registry, owner, "bmq://bmq.test.mem.priority/b?id=x", read=True)
    messages = [bmq.Message(b"m", bytes([i]) * 16, a if i < 6 else b, None, False) for i in range(9)]
    conn = SimpleNamespace(transport=_Transport())
    Deliveries(owner, registry, threading.RLock(), 5.0).confirm(messages, conn)
    confirmed = [record for event in conn.transport.events for record in _codec.iter_confirms(event)]
    assert len(conn.transport.events) == 3
    assert confirmed == [(m._queue.queue_id, m.guid, m._queue.sub_id) for m in messages]
    assert (a.counters.confirmed, b.counters.confirmed) == (6, 3)


def test_confirms_are_refused_for_another_sessions_or_a_closed_queue_and_dropped_offline(registry):
    owner = _owner()
    deliveries = Deliveries(owner, registry, threading.RLock(), 5.0)
    ours = _queue(registry, owner, "bmq://bmq.test.mem.priority/a", read=True)
    theirs = _queue(QueueRegistry(), _owner(), "bmq://bmq.test.mem.priority/a", read=True)
    with pytest.raises(bmq.QueueStateError, match="another session"):
        deliveries.confirm([bmq.Message(b"m", b"g" * 16, theirs, None, False)], SimpleNamespace(transport=_Transport()))
    deliveries.confirm([bmq.Message(b"m", b"g" * 16, ours, None, False)], None)  # offline: dropped, not counted
    assert ours.counters.confirmed == 0
    ours.state = QueueState.CLOSED
    with pytest.raises(bmq.QueueStateError, match="closed"):
        deliveries.confirm([bmq.Message(b"m", b"g" * 16, ours, None, False)], None)


class _HeldInbox:
    """A queue's inbox whose first ``get`` is held until ``release``; it records how many takers
    were inside it at once."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self.inside = self.most_inside = 0

    def get(self, timeout: Any = None) -> str:
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            if self.entered.is_set():
                raise stdqueue.Empty
            self.entered.set()
            assert self.release.wait(30)
            return "message"
        finally:
            with self._lock:
                self.inside -= 1

    def get_nowait(self) -> str:
        raise stdqueue.Empty  # nothing there yet (a taker then waits in get)


@pytest.mark.parametrize("one_taker, most_inside", [(True, 1), (False, 2)], ids=["3.10-3.12", "3.13+"])
def test_consumer_threads_take_from_a_queues_inbox_one_at_a_time_only_before_3_13(registry, monkeypatch, one_taker,
                                                                                  most_inside):
    """CPython 3.10-3.12's SimpleQueue.get(timeout=...) may block until the next put() when
    another thread's get takes the item that woke it (Queue._take): there a second get() waits for
    the first, within its own timeout, rather than entering the inbox beside it. From 3.13 (no
    such bug) they wait in it side by side: one at a time would hand every message from thread to
    thread (six times the CPU with 8 consumers). Either way a get() returns by its timeout."""
    monkeypatch.setattr(_queue_module, "_ONE_TAKER", one_taker)
    queue = _queue(registry, _owner(), "bmq://bmq.test.mem.priority/takers", read=True)
    inbox = queue._inbox = _HeldInbox()  # type: ignore[assignment]
    got: List[Any] = []
    first = threading.Thread(target=lambda: got.append(queue.get(timeout=30)), name="first-taker", daemon=True)
    first.start()
    assert inbox.entered.wait(30)  # the first get() waits inside the inbox
    assert queue.get(timeout=0.05) is None  # the second gives up at its timeout (inside the inbox or not)
    inbox.release.set()
    first.join(30)
    assert got == ["message"] and inbox.most_inside == most_inside


def test_on_3_10_to_3_12_a_consumer_takes_a_waiting_message_beside_a_taker_not_waiting(registry, monkeypatch):
    """On 3.10-3.12, while another thread holds the inbox but does not wait in it (it is taking
    a message, or about to), get() takes a message that is there at once, not in turn: each
    message passing from thread to thread made 8 consumer threads cost six times the CPU. Only a
    thread waiting in the inbox can be robbed into the hang, and none is."""
    monkeypatch.setattr(_queue_module, "_ONE_TAKER", True)
    queue = _queue(registry, _owner(), "bmq://bmq.test.mem.priority/takers", read=True)
    queue._inbox.put("message")
    holding, release = threading.Event(), threading.Event()

    def other_taker() -> None:  # holds the take lock, not waiting in the inbox
        with queue._take_lock:
            holding.set()
            release.wait(30)

    other = threading.Thread(target=other_taker, daemon=True)
    other.start()
    try:
        assert holding.wait(30)
        assert queue.get(timeout=10) == "message"
    finally:
        release.set()
        other.join(30)


def _is_the(message: Any, taken: Any) -> bool:
    """Whether get() or get_batch() returned ``message`` (get_batch: a batch of its one message)."""
    return taken is message or (isinstance(taken, bmq.MessageBatch) and taken.guids == message.guids)


@pytest.mark.parametrize("one_taker", [True, False], ids=["3.10-3.12", "3.13+"])
@pytest.mark.parametrize("waiting", [False, True], ids=["message there", "message to wait for"])
@pytest.mark.parametrize("call", ["get", "get_batch"])
def test_an_interrupt_anywhere_in_get_leaves_the_inbox_to_the_next_taker(registry, monkeypatch, one_taker, waiting,
                                                                         call):
    """A Ctrl-C at any point of get() or get_batch() (a consumer loop in the main thread) must
    leave the take lock and the waiting flag free: else every later call would wait out its
    timeout on the lock, whatever arrived. The next call takes the message, unless the
    interrupted one had taken it (it then comes again from the broker, unconfirmed)."""
    monkeypatch.setattr(_queue_module, "_ONE_TAKER", one_taker)
    at = 0
    while True:
        queue = _queue(registry, _owner(), f"bmq://bmq.test.mem.priority/interrupted-{call}-{at}", read=True,
                       batches=call == "get_batch")
        message = bmq.MessageBatch(queue, bytes(16), b"m", array.array("i", [0, 1]).tobytes(), None) \
            if call == "get_batch" else "message"
        if waiting:  # put by another thread as this one waits (or about to)
            putter = threading.Timer(0.01, queue._inbox.put, (message,))
            putter.start()
        else:
            queue._inbox.put(message)
        take = getattr(queue, call)
        got: List[Any] = []
        fired = interrupted_at(lambda: got.append(take(timeout=5)), at,
                               {call, "_take", "_lock_taking", "_take_held", "_opened"})
        where = f"interrupted {fired}" if fired else "not interrupted"
        if waiting:
            putter.join(5)
        assert queue._take_lock.acquire(False) and not queue._taker_waiting, where
        queue._take_lock.release()
        if not fired:
            assert len(got) == 1 and _is_the(message, got[0]), where
            break
        after = take(timeout=0)
        assert after is None or _is_the(message, after), where  # None: the interrupted call had taken it
        at += 1
    assert at > 3


class _SimpleQueue310:
    """CPython 3.10's SimpleQueue as far as its lock goes: put() frees the lock; get() on an
    empty inbox first takes a free lock without waiting (a stale signal when the put's item was
    taken without waiting, or on a new inbox). A timed get() that does so finds the inbox still
    empty and, when its deadline has passed meanwhile (a microsecond's preemption for timeout 0),
    waits until the next put(): the model fails there. A timed wait on a clean lock times out at
    once; an untimed one is not modelled."""

    def __init__(self) -> None:
        self.items: List[Any] = []
        self.locked = False

    def put(self, item: Any) -> None:
        self.items.append(item)
        self.locked = False

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def get(self, block: bool = True, timeout: Any = None) -> Any:
        assert block is False or timeout is not None, "an untimed get() is not modelled"
        if self.items:
            return self.items.pop(0)
        stale, self.locked = not self.locked, True
        assert not (block and stale), "3.10 can wait here until the next put(), past the timeout"
        raise stdqueue.Empty


@pytest.mark.parametrize("one_taker", [True, False], ids=["3.10-3.12", "3.13+"])
@pytest.mark.parametrize("call", ["get", "get_batch"])
def test_a_timed_get_on_an_empty_inbox_never_meets_a_stale_signal(registry, monkeypatch, one_taker, call):
    """On 3.10, get_batch(timeout=0) on a new queue, or once the last messages were taken,
    hung in CI until the next message: every timed wait in the inbox must start on a clean lock."""
    monkeypatch.setattr(_queue_module, "_ONE_TAKER", one_taker)
    queue = _queue(registry, _owner(), f"bmq://bmq.test.mem.priority/stale-{call}", read=True,
                   batches=call == "get_batch")
    queue._inbox = _SimpleQueue310()  # type: ignore[assignment]
    take = getattr(queue, call)
    messages = [bmq.MessageBatch(queue, bytes(16), b"m", array.array("i", [0, 1]).tobytes(), None)
                if call == "get_batch" else f"message {n}" for n in range(2)]
    for timeout in (0, 0.01):
        assert take(timeout=timeout) is None  # a new inbox, then one emptied by a timed-out wait
    for message in messages:
        queue._inbox.put(message)
    taken = [take(timeout=0)] if call == "get_batch" else [take(timeout=0), take(timeout=0.01)]
    assert taken == messages if call == "get" else len(taken[0]) == 2
    for timeout in (0, 0.01, 0):  # taken without waiting: the signal of the puts is stale
        assert take(timeout=timeout) is None


def test_events_are_kept_in_order_given_to_on_event_and_closing_wakes_waiters():
    seen: List[ev.SessionEvent] = []
    dispatcher = SimpleNamespace(submit=lambda fn, *args: fn(*args))
    events = EventQueue(dispatcher, seen.append, backlog=2)  # type: ignore[arg-type]
    for event in (ev.Connected(), ev.ConnectionLost("x"), ev.Reconnected()):
        events.emit(event)
    assert [type(e) for e in seen] == [ev.Connected, ev.ConnectionLost, ev.Reconnected]
    # The backlog keeps the newest two.
    assert isinstance(events.next(0), ev.ConnectionLost) and isinstance(events.next(0), ev.Reconnected)
    assert events.next(0) is None and not events.closed
    woke = threading.Event()
    waiter = threading.Thread(target=lambda: (events.next(None), woke.set()))
    waiter.start()
    events.close()
    assert woke.wait(5) and events.closed
    waiter.join(5)


# ---- Recovery: the session's state machine faked, the real units driven ----------------------
class _FakeTransport:
    def __init__(self) -> None:
        self.control: List[bytes] = []
        self.closed = False

    def send_control(self, data: bytes) -> None:
        self.control.append(bytes(data))

    def send(self, data: bytes, timeout: float, coalesce: bool = False) -> None:
        self.control.append(bytes(data))


def _connection() -> Any:
    return SimpleNamespace(transport=_FakeTransport(), close=lambda: None, endpoint=None, new_style_properties=True)


class _FakeSession:
    """The real state machine (ConnectionState) with a fake connection adopted and the services
    Recovery asks of its Session (connect, forget_queue, stop: see bmq/_recovery.py) faked."""

    def __init__(self, registry: QueueRegistry, puts: Any,
                 options: bmq.SessionOptions = bmq.SessionOptions(
                     reconnect=bmq.ReconnectPolicy(initial_delay=0, jitter=0)),
                 brokers: Any = "tcp://fake:1") -> None:
        self.brokers = BrokerAddresses(brokers)
        self.options = options
        self.link = ConnectionState(puts, self.brokers.first, lambda conn: None)
        self.lock = self.link.lock
        self._registry = registry
        self.connects: List[Any] = []
        self.first = _connection()
        self.link.adopt(self.first)
        self.link.restored(self.first)
        self.connect = self._connect

    def _connect(self, timeout: float, after: Any = None) -> Any:
        conn = _connection()
        self.connects.append(conn)
        return conn

    def forget_queue(self, queue: Queue, status: Any) -> None:
        self._registry.forget(queue)
        queue.mark_closed()

    def services(self) -> SessionServices:
        return SessionServices(1, self.options, self.brokers, lambda *args: self.connect(*args), self.forget_queue,
                               lambda fn, *args: fn(*args), lambda: None, self.link.finish_stop)  # type: ignore[arg-type]


def test_recovery_reopens_queues_and_resends_unacknowledged_puts_on_a_new_connection(registry):
    from bmq._puts import Completion, PendingPuts
    from bmq._recovery import Recovery
    from bmq._requests import ControlRequests

    broker = FakeBroker(refuse=())
    options = bmq.SessionOptions()
    puts = PendingPuts(options, lambda fn, *args: fn(*args), None)
    session = _FakeSession(registry, puts)
    old = session.first
    handles = QueueHandles(broker.call, session.lock, registry)
    requests = ControlRequests()
    seen: List[ev.SessionEvent] = []
    events = EventQueue(SimpleNamespace(submit=lambda fn, *args: fn(*args)), seen.append, 100)  # type: ignore[arg-type]
    recovery = Recovery(session.link, requests, registry, handles, puts, events, session.services())

    reader = _queue(registry, session, "bmq://bmq.test.mem.priority/r", read=True)
    writer = _queue(registry, session, "bmq://bmq.test.mem.priority/w", write=True)
    refused = _queue(registry, session, "bmq://bmq.test.mem.priority/gone", read=True)
    guid = _codec.GuidGenerator(1).generate(1)
    events_sent = _codec.build_put_events(writer.queue_id, guid, [b"kept"], None, flags=_codec.PUT_ACK_REQUESTED)
    puts.track_and_send(writer, guid, [b"kept"], [None], True, 0, events_sent, Completion.FUTURES)
    unbuffered = requests.add({"openQueue": {}}, buffered=False)

    recovery.connection_lost(old, bmq.ConnectionLost("cut"))
    assert session.link.current is None and session.link.state is bmq.SessionState.RECONNECTING
    assert {q.state for q in (reader, writer, refused)} == {QueueState.PENDING}
    assert isinstance(unbuffered.future.exception(0), bmq.ConnectionLost)
    recovery.connection_lost(old, bmq.ConnectionLost("again"))  # a stale connection: ignored

    broker.sent.clear()
    original_call = broker.call

    def call(body: Dict[str, Any], *args: Any, **kwargs: Any) -> Dict[str, Any]:
        if "openQueue" in body and body["openQueue"]["handleParameters"]["uri"] == refused.uri:
            raise bmq.BrokerError("open refused", "E_REFUSED", -1)
        return original_call(body, *args, **kwargs)

    handles._call = call
    recovery._reconnect()
    new = session.connects[0]
    assert session.link.current is new and session.link.state is bmq.SessionState.STARTED
    assert reader.state == writer.state == QueueState.OPEN and refused.state == QueueState.CLOSED
    assert broker.kinds().count("openQueue") == 2 and broker.kinds().count("configureStream") == 1
    # The unacknowledged PUT went out again on the new connection, with its GUID.
    resent = [m for data in new.transport.control for m in _codec.iter_put_messages(data)]
    assert [(m[1], m[2]) for m in resent] == [(writer.queue_id, guid)]
    kinds = [type(e).__name__ for e in seen]
    assert kinds[:1] == ["ConnectionLost"] and kinds[1] == "Reconnected" and kinds[-1] == "StateRestored"
    assert kinds.count("QueueReopened") == 2 and kinds.count("QueueReopenFailed") == 1


class _RecordingCondition:
    """A condition whose waits return at once and are recorded (the delays asked for)."""

    def __init__(self, lock: Any) -> None:
        self._condition = threading.Condition(lock)
        self.waits: List[float] = []

    def __enter__(self) -> Any:
        return self._condition.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._condition.__exit__(*exc)

    def wait(self, timeout: float = None) -> bool:  # type: ignore[assignment]
        self.waits.append(timeout)  # type: ignore[arg-type]
        return False

    def notify_all(self) -> None:
        self._condition.notify_all()


@pytest.mark.parametrize("brokers, waits_before", [
    (["tcp://fake:1"], [0, 1, 2]),                # one address: every attempt backs off
    (["tcp://fake:1", "tcp://fake:2"], [0, 1]),   # several: the first round goes at once
])
def test_reconnect_backs_off_only_after_a_round_in_which_every_address_failed(registry, brokers, waits_before):
    from bmq._puts import PendingPuts
    from bmq._recovery import Recovery
    from bmq._requests import ControlRequests

    puts = PendingPuts(bmq.SessionOptions(), lambda fn, *args: fn(*args), None)
    options = bmq.SessionOptions(reconnect=bmq.ReconnectPolicy(initial_delay=1.0, multiplier=2.0, jitter=0))
    session = _FakeSession(registry, puts, options, brokers)
    session.link._wake = wake = _RecordingCondition(session.lock)
    session.link.lost(session.first)
    failures = [2]

    def connect(timeout: float, after: Any = None) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise bmq.ConnectionError("refused")
        return session._connect(timeout, after)

    session.connect = connect  # type: ignore[method-assign]
    events = EventQueue(SimpleNamespace(submit=lambda fn, *args: fn(*args)), lambda e: None, 100)  # type: ignore[arg-type]
    recovery = Recovery(session.link, ControlRequests(), registry, QueueHandles(FakeBroker().call, session.lock, registry),
                        puts, events, session.services())
    recovery._reconnect()
    assert session.link.state is bmq.SessionState.STARTED and len(session.connects) == 1
    # ReconnectPolicy.delay(n) is 1 * 2**n here.
    assert wake.waits == [2.0 ** n for n in waits_before]
