"""The Session API against the embedded broker: posting, consuming, options, misuse."""
from __future__ import annotations

import threading
import time

import pytest

import bmq
from bmq import events
from bmq.broker import Broker
from support import drain, fresh_uri as fresh

pytestmark = pytest.mark.timeout(60)


# ---- connecting ---------------------------------------------------------------------
def test_connected_event_comes_first(session):
    assert session.next_event(5.0) == events.Connected()
    assert session.next_event(0.05) is None


def test_unreachable_broker_raises_connection_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(bmq.ConnectionError, match=str(port)):
        bmq.Session(f"tcp://127.0.0.1:{port}", bmq.SessionOptions(connect_timeout=2.0))


def test_refused_negotiation_raises_closed_by_broker(broker):
    broker.faults.refuse_negotiation(True)
    try:
        with pytest.raises(bmq.ClosedByBroker):
            bmq.Session(broker.address, bmq.SessionOptions(connect_timeout=5.0))
    finally:
        broker.faults.refuse_negotiation(False)


def test_bad_broker_address_is_refused():
    with pytest.raises(bmq.InvalidURIError):
        bmq.Session("tcp://nohost")


# ---- posting and receiving ------------------------------------------------------------
def test_post_then_get_round_trips_payload_properties_and_guid(session):
    queue = session.open_queue(fresh(), read=True, write=True)
    ack = queue.post(b"payload", properties={"kind": "new", "n": 7})
    assert ack.status is bmq.AckStatus.SUCCESS and len(ack.guid) == 16 and ack.queue_uri == queue.uri
    message = queue.get(timeout=5.0)
    assert message is not None
    assert (message.data, message.guid, message.queue_uri) == (b"payload", ack.guid, queue.uri)
    assert message.properties == {"kind": "new", "n": 7}
    assert message.property_types == {"kind": bmq.PropertyType.STRING, "n": bmq.PropertyType.INT32}
    message.confirm()


def test_all_seven_property_types_arrive_typed(session):
    queue = session.open_queue(fresh(), read=True, write=True)
    props = {"b": True, "c": b"\x07", "sh": 300, "i32": -5, "i64": 2**40, "s": "text", "bin": b"\x00\x01\x02"}
    types = {"c": bmq.PropertyType.CHAR, "sh": bmq.PropertyType.SHORT, "i64": bmq.PropertyType.INT64}
    queue.post(b"typed", props, property_types=types)
    message = queue.get(timeout=5.0)
    assert message.properties == props
    assert message.property_types["sh"] is bmq.PropertyType.SHORT
    assert message.property_types["c"] is bmq.PropertyType.CHAR
    assert message.property_types["i64"] is bmq.PropertyType.INT64


@pytest.mark.parametrize("how", ["per_message", "session_default"])
def test_zlib_compression_round_trips(broker, how):
    payload = b"0123456789abcdef" * 256
    options = bmq.SessionOptions(compression="zlib" if how == "session_default" else None)
    with bmq.Session(broker.address, options) as session:
        queue = session.open_queue(fresh(), read=True, write=True)
        if how == "per_message":
            queue.post(payload, {"kind": "zlib"}, compression="zlib")
        else:
            queue.post(payload, {"kind": "zlib"})
        stored = broker.queue_messages(queue.uri)
        assert len(stored) == 1 and stored[0].compression == bmq.CompressionAlgorithmType.ZLIB.value
        assert len(stored[0].app_data) < len(payload)
        message = queue.get(timeout=5.0)
        assert message.data == payload and message.properties == {"kind": "zlib"}


def test_small_messages_are_not_compressed(session, broker):
    queue = session.open_queue(fresh(), write=True)
    queue.post(b"tiny", compression=bmq.CompressionAlgorithmType.ZLIB)
    assert broker.queue_messages(queue.uri)[0].compression == 0


def test_post_async_returns_a_future_of_the_ack(session):
    queue = session.open_queue(fresh(), write=True)
    future = queue.post_async(b"x")
    ack = future.result(5.0)
    assert ack.status is bmq.AckStatus.SUCCESS


