"""A PUSH message that cannot be decoded (its payload flagged zlib but not zlib: what a corrupted
PUT header stored by the broker becomes) is skipped with an error, and the connection stays up.

Dropping the connection, as bmq did, made a consumer reconnect for ever: the broker delivers
the same unconfirmed message first on every new connection (seen in the hostile proxy test
against bmqbrkr). The C++ SDK logs such a message and goes on; so does bmq, delivering the
other messages of the event.
"""
from __future__ import annotations

import os

import bmq
from bmq import _codec, events
from bmq.broker import Broker
from support import fresh_uri, wait_event


def test_an_undecodable_push_message_is_skipped_and_the_connection_kept(broker: Broker) -> None:
    uri = fresh_uri()
    with bmq.Session(broker.address) as session:
        queue = session.open_queue(uri, read=True, write=True)
        (client,) = [c for c in broker.clients() if not c.admin]
        good, bad = os.urandom(16), os.urandom(16)
        event, = _codec.build_push_events([
            (queue.queue_id, good, (), b"decodes", 0, 0, 0),
            (queue.queue_id, bad, (), b"flagged zlib, but not zlib", 0, _codec.COMPRESSION_ZLIB, 0),
        ])
        broker.faults.send_raw(client.id, event)

        assert queue.get(timeout=10).data == b"decodes"
        seen = wait_event(session, events.Error)
        assert f"message {bad.hex().upper()} from the broker could not be decoded" in str(seen[-1])
        assert not [e for e in seen if isinstance(e, events.ConnectionLost)]
        # Still the same connection: a post goes through and comes back on it.
        queue.post(b"after")
        assert queue.get(timeout=10).data == b"after"
        stats = session.stats()
    assert stats.reconnects == 0
