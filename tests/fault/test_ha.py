"""High availability: reconnects, retransmission with original GUIDs, stalls, dead links,
malformed input — injected by the embedded broker's faults."""
from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import List

import pytest

import bmq
from bmq import _codec, events
from bmq.broker import Broker
from support import drain, fresh_uri as fresh, ha_options as options, wait_event

pytestmark = pytest.mark.timeout(120)


def test_reconnect_reopens_queues_and_reports_events_in_order(broker):
    with bmq.Session(broker.address, options()) as session:
        writer = session.open_queue(fresh(), write=True)
        reader = session.open_queue(fresh("bmq.test.mem.fanout") + "?id=foo", read=True)
        wait_event(session, events.Connected)
        assert broker.faults.drop_connections() == 1
        seen = wait_event(session, events.StateRestored)
        kinds = [type(e) for e in seen]
        assert kinds[0] is events.ConnectionLost and kinds[1] is events.Reconnected
        assert sorted(e.queue_uri for e in seen[2:-1]) == sorted([writer.uri, reader.uri])
        assert all(isinstance(e, events.QueueReopened) for e in seen[2:-1])
        assert writer.post(b"after").status is bmq.AckStatus.SUCCESS
        with bmq.Session(broker.address) as other:
            other.open_queue(reader.uri.split("?")[0], write=True).post(b"to foo")
        assert reader.get(timeout=5.0).data == b"to foo"


def test_a_queue_that_cannot_be_reopened_is_reported_and_closed(broker):
    with bmq.Session(broker.address, options()) as session:
        kept = session.open_queue(fresh(), write=True)
        lost = session.open_queue(fresh("bmq.test.mem.fanout"), write=True)
        del broker.domains["bmq.test.mem.fanout"]  # the broker no longer knows the domain
        broker.faults.refuse_negotiation(True)
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        orphan = lost.post_async(b"never acknowledged")
        broker.faults.refuse_negotiation(False)
        seen = wait_event(session, events.StateRestored)
        assert events.QueueReopenFailed(lost.uri) in [type(e)(e.queue_uri) for e in seen
                                                      if isinstance(e, events.QueueReopenFailed)]
        assert events.QueueReopened(kept.uri) in seen
        assert orphan.result(5.0).status is bmq.AckStatus.UNKNOWN
        with pytest.raises(bmq.QueueStateError):
            lost.post(b"x")
        assert kept.post(b"x").status is bmq.AckStatus.SUCCESS


def test_unacknowledged_posts_are_resent_with_original_guids(broker):
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.withhold_acks()
        futures = queue.post_many_async([b"m%d" % i for i in range(100)])
        assert broker.wait_for(lambda: len(broker.queue_messages(queue.uri)) == 100, 5.0)
        first_guids = [m.guid for m in broker.queue_messages(queue.uri)]
        broker.faults.drop_connections()
        broker.faults.release_acks()
        acks = [f.result(10.0) for f in futures]
        assert [a.status for a in acks] == [bmq.AckStatus.SUCCESS] * 100
        assert [a.guid for a in acks] == first_guids
        stored = broker.queue_messages(queue.uri)
        assert len(stored) == 100 and [m.guid for m in stored] == first_guids


def test_posts_while_disconnected_are_buffered_then_delivered_once(broker):
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.refuse_negotiation(True)
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        futures = queue.post_many_async([b"b%d" % i for i in range(50)])
        assert not any(f.done() for f in futures)
        broker.faults.refuse_negotiation(False)
        assert [f.result(10.0).status for f in futures] == [bmq.AckStatus.SUCCESS] * 50
        assert sorted(m.app_data for m in broker.queue_messages(queue.uri)) == sorted(b"b%d" % i for i in range(50))


def test_buffer_bound_makes_posters_wait_then_fail(broker):
    opts = options(max_pending_bytes=10_000, channel_write_timeout=0.5)
    with bmq.Session(broker.address, opts) as session:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.refuse_negotiation(True)
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        queue.post_async(bytes(9_000))
        start = time.monotonic()
        with pytest.raises(bmq.BandwidthLimitError):
            queue.post_async(bytes(2_000))
        assert 0.4 <= time.monotonic() - start <= 1.5
        broker.faults.refuse_negotiation(False)
        assert queue.post(bytes(2_000)).status is bmq.AckStatus.SUCCESS


