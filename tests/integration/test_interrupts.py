"""A Ctrl-C (any exception a signal handler raises) at any point of ``open_queue()``,
``Queue.configure()``, ``Queue.close()``, a post, ``Session()`` or ``Session.stop()`` in the
main thread: a script or a notebook cell that goes on with the session afterwards, or one whose
``with`` block stops it.

What must hold wherever it lands: the URI can be opened (or the queue closed) again, and no
handle or subscription the broker keeps, which this side gave up on, holds the messages: they
reach the handles the application has. Where the broker may act on a request this side gave up
on, the session replaces the connection (as when such a request times out), so each point may
cost a reconnect. An interrupted post is answered without waiting for its ACK timeout (not
recorded, or sent). A stop still stops the session: its threads end, every post is answered; a
start that does not finish leaves no thread running. On both brokers."""
from __future__ import annotations

import threading
from typing import Callable, List, Set

import pytest

import bmq
from support import fresh_uri, interrupted_at

# The session's and the handles' functions of these sequences, the control-request table's and
# the registry's: every point in them where a signal handler could raise.
_SEQUENCES = {
    "open_queue", "_join_open", "_abandon_open", "_after_unfinished", "_replace_connection", "register", "open",
    "configure", "_configure_queue", "close", "_close_queue", "_forget_queue", "_unregister", "forget",
    "mark_closed", "cancel_queue", "_call", "_request", "add", "discard", "subscribe", "unsubscribe",
    "replace_subscriptions", "keep_options", "close_request",
}
# Every point from a post call to its event queued (or its blocking wait for the answer).
_POSTING = {"post", "_post", "post_async", "post_many", "track_and_send", "_build", "send", "fail_interrupted"}
# Every point of a session's start: its units' constructors, the connect and the negotiation.
_STARTING = {"__init__", "start", "_connect", "_connect_to", "connecting", "establish", "connect", "adopt",
             "restored"}
_WAIT = 10.0  # for a message, or the reconnect an interrupt may cost


def _each_point(attempt: Callable[[int], str]) -> int:
    """``attempt(at)`` for at = 0, 1, 2... until it is not interrupted; how many points."""
    at = 0
    while attempt(at):
        at += 1
    return at


def _get_one(queue: bmq.Queue, data: bytes, where: str) -> None:
    message = queue.get(timeout=_WAIT)
    assert message is not None and message.data == data, where
    message.confirm()


def test_an_interrupted_open_leaves_the_uri_to_open_again_and_no_handle_behind(session):
    def attempt(at: int) -> str:
        uri = fresh_uri(prefix=f"open-{at}-")
        fired = interrupted_at(lambda: session.open_queue(uri, read=True, write=True), at, _SEQUENCES)
        where = f"interrupted {fired}" if fired else "not interrupted"
        queue = session.open_queue(uri, read=True, write=True, timeout=_WAIT)  # not "under way" for good
        queue.post(b"after", timeout=_WAIT)
        _get_one(queue, b"after", where)  # not held by a handle the broker kept for the interrupted open
        queue.close(timeout=_WAIT)
        return fired

    assert _each_point(attempt) > 10


def test_an_interrupted_close_leaves_the_uri_to_open_again_and_redelivers_what_it_held(session):
    def attempt(at: int) -> str:
        uri = fresh_uri(prefix=f"close-{at}-")
        queue = session.open_queue(uri, read=True, write=True)
        queue.post(b"held", timeout=_WAIT)  # delivered to this handle, never confirmed
        fired = interrupted_at(queue.close, at, _SEQUENCES)
        where = f"interrupted {fired}" if fired else "not interrupted"
        if queue.state is bmq.QueueState.OPEN:  # interrupted before the close began: it closes now
            queue.close(timeout=_WAIT)
        assert queue.state is bmq.QueueState.CLOSED, where  # not CLOSING for good
        again = session.open_queue(uri, read=True, timeout=_WAIT)
        _get_one(again, b"held", where)  # the broker let go of the interrupted handle
        again.close(timeout=_WAIT)
        return fired

    assert _each_point(attempt) > 10


