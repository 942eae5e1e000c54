"""Transport writes: whichever thread writes (the sender itself, or the writer thread), and
however queued events are joined, the peer receives every message once, each sender's in
order, and the byte counters agree with what arrived. Blocking posts answered together send
their next PUTs together, and what such a wave holds is never left unwritten. A write that
fails is reported to the owner, however late its thread gets round to it."""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from bmq import _codec
from bmq import _transport
from bmq._transport import Transport
from bmq.exceptions import ConnectionLost
from support import interrupted_at, until

SENDERS, EACH = 4, 3000


class _ReadingPeer:
    """Reads every event sent to it (parsing the stream: a cut event would fail to parse) until
    a HEARTBEAT_RSP marker."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.events: List[bytes] = []
        self.marked = threading.Event()
        self.failed: List[BaseException] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        frames = _codec.FrameReader()
        conn, _ = self.server.accept()
        with conn:
            try:
                while True:
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        return
                    for event in frames.feed(chunk):
                        if _codec.unpack_event_header(event)[1] == _codec.EVENT_HEARTBEAT_RSP:
                            self.marked.set()
                            return
                        self.events.append(event)
            except Exception as e:  # a cut event: what the tests look for
                self.failed.append(e)
            finally:
                self.marked.set()


def test_streams_of_coalescing_sends_arrive_whole_and_in_order_per_sender():
    peer = _ReadingPeer()
    transport = Transport(peer.server.getsockname(), lambda *_: None, lambda exc: None, 64 << 20, "test")
    transport.connect(5.0)
    guids = _codec.GuidGenerator(4)

    def send(sender: int) -> None:
        for i in range(EACH):
            event = _codec.build_put_events(sender, guids.generate(1), [b"%d:%d" % (sender, i)])[0]
            transport.send(event, 5.0, coalesce=(i % 10 != 0))  # mostly coalescing, some direct

    threads = [threading.Thread(target=send, args=(n,)) for n in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    transport.send_control(_codec.HEARTBEAT_RSP)  # a marker after everything
    assert peer.marked.wait(30) and not peer.failed
    transport.close()
    transport.join(5.0)
    peer.server.close()
    assert transport.bytes_out == sum(map(len, peer.events)) + len(_codec.HEARTBEAT_RSP)
    puts = [event for event in peer.events if _codec.unpack_event_header(event)[1] == _codec.EVENT_PUT]
    assert len(puts) < SENDERS * EACH  # queued PUTs were joined into fewer events
    by_sender: List[List[int]] = [[] for _ in range(SENDERS)]
    for event in puts:
        for message in _codec.iter_put_messages(event):
            sender, index = message[-1].split(b":")
            by_sender[int(sender)].append(int(index))
    assert by_sender == [list(range(EACH))] * SENDERS


class _AckingPeer:
    """Records the GUIDs of every PUT event it receives (one list per event) and answers each
    event with one ACK event for its messages."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.puts: List[List[bytes]] = []
        self.received = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        frames = _codec.FrameReader()
        with conn:
            while True:
                try:
                    chunk = conn.recv(1 << 20)
                except OSError:
                    return
                if not chunk:
                    return
                for event in frames.feed(chunk):
                    if _codec.unpack_event_header(event)[1] != _codec.EVENT_PUT:
                        continue
                    messages = _codec.iter_put_messages(event)
                    with self.received:
                        self.puts.append([message[2] for message in messages])
                        self.received.notify_all()
                    conn.sendall(_codec.build_ack_event([(0, 0, message[2], message[1]) for message in messages]))

    def wait_for_messages(self, count: int, timeout: float) -> bool:
        with self.received:
            return self.received.wait_for(lambda: sum(map(len, self.puts)) >= count, timeout)


