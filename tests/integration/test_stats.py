"""Session statistics: the figures add up (also across faults), the report comes at its interval."""
from __future__ import annotations

import json
import logging
import threading

import bmq
from bmq import events
from support import drain, fresh_uri, ha_options, wait_event


def _adds_up(queue: bmq.QueueStats) -> bool:
    return queue.posted == sum(queue.acked.values()) + queue.in_flight


def test_the_figures_add_up_on_both_brokers(session):
    queue = session.open_queue(fresh_uri(prefix="stats"), read=True, write=True)
    queue.post_many([b"m%d" % i for i in range(100)])
    got = drain(queue, 100)
    session.confirm_many(got[:60])
    stats = session.stats()
    figures = stats.queues[queue.uri]
    assert (figures.posted, figures.acked, figures.in_flight) == (100, {"SUCCESS": 100}, 0)
    assert figures.posted_bytes == sum(len(b"m%d" % i) for i in range(100))
    assert (figures.pushed, figures.confirmed, figures.unconfirmed) == (100, 60, 40)
    assert 0 < figures.ack_latency_us["p50"] <= figures.ack_latency_us["p99"] <= figures.ack_latency_us["max"]
    assert stats.connections == 1 and stats.reconnects == 0 and stats.bytes_in > 0 and stats.bytes_out > 0
    assert json.loads(stats.to_json())["queues"][queue.uri]["confirmed"] == 60
    assert queue.uri in stats.table() and "reconnects 0" in stats.table()


def test_the_figures_add_up_across_nacks_withheld_acks_and_a_reconnect(broker):
    with bmq.Session(broker.address, ha_options()) as session:
        queue = session.open_queue(fresh_uri(prefix="stats-faults"), write=True)
        broker.faults.nack_next(5)
        acks = [queue.post_async(b"n%d" % i) for i in range(10)]
        assert sorted(a.result(10).status.name for a in acks).count("UNKNOWN") == 5
        broker.faults.withhold_acks()
        pending = [queue.post_async(b"w%d" % i) for i in range(20)]
        assert broker.wait_for(lambda: len(broker.queue_messages(queue.uri)) >= 25, 10)
        during = session.stats().queues[queue.uri]
        assert during.in_flight == 20 and _adds_up(during)
        broker.faults.drop_connections()  # the withheld ACKs die with it; the PUTs are re-sent
        broker.faults.reset()
        wait_event(session, events.StateRestored, timeout=30)
        assert all(f.result(30).status is bmq.AckStatus.SUCCESS for f in pending)
        stats = session.stats()
    after = stats.queues[queue.uri]
    assert after.posted == 30 and after.acked == {"SUCCESS": 25, "UNKNOWN": 5} and after.in_flight == 0
    assert stats.connections == 2 and stats.reconnects == 1


def test_the_report_comes_at_its_interval(broker, caplog):
    caplog.set_level(logging.INFO, logger="bmq.stats")
    reports = []
    two = threading.Event()

    def on_stats(snapshot: bmq.SessionStats) -> None:
        reports.append(snapshot)
        if len(reports) >= 2:
            two.set()

    options = bmq.SessionOptions(stats_interval=0.2, on_stats=on_stats)
    with bmq.Session(broker.address, options) as session:
        queue = session.open_queue(fresh_uri(prefix="stats-report"), write=True)
        queue.post(b"counted")
        assert two.wait(10), "two reports within 10 s at a 0.2 s interval"
    assert reports[-1].queues[queue.uri].posted == 1
    assert any(queue.uri in record.getMessage() for record in caplog.records if record.name == "bmq.stats")