def test_every_post_accepted_up_to_the_bound_is_delivered_once_the_broker_returns(broker):
    """Posting into the gap until the bound refuses (issue 29): what was accepted before the
    refusal, by post_async and post_many_async alike, is acknowledged and stored exactly once
    after the reconnect; the refused messages are not stored."""
    opts = options(max_pending_bytes=20_000, channel_write_timeout=0.2)
    with bmq.Session(broker.address, opts) as session:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.refuse_negotiation(True)
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        accepted, futures, refused = [], [], []
        for n in range(100):
            batch = [b"%04d" % (10 * n + i) + bytes(996) for i in range(1 if n % 2 else 3)]
            try:
                futures.extend([queue.post_async(batch[0])] if n % 2 else queue.post_many_async(batch))
            except bmq.BandwidthLimitError:
                refused = batch
                break
            accepted.extend(batch)
        assert refused and 15 <= len(accepted) <= 20
        broker.faults.refuse_negotiation(False)
        assert [f.result(10.0).status for f in futures] == [bmq.AckStatus.SUCCESS] * len(accepted)
        stored = [m.app_data for m in broker.queue_messages(queue.uri)]
        assert sorted(stored) == sorted(accepted) and not set(refused) & set(stored)


def test_post_many_callback_buffered_while_disconnected_is_answered_when_the_session_stops(broker):
    """A call buffered in the gap gets its one on_done, NOT_CONNECTED for every message, when
    the session stops (before the Disconnected event)."""
    got = []
    session = bmq.Session(broker.address, options(on_event=lambda e: got.append(type(e))))
    try:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.refuse_negotiation(True)
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        queue.post_many_callback([b"a", b"b", b"c"], lambda acks: got.append([a.status for a in acks]))
    finally:
        session.stop()
    assert [bmq.AckStatus.NOT_CONNECTED] * 3 in got
    assert got.index([bmq.AckStatus.NOT_CONNECTED] * 3) < got.index(events.Disconnected)


def test_close_while_disconnected_completes_locally(broker):
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.refuse_negotiation(True)
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        pending = queue.post_async(b"never sent")
        start = time.monotonic()
        session.close_queue(queue.uri)
        assert time.monotonic() - start < 1.0
        assert pending.result(1.0).status is bmq.AckStatus.CANCELED
        broker.faults.refuse_negotiation(False)
        seen = wait_event(session, events.StateRestored)
        assert not any(isinstance(e, (events.QueueReopened, events.QueueReopenFailed)) for e in seen)


def test_open_while_disconnected_is_sent_after_reconnect(broker):
    with bmq.Session(broker.address, options()) as session:
        broker.faults.refuse_negotiation(True)
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        result = {}
        uri = fresh()
        opener = threading.Thread(target=lambda: result.setdefault("q", session.open_queue(uri, write=True)))
        opener.start()
        broker.faults.refuse_negotiation(False)
        opener.join(10.0)
        assert result["q"].post(b"x").status is bmq.AckStatus.SUCCESS


def test_ack_timeout_resolves_as_timeout(broker):
    with bmq.Session(broker.address, options(ack_timeout=0.3)) as session:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.withhold_acks()
        start = time.monotonic()
        with pytest.raises(bmq.PostError) as info:
            queue.post(b"x")
        assert info.value.ack.status is bmq.AckStatus.TIMEOUT
        assert 0.25 <= time.monotonic() - start < 2.0
        broker.faults.reset()


def test_stalled_broker_gives_bandwidth_limit_after_write_timeout():
    opts = options(channel_write_timeout=1.0, channel_high_watermark=1 << 20)
    # Default heartbeats: a broker that stops reading must not drop us for "missed" ones.
    with Broker() as broker, bmq.Session(broker.address, opts) as session:
        queue = session.open_queue(fresh(), write=True)
        broker.faults.pause_reading()
        payload = bytes(256 * 1024)
        futures = []
        failed_after = None
        for _ in range(2000):  # kernel buffers absorb some MiB first
            start = time.monotonic()
            try:
                futures.append(queue.post_async(payload))
            except bmq.BandwidthLimitError:
                failed_after = time.monotonic() - start
                break
        assert failed_after is not None, "posting never hit the high watermark"
        assert 0.5 <= failed_after <= 1.5
        broker.faults.resume_reading()
        futures.append(queue.post_async(payload))
        assert all(f.result(20.0).status is bmq.AckStatus.SUCCESS for f in futures)
        assert len(broker.queue_messages(queue.uri)) == len(futures)