def test_a_stream_of_single_posts_and_confirms_is_taken_whole_by_the_broker(session):
    """post_async and confirm() one message at a time: what queues meanwhile is written as
    joined PUT and CONFIRM events. Every message is acknowledged, arrives once and in order,
    with its properties, and once confirmed is gone."""
    uri = fresh(prefix="joined")
    queue = session.open_queue(uri, read=True, write=True)
    futures = [queue.post_async(b"m%d" % i, {"i": i} if i % 7 == 0 else None) for i in range(3000)]
    assert {future.result(30).status for future in futures} == {bmq.AckStatus.SUCCESS}
    for i in range(3000):
        message = queue.get(timeout=10)
        assert message is not None and message.data == b"m%d" % i
        assert message.properties == ({"i": i} if i % 7 == 0 else {})
        message.confirm()
    queue.close()  # after the confirms on the same connection: the broker has them all
    again = session.open_queue(uri, read=True)
    assert again.get(timeout=0.5) is None


def test_post_many_acks_every_message_in_order(session, broker):
    queue = session.open_queue(fresh(), read=True, write=True)
    payloads = [b"m%d" % i for i in range(500)]
    acks = queue.post_many(payloads, properties={"batch": 1})
    assert [a.status for a in acks] == [bmq.AckStatus.SUCCESS] * 500
    assert len({a.guid for a in acks}) == 500
    received = drain(queue, 500)
    assert [m.data for m in received] == payloads
    assert [m.guid for m in received] == [a.guid for a in acks]
    session.confirm_many(received)
    assert broker.wait_for(lambda: not broker.queue_messages(queue.uri), 5.0)


def test_post_many_with_per_message_properties(session):
    queue = session.open_queue(fresh(), read=True, write=True)
    queue.post_many([b"a", b"b", b"c"], properties=[{"i": 1}, None, {"i": 3}])
    received = drain(queue, 3)
    assert [m.properties for m in received] == [{"i": 1}, {}, {"i": 3}]


def test_post_many_with_caller_guids_is_deduplicated(session, broker):
    queue = session.open_queue(fresh(), write=True)
    guids = b"".join(bmq._codec.deterministic_guid(b"key-%d" % i) for i in range(3))
    first = queue.post_many([b"a", b"b", b"c"], guids=guids)
    second = queue.post_many([b"a", b"b", b"c"], guids=guids)
    assert [a.guid for a in first] == [a.guid for a in second] == [guids[i:i + 16] for i in (0, 16, 32)]
    assert len(broker.queue_messages(queue.uri)) == 3


def test_post_many_with_wrong_guid_length_is_refused(session):
    queue = session.open_queue(fresh(), write=True)
    with pytest.raises(ValueError, match="16 bytes"):
        queue.post_many([b"a", b"b"], guids=b"\x01" * 16)


def test_repeated_or_pending_caller_guids_are_refused(session, broker):
    queue = session.open_queue(fresh(), write=True)
    guid = bmq._codec.deterministic_guid(b"once")
    with pytest.raises(ValueError, match="twice"):
        queue.post_many([b"a", b"b"], guids=guid * 2)
    broker.faults.withhold_acks()
    try:
        first = queue.post_many_async([b"a"], guids=guid)
        with pytest.raises(ValueError, match="still waiting"):
            queue.post_many_async([b"a"], guids=guid)
    finally:
        broker.faults.reset()
    assert first[0].result(5.0).status is bmq.AckStatus.SUCCESS


def test_empty_post_many_returns_no_acks(session):
    queue = session.open_queue(fresh(), write=True)
    assert queue.post_many([]) == [] and queue.post_many_async([]) == []


