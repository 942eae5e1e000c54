"""Misuse and races at the API's edges: handles of one URI, posts racing stop(), payload and
argument types, broker addresses, confirms across sessions (each section was once a bug)."""
from __future__ import annotations

import array
import concurrent.futures as cf
import threading

import pytest

import bmq
from bmq import _codec, events
from support import fresh_uri as fresh

pytestmark = pytest.mark.timeout(60)


def record_close_requests(session: bmq.Session) -> list:
    """The closeQueue bodies the session sends from now on."""
    sent = []
    call = session._handles._call

    def recording_call(body, *args, **kwargs):
        if "closeQueue" in body:
            sent.append(body["closeQueue"])
        return call(body, *args, **kwargs)

    session._handles._call = recording_call
    return sent


# ---- 1. closing one handle of a canonical URI must not release the others -------------
def test_closing_one_fanout_reader_keeps_the_writer_and_other_reader(session):
    uri = fresh("bmq.test.mem.fanout")
    closes = record_close_requests(session)
    writer = session.open_queue(uri, write=True)
    foo = session.open_queue(uri + "?id=foo", read=True)
    bar = session.open_queue(uri + "?id=bar", read=True)
    foo.close()
    assert closes[-1]["isFinal"] is False
    params = closes[-1]["handleParameters"]
    assert (params["readCount"], params["writeCount"], params["subIdInfo"]["appId"]) == (1, 0, "foo")
    assert writer.post(b"after").status is bmq.AckStatus.SUCCESS
    message = bar.get(timeout=5.0)
    assert message is not None and message.data == b"after"
    message.confirm()
    bar.close()
    assert closes[-1]["isFinal"] is False
    writer.close()
    assert closes[-1]["isFinal"] is True and closes[-1]["handleParameters"]["writeCount"] == 1


def test_refused_reader_open_keeps_the_writer_of_the_same_queue(broker, session):
    # Embedded broker only: its fault injector refuses the reader's ConfigureStream (after the
    # OpenQueue it answered), as a broker refusing the stream parameters would.
    uri = fresh("bmq.test.mem.fanout")
    writer = session.open_queue(uri, write=True)
    closes = record_close_requests(session)
    broker.faults.refuse_configure()
    with pytest.raises(bmq.BrokerError):
        session.open_queue(uri + "?id=foo", read=True)
    assert [c["isFinal"] for c in closes] == [False]
    assert writer.post(b"x").status is bmq.AckStatus.SUCCESS


def test_closing_the_last_handle_is_final(session):
    closes = record_close_requests(session)
    session.open_queue(fresh(), write=True).close()
    assert [c["isFinal"] for c in closes] == [True]


# ---- 2. posts racing stop() always resolve (or raise) -------------------------------
def test_posts_racing_stop_resolve_or_raise_session_closed(broker_address):
    for _ in range(5):
        session = bmq.Session(broker_address)
        queue = session.open_queue(fresh(), write=True)
        futures = []
        errors = []
        posting = threading.Event()

        def poster():
            try:
                while True:
                    futures.append(queue.post_async(b"x" * 100))
                    posting.set()
            except bmq.Error as e:
                errors.append(e)
                posting.set()

        thread = threading.Thread(target=poster)
        thread.start()
        assert posting.wait(5.0)
        session.stop(timeout=10.0)
        thread.join(10.0)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], bmq.SessionClosedError)
        # Every future must already be settled once stop() returned and the poster gave up.
        assert all(f.done() for f in futures)


# ---- 3. accepted posts cannot be cancelled; wait() sees every future ------------------
def test_post_futures_cannot_be_cancelled_and_wait_sees_them(session, broker):
    uri = fresh()
    queue = session.open_queue(uri, write=True)
    broker.faults.withhold_acks()
    try:
        single = queue.post_async(b"single")
        many = queue.post_many_async([b"m1", b"m2"])
        assert all(f.running() for f in [single, *many])
        assert not single.cancel() and not many[0].cancel()
    finally:
        broker.faults.release_acks()
    done, not_done = cf.wait([single, *many], timeout=10.0)
    assert not not_done
    assert [f.result().status for f in [single, *many]] == [bmq.AckStatus.SUCCESS] * 3
    assert len(broker.queue_messages(uri)) == 3


# ---- 4. only bytes-like payloads ------------------------------------------------------
@pytest.mark.parametrize("payload", [5, "text", None, [1, 2]])
def test_non_bytes_payload_is_a_type_error(session, broker, payload):
    uri = fresh()
    queue = session.open_queue(uri, write=True)
    with pytest.raises(TypeError, match="data must be bytes"):
        queue.post(payload)
    with pytest.raises(TypeError, match=r"payloads\[1\] must be bytes"):
        queue.post_many_async([b"ok", payload])
    assert broker.queue_messages(uri) == []


@pytest.mark.parametrize("payloads", [b"abc", bytearray(b"abc"), memoryview(b"abc"), "abc"])
def test_post_many_of_one_bytes_object_is_a_type_error(session, broker, payloads):
    uri = fresh()
    queue = session.open_queue(uri, write=True)
    for post_many in (queue.post_many, queue.post_many_async):
        with pytest.raises(TypeError, match="post_many takes a sequence of payloads"):
            post_many(payloads)
    assert broker.queue_messages(uri) == []