def test_silent_broker_is_detected_by_heartbeats_then_recovers(broker):
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(fresh(), write=True)
        wait_event(session, events.Connected)
        broker.faults.stop_heartbeats()
        start = time.monotonic()
        wait_event(session, events.ConnectionLost, timeout=5.0)
        # interval 0.1 s x 5 missed, plus two intervals of phase and a scheduling margin
        assert time.monotonic() - start < 0.1 * (5 + 2) + 1.0
        broker.faults.resume_heartbeats()
        wait_event(session, events.StateRestored)
        assert queue.post(b"alive").status is bmq.AckStatus.SUCCESS


def test_unconfirmed_messages_are_redelivered_after_reconnect(broker):
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(fresh(), read=True, write=True)
        queue.post_many([b"u%d" % i for i in range(20)])
        first = drain(queue, 20, timeout=20.0)
        assert len(first) == 20
        broker.faults.drop_connections()
        again = drain(queue, 20, timeout=20.0)
        assert sorted(m.guid for m in again) == sorted(m.guid for m in first)
        session.confirm_many(again)
        assert broker.wait_for(lambda: not broker.queue_messages(queue.uri), 5.0)


def test_unconfirmed_messages_go_to_another_consumer_when_one_dies(broker):
    uri = fresh()
    with bmq.Session(broker.address, options(reconnect=bmq.ReconnectPolicy(enabled=False))) as doomed, \
            bmq.Session(broker.address) as survivor:
        dying = doomed.open_queue(uri, read=True, write=True, options=bmq.QueueOptions(consumer_priority=10))
        dying.post_many([b"r%d" % i for i in range(10)])
        assert len(drain(dying, 10, timeout=20.0)) == 10
        backup = survivor.open_queue(uri, read=True)
        broker.faults.drop_connections(min(c.id for c in broker.clients()))  # the first session
        got = drain(backup, 10, timeout=20.0)
        assert sorted(m.data for m in got) == sorted(b"r%d" % i for i in range(10))
        wait_event(doomed, events.Disconnected)


def test_giving_up_reconnecting_stops_the_session(broker):
    policy = bmq.ReconnectPolicy(initial_delay=0.01, max_delay=0.05, max_attempts=3)
    session = bmq.Session(broker.address, bmq.SessionOptions(reconnect=policy))
    queue = session.open_queue(fresh(), write=True)
    broker.faults.refuse_negotiation(True)
    broker.faults.drop_connections()
    seen = wait_event(session, events.Disconnected)
    assert any(isinstance(e, events.Error) for e in seen)
    assert not session.is_running
    with pytest.raises(bmq.SessionClosedError):
        queue.post(b"x")
    session.stop()


def test_stop_while_reconnecting_is_prompt(broker):
    session = bmq.Session(broker.address, options(connect_timeout=30.0))
    queue = session.open_queue(fresh(), write=True)
    broker.faults.delay_control_responses(20.0)  # the reconnect hangs in negotiation
    broker.faults.drop_connections()
    wait_event(session, events.ConnectionLost)
    pending = queue.post_async(b"buffered")
    assert broker.wait_for(lambda: broker.clients(), 5.0)
    start = time.monotonic()
    session.stop()
    assert time.monotonic() - start < 3.0
    assert pending.result(1.0).status is bmq.AckStatus.NOT_CONNECTED
    broker.faults.reset()


def test_broker_restart_is_survived(broker):
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(fresh(), read=True, write=True)
        queue.post(b"before")
        queue.get(timeout=5.0).confirm()
        assert broker.wait_for(lambda: not broker.queue_messages(queue.uri), 5.0)
        broker.restart(keep_queues=True)
        wait_event(session, events.StateRestored)
        queue.post(b"after")
        assert queue.get(timeout=5.0).data == b"after"


def test_malformed_frame_emits_error_and_reconnects(broker):
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(fresh(), write=True)
        client_id = broker.clients()[0].id
        # A CONTROL event whose body is not JSON.
        broker.faults.send_raw(client_id, _codec.encode_control_event(b"{not json", _codec.ENCODING_JSON))
        seen = wait_event(session, events.StateRestored)
        assert any(isinstance(e, events.Error) for e in seen)
        assert queue.post(b"still works").status is bmq.AckStatus.SUCCESS


