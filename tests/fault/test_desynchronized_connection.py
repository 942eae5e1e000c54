"""A connection whose bytes were corrupted on the way is replaced, and nothing acknowledged is lost.

A proxy (tests/proxy.py) corrupts one chosen byte of one chosen event, nothing else, against
the embedded broker and bmqbrkr:

- client to broker, the length word of a PUT event: the broker now waits for the rest of an
  "event" 16 MiB longer, so it never reads anything this client sends again, while its own
  heartbeats keep reaching the client. The connection is replaced and the PUT re-sent with its
  GUID; whoever notices first: bmqbrkr after 10 missed heartbeats (it counts only valid
  events), the client because the embedded broker, which counts any bytes, falls silent, or
  the client because its ACK is overdue and the broker answers no heartbeat request
  (Transport.check_heard, which alone catches a broker that reads the rest of the stream
  from a wrong offset and takes some of it for events: tests/unit/test_transport_heard.py);
- broker to client, the length word of an ACK event: bytes that cannot be an event; the client
  drops the connection at once and re-sends the unanswered PUT;
- broker to client, the rId of a configure's response: the response answers nothing, the
  connection stays healthy, the configure times out. The broker may still apply it, so the
  client replaces the connection (as the C++ SDK does when an open or close times out) and
  reopens the queue with the options it knows.
"""
from __future__ import annotations

import pytest

import bmq
from bmq import _codec, events
from proxy import Proxy
from support import drain, fresh_uri, ha_options, wait_event

pytestmark = pytest.mark.slow

#: Bound on each recovery: bmqbrkr announces heartbeats every 3 s, 10 missed = dead, so the
#: broker that does not hear a connection is found out after ~33 s; the embedded broker of
#: these tests after ~0.6 s.
RECOVERY = 90.0
#: How long a configure waits for its response in the last test.
REQUEST_TIMEOUT = 2.0


def _post_across(broker_address: str, direction: str, event_type: int, xor: int) -> None:
    """Post once through an honest proxy, then once more with ``xor`` applied to the first byte
    (the length word's top byte) of the next ``event_type`` event going ``direction``: the
    second post is acknowledged SUCCESS on a new connection, and a reader gets both."""
    uri = fresh_uri(prefix="desync")
    with bmq.Session(broker_address) as consumer:
        reader = consumer.open_queue(uri, read=True)
        with Proxy(broker_address) as proxy, bmq.Session(proxy.address, ha_options()) as producer:
            queue = producer.open_queue(uri, write=True)
            assert queue.post(b"before").ok
            corrupted = proxy.corrupt(direction, event_type, offset=0, xor=xor)
            assert queue.post(b"across", timeout=RECOVERY).ok
            assert corrupted.is_set()
            assert proxy.connections == 2, "the corrupted connection was not replaced"
            assert any(isinstance(event, events.Reconnected) for event in wait_event(producer, events.StateRestored))
        assert sorted(message.data for message in drain(reader, 2)) == [b"across", b"before"]


def test_a_stream_the_broker_stopped_reading_is_replaced(broker_address):
    # 0x01 in the top byte of the length word: 16 MiB more, within both brokers' limits.
    _post_across(broker_address, "up", _codec.EVENT_PUT, 0x01)


def test_bytes_that_cannot_be_an_event_drop_the_connection(broker_address):
    # The top bit of the length word: the fragment bit, which a broker never sets towards a
    # client (and a length beyond any limit).
    _post_across(broker_address, "down", _codec.EVENT_ACK, 0x80)


def test_a_request_left_unanswered_on_a_live_connection_replaces_it(broker_address):
    uri = fresh_uri(prefix="desync")
    with Proxy(broker_address) as proxy, bmq.Session(proxy.address, ha_options()) as session:
        queue = session.open_queue(uri, read=True)
        before = queue.options
        # The configure's response (the next control message) gets "sId" for "rId": an unknown
        # element (skipped), so it answers no request.
        corrupted = proxy.corrupt("down", _codec.EVENT_CONTROL, offset=1, xor=ord("r") ^ ord("s"), anchor=b'"rId"')
        with pytest.raises(bmq.TimeoutError):
            queue.configure(bmq.QueueOptions(max_unconfirmed_messages=7), timeout=REQUEST_TIMEOUT)
        assert corrupted.is_set()
        seen = wait_event(session, events.StateRestored, RECOVERY)
        assert any(isinstance(event, events.Reconnected) for event in seen)
        assert proxy.connections == 2
        assert queue.options == before, "reopened with options the broker was never seen to apply"
        with bmq.Session(broker_address) as producer:
            producer.open_queue(uri, write=True).post(b"after")
        assert [message.data for message in drain(queue, 1)] == [b"after"]
