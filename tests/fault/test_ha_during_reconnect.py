"""What happens while a session reconnects: posts expire on time, a configure in flight at the
drop is applied after the reopen, a reopen that times out is reported and retried."""
from __future__ import annotations

import threading
from typing import Callable

import pytest

import bmq
from bmq import _schema, events
from bmq.broker import Broker
from support import drain, fresh_uri as fresh, ha_options as options, wait_event

pytestmark = pytest.mark.timeout(60)


def on_control_request(broker: Broker, key: str, action: Callable[[], None] = lambda: None) -> threading.Event:
    """An Event set (after running ``action``) when the broker receives a ``key`` request."""
    received = threading.Event()
    original = broker._on_control

    def hook(session, event):
        message, _ = _schema.decode_event(event, "control")
        if key in message and not received.is_set():
            action()
            received.set()
        original(session, event)

    broker._on_control = hook
    return received


# ---- posts expire after ack_timeout while the session is reconnecting ------------------
def test_posts_expire_as_timeout_while_reconnecting(broker):
    with bmq.Session(broker.address, options(ack_timeout=0.5)) as session:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.withhold_acks()
        on_the_wire = queue.post_async(b"sent, never acknowledged")
        broker.faults.refuse_negotiation()  # every reconnect attempt fails
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        buffered = queue.post_async(b"posted while disconnected")
        assert on_the_wire.result(5.0).status is bmq.AckStatus.TIMEOUT
        assert buffered.result(5.0).status is bmq.AckStatus.TIMEOUT
        assert session.flush(0) == 0


# ---- a configure in flight at the drop is applied after the reopen ----------------------
def test_configure_in_flight_at_a_drop_is_applied_after_the_reopen(broker):
    with bmq.Session(broker.address, options()) as session:
        reader = session.open_queue(fresh(), read=True)
        configured = on_control_request(broker, "configureStream", lambda: broker.faults.delay_control_responses(30))
        result: list = []
        worker = threading.Thread(
            target=lambda: result.append(session.configure_queue(
                reader.uri, bmq.QueueOptions(max_unconfirmed_messages=2), timeout=20)))
        worker.start()
        assert configured.wait(10)  # on the wire; its answer is held back
        broker.faults.delay_control_responses(0)
        broker.faults.drop_connections()
        worker.join(20)
        assert result == [None]  # returned normally, no BrokerError about an unknown qId
        assert reader.options.max_unconfirmed_messages == 2
        wait_event(session, events.StateRestored)
        with bmq.Session(broker.address) as other:
            other.open_queue(reader.uri, write=True).post_many([b"%d" % i for i in range(5)])
        got = drain(reader, 2)
        assert len(got) == 2
        assert reader.get(timeout=0.3) is None  # the broker honours the new limit of 2
        reader.confirm_many(got)
        assert len(drain(reader, 2)) == 2


# ---- a reopen that times out is not "bad data", and the session still recovers ---------
def test_reopen_timeout_is_reported_as_a_timeout_and_reconnects(broker):
    with bmq.Session(broker.address, options(open_queue_timeout=0.5)) as session:
        queue = session.open_queue(fresh(), write=True)
        wait_event(session, events.Connected)
        broker.faults.delay_control_responses(0.8)  # negotiation fits connect_timeout, the reopen does not
        broker.faults.drop_connections()
        seen = wait_event(session, events.Error)
        broker.faults.delay_control_responses(0)
        error = seen[-1]
        assert "bad data" not in str(error)
        assert "no response" in str(error) and queue.uri in str(error)
        seen += wait_event(session, events.StateRestored)
        assert not any(isinstance(e, events.Error) and "bad data" in str(e) for e in seen)
        assert any(isinstance(e, events.QueueReopened) for e in seen)
        assert queue.post(b"after", timeout=10).status is bmq.AckStatus.SUCCESS