def test_host_health_suspends_and_resumes_opted_in_queues(broker):
    monitor = bmq.ManualHostHealthMonitor()
    with bmq.Session(broker.address, options(host_health_monitor=monitor)) as session:
        opted = bmq.QueueOptions(suspends_on_bad_host_health=True)
        writer = session.open_queue(fresh(), write=True, options=opted)
        reader = session.open_queue(fresh(), read=True, write=True, options=opted)
        plain = session.open_queue(fresh(), write=True)
        monitor.set_unhealthy()
        seen = wait_event(session, events.QueueSuspended)
        seen += wait_event(session, events.QueueSuspended)
        assert sum(isinstance(e, events.QueueSuspended) for e in seen) == 2
        assert any(isinstance(e, events.HostUnhealthy) for e in seen)
        with pytest.raises(bmq.QueueStateError, match="suspended"):
            writer.post(b"x")
        assert plain.post(b"unaffected").status is bmq.AckStatus.SUCCESS
        monitor.set_healthy()
        seen = wait_event(session, events.HostHealthRestored)
        assert sum(isinstance(e, events.QueueResumed) for e in seen) == 2
        assert writer.post(b"resumed").status is bmq.AckStatus.SUCCESS
        reader.post(b"to reader")
        assert reader.get(timeout=5.0).data == b"to reader"


@pytest.mark.slow
def test_100k_posts_from_8_threads_survive_5_drops_stored_exactly_once(broker):
    total, threads_count, chunk = 100_000, 8, 500
    uri = fresh()
    rng = random.Random(20261121)
    drop_points = sorted(rng.sample(range(5_000, total - 5_000), 5))
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(uri, write=True)
        acked = [0]
        lock = threading.Lock()
        failures = []

        def poster(index):
            per_thread = total // threads_count
            try:
                for start in range(0, per_thread, chunk):
                    acks = queue.post_many([b"%d-%d" % (index, i) for i in range(start, start + chunk)])
                    assert all(a.status is bmq.AckStatus.SUCCESS for a in acks)
                    with lock:
                        acked[0] += len(acks)
            except BaseException as e:  # reported below
                failures.append(e)

        workers = [threading.Thread(target=poster, args=(i,)) for i in range(threads_count)]
        for w in workers:
            w.start()
        drops = 0
        for point in drop_points:
            while acked[0] < point and any(w.is_alive() for w in workers):
                broker.wait_for(lambda: acked[0] >= point, 0.05)
            drops += broker.faults.drop_connections()
        for w in workers:
            w.join(120.0)
        assert not failures, failures[:3]
        assert acked[0] == total and drops == 5
    stored = broker.queue_messages(uri)
    assert len(stored) == total and len({m.app_data for m in stored}) == total
    # Every stored message reaches a consumer. At least once, not exactly once: BlazingMQ
    # redelivers what was unconfirmed when a consumer's connection was lost.
    expected = {b"%d-%d" % (t, i) for t in range(threads_count) for i in range(total // threads_count)}
    with bmq.Session(broker.address, options()) as consumer:
        reader = consumer.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=5000))
        payloads = set()
        deadline = time.monotonic() + 120.0
        while payloads != expected and time.monotonic() < deadline:
            message = reader.get(timeout=max(0.0, deadline - time.monotonic()))
            if message is not None:
                payloads.add(message.data)
                message.confirm()
        assert payloads == expected
        assert broker.wait_for(lambda: not broker.queue_messages(uri), 30.0)  # all confirmed



