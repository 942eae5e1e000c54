"""Transport reads: whichever thread reads (the reader thread, or on Linux a thread alone
waiting for an answer in its place), events go up whole, once and in order, every waiter is
woken, and a failure is reported once, as the reader thread would report it."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

from bmq import _codec
from support import interrupted_at, until as _until
from bmq import _transport
from bmq._dispatch import new_futures, resolve_futures
from bmq._transport import Transport
from bmq.exceptions import ConnectionLost, ProtocolError

pytestmark = pytest.mark.timeout(120)
needs_epoll = pytest.mark.skipif(not _transport._EPOLL, reason="a waiting thread reads only where epoll exists (Linux)")


class _Peer:
    """A broker stand-in: answers every PUT message with an ACK event of its own, in order.
    With a ``marker`` GUID it then sends 16 MiB of large ACK events for nobody in one call, and
    one for ``marker``."""

    def __init__(self, marker: bytes = b"") -> None:
        self.marker = marker
        self.server = socket.create_server(("127.0.0.1", 0))
        self.conn: Optional[socket.socket] = None
        self.accepted = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.conn, _ = self.server.accept()
        self.accepted.set()
        frames = _codec.FrameReader()
        with self.conn:
            while True:
                try:
                    chunk = self.conn.recv(1 << 20)
                except OSError:
                    return
                if not chunk:
                    return
                for event in frames.feed(chunk):
                    if _codec.unpack_event_header(event)[1] == _codec.EVENT_PUT:
                        for message in _codec.iter_put_messages(event):
                            self.conn.sendall(_codec.build_ack_event([(0, 0, message[2], message[1])]))
                            if self.marker:
                                nobody = _codec.build_ack_event([(0, 0, bytes(16), 1)] * 1000)
                                self.conn.sendall(nobody * (16 * 1024 * 1024 // len(nobody)))
                                self.conn.sendall(_codec.build_ack_event([(0, 0, self.marker, 1)]))

    @property
    def address(self) -> Tuple[str, int]:
        return self.server.getsockname()

    def wait_accepted(self) -> bool:
        return self.accepted.wait(5)

    def close(self) -> None:
        self.server.close()


_PEER_PROCESS = """
import socket, sys
from bmq import _codec
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
frames = _codec.FrameReader()
while True:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    for event in frames.feed(chunk):
        if _codec.unpack_event_header(event)[1] == _codec.EVENT_PUT:
            for message in _codec.iter_put_messages(event):
                conn.sendall(_codec.build_ack_event([(0, 0, message[2], message[1])]))
"""


class _PeerProcess:
    """:class:`_Peer`'s answers from another process: its answers never wait for this
    process's interpreter lock (an in-process peer may answer before the waiting thread has
    reached its wait: then the reader thread reads it)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _PEER_PROCESS], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    @property
    def address(self) -> Tuple[str, int]:
        return ("127.0.0.1", self.port)

    def wait_accepted(self) -> bool:
        return True  # connect() returned: the peer's listening socket took the connection

    def close(self) -> None:
        self.process.wait(10)  # it exits once the transport closed the connection


class _Link:
    """A transport connected to a :class:`_Peer`, noting which thread handed up each answer
    to a GUID in ``latches`` (and waking its latch)."""

    def __init__(self, peer: Optional[Any] = None, on_events: Optional[Any] = None, busy_poll: float = 0.0) -> None:
        self.peer = peer or _Peer()
        self.latches: Dict[bytes, _codec.Latch] = {}
        self.seen: List[Tuple[str, bytes]] = []
        self.failures: List[BaseException] = []
        self.transport = Transport(self.peer.address, on_events or self._on_events,
                                   self.failures.append, 64 << 20, "reads", busy_poll)

    def __enter__(self) -> "_Link":
        self.transport.connect(5.0)
        assert self.peer.wait_accepted()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.transport.close()
        self.transport.join(5.0)
        self.peer.close()

    def _on_events(self, event_type: int, events: List[bytes]) -> List[_codec.Latch]:
        woken = []
        for event in events:
            if len(event) > 1024:  # the peer's stream for nobody
                continue
            for ack in _codec.iter_acks(event):
                if ack[2] in self.latches:
                    self.seen.append((threading.current_thread().name, ack[2]))
                    woken.append(self.latches.pop(ack[2]))
        return woken

    def post(self, guids: _codec.GuidGenerator, queue_id: int) -> Tuple[bytes, _codec.Latch]:
        guid = guids.generate(1)
        latch = self.latches[guid] = _codec.Latch()
        self.transport.send(_codec.build_put_events(queue_id, guid, [b"x"])[0], 5.0)
        return guid, latch


