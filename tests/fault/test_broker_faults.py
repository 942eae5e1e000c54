"""The embedded broker's fault-injection API (``broker.faults`` and ``broker.restart``)."""
from __future__ import annotations

import time

import pytest

from bmq import _codec
from bmq.broker import Broker
from bmq.broker._rawclient import RawClient

URI = "bmq://bmq.test.mem.priority/faults"

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def broker():
    with Broker() as running:
        yield running


def writer(broker: Broker) -> RawClient:
    c = RawClient(broker.port)
    assert c.open(URI, 0, write=True)[0] == "openQueueResponse"
    return c


def test_drop_all_connections(broker: Broker) -> None:
    clients = [RawClient(broker.port) for _ in range(3)]
    assert broker.faults.drop_connections() == 3
    assert all(c.wait_closed() for c in clients)
    assert broker.wait_for(lambda: not broker.clients(), 5)
    with RawClient(broker.port) as again:  # still serving
        assert again.broker_response["result"]["category"] == "E_SUCCESS"


def test_drop_one_connection(broker: Broker) -> None:
    victim, survivor = writer(broker), writer(broker)
    victim_id = broker.clients()[0].id
    assert broker.faults.drop_connections(victim_id) == 1
    assert victim.wait_closed()
    [guid] = survivor.put(0, [b"alive"])
    assert survivor.acks(1)[0][2] == guid
    with pytest.raises(KeyError):
        broker.faults.drop_connections(victim_id)


def test_pause_reading_builds_tcp_backpressure_then_resume_drains(broker: Broker) -> None:
    c = writer(broker)
    broker.faults.pause_reading()
    c.sock.setblocking(False)
    complete, rest = 0, b""
    try:
        while complete < 100_000:  # far more than any pair of socket buffers holds
            [event] = _codec.build_put_events(0, c.put_ids(1), [b"x" * 60000], flags=0)
            n = c.sock.send(event)
            if n < len(event):
                rest = event[n:]
                break
            complete += 1
    except BlockingIOError:
        pass
    assert complete < 100_000, "the broker kept reading while paused"
    assert broker.queue_messages(URI) == [] or len(broker.queue_messages(URI)) < complete
    broker.faults.resume_reading()
    c.sock.setblocking(True)
    if rest:
        c.sock.sendall(rest)
        complete += 1
    assert broker.wait_for(lambda: len(broker.queue_messages(URI)) == complete, 10)


def test_withhold_and_release_acks(broker: Broker) -> None:
    c = writer(broker)
    broker.faults.withhold_acks()
    guids = c.put(0, [b"a", b"b", b"c"])
    assert c.expect_silence(_codec.EVENT_ACK, 0.3)
    assert len(broker.queue_messages(URI)) == 3  # stored, just not acknowledged
    assert broker.faults.release_acks() == 1
    assert [a[2] for a in c.acks(3)] == guids
    c.put(0, [b"d"])
    assert c.acks(1)[0][0] == 0


def test_delay_acks(broker: Broker) -> None:
    c = writer(broker)
    broker.faults.delay_acks(0.3)
    start = time.monotonic()
    c.put(0, [b"slow"])
    c.acks(1)
    assert time.monotonic() - start >= 0.25
    broker.faults.delay_acks(0)


def test_nack_next_n_puts(broker: Broker) -> None:
    c = writer(broker)
    broker.faults.nack_next(2, status=7)
    guids = c.put(0, [b"1", b"2", b"3"])
    assert [(a[0], a[2]) for a in c.acks(3)] == [(7, guids[0]), (7, guids[1]), (0, guids[2])]
    assert [m.payload for m in broker.queue_messages(URI)] == [b"3"]
    with pytest.raises(ValueError):
        broker.faults.nack_next(1, status=0)


def test_refuse_negotiation(broker: Broker) -> None:
    broker.faults.refuse_negotiation()
    refused = RawClient(broker.port, negotiate=False)
    result = refused.negotiate()["result"]
    assert (result["category"], result["code"]) == ("E_REFUSED", -1)
    assert refused.wait_closed()
    broker.faults.refuse_negotiation(False)
    with RawClient(broker.port) as accepted:
        assert accepted.broker_response["result"]["category"] == "E_SUCCESS"


def test_delay_control_responses(broker: Broker) -> None:
    c = RawClient(broker.port)
    broker.faults.delay_control_responses(0.3)
    start = time.monotonic()
    assert c.open(URI, 0, write=True)[0] == "openQueueResponse"
    assert time.monotonic() - start >= 0.25


def test_stop_and_resume_heartbeats() -> None:
    # Once heartbeats resume, the broker drops a client silent for max_missed intervals: 300 ms
    # for this test thread to go from resuming them to reading (20 ms x 2 was missed under load).
    with Broker(heartbeat_interval_ms=100, max_missed_heartbeats=3) as b:
        b.faults.stop_heartbeats()
        c = RawClient(b.port)
        c.send(_codec.HEARTBEAT_REQ)
        assert c.expect_silence(_codec.EVENT_HEARTBEAT_RSP, 1.0)  # 10 intervals
        assert c.heartbeat_requests == 0
        assert len(b.clients()) == 1  # nobody dropped while heartbeats are off
        b.faults.resume_heartbeats()
        c.send(_codec.HEARTBEAT_REQ)
        assert c.next_event(_codec.EVENT_HEARTBEAT_RSP) == _codec.HEARTBEAT_RSP


def test_send_raw_bytes_to_a_client(broker: Broker) -> None:
    c = RawClient(broker.port)
    [info] = broker.clients()
    broker.faults.send_raw(info.id, _codec.HEARTBEAT_RSP)
    assert c.next_event(_codec.EVENT_HEARTBEAT_RSP) == _codec.HEARTBEAT_RSP
    broker.faults.send_raw(info.id, b"\xff\xff\xff\xff")
    with pytest.raises(Exception):
        c.next_event(timeout=2)


def test_restart_drops_clients_and_keeps_port(broker: Broker) -> None:
    c = writer(broker)
    c.put(0, [b"kept"])
    c.acks(1)
    port = broker.port
    broker.restart(keep_queues=True)
    assert c.wait_closed()
    with RawClient(port) as again:
        assert again.broker_response["result"]["category"] == "E_SUCCESS"
    assert [m.payload for m in broker.queue_messages(URI)] == [b"kept"]
    broker.restart(keep_queues=False)
    assert broker.queue_messages(URI) == []


def test_reset_undoes_everything(broker: Broker) -> None:
    c = writer(broker)
    faults = broker.faults
    faults.withhold_acks()
    c.put(0, [b"held"])
    faults.delay_acks(5)
    faults.delay_control_responses(5)
    faults.refuse_negotiation()
    faults.stop_heartbeats()
    faults.nack_next(3)
    faults.reset()
    assert c.acks(1)[0][0] == 0  # the withheld ACK was sent
    [guid] = c.put(0, [b"fresh"])
    assert c.acks(1, timeout=2) == [(0, 0, guid, 0)]
    with RawClient(broker.port, timeout=2) as other:
        assert other.broker_response["result"]["category"] == "E_SUCCESS"