def test_an_interrupted_configure_leaves_no_subscription_behind(session):
    """Two fan-out readers share a qId: a PUSH can reach a reader only through a subscription
    this side knows. An interrupted configure must not leave the broker with one it does not
    (the buffered request re-sent after a reconnect did)."""
    def attempt(at: int) -> str:
        uri = fresh_uri("bmq.test.mem.fanout", prefix=f"configure-{at}-")
        readers: List[bmq.Queue] = [session.open_queue(f"{uri}?id={app}", read=True) for app in ("foo", "bar")]
        writer = session.open_queue(uri, write=True)
        options = bmq.QueueOptions(subscriptions=["n > 0"])
        fired = interrupted_at(lambda: readers[0].configure(options), at, _SEQUENCES)
        where = f"interrupted {fired}" if fired else "not interrupted"
        writer.post(b"to both", properties={"n": 1}, timeout=_WAIT)
        for reader in readers:
            _get_one(reader, b"to both", where)
        for queue in (*readers, writer):
            queue.close(timeout=_WAIT)
        return fired

    assert _each_point(attempt) > 10


@pytest.mark.parametrize("call", ["post", "post_async", "post_many"])
def test_an_interrupted_post_is_sent_or_not_recorded_never_left_waiting(session, call):
    """Between recording a message for re-sending and queueing its event, a Ctrl-C left it
    unsent and waiting for its ACK timeout (120 s): flush() waited, the message never came.
    What a post recorded reaches the broker now: the connection is replaced, and the reconnect
    re-sends it (a message delivered before that comes again, unconfirmed: at least once)."""
    posts = {"post": lambda q: q.post(b"first", timeout=_WAIT),
             "post_async": lambda q: q.post_async(b"first").result(_WAIT),
             "post_many": lambda q: q.post_many([b"first", b"first too"], timeout=_WAIT)}

    def attempt(at: int) -> str:
        queue = session.open_queue(fresh_uri(prefix=f"{call}-{at}-"), read=True, write=True)
        fired = interrupted_at(lambda: posts[call](queue), at, _POSTING)
        where = f"interrupted {fired}" if fired else "not interrupted"
        queue.post(b"after", timeout=_WAIT)
        assert session.flush(_WAIT) == 0, where  # every post answered: none waits for its timeout
        seen: Set[bytes] = set()
        while b"after" not in seen:
            message = queue.get(timeout=_WAIT)
            assert message is not None, f"{where}: only {sorted(seen)} came"
            seen.add(message.data)
            message.confirm()
        assert seen <= {b"first", b"first too", b"after"}, where
        queue.close(timeout=_WAIT)
        return fired

    assert _each_point(attempt) > 10


def test_an_interrupted_stop_still_stops_the_session(broker_address):
    def attempt(at: int) -> str:
        session = bmq.Session(broker_address)
        queue = session.open_queue(fresh_uri(prefix=f"stop-{at}-"), read=True, write=True)
        answer = queue.post_async(b"x")
        threads = session._own_threads()  # the dispatcher, the supervisor, the ACK timer, the socket's
        fired = interrupted_at(session.stop, at, {"stop", "begin_stop", "_call", "_request"})
        where = f"interrupted {fired}" if fired else "not interrupted"
        session.stop()  # the script's next stop() (or the with block's) returns at once or stops it
        for thread in threads:
            thread.join(_WAIT)
            assert not thread.is_alive(), f"{where}: {thread.name} still runs"
        assert answer.done(), where  # acknowledged, or NOT_CONNECTED: not left waiting
        return fired

    assert _each_point(attempt) > 5


def test_an_interrupted_start_leaves_no_thread_running(broker_address):
    """The caller of an interrupted ``Session()`` gets no session to stop: whatever it had
    started (the dispatcher, the connection's reader and writer, the supervisor) must end."""
    def attempt(at: int) -> str:
        before = set(threading.enumerate())
        made: List[bmq.Session] = []
        fired = interrupted_at(lambda: made.append(bmq.Session(broker_address)), at, _STARTING)
        where = f"interrupted {fired}" if fired else "not interrupted"
        for session in made:
            session.stop()
        for thread in set(threading.enumerate()) - before:
            if not thread.name.startswith("bmq-broker"):  # the embedded broker's, for its new client
                thread.join(_WAIT)
                assert not thread.is_alive(), f"{where}: {thread.name} still runs"
        return fired

    assert _each_point(attempt) > 20