def test_post_many_callback_answers_the_whole_call_once_in_order_on_the_dispatcher(session):
    """post_many_callback: no future per message; one call of on_done with every Ack, in the
    order of the payloads, on the dispatcher thread; refused calls raise and never call it."""
    queue = session.open_queue(fresh(), write=True)
    calls = []
    done = threading.Event()

    def on_done(acks):
        calls.append((acks, threading.current_thread().name))
        done.set()

    assert queue.post_many_callback([b"c%d" % i for i in range(500)], on_done, {"n": 1}) is None
    assert done.wait(10.0)
    (acks, thread), = calls
    assert [a.status for a in acks] == [bmq.AckStatus.SUCCESS] * 500 and thread.startswith("bmq-dispatcher-")
    assert len({a.guid for a in acks}) == 500 and all(a.queue_uri == queue.uri for a in acks)
    with bmq.Session(session.broker) as reader_session:
        reader = reader_session.open_queue(queue.uri, read=True)
        received = drain(reader, 500)
    assert [m.data for m in received] == [b"c%d" % i for i in range(500)]
    assert [m.guid for m in received] == [a.guid for a in acks]
    with pytest.raises(bmq.InvalidArgumentError):
        queue.post_many_callback([], on_done)
    with pytest.raises(bmq.InvalidArgumentError):
        queue.post_many_callback([b"x", b""], on_done)
    assert len(calls) == 1


def test_session_post_by_uri_calls_on_ack_on_the_dispatcher(session):
    uri = fresh()
    session.open_queue(uri, write=True)
    got = []
    done = threading.Event()

    def on_ack(ack):
        got.append((ack, threading.current_thread().name))
        done.set()

    future = session.post_async(uri, b"x", on_ack=on_ack)
    assert future.result(5.0).status is bmq.AckStatus.SUCCESS
    assert done.wait(5.0)
    assert got[0][0].status is bmq.AckStatus.SUCCESS and got[0][1].startswith("bmq-dispatcher-")


def test_messages_iterator_stops_after_the_timeout(session):
    queue = session.open_queue(fresh(), read=True, write=True)
    queue.post_many([b"1", b"2", b"3"])
    start = time.monotonic()
    assert [m.data for m in queue.messages(timeout=0.3)] == [b"1", b"2", b"3"]
    assert time.monotonic() - start < 5.0


def test_get_returns_none_on_timeout(session):
    queue = session.open_queue(fresh(), read=True)
    assert queue.get(timeout=0.05) is None


def test_unconfirmed_messages_are_held_confirmed_ones_removed(session, broker):
    queue = session.open_queue(fresh(), read=True, write=True)
    queue.post_many([b"1", b"2"])
    first, second = drain(queue, 2)
    first.confirm()
    assert broker.wait_for(lambda: [m.guid for m in broker.queue_messages(queue.uri)] == [second.guid], 5.0)


def test_unconfirmed_messages_go_to_the_next_consumer_confirmed_ones_do_not(session, broker_address):
    uri = fresh()
    session.open_queue(uri, write=True).post_many([b"1", b"2", b"3"])
    with bmq.Session(broker_address) as first_consumer:
        got = drain(first_consumer.open_queue(uri, read=True), 3)
        assert sorted(m.data for m in got) == [b"1", b"2", b"3"]
        next(m for m in got if m.data == b"2").confirm()
    with bmq.Session(broker_address) as second_consumer:
        queue = second_consumer.open_queue(uri, read=True)
        redelivered = drain(queue, 2)
        assert sorted(m.data for m in redelivered) == [b"1", b"3"]
        assert queue.get(timeout=0.3) is None, "a confirmed message is not redelivered"


def test_max_unconfirmed_messages_limits_delivery_until_confirms(session):
    options = bmq.QueueOptions(max_unconfirmed_messages=2)
    queue = session.open_queue(fresh(), read=True, write=True, options=options)
    queue.post_many([b"1", b"2", b"3"])
    got = drain(queue, 2)
    assert queue.get(timeout=0.3) is None, "a third message exceeds max_unconfirmed_messages"
    got[0].confirm()
    third = queue.get(timeout=5.0)
    assert third is not None and third.data == b"3"


def test_same_uri_cannot_be_opened_twice_but_two_sessions_can(session, broker_address):
    uri = fresh()
    session.open_queue(uri, write=True)
    with pytest.raises(bmq.QueueStateError, match="already open"):
        session.open_queue(uri, read=True)
    with bmq.Session(broker_address) as other:
        reader = other.open_queue(uri, read=True)
        session.post_async(uri, b"across sessions").result(5.0)
        assert reader.get(timeout=5.0).data == b"across sessions"