def test_blocking_posts_from_8_threads_survive_3_drops_stored_exactly_once(broker):
    """One message per blocking post: posts answered together are sent together (a wave held
    in the transport's queue, see Transport._hold_wave); a drop loses nothing held."""
    threads_count, per_thread = 8, 1_000
    uri = fresh()
    with bmq.Session(broker.address, options()) as session:
        queue = session.open_queue(uri, write=True)
        progress = threading.Condition()
        acked = [0]
        failures: List[BaseException] = []

        def poster(index: int) -> None:
            try:
                for i in range(per_thread):
                    assert queue.post(b"%d-%d" % (index, i)).status is bmq.AckStatus.SUCCESS
                    with progress:
                        acked[0] += 1
                        progress.notify_all()
            except BaseException as e:  # reported below
                failures.append(e)
                with progress:
                    progress.notify_all()

        workers = [threading.Thread(target=poster, args=(i,)) for i in range(threads_count)]
        for w in workers:
            w.start()
        drops = 0
        for point in (2_000, 4_000, 6_000):
            with progress:
                assert progress.wait_for(lambda: acked[0] >= point or failures, 60.0)
            drops += broker.faults.drop_connections()
        for w in workers:
            w.join(60.0)
        assert not failures, failures[:3]
        assert acked[0] == threads_count * per_thread and drops == 3
    stored = broker.queue_messages(uri)
    expected = {b"%d-%d" % (t, i) for t in range(threads_count) for i in range(per_thread)}
    assert len(stored) == len(expected) and {m.app_data for m in stored} == expected

def _broker_events(captures: Path) -> List[bytes]:
    stream = (captures / "json-client" / "conn1.b2c.bin").read_bytes()
    frames = _codec.FrameReader().feed(stream)
    assert frames
    return frames


def test_fuzzed_broker_frames_never_crash_or_hang_the_session(broker, captures_dir):
    valid = _broker_events(captures_dir)
    rng = random.Random(4242)
    errors = []

    def on_event(event):
        if isinstance(event, events.Error):
            errors.append(event)

    with bmq.Session(broker.address, options(ack_timeout=5.0, on_event=on_event)) as session:
        queue = session.open_queue(fresh(), write=True)
        for round_ in range(100):
            frame = bytearray(rng.choice(valid))
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(4, len(frame))] = rng.randrange(256)
            clients = broker.clients()
            if clients:
                try:
                    broker.faults.send_raw(clients[0].id, bytes(frame))
                except KeyError:
                    pass  # the client is reconnecting
            if round_ % 10 == 9:
                ack = queue.post_async(b"probe %d" % round_).result(15.0)
                assert ack.status in (bmq.AckStatus.SUCCESS, bmq.AckStatus.TIMEOUT)
        assert session.is_running
        assert queue.post(b"final", timeout=15.0).status is bmq.AckStatus.SUCCESS
    # Many mutations are caught (connection dropped and re-established), none crashed anything.
    assert len(errors) >= 5, f"only {len(errors)} of 100 mutated frames were detected"


def test_configure_while_disconnected_is_applied_by_the_reopen(broker):
    with bmq.Session(broker.address, options()) as session:
        big_only = bmq.QueueOptions(subscriptions=("n > 100",))
        reader = session.open_queue(fresh(), read=True, write=True, options=big_only)
        broker.faults.refuse_negotiation(True)
        broker.faults.drop_connections()
        wait_event(session, events.ConnectionLost)
        start = time.monotonic()
        session.configure_queue(reader.uri, bmq.QueueOptions(subscriptions=("n < 5",)))
        assert time.monotonic() - start < 1.0, "a configure while disconnected completes locally"
        broker.faults.refuse_negotiation(False)
        wait_event(session, events.StateRestored)
        reader.post_many([b"small", b"big"], [{"n": 1}, {"n": 500}])
        assert reader.get(timeout=5.0).data == b"small"
        assert reader.get(timeout=0.2) is None


def test_open_in_flight_during_a_disconnect_completes_after_the_reconnect(broker):
    with bmq.Session(broker.address, options()) as session:
        session.open_queue(fresh(), write=True)
        broker.faults.delay_control_responses(0.3)
        result = {}
        uri = fresh()

        def opener():
            try:
                result["queue"] = session.open_queue(uri, read=True, write=True)
            except Exception as e:  # reported below
                result["error"] = e

        thread = threading.Thread(target=opener)
        thread.start()
        # Drop the connection once the broker has the OpenQueue but before it answers.
        assert broker.wait_for(lambda: sum(len(c.handles) for c in broker.clients()) >= 2, 5.0)
        broker.faults.drop_connections()
        broker.faults.delay_control_responses(0.0)
        thread.join(10.0)
        assert "error" not in result, result.get("error")
        queue = result["queue"]
        queue.post(b"works")
        assert queue.get(timeout=5.0).data == b"works"