def test_bytearray_and_memoryview_payloads_are_sent(session, broker):
    uri = fresh()
    queue = session.open_queue(uri, write=True)
    queue.post_many([bytearray(b"ba"), memoryview(b"mv"), b"b"])
    assert [m.app_data for m in broker.queue_messages(uri)] == [b"ba", b"mv", b"b"]


def test_a_payload_column_is_posted_value_by_value(session, broker):
    """post_many of a PayloadColumn (the Spark sink's Arrow buffers) sends each value as a message."""
    uri = fresh()
    queue = session.open_queue(uri, write=True)
    ends = array.array("i", [0, 1, 4, 1028])
    acks = queue.post_many(_codec.PayloadColumn(ends, b"a" + b"bcd" + b"e" * 1024, 0, 3))
    assert len(acks) == 3 and session._puts._bytes == 0  # the column's bytes counted in and out
    assert [m.app_data for m in broker.queue_messages(uri)] == [b"a", b"bcd", b"e" * 1024]
    with pytest.raises(bmq.InvalidArgumentError, match=r"payloads\[1\] is empty"):
        queue.post_many(_codec.PayloadColumn(array.array("i", [0, 1, 1]), b"a", 0, 2))
    assert len(broker.queue_messages(uri)) == 3


# ---- 5. misuse errors are bmq errors ---------------------------------------------------
def test_misuse_raises_invalid_argument_error(session):
    queue = session.open_queue(fresh(), write=True)
    misuse = [
        lambda: queue.post(b""),
        lambda: queue.post_many([b"a", b""]),
        lambda: queue.post(b"x", compression="lz4"),
        lambda: session.open_queue(fresh()),
        lambda: session.open_queue(fresh("bmq.test.mem.fanout") + "?id=foo", write=True),
        lambda: session.open_queue(fresh(), write=True, on_message=print),
        lambda: queue.post_many([b"a"], guids=b"short"),
        lambda: queue.post_many([b"a", b"b"], [{"k": 1}]),
        lambda: bmq.QueueOptions(max_unconfirmed_messages=-1),
    ]
    for call in misuse:
        with pytest.raises(bmq.InvalidArgumentError) as info:
            call()
        assert isinstance(info.value, ValueError)


def test_wrong_types_are_type_errors_under_bmq_error(session):
    queue = session.open_queue(fresh(), write=True)
    with pytest.raises(bmq.ArgumentTypeError) as info:
        queue.post("text")
    assert isinstance(info.value, TypeError) and isinstance(info.value, bmq.Error)


# ---- 6. broker address syntax ----------------------------------------------------------
@pytest.mark.parametrize("scheme", ["http", "udp"])
def test_session_with_a_non_tcp_scheme_is_an_invalid_uri(broker, scheme):
    with pytest.raises(bmq.InvalidURIError, match="tcp://HOST:PORT"):
        bmq.Session(f"{scheme}://127.0.0.1:{broker.port}", bmq.SessionOptions(connect_timeout=3))


# ---- 7. smaller misuse ------------------------------------------------------------------
def test_confirming_a_message_of_another_session_is_refused(broker):
    uri = fresh()
    with bmq.Session(broker.address) as first, bmq.Session(broker.address) as second:
        reader = first.open_queue(uri, read=True, write=True)
        other = second.open_queue(fresh(), read=True)
        reader.post(b"x")
        message = reader.get(timeout=5.0)
        assert message is not None
        with pytest.raises(bmq.QueueStateError, match="another session"):
            second.confirm(message)
        with pytest.raises(bmq.QueueStateError, match="another session"):
            other.confirm_many([message])
        message.confirm()
    assert broker.queue_messages(uri) == []


def test_entering_a_stopped_session_raises(broker_address):
    session = bmq.Session(broker_address)
    session.stop()
    with pytest.raises(bmq.SessionClosedError):
        with session:
            pass


def test_queue_resumed_only_for_queues_that_were_suspended(broker_address):
    monitor = bmq.ManualHostHealthMonitor()
    opted = bmq.QueueOptions(suspends_on_bad_host_health=True)
    with bmq.Session(broker_address, bmq.SessionOptions(host_health_monitor=monitor)) as session:
        suspended = session.open_queue(fresh(), write=True, options=opted)
        monitor.set_unhealthy()
        seen = [session.next_event(5.0) for _ in range(3)]
        assert [type(e) for e in seen] == [events.Connected, events.HostUnhealthy, events.QueueSuspended]
        late = session.open_queue(fresh(), write=True, options=opted)  # opened unhealthy, never suspended
        monitor.set_healthy()
        restored = []
        while not restored or not isinstance(restored[-1], events.HostHealthRestored):
            event = session.next_event(5.0)
            assert event is not None
            restored.append(event)
        resumed = [e.queue_uri for e in restored if isinstance(e, events.QueueResumed)]
        assert resumed == [suspended.uri] and late.uri not in resumed