def test_push_mode_callback_may_use_the_session(session):
    replies = session.open_queue(fresh(), read=True, write=True)
    threads = []

    def on_message(message):
        threads.append(threading.current_thread().name)
        # Any session call from a callback must work: post (blocking) and confirm.
        replies.post(b"reply:" + message.data)
        message.confirm()

    queue = session.open_queue(fresh(), read=True, write=True, on_message=on_message)
    queue.post_many([b"a", b"b"])
    assert sorted(m.data for m in drain(replies, 2)) == [b"reply:a", b"reply:b"]
    assert all(name.startswith("bmq-dispatcher-") for name in threads)


def test_callback_may_open_and_close_queues_and_stop_the_session(broker_address):
    stopped = threading.Event()
    result = {}

    def on_message(message):
        other = session.open_queue(fresh(), write=True)
        result["ack"] = other.post(b"from callback")
        other.close()
        session.stop()
        result["running"] = session.is_running
        stopped.set()

    session = bmq.Session(broker_address)
    session.open_queue(fresh(), read=True, write=True, on_message=on_message).post(b"go")
    assert stopped.wait(10.0)
    assert result["ack"].status is bmq.AckStatus.SUCCESS and result["running"] is False
    session.stop()  # idempotent from another thread


def test_event_callback_receives_events_on_the_dispatcher(broker_address):
    seen = []
    done = threading.Event()

    def on_event(event):
        seen.append((event, threading.current_thread().name))
        if isinstance(event, events.Disconnected):
            done.set()

    with bmq.Session(broker_address, on_event=on_event):
        pass
    assert done.wait(5.0)
    assert [type(e) for e, _ in seen] == [events.Connected, events.Disconnected]
    assert all(name.startswith("bmq-dispatcher-") for _, name in seen)


def test_fanout_app_ids_each_get_every_message(session):
    uri = fresh("bmq.test.mem.fanout")
    foo = session.open_queue(uri + "?id=foo", read=True)
    bar = session.open_queue(uri + "?id=bar", read=True)
    session.open_queue(uri, write=True).post_many([b"1", b"2"])
    for reader in (foo, bar):
        got = drain(reader, 2)
        assert [m.data for m in got] == [b"1", b"2"]
        assert all(m.queue_uri == reader.uri for m in got)
        reader.confirm_many(got)


def test_subscriptions_filter_by_properties(session):
    options = bmq.QueueOptions(subscriptions=("n > 5",))
    reader = session.open_queue(fresh(), read=True, write=True, options=options)
    reader.post_many([b"%d" % n for n in range(10)], [{"n": n} for n in range(10)])
    assert sorted(m.data for m in drain(reader, 4)) == [b"6", b"7", b"8", b"9"]
    assert reader.get(timeout=0.2) is None


def test_configure_queue_applies_and_keeps_new_options(session):
    uri = fresh()
    reader = session.open_queue(uri, read=True, write=True)
    options = bmq.QueueOptions(max_unconfirmed_messages=50, consumer_priority=5)
    session.configure_queue(uri, options)
    assert reader.options == options
    reader.post(b"after configure")
    assert reader.get(timeout=5.0).data == b"after configure"


def test_close_queue_then_get_raises_and_uri_is_reusable(session):
    uri = fresh()
    queue = session.open_queue(uri, read=True)
    blocked = []
    waiter = threading.Thread(target=lambda: blocked.append(pytest.raises(bmq.QueueStateError, queue.get, 10.0)))
    waiter.start()
    session.close_queue(uri)
    waiter.join(5.0)
    assert not waiter.is_alive() and blocked
    assert not queue.is_open
    with pytest.raises(bmq.QueueStateError):
        queue.get(timeout=0.1)
    with session.open_queue(uri, write=True) as again:
        assert again.post(b"x").status is bmq.AckStatus.SUCCESS
    assert again.state == "closed"


