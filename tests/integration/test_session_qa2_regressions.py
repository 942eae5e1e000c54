"""Regression tests for client bugs found by QA round 2 (one section per bug)."""
from __future__ import annotations

import os
import threading
import time

import pytest

import bmq
from bmq import _codec, _properties, _schema, events
from bmq.broker import Broker
from support import fresh_uri as fresh

pytestmark = pytest.mark.timeout(60)


# ---- next_event() on a stopped session ---------------------------------------------------
def test_stop_wakes_next_event_which_then_raises_once_events_are_drained(broker_address):
    session = bmq.Session(broker_address)
    seen: list = []
    ended: list = []

    def consume():
        try:
            while True:
                seen.append(type(session.next_event()))
        except bmq.SessionClosedError as e:
            ended.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    session.stop(5)
    consumer.join(5)
    assert not consumer.is_alive()
    assert len(ended) == 1
    assert seen == [events.Connected, events.Disconnected]
    with pytest.raises(bmq.SessionClosedError):
        session.next_event()  # no event can come any more: does not block


def test_a_stopped_session_still_hands_out_its_remaining_events(broker_address):
    session = bmq.Session(broker_address)
    session.stop(5)
    assert session.next_event() == events.Connected()
    assert session.next_event() == events.Disconnected()
    with pytest.raises(bmq.SessionClosedError):
        session.next_event(0.01)


# ---- open_queue(timeout=T) is bounded by T even when the rollback close gets no answer ----
def test_open_timeout_bounds_the_rollback_close():
    with Broker() as broker:
        original = broker._on_control

        def stall_after_open(client, event):
            message, _ = _schema.decode_event(event, "control")
            if "configureStream" in message:
                broker.faults.delay_control_responses(30)  # neither configure nor close answered
            original(client, event)

        broker._on_control = stall_after_open
        with bmq.Session(broker.address, bmq.SessionOptions(close_queue_timeout=30.0)) as session:
            started = time.monotonic()
            with pytest.raises(bmq.TimeoutError):
                session.open_queue(fresh(), read=True, timeout=1.0)
            elapsed = time.monotonic() - started
            assert elapsed < 5.0, f"open_queue(timeout=1.0) took {elapsed:.1f} s"  # not 1 + 30
            broker.faults.reset()
            broker._on_control = original
            queue = session.open_queue(fresh(), write=True, timeout=10)
            assert queue.post(b"still usable").status is bmq.AckStatus.SUCCESS


# ---- an unusable outbox_dir is an OutboxError and leaves nothing behind -----------------
@pytest.mark.parametrize("make_bad", [
    lambda tmp: tmp / "a-file",                  # exists, not a directory
    lambda tmp: tmp / "a-file" / "outbox",       # a parent is not a directory
])
def test_unusable_outbox_dir_raises_outbox_error_without_leaks(broker_address, tmp_path, make_bad):
    (tmp_path / "a-file").write_bytes(b"x")
    bad = make_bad(tmp_path)
    threads = set(threading.enumerate())
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(bmq.OutboxError) as info:
        bmq.Session(broker_address, bmq.SessionOptions(outbox_dir=str(bad)))
    assert str(bad) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert os.strerror(info.value.__cause__.errno) in str(info.value)
    assert [t.name for t in set(threading.enumerate()) - threads] == []
    assert len(os.listdir("/proc/self/fd")) == fds


# ---- property_types with per-message properties of different shapes -----------------------
def test_property_types_apply_only_to_messages_having_the_name():
    areas = _properties.encode_each([{"c": b"\x01"}, {"other": 1}, None], {"c": bmq.PropertyType.CHAR})
    assert _codec.decode_properties(areas[0], True) == {"c": (_codec.PROPERTY_CHAR, b"\x01")}
    assert _codec.decode_properties(areas[1], True) == {"other": (_codec.PROPERTY_INT32, 1)}
    assert areas[2] is None


def test_property_types_naming_a_property_no_message_has_is_an_error():
    with pytest.raises(bmq.PropertyError, match="typo") as info:
        _properties.encode_each([{"c": b"\x01"}, {"other": 1}], {"c": bmq.PropertyType.CHAR, "typo": 1})
    assert info.value.name == "typo"
    with pytest.raises(bmq.PropertyError, match="c"):
        _properties.encode_each([None, {}], {"c": bmq.PropertyType.CHAR})
    with pytest.raises(bmq.PropertyError):
        _properties.encode({"other": 1}, {"c": bmq.PropertyType.CHAR})  # one mapping: still strict


def test_post_many_with_heterogeneous_properties_and_types(session):
    writer = reader = session.open_queue(fresh(), read=True, write=True)
    acks = writer.post_many([b"a", b"b"], properties=[{"c": b"\x01"}, {"other": 1}],
                            property_types={"c": bmq.PropertyType.CHAR})
    assert [a.status for a in acks] == [bmq.AckStatus.SUCCESS] * 2
    got = {m.data: m for m in (reader.get(timeout=5), reader.get(timeout=5)) if m is not None}
    assert got[b"a"].property_types == {"c": bmq.PropertyType.CHAR}
    assert got[b"b"].properties == {"other": 1}


# ---- str properties must be valid UTF-8 on the wire ---------------------------------------
@pytest.mark.parametrize("properties, name", [
    ({"x": "\udc80", "y": "ok"}, "x"),
    ({"n\udc80": "value"}, "n\udc80"),
])
def test_str_property_that_is_not_utf8_is_refused_at_post_time(session, properties, name):
    writer = reader = session.open_queue(fresh(), read=True, write=True)
    with pytest.raises(bmq.PropertyError) as info:
        writer.post(b"bad", properties=properties)
    assert info.value.name == name
    assert writer.post(b"good", properties={"y": "ok"}).status is bmq.AckStatus.SUCCESS
    message = reader.get(timeout=5)
    assert message is not None and message.data == b"good" and message.properties == {"y": "ok"}
    assert reader.get(timeout=0.2) is None  # the refused post sent nothing
