"""The official BlazingMQ Python SDK (C++ libbmq inside) against the embedded broker.

If the official SDK cannot tell the embedded broker from bmqbrkr, it negotiates in BER,
opens, configures, posts with properties, receives PUSHes, confirms and closes without a
single error event.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Dict, List, Tuple

import pytest

try:
    import blazingmq
except ImportError as exc:  # pragma: no cover - depends on the platform
    pytest.skip(f"official blazingmq SDK not installable here ({exc}); interop tests skipped", allow_module_level=True)

from bmq.broker import Broker

pytestmark = pytest.mark.interop
TIMEOUT = 20.0


class Recorder:
    """Collects session events, messages and acks from the SDK's callback threads."""

    def __init__(self, expected_messages: int, confirm: bool = True) -> None:
        self.expected = expected_messages
        self.confirm = confirm
        self.events: List[Any] = []
        self.messages: List[Tuple[str, bytes, Dict[str, Any]]] = []
        self.acks: List[Any] = []
        self.lock = threading.Lock()
        self.all_received = threading.Event()
        self.all_acked = threading.Event()
        self.expected_acks = 0

    def on_event(self, event: Any) -> None:
        with self.lock:
            self.events.append(event)

    def on_message(self, message: Any, handle: Any) -> None:
        with self.lock:
            self.messages.append((message.queue_uri, message.data, dict(message.properties)))
            done = len(self.messages) >= self.expected
        if self.confirm:
            handle.confirm()
        if done:
            self.all_received.set()

    def on_ack(self, ack: Any) -> None:
        with self.lock:
            self.acks.append(ack)
            done = len(self.acks) >= self.expected_acks
        if done:
            self.all_acked.set()

    def errors(self) -> List[Any]:
        bad = (blazingmq.session_events.Disconnected, blazingmq.session_events.Connected)
        return [e for e in self.events if not isinstance(e, bad)]


@pytest.fixture
def broker():
    with Broker() as running:
        yield running


def _properties(i: int) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    values = {
        "index": i,
        "name": f"message-{i}",
        "even": i % 2 == 0,
        "big": 2**40 + i,
        "small": i % 300,
        "blob": bytes([i % 256, 1, 2]),
    }
    types = {"big": blazingmq.PropertyType.INT64, "small": blazingmq.PropertyType.SHORT}
    return values, types


def test_priority_queue_1000_messages_with_properties(broker: Broker) -> None:
    uri = "bmq://bmq.test.mem.priority/interop-1000"
    count = 1000
    rec = Recorder(count)
    rec.expected_acks = count
    session = blazingmq.Session(rec.on_event, on_message=rec.on_message, broker=broker.address)
    try:
        session.open_queue(uri, read=True, write=True, timeout=TIMEOUT)
        for i in range(count):
            values, types = _properties(i)
            session.post(uri, b"payload-%d" % i, properties=values, property_type_overrides=types, on_ack=rec.on_ack)
        assert rec.all_acked.wait(TIMEOUT), f"{len(rec.acks)} acks"
        assert rec.all_received.wait(TIMEOUT), f"{len(rec.messages)} messages"
        assert broker.wait_for(lambda: not broker.queue_messages(uri), TIMEOUT), "confirms did not empty the queue"
        session.close_queue(uri, timeout=TIMEOUT)
    finally:
        session.stop()
    assert all(ack.status == blazingmq.AckStatus.SUCCESS for ack in rec.acks)
    received = sorted(rec.messages, key=lambda m: m[2]["index"])
    assert [m[1] for m in received] == [b"payload-%d" % i for i in range(count)]
    for i, (_, _, props) in enumerate(received):
        assert props == _properties(i)[0]
    assert rec.errors() == []


def test_fanout_each_app_gets_each_message_once(broker: Broker) -> None:
    base = "bmq://bmq.test.mem.fanout/interop-fanout"
    apps = ("foo", "bar", "baz")
    count = 200
    rec = Recorder(count * len(apps))
    rec.expected_acks = count
    session = blazingmq.Session(rec.on_event, on_message=rec.on_message, broker=broker.address)
    try:
        for app in apps:
            session.open_queue(f"{base}?id={app}", read=True, timeout=TIMEOUT)
        session.open_queue(base, write=True, timeout=TIMEOUT)
        for i in range(count):
            session.post(base, b"fan-%d" % i, properties={"index": i}, on_ack=rec.on_ack)
        assert rec.all_acked.wait(TIMEOUT)
        assert rec.all_received.wait(TIMEOUT), f"{len(rec.messages)} messages"
        for app in apps:
            assert broker.wait_for(lambda app=app: not broker.queue_messages(base, app_id=app), TIMEOUT)
        for app in apps:
            session.close_queue(f"{base}?id={app}", timeout=TIMEOUT)
        session.close_queue(base, timeout=TIMEOUT)
    finally:
        session.stop()
    per_app = collections.Counter((uri.split("?id=")[1], data) for uri, data, _ in rec.messages)
    assert set(per_app.values()) == {1}
    assert len(per_app) == count * len(apps)
    assert rec.errors() == []


def test_consumer_priority_and_redelivery_with_official_sdk(broker: Broker) -> None:
    uri = "bmq://bmq.test.mem.priority/interop-priority"
    high = Recorder(5, confirm=False)
    low = Recorder(5)
    s_high = blazingmq.Session(high.on_event, on_message=high.on_message, broker=broker.address)
    s_low = blazingmq.Session(low.on_event, on_message=low.on_message, broker=broker.address)
    try:
        s_low.open_queue(uri, read=True, write=True, options=blazingmq.QueueOptions(consumer_priority=1), timeout=TIMEOUT)
        s_high.open_queue(uri, read=True, options=blazingmq.QueueOptions(consumer_priority=5), timeout=TIMEOUT)
        for i in range(5):
            s_low.post(uri, b"p%d" % i)
        assert high.all_received.wait(TIMEOUT)
        assert low.messages == []
        # The high-priority consumer leaves without confirming: everything goes to "low".
        s_high.stop()
        assert low.all_received.wait(TIMEOUT)
        assert sorted(m[1] for m in low.messages) == [b"p%d" % i for i in range(5)]
    finally:
        s_high.stop()
        s_low.stop()


def test_sdk_retransmission_after_dropped_connection_is_deduplicated(broker: Broker) -> None:
    uri = "bmq://bmq.test.mem.priority/interop-retransmit"
    count = 5
    rec = Recorder(0)
    rec.expected_acks = count
    restored = threading.Event()

    def on_event(event: Any) -> None:
        rec.on_event(event)
        if isinstance(event, blazingmq.session_events.StateRestored):
            restored.set()

    session = blazingmq.Session(on_event, broker=broker.address)
    try:
        session.open_queue(uri, write=True, timeout=TIMEOUT)
        broker.faults.withhold_acks()
        for i in range(count):
            session.post(uri, b"r%d" % i, on_ack=rec.on_ack)
        assert broker.wait_for(lambda: len(broker.queue_messages(uri)) == count, TIMEOUT)
        broker.faults.drop_connections()
        broker.faults.release_acks()  # the old connection is gone: nothing reaches the SDK
        assert restored.wait(TIMEOUT), rec.events
        assert rec.all_acked.wait(TIMEOUT), f"{len(rec.acks)} acks"
        assert [m.payload for m in broker.queue_messages(uri)] == [b"r%d" % i for i in range(count)]
    finally:
        session.stop()
    assert all(ack.status == blazingmq.AckStatus.SUCCESS for ack in rec.acks)
