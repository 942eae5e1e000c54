"""A connection lost between a reopen's answer and the queue's marking as OPEN.

The supervisor reopens a PENDING queue on a new connection, then marks it OPEN. If that
connection dies in between (its reader finds the queue still PENDING and leaves it so), the
queue used to be marked OPEN anyway: the next connection, which reopens only PENDING queues,
skipped it, and the consumer received nothing more for the life of the session (seen in the
hostile proxy test against bmqbrkr). The interleaving is driven by wrapping the reopen.
"""
from __future__ import annotations

import threading

import bmq
from bmq import events
from bmq._handles import QueueHandles
from bmq.broker import Broker
from support import fresh_uri, ha_options


def test_a_connection_lost_right_after_a_reopen_has_the_queue_reopened_on_the_next(broker: Broker, monkeypatch) -> None:
    uri = fresh_uri()
    losses, restored = threading.Semaphore(0), threading.Semaphore(0)

    def on_event(event: events.SessionEvent) -> None:
        if isinstance(event, events.ConnectionLost):
            losses.release()
        elif isinstance(event, events.StateRestored):
            restored.release()

    original = QueueHandles.reopen
    first = [True]

    def reopen_then_lose_the_connection(self, queue, open_timeout, configure_timeout):
        original(self, queue, open_timeout, configure_timeout)
        if first[0]:
            first[0] = False
            broker.faults.drop_connections()
            assert losses.acquire(timeout=10)  # the reader has seen it: the queue was PENDING

    with bmq.Session(broker.address, ha_options(on_event=on_event)) as consumer:
        reader = consumer.open_queue(uri, read=True)
        monkeypatch.setattr(QueueHandles, "reopen", reopen_then_lose_the_connection)
        broker.faults.drop_connections()
        assert losses.acquire(timeout=10)
        assert restored.acquire(timeout=30)
        assert not first[0], "the reopen was not reached"
        with bmq.Session(broker.address) as producer:
            producer.open_queue(uri, write=True).post(b"after the second loss")
        message = reader.get(timeout=10)
        assert message is not None and message.data == b"after the second loss"