# Whether a thread waiting alone reads its answer itself is asserted with the GIL only: see below.
_WITH_GIL = getattr(sys, "_is_gil_enabled", lambda: True)()


@needs_epoll
@pytest.mark.parametrize("busy_poll", [0.0, 0.0002], ids=["sleeping", "polling"])
def test_a_thread_alone_waiting_reads_its_answer_itself(busy_poll):
    with _Link(_PeerProcess(), busy_poll=busy_poll) as link:
        guids = _codec.GuidGenerator(5)
        sent = []
        for _ in range(50):
            guid, latch = link.post(guids, 1)
            sent.append(guid)
            assert link.transport.wait_for(latch, 10.0)
        assert [guid for _, guid in link.seen] == sent
        me = threading.current_thread().name
        # Answers that come while this thread waits for the socket are read here (the reader
        # thread would read them all otherwise); on a loaded machine an answer may come before
        # this thread reaches its wait, so not necessarily every one. With the GIL off the reader
        # thread runs beside this one and, woken by the answer, may read it first every time
        # (0 of 50 once in CI's free-threaded job under load): there only the answers are checked.
        assert not _WITH_GIL or sum(name == me for name, _ in link.seen) >= 10
        assert not link.failures


@needs_epoll
def test_a_thread_alone_waiting_for_a_post_future_reads_its_answer_itself():
    """A post future's result() waits as a blocking post does (the future is resolved as its
    answer is handed up, by whichever thread reads it)."""
    futures: Dict[bytes, Any] = {}
    readers: List[str] = []

    def on_events(event_type: int, events: List[bytes]) -> List[_codec.Latch]:
        for event in events:
            for status, _, guid, _ in _codec.iter_acks(event):
                readers.append(threading.current_thread().name)
                resolve_futures([futures.pop(guid)], [status])
        return []

    with _Link(_PeerProcess(), on_events=on_events) as link:
        guids = _codec.GuidGenerator(10)
        for _ in range(50):
            guid = guids.generate(1)
            future = futures[guid] = new_futures(1, link.transport.wait_for)[0]
            link.transport.send(_codec.build_put_events(1, guid, [b"x"])[0], 5.0)
            assert future.result(10.0) == 0
        assert len(readers) == 50 and not futures
        # As for a blocking post: not necessarily every one on a loaded machine.
        assert not _WITH_GIL or readers.count(threading.current_thread().name) >= 10  # as above
        assert not link.failures


@needs_epoll
def test_a_post_future_resolved_by_another_thread_wakes_the_thread_reading_for_it(monkeypatch):
    """The thread waiting in result() waits for the socket, not on the future's condition:
    resolving the future elsewhere (an ACK timeout, the session stopping) must wake it there.
    With its periodic look (at signals) pushed beyond the test's timeouts, a missed wake-up
    would hold result() until its own timeout."""
    monkeypatch.setattr(_transport, "_LEAD_SLICE", 600.0)
    with _Link(on_events=lambda event_type, events: []) as link:
        for _ in range(20):
            future = new_futures(1, link.transport.wait_for)[0]
            # Resolved soon, most often while the main thread waits for the socket; sooner
            # (kick_to finds it done) or later, it must return at once.
            resolver = threading.Timer(0.05, resolve_futures, ([future], ["answered"]))
            resolver.start()
            started = time.monotonic()
            assert future.result(30.0) == "answered"
            assert time.monotonic() - started < 15.0  # not the 30 s timeout: woken
            resolver.join(10)
        assert not link.failures