class _LingeringWriter:
    """A transport to an :class:`_AckingPeer` whose writer thread lingers as with the GIL off
    (see _transport._LINGER), the linger held until ``go`` is set; every coalescing send is
    queued for the writer thread (as in a stream of them)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.lingering, self.go = threading.Event(), threading.Event()

        def linger(seconds: float) -> None:
            self.lingering.set()
            self.go.wait(30)

        monkeypatch.setattr(_transport, "_sleep", linger)
        monkeypatch.setattr(_transport, "_BURST", 1e9)
        self.peer = _AckingPeer()
        self.transport = Transport(self.peer.server.getsockname(), lambda *_: None, lambda exc: None, 64 << 20,
                                   "linger")
        self.transport._linger = 0.0001
        self.transport.connect(5.0)
        self.guids = _codec.GuidGenerator(5)

    def send(self, count: int, coalesce: bool) -> List[bytes]:
        sent = []
        for _ in range(count):
            guid = self.guids.generate(1)
            self.transport.send(_codec.build_put_events(1, guid, [b"x"])[0], 5.0, coalesce=coalesce)
            sent.append(guid)
        return sent

    def close(self) -> None:
        self.go.set()
        self.transport.close()
        self.transport.join(5.0)
        self.peer.server.close()


def test_with_the_gil_off_the_writer_thread_lingers_and_writes_a_stream_in_one_event(monkeypatch):
    """Free-threaded CPython: the writer thread, woken for a coalescing send, waits for the
    rest of the stream and writes it as one event, not an event (and a socket write) per send."""
    link = _LingeringWriter(monkeypatch)
    try:
        first = link.send(1, coalesce=True)
        assert link.lingering.wait(10), "the writer thread did not linger"
        rest = link.send(9, coalesce=True)
        link.go.set()
        assert link.peer.wait_for_messages(10, 10)
        assert link.peer.puts == [first + rest]
    finally:
        link.close()


def test_a_blocking_send_does_not_wait_for_a_lingering_writer_thread(monkeypatch):
    """A blocking post (someone waits for its answer) finding the writer thread lingering writes
    what is queued and itself at once, in order, from its own thread."""
    link = _LingeringWriter(monkeypatch)
    try:
        queued = link.send(3, coalesce=True)
        assert link.lingering.wait(10), "the writer thread did not linger"
        blocking = link.send(1, coalesce=False)
        assert link.peer.wait_for_messages(4, 10)  # the writer thread still lingers
        assert link.peer.puts == [queued + blocking]
    finally:
        link.close()


class _WaveLink:
    """A transport to an :class:`_AckingPeer` whose reader wakes the latches registered for
    an answered GUID. ``start_wave()`` posts once and has its answer wake two threads at once
    (the test's and a stand-in's): the reader thread then holds a wave of two blocking sends."""

    def __init__(self) -> None:
        self.peer = _AckingPeer()
        self.guids = _codec.GuidGenerator(5)
        self.wake: Dict[bytes, List[_codec.Latch]] = {}
        self.transport = Transport(self.peer.server.getsockname(), self._on_events, lambda exc: None,
                                   64 << 20, "wave")

    def __enter__(self) -> "_WaveLink":
        self.transport.connect(5.0)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.transport.close()
        self.transport.join(5.0)
        self.peer.server.close()

    def _on_events(self, event_type: int, events: List[bytes]) -> List[_codec.Latch]:
        return [latch for event in events for ack in _codec.iter_acks(event) for latch in self.wake.pop(ack[2], [])]

    def post(self, woken: int = 1) -> Tuple[bytes, List[_codec.Latch]]:
        """A blocking send of one PUT whose answer wakes ``woken`` latches."""
        guid = self.guids.generate(1)
        latches = self.wake[guid] = [_codec.Latch() for _ in range(woken)]
        self.transport.send(_codec.build_put_events(1, guid, [b"x"])[0], 5.0)
        return guid, latches

    def start_wave(self) -> bytes:
        guid, latches = self.post(woken=2)
        assert latches[0].wait(10.0)  # set by the reader thread as it waits, the wave held
        return guid


def test_posters_woken_together_send_their_next_puts_in_one_event(monkeypatch):
    """Their PUTs reach the broker as one event (bmqbrkr's CPU per PUT: ~13 instead of ~20 us
    with 8 posting threads). The reader's waits are stretched so that the wave cannot be
    released early on a slow machine."""
    monkeypatch.setattr(_transport, "_IDLE_POLL", 60.0)
    monkeypatch.setattr(_transport, "_WAVE_WAIT", 60.0)
    with _WaveLink() as link:
        first = link.start_wave()
        a, _ = link.post()
        b, _ = link.post()
        assert link.peer.wait_for_messages(3, 10.0)
        assert link.peer.puts == [[first], [a, b]]


def test_a_wave_that_does_not_complete_is_written_by_the_reader_thread(monkeypatch):
    """The second woken thread never posts: the reader thread writes what the wave held once
    its wait ends (the idle poll is stretched beyond the test's timeouts)."""
    monkeypatch.setattr(_transport, "_IDLE_POLL", 600.0)
    monkeypatch.setattr(_transport, "_WAVE_WAIT", 3.0)  # this thread posts well within it
    with _WaveLink() as link:
        first = link.start_wave()
        held, _ = link.post()
        assert link.peer.puts == [[first]]  # held: the peer has answered all it got
        assert link.peer.wait_for_messages(2, 30.0)
        assert link.peer.puts == [[first], [held]]


@pytest.mark.skipif(not _transport._EPOLL, reason="a waiting thread reads only where epoll exists (Linux)")
def test_a_held_post_whose_thread_waits_alone_is_written_at_once(monkeypatch):
    """A thread that goes on to wait for its answer alone (reading in the reader's place)
    writes what the wave held instead of waiting for the reader thread's wait to end."""
    monkeypatch.setattr(_transport, "_IDLE_POLL", 600.0)
    monkeypatch.setattr(_transport, "_WAVE_WAIT", 600.0)
    with _WaveLink() as link:
        link.start_wave()
        _, latches = link.post()
        assert link.transport.wait_for(latches[0], 10.0)


class _HoldSenderUntilReaderEnds(logging.Handler):
    """Holds a thread other than the transport's reader inside its "connection lost" log call
    until the reader thread has ended: as a sender preempted there on a loaded machine."""

    def __init__(self, transport: Transport) -> None:
        super().__init__()
        self.transport = transport
        self.reader_ended = False

    def emit(self, record: logging.LogRecord) -> None:
        reader = self.transport._reader
        if "lost" in record.getMessage() and reader is not None and threading.current_thread() is not reader:
            reader.join(10.0)
            self.reader_ended = not reader.is_alive()


@contextlib.contextmanager
def _connected(name: str) -> Iterator[Tuple[Transport, List[BaseException]]]:
    """A transport connected to a peer that reads nothing, with the failures reported to its
    owner; closed and joined, and its peer gone, after."""
    server = socket.create_server(("127.0.0.1", 0))
    peer: List[socket.socket] = []
    threading.Thread(target=lambda: peer.append(server.accept()[0]), daemon=True).start()
    failures: List[BaseException] = []
    transport = Transport(server.getsockname(), lambda *_: None, failures.append, 1 << 20, name)
    try:
        transport.connect(5.0)
        yield transport, failures
    finally:
        transport.close()
        transport.join(5.0)
        server.close()
        for sock in peer:
            sock.close()


def test_a_failed_write_is_reported_even_when_the_reader_thread_ends_first():
    """The sender whose write fails closes the transport; the reader thread, seeing it closed,
    ends and lets go of the owner's callbacks. The failure must reach the owner all the same
    (it did not: a session behind a cut connection or a killed broker, told nothing, never
    reconnected, and its posts timed out after ack_timeout)."""
    with _connected("failing") as (transport, failures):
        transport.set_heartbeat(0.0, 0)  # negotiated: the loss is logged as a warning
        handler = _HoldSenderUntilReaderEnds(transport)
        logger = logging.getLogger("bmq._transport")
        logger.addHandler(handler)
        try:
            # Our side stops sending (the peer stays open, the reader sees nothing): the next
            # write fails in the sending thread itself (nothing queued, so it writes directly).
            transport._sock.shutdown(socket.SHUT_WR)
            with pytest.raises(ConnectionLost, match="write to"):
                transport.send(_codec.HEARTBEAT_REQ, 5.0)
        finally:
            logger.removeHandler(handler)
    assert handler.reader_ended  # the interleaving under test did happen
    assert len(failures) == 1 and "write to" in str(failures[0])


@pytest.mark.parametrize("where", ["after the system call", "as the write is recorded"])
def test_an_interrupted_direct_write_fails_the_connection_and_reaches_the_caller(monkeypatch, where):
    """A KeyboardInterrupt (any BaseException) landing in a sender's own write, before it gave
    the write token back, must not leave the token taken: the writer thread would wait for it
    for ever. The write may have put part of an event on the wire, so the connection fails
    (the session reconnects and re-sends) and the caller gets the exception."""
    send_now = _transport._send_now

    def interrupted(fd: int, data: bytes) -> int:
        send_now(fd, data)
        raise KeyboardInterrupt

    with _connected("interrupted") as (transport, failures):
        if where == "after the system call":
            monkeypatch.setattr(_transport, "_send_now", interrupted)
        else:
            monkeypatch.setattr(transport, "_lock", _InterruptOnce(transport._lock, transport))
        with pytest.raises(KeyboardInterrupt):
            transport.send(_codec.HEARTBEAT_REQ, 5.0)
        assert not transport._writing
        assert transport.closed
        assert len(failures) == 1 and "interrupted" in str(failures[0])
        with pytest.raises(ConnectionLost):
            transport.send(_codec.HEARTBEAT_REQ, 5.0)


class _InterruptOnce:
    """The transport's lock, raising KeyboardInterrupt as the first direct write, done, takes it
    to record what it wrote (the point a signal handler could raise)."""

    def __init__(self, lock: Any, transport: Transport) -> None:
        self._inner = lock
        self._transport = transport
        self.fired = False

    def __enter__(self) -> Any:
        if self._transport._writing and not self.fired and threading.current_thread() is threading.main_thread():
            self.fired = True
            raise KeyboardInterrupt
        return self._inner.__enter__()

    def __exit__(self, *exc_info: Any) -> Any:
        return self._inner.__exit__(*exc_info)

    def __getattr__(self, name: str) -> Any:  # acquire, release (the writer thread's waits): the lock's
        return getattr(self._inner, name)


# Where a sending thread holds the write token or the queue: every line of these is tried.
_SENDING = {"send", "_enqueue", "_rouse_writer", "_take", "_write_direct", "_write", "_wake_writer",
            "_write_interrupted"}


@pytest.mark.parametrize("queued", [False, True], ids=["alone", "behind queued events"])
def test_an_interrupt_anywhere_in_a_send_leaves_the_token_free_and_nothing_stranded(queued):
    """A Ctrl-C at any line of a send (the main thread's post) leaves the write token and the
    lock free, and either the connection failed (the session reconnects and re-sends what is
    unanswered) or every event sent arrives whole, the interrupted one at most missing, and
    the queued-byte count back to 0; the sends after it go out."""
    at = 0
    guids = _codec.GuidGenerator(5)
    while True:
        peer = _ReadingPeer()
        failures: List[BaseException] = []
        transport = Transport(peer.server.getsockname(), lambda *_: None, failures.append, 1 << 20, "interrupted")
        transport.connect(5.0)
        try:
            before = [_codec.build_put_events(1, guids.generate(1), [b"before%d" % i])[0] for i in range(3)]
            if queued:  # the writer thread is kept from writing them: this send takes them along
                transport._writing = 1
                for event in before:
                    transport.send(event, 5.0, coalesce=True)
                transport._writing = 0
            interrupted = _codec.build_put_events(1, guids.generate(1), [b"interrupted"])[0]
            fired = interrupted_at(lambda: transport.send(interrupted, 5.0), at, _SENDING)
            where = f"interrupted {fired}" if fired else "not interrupted"
            assert not transport._writing and transport._lock.acquire(timeout=10), where  # the writer thread may hold it a moment
            transport._lock.release()
            if transport.closed:
                assert fired and len(failures) == 1, where
            else:
                after = _codec.build_put_events(1, guids.generate(1), [b"after"])[0]
                transport.send(after, 5.0)
                transport.send_control(_codec.HEARTBEAT_RSP)
                assert peer.marked.wait(10) and not peer.failed, where
                payloads = [message[-1] for event in peer.events for message in _codec.iter_put_messages(event)]
                expected = [b"before0", b"before1", b"before2"] if queued else []
                assert payloads in (expected + [b"interrupted", b"after"], expected + [b"after"]), where
                assert fired or b"interrupted" in payloads, where
                assert until(lambda: transport._queued == 0, 10), where
        finally:
            transport.close()
            transport.join(5.0)
            peer.server.close()
        if not fired:
            break
        at += 1
    assert at > 5
