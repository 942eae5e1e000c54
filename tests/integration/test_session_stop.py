"""A stopping session: next_event() wakes and drains, open_queue(timeout) stays bounded when its
rollback gets no answer, an unusable outbox_dir fails cleanly."""
from __future__ import annotations

import os
import threading
import time

import pytest

import bmq
from bmq import _schema, events
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
