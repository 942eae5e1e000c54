"""A blocking post (or a post future's result()) that is the only one waiting reads the socket
in the reader thread's place (Linux: see Transport.wait_for). What it reads, and what it fails to read, must reach the
session exactly as if the reader thread had read it; whatever ends its wait must end it
promptly."""
from __future__ import annotations

import signal
import threading
from concurrent.futures import Future

import pytest

import bmq
from bmq import events
from support import Interrupted, fresh_uri as fresh, ha_options as options, sigusr1_raises, wait_event

pytestmark = pytest.mark.timeout(60)


def _post_in_thread(queue: bmq.Queue, data: bytes) -> "Future[bmq.Ack]":
    result: "Future[bmq.Ack]" = Future()

    def post() -> None:
        try:
            result.set_result(queue.post(data, timeout=30.0))
        except BaseException as e:  # noqa: B902 - handed to the test
            result.set_exception(e)

    threading.Thread(target=post, daemon=True).start()
    return result


def test_a_connection_lost_while_a_blocking_post_waits_is_survived(broker):
    with bmq.Session(broker.address, options()) as session:
        uri = fresh()
        queue = session.open_queue(uri, write=True)
        broker.faults.withhold_acks()
        result = _post_in_thread(queue, b"once")
        assert broker.wait_for(lambda: len(broker.queue_messages(uri)) == 1, 10)
        assert broker.faults.drop_connections() == 1
        seen = wait_event(session, events.StateRestored)
        assert any(isinstance(e, events.ConnectionLost) for e in seen)
        assert not result.done()  # its ACK never came: re-sent with its GUID, still unanswered
        broker.faults.release_acks()
        assert result.result(10).status is bmq.AckStatus.SUCCESS
        assert len(broker.queue_messages(uri)) == 1  # the broker dropped the re-sent copy
        assert queue.post(b"after").status is bmq.AckStatus.SUCCESS


def test_stopping_the_session_ends_a_waiting_blocking_post_promptly(broker):
    session = bmq.Session(broker.address, options())
    uri = fresh()
    queue = session.open_queue(uri, write=True)
    broker.faults.withhold_acks()
    result = _post_in_thread(queue, b"never answered")
    assert broker.wait_for(lambda: len(broker.queue_messages(uri)) == 1, 10)
    session.stop()
    with pytest.raises(bmq.PostError) as raised:
        result.result(10)  # well within its 30 s timeout
    assert raised.value.acks[0].status is bmq.AckStatus.NOT_CONNECTED


def test_an_ack_timeout_ends_a_post_futures_wait_in_the_main_thread(broker):
    """The expiry settles the future on another thread while this one waits for the socket
    (the wake-up itself: test_transport_reads; here the broker's heartbeats would wake it too)."""
    with bmq.Session(broker.address, options(ack_timeout=0.5)) as session:
        queue = session.open_queue(fresh(), write=True)
        assert queue.post_async(b"answered").result(10).status is bmq.AckStatus.SUCCESS
        broker.faults.withhold_acks()
        future = queue.post_async(b"never answered")
        assert future.result(30).status is bmq.AckStatus.TIMEOUT
        broker.faults.release_acks()


def test_stopping_the_session_ends_a_post_futures_wait_promptly(broker):
    session = bmq.Session(broker.address, options())
    uri = fresh()
    queue = session.open_queue(uri, write=True)
    broker.faults.withhold_acks()
    future = queue.post_async(b"never answered")

    def stop_once_stored() -> None:
        if broker.wait_for(lambda: len(broker.queue_messages(uri)) == 1, 10):
            session.stop()

    stopper = threading.Thread(target=stop_once_stored)
    stopper.start()
    assert future.result(30).status is bmq.AckStatus.NOT_CONNECTED  # well within its timeout
    stopper.join(10)


@pytest.mark.parametrize("wait", ["post", "future"])
def test_a_signal_ends_a_wait_for_an_ack_in_the_main_thread_and_the_session_goes_on(broker, wait):
    """A blocking post, or a post future's result(), reading in the reader's place when a
    signal handler raises: the connection is dropped, the message re-sent with its GUID."""
    with sigusr1_raises():
        with bmq.Session(broker.address, options()) as session:
            uri = fresh()
            queue = session.open_queue(uri, write=True)
            broker.faults.withhold_acks()
            reading = session._link.current.transport._lead  # held by a thread reading in the reader's place

            def interrupt_once_waiting() -> None:
                if broker.wait_for(lambda: len(broker.queue_messages(uri)) == 1 and reading.locked(), 10):
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

            interrupter = threading.Thread(target=interrupt_once_waiting)
            interrupter.start()
            future = queue.post_async(b"interrupted") if wait == "future" else None
            with pytest.raises(Interrupted):
                if future is None:
                    queue.post(b"interrupted", timeout=30.0)
                else:
                    future.result(30)
            interrupter.join(10)
            broker.faults.release_acks()
            if future is not None:
                assert future.result(10).status is bmq.AckStatus.SUCCESS
            assert queue.post(b"after", timeout=10.0).status is bmq.AckStatus.SUCCESS
            # Re-sent with its GUID once the session reconnected: stored once.
            assert len(broker.queue_messages(uri)) == 2


def test_without_epoll_the_reader_thread_reads_everything(broker, monkeypatch):
    """Where epoll or eventfd is missing (macOS, Python 3.9) blocking posts wait on their
    latch and the reader thread reads, with poll: every way of posting and consuming works."""
    from bmq import _transport

    monkeypatch.setattr(_transport, "_EPOLL", False)
    uri = fresh()
    with bmq.Session(broker.address, options()) as session, bmq.Session(broker.address) as consumer:
        queue = session.open_queue(uri, write=True)
        assert session._link.current.transport._epoll is None
        assert all(queue.post(b"one %d" % i).status is bmq.AckStatus.SUCCESS for i in range(50))
        assert len(queue.post_many([b"many"] * 200)) == 200
        futures = [queue.post_async(b"async") for _ in range(100)]
        assert all(future.result(10).status is bmq.AckStatus.SUCCESS for future in futures)
        reader = consumer.open_queue(uri, read=True)
        for _ in range(350):
            message = reader.get(timeout=10.0)
            assert message is not None
            message.confirm()