def test_many_threads_posting_lose_and_duplicate_nothing(broker):
    threads_count, per_thread = 8, 10_000
    uri = fresh()
    with bmq.Session(broker.address) as session:
        queue = session.open_queue(uri, write=True)
        futures_per_thread: list = [None] * threads_count
        errors = []

        def poster(index):
            try:
                futures = []
                for start in range(0, per_thread, 500):
                    futures += queue.post_many_async([b"%d-%d" % (index, i) for i in range(start, start + 500)])
                futures_per_thread[index] = futures
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        workers = [threading.Thread(target=poster, args=(i,)) for i in range(threads_count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60.0)
        assert not errors
        acks = [f.result(30.0) for futures in futures_per_thread for f in futures]
        assert len(acks) == threads_count * per_thread
        assert all(a.status is bmq.AckStatus.SUCCESS for a in acks)
        stored = broker.queue_messages(uri)
        assert len(stored) == threads_count * per_thread
        assert len({m.guid for m in stored}) == threads_count * per_thread


def test_concurrent_blocking_posts_from_threads(session):
    queue = session.open_queue(fresh(), write=True)
    results = []

    def poster():
        results.extend(queue.post(b"p%d" % i).status for i in range(200))

    workers = [threading.Thread(target=poster) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30.0)
    assert results == [bmq.AckStatus.SUCCESS] * 1600


# ---- NACKs and errors ------------------------------------------------------------------
def test_nacked_post_raises_post_error_with_the_ack(session, broker):
    queue = session.open_queue(fresh(), write=True)
    broker.faults.nack_next(1, 2)
    with pytest.raises(bmq.PostError) as info:
        queue.post(b"x")
    assert info.value.ack.status is bmq.AckStatus.LIMIT_BYTES


def test_post_many_reports_every_failed_message(session, broker):
    queue = session.open_queue(fresh(), write=True)
    broker.faults.nack_next(3, 1)
    with pytest.raises(bmq.PostError) as info:
        queue.post_many([b"%d" % i for i in range(10)])
    assert len(info.value.acks) == 10 and len(info.value.failed) == 3
    assert {info.value.acks[i].status for i in info.value.failed} == {bmq.AckStatus.LIMIT_MESSAGES}


def test_post_on_a_read_only_queue_is_refused(session):
    queue = session.open_queue(fresh(), read=True)
    with pytest.raises(bmq.QueueStateError, match="write"):
        queue.post(b"x")


def test_empty_payload_is_refused(session):
    queue = session.open_queue(fresh(), write=True)
    with pytest.raises(ValueError):
        queue.post(b"")


def test_payload_over_64_mib_is_refused(session):
    queue = session.open_queue(fresh(), write=True)
    with pytest.raises(bmq.MessageTooLargeError):
        queue.post_async(bytes(64 * 1024 * 1024 + 1))


def test_bad_properties_are_refused_before_sending(session):
    queue = session.open_queue(fresh(), write=True)
    with pytest.raises(bmq.PropertyError):
        queue.post(b"x", {"price": 1.5})
    with pytest.raises(bmq.PropertyError):
        queue.post(b"x", {f"p{i}": i for i in range(256)})


def test_unknown_and_malformed_uris(session):
    with pytest.raises(bmq.QueueStateError, match="not open"):
        session.post_async(fresh(), b"x")
    with pytest.raises(bmq.InvalidURIError):
        session.open_queue("bmq:/bad", write=True)
    with pytest.raises(bmq.InvalidURIError):
        session.close_queue("nope")


def test_open_misuse(session):
    uri = fresh()
    with pytest.raises(ValueError):
        session.open_queue(uri)
    with pytest.raises(ValueError):
        session.open_queue(fresh("bmq.test.mem.fanout") + "?id=foo", write=True)
    queue = session.open_queue(uri, write=True)
    assert session.open_queue(uri, write=True) is queue  # the same arguments: the same handle


def test_a_closed_queue_object_never_acts_on_a_newer_queue_of_the_same_uri(session):
    uri = fresh()
    old = session.open_queue(uri, read=True, write=True)
    old.close()
    new = session.open_queue(uri, read=True, write=True)
    with pytest.raises(bmq.QueueStateError, match="this Queue object is closed"):
        old.close()
    with pytest.raises(bmq.QueueStateError, match="this Queue object is closed"):
        old.configure(bmq.QueueOptions(max_unconfirmed_messages=1))
    assert new.is_open and session.get_queue(uri) is new
    assert new.post(b"still open").status is bmq.AckStatus.SUCCESS
    assert new.get(timeout=5.0).data == b"still open"


@pytest.mark.parametrize("uri, refusal", [
    ("bmq://bmq.test.mem.priority/{}?id=foo", "E_UNKNOWN: AppId should not be specified when opening a non-fanout"),
    ("bmq://bmq.test.mem.fanout/{}", "E_UNKNOWN: Reader of a fanout queue requires an appId to be specified"),
])
def test_reader_opens_that_bmqbrkr_refuses(session, uri, refusal):
    with pytest.raises(bmq.BrokerError, match=refusal):
        session.open_queue(uri.format(fresh().rsplit("/", 1)[1]), read=True)


def test_unknown_domain_is_a_broker_error(session):
    with pytest.raises(bmq.BrokerError):
        session.open_queue("bmq://no.such.domain/q", write=True)


def test_calls_on_a_stopped_session_raise(broker_address):
    session = bmq.Session(broker_address)
    queue = session.open_queue(fresh(), write=True)
    session.stop()
    session.stop()
    with pytest.raises(bmq.SessionClosedError):
        session.open_queue(fresh(), write=True)
    with pytest.raises(bmq.SessionClosedError):
        queue.post(b"x")
    with pytest.raises(bmq.SessionClosedError):
        session.post_async(queue.uri, b"x")


def test_stop_resolves_unacknowledged_posts_as_not_connected(broker):
    broker.faults.withhold_acks()
    try:
        session = bmq.Session(broker.address, bmq.SessionOptions(disconnect_timeout=1.0))
        queue = session.open_queue(fresh(), write=True)
        futures = queue.post_many_async([b"a", b"b"])
        start = time.monotonic()
        session.stop()
        assert time.monotonic() - start < 5.0
        assert [f.result(1.0).status for f in futures] == [bmq.AckStatus.NOT_CONNECTED] * 2
    finally:
        broker.faults.release_acks()
        broker.faults.reset()


def test_flush_returns_how_many_are_still_unacknowledged(session, broker):
    queue = session.open_queue(fresh(), write=True)
    broker.faults.withhold_acks()
    try:
        queue.post_many_async([b"a", b"b", b"c"])
        assert session.flush(0.2) == 3
    finally:
        broker.faults.release_acks()
    assert session.flush(5.0) == 0
    broker.faults.reset()


# ---- heartbeats and slow consumers -------------------------------------------------------
def test_idle_session_answers_heartbeats_and_stays_connected():
    with Broker(heartbeat_interval_ms=50, max_missed_heartbeats=3) as broker:
        with bmq.Session(broker.address) as session:
            assert session.next_event(5.0) == events.Connected()
            # 20 heartbeat intervals of silence from the application side
            assert session.next_event(1.0) is None
            queue = session.open_queue(fresh(), write=True)
            assert queue.post(b"still connected").status is bmq.AckStatus.SUCCESS
            assert len(broker.clients()) == 1


def test_slow_callbacks_raise_and_clear_the_slow_consumer_events(broker_address):
    release = threading.Event()
    handled = []
    options = bmq.SessionOptions(event_queue_high_watermark=20, event_queue_low_watermark=2)
    with bmq.Session(broker_address, options) as session:
        def on_message(message):
            release.wait(10.0)
            handled.append(message.data)
            message.confirm()

        queue = session.open_queue(fresh(), read=True, write=True, on_message=on_message)
        queue.post_many([b"%d" % i for i in range(50)])
        seen = []
        while not any(isinstance(e, events.SlowConsumerHighWaterMark) for e in seen):
            event = session.next_event(10.0)
            assert event is not None, f"no SlowConsumerHighWaterMark; saw {seen}"
            seen.append(event)
        release.set()
        event = session.next_event(10.0)
        while event is not None and not isinstance(event, events.SlowConsumerNormal):
            event = session.next_event(10.0)
        assert isinstance(event, events.SlowConsumerNormal)
    assert sorted(handled) == sorted(b"%d" % i for i in range(50))