def test_the_reader_thread_waiting_for_an_answer_does_not_read_in_its_own_place():
    """A callback run on the reader thread as it hands up events (a future's done-callback)
    that waits for another answer must not try to read for it: the reader holds the read
    lock, and nobody else would read. It waits as anyone else would, up to its timeout."""
    waited: List[Any] = []
    latch = _codec.Latch()
    guids = _codec.GuidGenerator(11)

    def on_events(event_type: int, events: List[bytes]) -> List[_codec.Latch]:
        if not waited:
            # An answer comes while it waits: reading it here would wait for the read lock.
            link.transport.send(_codec.build_put_events(1, guids.generate(1), [b"x"])[0], 5.0)
            waited.append(link.transport.wait_for(_codec.Latch(), 1.0))  # never set
        else:
            latch.set()
        return []

    with _Link(on_events=on_events) as link:
        link.transport.send(_codec.build_put_events(1, guids.generate(1), [b"x"])[0], 5.0)
        assert latch.wait(20.0)  # and the reader read on
        assert waited == [False] and not link.failures


@pytest.mark.parametrize("epoll, busy_poll", [(True, 0.0), (True, 0.0002), (False, 0.0)],
                         ids=["epoll", "epoll-polling", "poll"])
def test_answers_to_many_waiting_threads_go_up_once_and_in_order(monkeypatch, epoll, busy_poll):
    """Also without epoll (macOS, Python 3.9): the reader thread alone reads, with poll."""
    monkeypatch.setattr(_transport, "_EPOLL", epoll and _transport._EPOLL)
    with _Link(busy_poll=busy_poll) as link:
        assert (link.transport._epoll is not None) == (epoll and _transport._EPOLL)
        guids = _codec.GuidGenerator(6)
        sent: List[bytes] = []
        sending = threading.Lock()  # the peer answers in the order PUTs were written

        def poster(queue_id: int) -> None:
            for _ in range(200):
                with sending:
                    guid, latch = link.post(guids, queue_id)
                    sent.append(guid)
                assert link.transport.wait_for(latch, 10.0)

        threads = [threading.Thread(target=poster, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        assert [guid for _, guid in link.seen] == sent and not link.latches
        assert not link.failures


@needs_epoll
def test_a_waiting_thread_is_woken_whichever_thread_reads_its_last_answer(monkeypatch):
    """Answers of a batch arrive in many reads, some read by the waiting thread, some by the
    reader thread; whoever reads the last one must wake it. With the waiting thread's
    periodic look (at signals) pushed beyond the test's timeouts, a missed wake-up fails."""
    monkeypatch.setattr(_transport, "_LEAD_SLICE", 60.0)
    remaining = {"count": 0}
    done: List[_codec.Latch] = []

    def on_events(event_type: int, events: List[bytes]) -> List[_codec.Latch]:
        woken = []
        for event in events:
            remaining["count"] -= len(_codec.iter_acks(event))
            if remaining["count"] == 0:
                woken.append(done[-1])
        return woken

    with _Link(on_events=on_events) as link:
        guids = _codec.GuidGenerator(8)
        for _ in range(100):
            remaining["count"] = 50
            done.append(_codec.Latch())
            link.transport.send(_codec.build_put_events(1, guids.generate(50), [b"x"] * 50)[0], 5.0)
            assert link.transport.wait_for(done[-1], 20.0)
        assert not link.failures


@needs_epoll
def test_a_thread_answered_amid_a_stream_returns_and_the_reader_thread_reads_on():
    """A thread reading in the reader's place must return once answered even while the
    stream goes on, and hand the rest to the reader thread (edge-triggered: what it leaves
    unread raises no new wake-up)."""
    marker = b"\x01" * 16
    with _Link(_Peer(marker=marker)) as link:
        last = link.latches[marker] = _codec.Latch()
        guid, latch = link.post(_codec.GuidGenerator(7), 1)
        answered: List[bool] = []
        waiter = threading.Thread(target=lambda: answered.append(link.transport.wait_for(latch, 10.0)),
                                  name="waiter")
        waiter.start()
        waiter.join(20.0)
        assert answered == [True]
        assert last.wait(10.0)  # the stream's end was read
        assert [g for _, g in link.seen] == [guid, marker] and not link.failures
        # It returned once answered: the end of the stream (16 MiB on, more than the sockets'
        # buffers hold) was handed up by the reader thread, not by the waiter reading on. (Timing
        # the return against the peer's progress instead failed on a loaded machine.)
        assert link.seen[1][0].startswith("bmq-reader-"), link.seen


@needs_epoll
def test_the_peer_closing_while_a_thread_reads_is_reported_once_by_the_transport():
    with _Link() as link:
        latch = _codec.Latch()
        waited: List[bool] = []
        waiter = threading.Thread(target=lambda: waited.append(link.transport.wait_for(latch, 2.0)))
        waiter.start()
        assert link.peer.conn is not None
        link.peer.conn.shutdown(socket.SHUT_RDWR)  # the end of the stream, read by whichever thread waits last
        link.transport.join(10.0)
        waiter.join(10.0)
        assert link.transport.closed and waited == [False]
        assert len(link.failures) == 1 and isinstance(link.failures[0], ConnectionLost)
        assert "closed the connection" in str(link.failures[0])


class _Interrupted(Exception):
    """What a signal handler might raise while the waiting thread hands up events."""


@needs_epoll
@pytest.mark.parametrize("raised, propagates", [(_Interrupted, True), (KeyboardInterrupt, True),
                                                (ProtocolError, False)])
def test_what_handing_up_events_raises_in_a_waiting_thread(raised, propagates):
    """The connection's own failures (bad data) fail the transport as on the reader thread,
    and the waiting caller goes on waiting; anything else (a signal handler's exception, a
    bug) may have come halfway through: it fails the transport and reaches the caller."""
    me = threading.current_thread()
    latches: Dict[bytes, _codec.Latch] = {}

    def on_events(event_type: int, events: List[bytes]) -> List[_codec.Latch]:
        if threading.current_thread() is me:  # the waiting thread hands them up
            raise raised("from on_events")
        return [latches.pop(ack[2]) for event in events for ack in _codec.iter_acks(event)]

    with _Link(on_events=on_events) as link:
        guids = _codec.GuidGenerator(9)
        outcome = None
        for _ in range(50):  # until this thread, not the reader thread, reads an answer
            guid = guids.generate(1)
            latch = latches[guid] = _codec.Latch()
            link.transport.send(_codec.build_put_events(1, guid, [b"x"])[0], 5.0)
            try:
                answered = link.transport.wait_for(latch, 1.0)
            except raised as e:
                outcome = e
                break
            if not answered:
                outcome = "waited"
                break
        if propagates:
            assert isinstance(outcome, raised)
        else:
            assert outcome == "waited"  # nothing raised: it went on waiting for the answer
        link.transport.join(10.0)
        assert link.transport.closed and len(link.failures) == 1
        failure = link.failures[0]
        if propagates:
            assert isinstance(failure, ConnectionLost) and "interrupted" in str(failure)
            assert isinstance(failure.__cause__, raised)
        else:
            assert isinstance(failure, ProtocolError)


def test_busy_polling_pauses_while_answers_come_later_and_resumes_once_one_comes_in_time(monkeypatch):
    """Polling that keeps missing (a distant broker) pauses, longer each time; a wait whose
    answer the polling catches makes the next pause short again. Waits with no answer due,
    and waits that handed a kick to another thread, never poll nor count."""
    results: List[int] = []
    spins: List[float] = []

    def wait_ready(epfd: int, fd: int, timeout: float, woken: List[_codec.Latch], spin: float = 0.0,
                   lead: Any = None) -> int:
        spins.append(spin)
        return results.pop(0) if results else 0

    monkeypatch.setattr(_transport, "_wait_ready", wait_ready)
    transport = Transport(("127.0.0.1", 9), lambda *_: None, lambda exc: None, 64 << 20, "poll", 0.001)
    transport._epoll = _transport.select.epoll()  # never waited on: wait_ready is replaced
    try:
        def waits(count: int, answer_due: bool = True) -> List[float]:
            del spins[:]
            for _ in range(count):
                transport._wait(0.01, [], answer_due, transport._epoll)
            return list(spins)

        misses, pause = _transport._POLL_MISSES, _transport._POLL_PAUSE_MIN
        assert waits(3, answer_due=False) == [0.0] * 3
        assert waits(misses) == [0.001] * misses
        assert waits(pause) == [0.0] * pause  # paused
        assert waits(misses) == [0.001] * misses
        assert waits(2 * pause) == [0.0] * (2 * pause)  # paused twice as long
        results[:] = [_codec.READY_HANDED] * 10 + [_codec.READY_SOCKET | _codec.READY_SPUN]
        assert waits(11 + misses) == [0.001] * (11 + misses)
        assert waits(pause + 1) == [0.0] * pause + [0.001]  # caught one: the pause is short again
    finally:
        transport._epoll.close()


class _SilentPeer:
    """A broker stand-in that answers only when told (:meth:`answer`)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.conn: Optional[socket.socket] = None

    @property
    def address(self) -> Tuple[str, int]:
        return self.server.getsockname()

    def wait_accepted(self) -> bool:
        self.server.settimeout(5)
        self.conn, _ = self.server.accept()
        return True

    def answer(self, guid: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(_codec.build_ack_event([(0, 0, guid, 1)]))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()


@needs_epoll
def test_a_poster_taking_the_lead_sends_the_reader_thread_out_of_its_set_and_reads_its_answer():
    """The reader thread waiting in its epoll set would wake for the poster's answer too (each
    set hears of every arrival): the poster kicks it out as it takes the lead, and the reader
    waits for the poster to finish instead."""
    peer = _SilentPeer()
    with _Link(peer, busy_poll=0.0002) as link:
        transport = link.transport
        transport.set_heartbeat(60.0, 10)  # the reader's waits last a minute unless woken
        guids = _codec.GuidGenerator(7)
        for _ in range(5):
            assert _until(lambda: transport._lead.reader_waiting(), 10)  # idle, in its set
            guid, latch = link.post(guids, 1)
            answered: List[bool] = []
            poster = threading.Thread(target=lambda: answered.append(transport.wait_for(latch, 30)), name="poster")
            poster.start()
            assert _until(lambda: transport._lead.locked() and not transport._lead.reader_waiting(), 10)
            peer.answer(guid)
            poster.join(30)
            assert answered == [True] and link.seen[-1] == ("poster", guid)
        assert not link.failures


@needs_epoll
def test_the_reader_thread_leaves_the_socket_to_the_lead_and_reads_what_is_left_once_it_is_free():
    peer = _SilentPeer()
    with _Link(peer) as link:
        transport = link.transport
        assert _until(lambda: transport._lead.reader_waiting(), 10)
        assert transport._lead.acquire()  # as a poster taking the lead (that then reads nothing)
        guid = bytes(range(16))
        latch = link.latches[guid] = _codec.Latch()
        try:
            peer.answer(guid)
            # The reader thread hears of the data in its set, but leaves it to the lead's holder.
            assert not latch.wait(0.2) and link.seen == []
        finally:
            transport._lead.release()
        assert latch.wait(10)  # then reads it once the lead is free: nothing is stranded
        assert link.seen == [("bmq-reader-reads", guid)] and not link.failures


# A thread reading in the reader's place holds the lead: every point of these is tried.
_WAITING = {"wait_for", "_read_until", "_lead_done", "_wait", "_read_once", "_hand_up", "_release_wave"}


@needs_epoll
def test_an_interrupt_anywhere_in_a_wait_leaves_the_lead_free_and_the_reads_going():
    """A Ctrl-C at any point of a post's wait for its answer (the main thread reading in the
    reader's place) must not leave the lead taken: the reader thread would never read again
    and every later wait would time out. Either the transport failed (the interrupt came amid
    handing up events: the session reconnects) or it goes on answering."""
    at = 0
    guids = _codec.GuidGenerator(12)
    link = _Link(_PeerProcess()).__enter__()
    try:
        while True:
            _, latch = link.post(guids, 1)
            fired = interrupted_at(lambda: link.transport.wait_for(latch, 10.0), at, _WAITING)
            where = f"interrupted {fired}" if fired else "not interrupted"
            assert not link.transport._blocked, where
            if link.transport.closed:
                assert fired and len(link.failures) == 1, where
                link.__exit__(None, None, None)
                link = _Link(_PeerProcess()).__enter__()
            else:
                assert latch.wait(10.0) and not link.transport._lead.locked(), where
                _, after = link.post(guids, 1)
                assert link.transport.wait_for(after, 10.0), where  # read by this thread or the reader
                assert not link.failures, where
            if not fired:
                break
            at += 1
    finally:
        link.__exit__(None, None, None)
    assert at > 5
