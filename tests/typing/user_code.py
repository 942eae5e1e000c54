"""Typical user code, type-checked by tests/unit/test_typing.py (never run): what a user's mypy
must accept about bmq's public API."""
from __future__ import annotations

from concurrent.futures import Future
from typing import List, Optional, Union

import bmq
from bmq import events


def on_event(event: events.SessionEvent) -> None:
    if isinstance(event, events.ConnectionLost):
        print("lost", event)


def produce_and_consume(address: str) -> int:
    options = bmq.SessionOptions(ack_timeout=5.0, on_event=on_event,
                                 reconnect=bmq.ReconnectPolicy(initial_delay=0.1, max_attempts=5),
                                 stats_interval=60.0, on_stats=lambda stats: print(stats.table()),
                                 opentelemetry=False)
    with bmq.Session(address, options) as session:
        queue: bmq.Queue = session.open_queue(
            "bmq://bmq.test.mem.priority/typed", read=True, write=True,
            options=bmq.QueueOptions(max_unconfirmed_messages=100, subscriptions=[
                "n > 1", bmq.Subscription('kind == "x"', consumer_priority=2, max_unconfirmed_messages=5)]))
        ack: bmq.Ack = queue.post(b"payload", {"n": 2, "kind": "x"},
                                  property_types={"n": bmq.PropertyType.INT64})
        assert ack.status is bmq.AckStatus.SUCCESS
        pending: Future[bmq.Ack] = queue.post_async(b"later", compression="zlib")
        acks: List[bmq.Ack] = queue.post_many([b"a", b"b"])
        message: Optional[bmq.Message] = queue.get(timeout=1.0)
        if message is not None:
            data: bytes = message.data
            matched: Union[str, bmq.Subscription, None] = message.subscription
            print(data, message.properties, message.guid_hex, matched)
            message.confirm()
        batch = list(queue.messages(timeout=0.5))
        session.confirm_many(batch)
        event: Optional[events.SessionEvent] = session.next_event(0.1)
        print(event, pending.result(5.0).status, queue.state == bmq.QueueState.OPEN)
        queue.configure(bmq.QueueOptions(max_unconfirmed_messages=10))
        queue.close()
        bulk = session.open_queue("bmq://bmq.test.mem.priority/bulk", read=True, batches=True)
        rows: Optional[bmq.MessageBatch] = bulk.get_batch(1000, timeout=0.5, max_bytes=1 << 20)
        if rows is not None:
            payloads: bytes = rows.payloads
            first: int = rows.offsets[1]
            print(len(rows), payloads[:first], rows.guid(0), rows.properties(0), rows.has_properties)
            single: List[bmq.Message] = rows.messages()
            bmq.MessageBatch.join([rows]).confirm()
            print(len(single))
        return len(acks)


def code_written_for_the_official_sdk(address: str) -> None:
    # What a user's mypy sees after switching with ``import bmq.compat as blazingmq``.
    import bmq.compat as blazingmq
    from bmq.compat.session_events import Connected, SessionEvent, log_session_event

    def on_message(message: blazingmq.Message, handle: blazingmq.MessageHandle) -> None:
        data: bytes = message.data
        kinds = message.property_types.get("kind")
        print(data, kinds is blazingmq.PropertyType.STRING)
        handle.confirm()

    def on_ack(ack: blazingmq.Ack) -> None:
        if ack.status != blazingmq.AckStatus.SUCCESS:
            print("nack", ack)

    def on_event(event: SessionEvent) -> None:
        if isinstance(event, Connected):
            log_session_event(event)

    monitor = blazingmq.BasicHealthMonitor()
    with blazingmq.Session.with_options(
            on_event, on_message, address,
            blazingmq.SessionOptions(timeouts=blazingmq.Timeouts(open_queue_timeout=5.0),
                                     host_health_monitor=monitor)) as session:
        uri = "bmq://bmq.test.mem.priority/typed-compat"
        session.open_queue(uri, read=True, write=True,
                           options=blazingmq.QueueOptions(max_unconfirmed_messages=10))
        session.post(uri, b"x", {"kind": "k"}, {"kind": blazingmq.PropertyType.STRING}, on_ack=on_ack)
        options: blazingmq.QueueOptions = session.get_queue_options(uri)
        print(options.max_unconfirmed_messages)
        session.close_queue(uri, timeout=5.0)
