"""One TCP connection to a broker: a reader thread, a writer thread and a bounded write queue.

The transport knows framing and heartbeats (protocol §1.1, §10) and nothing about sessions:
whole events go up through ``on_events(event_type, events)`` on the reader thread (consecutive
events of one type together), and a failure goes up once through ``on_failure(exception)``.

``on_events`` may return latches (threads blocked on an answer): the reader sets them as it
releases the interpreter lock to wait for the socket, so that a woken thread finds the lock
free rather than waking only to wait for it again.
"""
from __future__ import annotations

import collections
import itertools
import logging
import mmap
import os
import select
import socket
import ssl
import sys
import threading
import time
from typing import Any, Callable, Deque, List, Optional, Protocol, Set, Tuple

from . import _codec
from ._protocol import check_first_answer
from ._tls import TLSChannel
from .exceptions import BandwidthLimitError, ConnectionError, ConnectionLost, Error, InvalidURIError, TLSError

__all__ = ["Transport", "parse_broker_address"]

logger = logging.getLogger(__name__)

_RECV_SIZE = 1 << 20
# Small events are joined into one sendall up to this many bytes; bigger ones go alone.
_COALESCE_BYTES = 256 * 1024
_IDLE_POLL = 0.5
# A read of at least this many bytes suggests that more is waiting (see _read_loop).
_STREAMING_READ = 16 * 1024
_send_now = _codec.send_now
_recv_now = _codec.recv_now
_wait_readable = _codec.wait_readable
_wait_ready = _codec.wait_ready
_READY_SOCKET = _codec.READY_SOCKET
_READY_HANDED = _codec.READY_HANDED
_READY_SPUN = _codec.READY_SPUN
_READY_LEFT = _codec.READY_LEFT
_wait_lead_then_ready = _codec.wait_lead_then_ready
_get_ident = threading.get_ident
# Where the system has them (Linux), the socket is waited on through edge-triggered epoll sets
# (one for the reader thread, one for a poster reading in its place): a blocking poster is
# woken by its ACK instead of by the reader thread (see Transport.wait_for).
_EPOLL = hasattr(select, "epoll") and hasattr(os, "eventfd")
# A thread reading in the reader's place looks at signals and at the transport this often.
_LEAD_SLICE = _codec.SIGNAL_CHECK_SECONDS
# A coalescing send within this many seconds of the previous direct write goes to the writer
# thread: a stream of post_async() calls or confirms becomes few socket writes (one syscall costs
# more than building a small PUT), while the first of a burst is still written at once.
_BURST = 0.0002
# Queued events at which a coalescing send writes them all from its own thread (see send).
_SELF_FLUSH = 48
# With the GIL off (free-threaded CPython) the writer thread, woken for a few small queued
# events, waits this long for more before taking them: it would otherwise run at once and write
# a stream of post_async() calls or confirms an event at a time (a socket write, a wake-up and a
# meeting with the sending thread on the lock per message: docs/free-threading.md). With the GIL
# it waits for the interpreter lock, which the sending thread holds, and finds a burst queued.
_LINGER = 0.0001
_gil_enabled = getattr(sys, "_is_gil_enabled", lambda: True)
_sleep = time.sleep
# How long the reader thread leaves a wave's held events waiting for the rest (see _hold_wave).
_WAVE_WAIT = 0.0005
# Busy polling (see Transport._wait) pauses after this many waits in a row whose answer came
# later than the polling, for a number of waits that doubles with every pause up to the
# maximum, and starts again from the minimum once polling catches an answer: a broker's
# hiccup costs little polling, a distant broker a few waits' polling in thousands.
_POLL_MISSES = 4
_POLL_PAUSE_MIN = 64
_POLL_PAUSE_MAX = 4096
_HEARTBEAT_REQ_TYPE = _codec.EVENT_HEARTBEAT_REQ
_HEARTBEAT_RSP_TYPE = _codec.EVENT_HEARTBEAT_RSP
_counter = itertools.count(1)

EventHandler = Callable[[int, List[bytes]], Optional[List[_codec.Latch]]]
FailureHandler = Callable[[BaseException], None]


class Answer(Protocol):
    """What :meth:`Transport.wait_for` waits for: a :class:`bmq._codec.Latch` (a blocking post)
    or a :class:`bmq._dispatch.FutureLatch` (a post future's ``result()``)."""

    def kick_to(self, kick_fd: int) -> bool: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float) -> bool: ...


def _closed_callback(*_: Any) -> None:
    """What a closed transport calls instead of its owner's callbacks (nothing, as it reads no more)."""


def parse_broker_address(broker: str) -> Tuple[str, int]:
    """``"tcp://host:port"`` (or ``"host:port"``) -> ``(host, port)``.

    Raises:
        InvalidURIError: not of that form: another scheme, an empty host (``"[]"`` too), a
            bracket outside a pair around the whole host, a port that is not ASCII digits
            (``int()`` would take other scripts' digits) or outside 1..65535.
    """
    scheme, sep, text = broker.partition("://")
    if not sep:
        text = broker
    host, sep_port, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        # An IPv6 address in brackets (as in a URL): stripped before the emptiness check, or
        # "[]:1" would give the host "", which a connect takes for the local host.
        host = host[1:-1]
    if (
        (sep and scheme != "tcp")
        or not sep_port
        or not host
        or "/" in host
        or "[" in host
        or "]" in host
        or not (port.isascii() and port.isdigit())
        or not 0 < int(port) < 65536
    ):
        raise InvalidURIError(f"bad broker address {broker!r}: expected the form 'tcp://HOST:PORT'")
    return host, int(port)


class Transport:
    """A connected socket with its reader and writer threads.

    Args:
        address: ``(host, port)``.
        on_events: called on the reader thread with every event except heartbeats, in order;
            consecutive events of one type that arrived together come in one call. What it
            returns (latches, or None) is set once the reader releases the interpreter lock.
        on_failure: called once, from the reader or writer thread, when the connection fails
            (not after :meth:`close`).
        high_watermark: bytes queued for the socket above which :meth:`send` waits.
        name: suffix of the thread names (``bmq-reader-<name>``).
        busy_poll: seconds a thread waiting for an answer (see :meth:`wait_for`) polls the
            socket before it sleeps (see :meth:`_wait`); 0: never.
        tls: a client ``ssl.SSLContext``: TLS from the first byte (see :mod:`bmq._tls`); the
            socket stays a plain descriptor that the threads read and write as without TLS,
            what is written being encrypted as it is written (after events are joined), so
            coalescing and the write paths are unchanged.
        server_hostname: the name the broker's certificate must carry (default: the host).

    Thread-safety: :meth:`send`, :meth:`send_control` and :meth:`close` may be called from
    any thread; :meth:`connect` once, by the owner.
    """

    def __init__(
        self,
        address: Tuple[str, int],
        on_events: EventHandler,
        on_failure: FailureHandler,
        high_watermark: int,
        name: str = "",
        busy_poll: float = 0.0,
        tls: Optional[ssl.SSLContext] = None,
        server_hostname: Optional[str] = None,
    ) -> None:
        self.address = address
        self._tls_context = tls
        self._server_hostname = server_hostname or address[0]
        self.tls: Optional[TLSChannel] = None  # once connected with TLS
        self.failure: Optional[BaseException] = None  # why the connection failed, once it has
        # Encrypted bytes a write without waiting left over: the next write (by the thread then
        # holding _writing) sends them first, and the writer thread is woken for them.
        self._tls_out = b""
        self._tls_early = b""
        self._on_events = on_events
        self._on_failure = on_failure
        self._high_watermark = high_watermark
        self._name = name or str(next(_counter))
        self._busy_poll = busy_poll
        # Waits in a row whose answer came after the polling; waits left that do not poll.
        # Updated without a lock by the thread waiting: a lost update only shifts a heuristic.
        self._poll_misses = 0
        self._poll_paused = 0
        self._poll_pause = _POLL_PAUSE_MIN
        self._sock: Optional[socket.socket] = None
        self._fd = -1
        self._lock = threading.Lock()
        # The latch the writer thread waits on (None: it does not wait), set by the first
        # sender to queue something: one wake-up per wait, not a notify per message. A latch of
        # the codec's rather than a Condition: a thread waiting on a Condition's lock with the
        # GIL off calls sched_yield() 40 times before it sleeps (docs/free-threading.md).
        self._writer_wakeup: Optional[_codec.Latch] = None
        self._has_room = threading.Condition(self._lock)
        self._queue: Deque[bytes] = collections.deque()
        self._queued = 0  # bytes queued or being written by the writer thread
        # The write token: the ident of the thread inside a socket write (0: none); the others
        # queue. Taken under _lock; given back on every path (see _write_interrupted).
        self._writing = 0
        self._last_direct = 0.0  # time.monotonic() after the last write from a sending thread
        self._linger = 0.0 if _gil_enabled() else _LINGER  # see _LINGER
        self._lingering = False  # the writer thread waits for more (a blocking send then writes)
        # Blocking sends still expected from posters that one read woke together; meanwhile
        # theirs wait in the queue, and the last writes them all (see _hold_wave).
        self._wave = 0
        self._closed = False
        # Reading: the reader thread, or a thread waiting for an answer in its place (wait_for),
        # reads and hands up events holding _read_lock, so events go up one read at a time and
        # in order. _lead is held by such a thread (for good by the reader once it exits).
        self._read_lock = threading.Lock()
        self._lead = _codec.Lead()
        # Two epoll sets hold the socket, each with an eventfd written to wake the thread waiting
        # there: the reader thread's, and that of a poster reading in its place (see connect).
        self._epoll: Optional["select.epoll"] = None
        self._kick = -1
        self._reader_epoll: Optional["select.epoll"] = None
        self._reader_kick = -1
        self._read_closed = False
        # One entry per thread in wait_for (list appends and pops are atomic): a thread reads in
        # the reader's place only while it is the one waiting. With several, the reader thread
        # wakes them as it releases the interpreter lock, which a reading poster returning
        # to its caller could not do.
        self._blocked: List[None] = []
        self._reader_ident: Optional[int] = None  # reading in its own place would deadlock
        # Whether the reader thread waits in its epoll set is _lead's reader-waiting flag: a
        # poster taking _lead then kicks it out, so that it does not wake for the poster's
        # answer (see _read_loop).
        self._frames = _codec.FrameReader()
        # One reusable buffer: recv() would allocate (and the allocator map) 1 MiB per call. A
        # mapping of its own, not malloc's: freeing a malloc'ed one raises glibc's dynamic mmap
        # threshold, later connections' buffers then come from a fragmented heap that is not
        # given back, and a session grew ~130 KB of RSS per reconnect (test_reconnect_memory).
        self._buffer = mmap.mmap(-1, _RECV_SIZE)
        self._view = memoryview(self._buffer)
        self._received = False  # whole events came since the last heartbeat check
        # Traffic counters (bmq.Session.stats): bytes_out and high_watermark_wait under the lock,
        # the others under _read_lock.
        self.bytes_in = self.events_in = self.bytes_out = 0
        self.high_watermark_wait = 0.0
        self._heartbeat_interval: Optional[float] = None
        self._max_missed = 0
        # check_heard's heartbeat request: when it was sent, for which oldest wait, and whether
        # it is still unanswered (the reader thread clears that, without a lock: a race costs
        # one request more or one interval later).
        self._connected_at = 0.0
        self._probe_sent = 0.0
        self._probe_for = 0.0
        self._probe_unanswered = False
        self._negotiated = False  # set_heartbeat was called: the session uses the connection
        self._reader: Optional[threading.Thread] = None
        self._writer: Optional[threading.Thread] = None

    def __repr__(self) -> str:
        return f"Transport({self.address[0]}:{self.address[1]}, name={self._name})"

    @property
    def threads(self) -> List[threading.Thread]:
        """The reader and writer threads (once started)."""
        return [thread for thread in (self._reader, self._writer) if thread is not None]

    @property
    def closed(self) -> bool:
        """True once the connection failed or was closed."""
        return self._closed

    def connect(self, timeout: float) -> None:
        """Open the TCP connection and start the threads.

        Raises:
            ConnectionError: the broker cannot be reached (with host:port). TLSError: with TLS,
            the handshake failed (the message says why). TimeoutError: no TLS answer in time.
        """
        host, port = self.address
        deadline = time.monotonic() + timeout
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ConnectionError(f"cannot connect to {host}:{port}: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connected_at = time.monotonic()
        if self._tls_context is not None:
            channel = TLSChannel(self._tls_context, server_hostname=self._server_hostname, peer=f"{host}:{port}")
            try:
                channel.handshake(sock, max(0.0, deadline - time.monotonic()))
            except BaseException:
                sock.close()
                raise
            self.tls = channel
            # Records that came with the end of the handshake wait in the channel: the reader
            # thread hands them up before it reads the socket.
            self._tls_early = channel.decrypt(b"")
            logger.debug("%r: %s, %s", self, channel.version, channel.cipher)
        sock.settimeout(None)
        with self._lock:
            if self._closed:
                sock.close()
                raise ConnectionError(f"connection to {host}:{port} closed while connecting")
            self._sock = sock
            self._fd = sock.fileno()
            if _EPOLL:
                # Each set hears of every arrival (edge-triggered), and each thread harvests its
                # own: a poster polling for its answer never races the reader thread for it, as
                # one set shared would make them (the reader stays out of its set meanwhile).
                self._epoll, self._kick = self._epoll_set()
                self._reader_epoll, self._reader_kick = self._epoll_set()
        self._writer = threading.Thread(target=self._write_loop, name=f"bmq-writer-{self._name}", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=f"bmq-reader-{self._name}", daemon=True)
        self._writer.start()
        self._reader.start()

    def _epoll_set(self) -> Tuple["select.epoll", int]:
        """A new edge-triggered epoll set holding the socket and a new kick eventfd."""
        epoll = select.epoll()
        kick = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        epoll.register(self._fd, select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET)
        epoll.register(kick, select.EPOLLIN | select.EPOLLET)
        return epoll, kick

    def set_heartbeat(self, interval: float, max_missed: int) -> None:
        """Start dead-link detection (the negotiation is over): after ``max_missed`` silent
        intervals the connection fails with ConnectionLost; ``max_missed == 0`` only answers
        requests (protocol §10)."""
        self._max_missed = max_missed
        self._heartbeat_interval = interval if max_missed > 0 and interval > 0 else None
        self._negotiated = True

    def check_heard(self, oldest: float) -> None:
        """Make sure that the broker hears this connection while an answer is overdue.

        ``oldest``: when the oldest message or request still waiting for its answer (an ACK, a
        control response) was made (``time.monotonic()``; 0.0: nothing waits). Once it has
        waited a heartbeat interval on this connection, ask the broker for a heartbeat response
        (at most one request an interval). The broker hears the connection if the response
        comes, or if that oldest wait ends meanwhile (a busy broker answering in order); if
        neither happens within ``max_missed`` intervals, the connection fails as a silent one
        does, and its owner replaces it.

        Why: a stream desynchronized on its way to the broker (a corrupted length word) leaves
        the other direction healthy: the broker's heartbeats keep arriving, so the silence rule
        (see :meth:`_read_loop`) never fires. bmqbrkr counts only valid events as a sign of
        life and closes such a connection after its missed heartbeats, unless the rest of
        the stream, read from a wrong offset, yields events that pass its checks: then
        nothing ends it, and every post ends as TIMEOUT. This check does not depend on how
        the broker watches its side.

        Thread-safety: one thread (the session's ACK timer); the reader thread only notes the
        heartbeat responses.
        """
        interval = self._heartbeat_interval
        if interval is None or self._closed:
            return
        now = time.monotonic()
        if self._probe_unanswered:
            if oldest == self._probe_for and now - self._probe_sent >= interval * self._max_missed:
                self._fail(ConnectionLost(
                    f"{self.address[0]}:{self.address[1]} answered neither a heartbeat request nor what was "
                    f"waiting for {now - self._probe_sent:.1f} s: the broker does not hear this connection "
                    f"(its stream desynchronized on the way?)"))
                return
            if oldest == self._probe_for:
                return  # one request at a time
            self._probe_unanswered = False  # what waited was answered: the broker reads this stream
        if not oldest or now - max(oldest, self._connected_at) < interval or now - self._probe_sent < interval:
            return
        self._probe_sent = now
        self._probe_for = oldest
        self._probe_unanswered = True
        try:
            self.send_control(_codec.HEARTBEAT_REQ)
        except ConnectionLost:
            pass  # closed meanwhile: its owner was told

    # ---- writing ------------------------------------------------------------------
    def send(self, data: bytes, timeout: float, coalesce: bool = False) -> None:
        """Queue ``data`` for the socket, waiting while the queue is above the high watermark.

        Args:
            data: one or more whole events.
            timeout: seconds to wait for room.
            coalesce: nobody waits for this very write (an asynchronous post, a confirm): right
                after another write it goes to the writer thread, to share a socket write with
                what follows, unless 48 events are queued already: then this thread writes them
                (joined) and it. Otherwise it is written from this thread when nothing is queued,
                or held for the rest of a wave of blocking posts (see _hold_wave).

        Raises:
            BandwidthLimitError: still no room after ``timeout``; nothing was queued.
            ConnectionLost: the connection is closed; nothing was queued.
        """
        size = len(data)
        took = 0  # this thread took the write token: given back on every path
        try:
            with self._lock:
                if self._queued and self._queued + size > self._high_watermark and not self._closed:
                    deadline = time.monotonic() + timeout
                    while self._queued and self._queued + size > self._high_watermark and not self._closed:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise BandwidthLimitError(
                                f"{self._queued} bytes still waiting for the socket after {timeout:g} s"
                            )
                        waited = time.monotonic()
                        self._has_room.wait(remaining)
                        self.high_watermark_wait += time.monotonic() - waited
                queue = self._queue
                if self._wave and not coalesce and not self._closed:
                    self._wave -= 1
                    if self._wave:
                        # Counted first: a signal handler's exception cannot come between a
                        # statement without a call and the call after it (see _enqueue).
                        self._queued += size
                        queue.append(data)  # held for the rest of the wave: no writer wake-up
                        return
                    last_of_wave = True
                else:
                    last_of_wave = False
                if self._writing or self._closed or (
                        (queue or (coalesce and time.monotonic() - self._last_direct < _BURST))
                        and not (coalesce and len(queue) >= _SELF_FLUSH) and not last_of_wave
                        and not (self._lingering and not coalesce)):
                    self._enqueue(data)
                    return
                # Write from this thread: nothing is queued (a blocking post's latency pays no
                # hand-off), a wave is complete, a stream of coalescing sends has queued enough,
                # or a blocking send finds the writer thread lingering (it would wait for it).
                # The writer thread needs the interpreter lock, which a thread that keeps posting
                # holds: without this, what is queued would wait for it while the broker idles.
                # The token first: whatever an exception (a signal handler's) interrupts from
                # here on, the except below gives it back and fails the connection, so that
                # events taken from the queue and not written are re-sent after the reconnect.
                self._writing = took = _get_ident()
                if queue:
                    self._queued += size
                    queue.append(data)
                    batch, taken = self._take()
                else:
                    batch, taken = [data], 0
            self._write_direct(batch, taken)
        except BaseException as e:  # noqa: B902 - a signal handler's exception included
            if took:
                self._write_interrupted(e)
            else:
                self._wake_writer()  # what a wave held, this send among them, is never stranded
            raise

    def _wake_writer(self) -> None:
        """Wake the writer thread if something is queued (a send that raised may have left
        the events a wave held in the queue without a wake-up)."""
        with self._lock:
            if self._queue:
                self._rouse_writer()

    def _hold_wave(self, posters: int) -> None:
        """The reader thread has just answered ``posters`` (two or more) blocking posts at once,
        and their threads will likely post again together: of the next ``posters`` blocking
        sends, all but the last are held in the queue, and the last writes them all. One event
        of several PUTs costs the broker much less than several events of one PUT each (the
        broker pays mostly per event: docs/performance-notes.md), and the client one socket
        write. The reader thread releases the wave when its next wait
        ends (after _WAVE_WAIT at most), and a poster that goes on to wait alone at once (see
        _release_wave)."""
        with self._lock:
            self._wave += posters

    def _release_wave(self) -> None:
        """Give up waiting for the rest of a wave: write what it held from this thread."""
        took = 0
        try:
            with self._lock:
                self._wave = 0
                if self._writing or self._closed or not self._queue:
                    return
                self._writing = took = _get_ident()  # before taking: see send
                batch, taken = self._take()
            self._write_direct(batch, taken)
        except ConnectionLost:
            pass  # the transport failed (its owner was told): the session re-sends what it held
        except BaseException as e:  # noqa: B902 - a signal handler's exception included
            if took:
                self._write_interrupted(e)
            raise

    def _write_interrupted(self, exc: BaseException) -> None:
        """This thread took the write token and ``exc`` (a signal handler's KeyboardInterrupt,
        say) came before it gave it back, maybe amid an event: give it back and fail the
        connection (the session reconnects and re-sends what is unanswered), as a failed
        write does. Idempotent: a write that failed has done both already."""
        with self._lock:
            if self._writing == _get_ident():
                self._writing = 0
                self._has_room.notify_all()  # the reader may be waiting to close the socket
        self._fail(ConnectionLost(f"write to {self.address[0]}:{self.address[1]} was interrupted ({exc!r}): "
                                  f"an event may have been cut"), exc)

    def fail_interrupted(self, exc: BaseException) -> None:
        """A sending thread recorded a message for re-sending, then ``exc`` (a signal handler's
        KeyboardInterrupt, say) stopped it before its event was surely queued: fail the
        connection, so that the session's reconnect re-sends it with the other unanswered
        messages (else it would wait, unsent, for its ACK timeout). Any thread."""
        self._fail(ConnectionLost(f"a send to {self.address[0]}:{self.address[1]} was interrupted ({exc!r}) "
                                  f"before its event was queued"), exc)

    def _write_direct(self, batch: List[bytes], taken: int) -> None:
        """This thread took the write token and ``taken`` queued bytes into ``batch``: write what
        the socket takes at once, and leave the rest to the writer thread. The caller gives the
        token back (:meth:`_write_interrupted`) if this raises."""
        data, sent = self._write(batch, wait=False)
        with self._lock:
            self._writing = 0
            self._last_direct = time.monotonic()
            self.bytes_out += sent
            self._queued -= taken
            if sent < len(data) and not self._closed:
                self._queue.appendleft(data[sent:] if sent else data)
                self._queued += len(data) - sent
            if self._queue or self._tls_out:
                self._rouse_writer()
            if taken or self._closed:
                self._has_room.notify_all()  # posters over the high watermark; the reader closing

    def send_control(self, data: bytes) -> None:
        """Queue ``data`` ignoring the high watermark (control traffic is never blocked).

        Raises:
            ConnectionLost: the connection is closed.
        """
        with self._lock:
            self._enqueue(data)

    def _enqueue(self, data: bytes) -> None:
        if self._closed:
            raise ConnectionLost(f"connection to {self.address[0]}:{self.address[1]} is closed")
        # Counted before it is queued: CPython runs a signal handler (whose exception could
        # end this) after a call, never between a statement without one and the next call, so
        # the event cannot be queued uncounted. Not woken, the writer is by the caller's except.
        self._queued += len(data)
        self._queue.append(data)
        self._rouse_writer()

    def _rouse_writer(self) -> None:
        """Caller holds the lock: wake the writer thread if it waits (one wake-up is enough: with
        the GIL it needs the interpreter lock to run, which a thread posting a stream holds)."""
        wakeup = self._writer_wakeup
        if wakeup is not None:
            self._writer_wakeup = None
            wakeup.set()

    def _write(self, batch: List[bytes], wait: bool) -> Tuple[bytes, int]:
        """This thread holds the write token: write ``batch`` joined (queued PUTs or CONFIRMs become
        one event: the broker pays per event). What the socket takes at once goes with the
        interpreter lock kept; with ``wait`` the rest is waited for with it released.
        Returns the data and how much of it was written.

        Raises:
            ConnectionLost: the write failed (the transport has failed; ``_writing`` is reset).
        """
        data = batch[0] if len(batch) == 1 else _codec.coalesce_events(batch)
        try:
            tls = self.tls
            if tls is None:
                sent = _send_now(self._fd, data)
                if wait and sent < len(data):
                    self._sock.sendall(memoryview(data)[sent:])  # type: ignore[union-attr]
                    sent = len(data)
            else:
                # The plaintext is consumed whole; encrypted bytes the socket does not take at
                # once wait in _tls_out for the next write (the writer thread's, woken for them).
                wire = tls.encrypt(data)
                if self._tls_out:
                    wire, self._tls_out = self._tls_out + wire, b""
                written = _send_now(self._fd, wire) if wire else 0
                if wait and written < len(wire):
                    self._sock.sendall(memoryview(wire)[written:])  # type: ignore[union-attr]
                    written = len(wire)
                self._tls_out = wire[written:]
                sent = len(data)
        except (OSError, TLSError) as e:
            with self._lock:
                self._writing = 0
                self._has_room.notify_all()  # the reader may be waiting to close the socket
            message = f"write to {self.address[0]}:{self.address[1]} failed: {e}"
            self._fail(ConnectionLost(message), e)
            raise ConnectionLost(message) from e
        return data, sent

    def _take(self) -> Tuple[List[bytes], int]:
        """Caller holds the lock and something is queued: the events at the front, up to
        _COALESCE_BYTES (at least one), and their size."""
        queue = self._queue
        batch = [queue.popleft()]
        size = len(batch[0])
        while queue and size + len(queue[0]) <= _COALESCE_BYTES:
            item = queue.popleft()
            batch.append(item)
            size += len(item)
        return batch, size

    def _write_loop(self) -> None:
        try:
            self._write_queued()
        except ConnectionLost:
            return  # the write failed: the transport has failed and given the token back
        except BaseException as e:  # noqa: B902 - a bug must not leave the token taken
            self._write_interrupted(e)
            raise

    def _write_queued(self) -> None:
        queue = self._queue
        ident = _get_ident()
        lingered = False
        while True:
            with self._lock:
                while ((not queue and not self._tls_out) or self._writing) and not self._closed:
                    wakeup = self._writer_wakeup = _codec.Latch()
                    self._lock.release()
                    try:
                        while not wakeup.wait(_IDLE_POLL):
                            pass
                    finally:
                        self._lock.acquire()
                    lingered = False
                if self._closed:
                    return
                if (self._linger and not lingered and queue and len(queue) < _SELF_FLUSH
                        and self._queued < _COALESCE_BYTES):
                    lingered = self._lingering = True
                    self._lock.release()  # the sending threads go on queueing meanwhile
                    try:
                        _sleep(self._linger)
                    finally:
                        self._lock.acquire()
                        self._lingering = False
                    continue  # look again: closed, written by a sending thread, or more queued
                lingered = False
                batch, size = self._take() if queue else ([b""], 0)  # else: TLS bytes left over
                self._writing = ident
            data, _ = self._write(batch, wait=True)
            with self._lock:
                self._writing = 0
                self._queued -= size  # what was queued: joining events made data shorter
                self.bytes_out += len(data)
                self._has_room.notify_all()

    # ---- reading ------------------------------------------------------------------
    def _read_loop(self) -> None:
        self._reader_ident = threading.get_ident()
        sock = self._sock
        assert sock is not None
        missed = 0
        next_check = 0.0
        woken: List[_codec.Latch] = []  # set by the next wait
        try:
            if self._tls_early:
                with self._read_lock:
                    early, self._tls_early = self._tls_early, b""
                    self._hand_up(self._frames.feed(early), woken)
            while True:
                interval = self._heartbeat_interval
                now = time.monotonic()
                if interval is None:
                    # Poll so that heartbeat settings made after negotiation take effect.
                    wait = _IDLE_POLL
                else:
                    if next_check == 0.0:
                        next_check = now + interval
                    elif now >= next_check:
                        next_check = now + interval
                        if self._received:
                            missed, self._received = 0, False
                        elif missed >= self._max_missed:
                            raise ConnectionLost(f"no traffic from the broker for {missed} heartbeat intervals")
                        else:
                            self.send_control(_codec.HEARTBEAT_REQ)
                            missed += 1
                    wait = max(0.0, next_check - now)
                ready = 0
                if not self._lead.locked():
                    if len(woken) > 1:
                        self._hold_wave(len(woken))
                    answer_due = len(self._blocked) > 1  # (with one, that poster reads: see _wait)
                    # A poster that takes the lead while this thread waits kicks it out (wait_for);
                    # one that took it before the flag was up saw none: look again.
                    self._lead.set_reader_waiting(True)
                    if not self._lead.locked():
                        if self._wave:
                            ready = self._wait(min(wait, _WAVE_WAIT), woken, answer_due, self._reader_epoll)
                            if self._wave:  # incomplete
                                self._release_wave()
                        else:
                            ready = self._wait(wait, woken, answer_due, self._reader_epoll)
                    self._lead.set_reader_waiting(False)
                if self._lead.locked():
                    # A poster reads in the reader's place (wait_for): reading too would race it
                    # for its answer (both sets hear of the socket's data, each has its kick).
                    # Wait, without the interpreter lock, until it is done and data is there
                    # (it may have left some): the next post need not hand this thread the
                    # interpreter lock as it lets go of it (see _codec.wait_lead_then_ready).
                    if woken:
                        _codec.set_latches(woken)
                    assert self._reader_epoll is not None  # posters take _lead only with epoll
                    ready = _wait_lead_then_ready(self._lead, self._reader_epoll.fileno(), self._fd,
                                                  min(max(wait, 0.01), 1.0))
                    if ready and self._lead.locked():
                        # A poster took the lead while this thread got the interpreter lock
                        # back: the data is its answer, for it to read.
                        ready = 0
                # A kick (without data) may mean that a thread reading in the reader's place
                # left data: look.
                if ready:
                    with self._read_lock:
                        # After a large read the broker is likely streaming: read again at once
                        # (waking those answered so far), sparing a wait.
                        while self._read_once(woken) >= _STREAMING_READ:
                            if woken:
                                _codec.set_latches(woken)
        except BaseException as e:  # noqa: B902 - whatever kills the reader must reach the owner
            self._read_failed(e)
        finally:
            _codec.set_latches(woken)  # answered before the failure: theirs are final
            writer = self._writer
            if writer is not None:
                writer.join(5.0)
            with self._lock:
                # A thread still inside a write holds the descriptor's number: closing it now
                # could let the number be reused and that write land elsewhere. The socket is
                # shut down, so such a write fails at once (the wait is bounded all the same).
                deadline = time.monotonic() + 5.0
                while self._writing and self._has_room.wait(max(0.0, deadline - time.monotonic())):
                    pass
            if self._epoll is not None:
                # The same for a thread reading in the reader's place: woken, it sees the
                # transport closed and stops; the reader then keeps _lead, so none starts again.
                os.eventfd_write(self._kick, 1)
                self._lead.acquire(5.0)
            with self._read_lock:
                self._read_closed = True
                sock.close()
                self._release_owner()
            if not self._blocked:
                self._close_wait_sets()
            # Else a thread in wait_for may still kick them (or have a latch kick one): the last
            # to leave closes them, so that no number is written after being reused.

    def _close_wait_sets(self) -> None:
        """The transport closed for good and no thread waits in :meth:`wait_for`: close the epoll
        sets and their kick eventfds (once; the last one out does it)."""
        with self._read_lock:
            sets = [(self._epoll, self._kick), (self._reader_epoll, self._reader_kick)]
            self._kick = self._reader_kick = -1
            for epoll, kick in sets:
                if kick >= 0:
                    epoll.close()  # type: ignore[union-attr]
                    os.close(kick)

    def _release_owner(self) -> None:
        """Caller holds _read_lock, the transport closed for good: drop the references back to
        its owner and to the threads' frames. A dead transport was in reference cycles (its
        callbacks are the Connection's bound methods, the Connection holds it; its failure's
        traceback holds the frames that hold it), freed only by a full collection of the cyclic
        garbage collector, rare in a long-lived process: each reconnect's transport, its 1 MiB
        receive mapping and what the failure's frames held stayed meanwhile (45 of them after
        12 minutes of the soak's faults). Now reference counting frees it with its Connection.
        """
        self._on_events = self._on_failure = _closed_callback
        seen: Set[int] = set()
        exc = self.failure
        while exc is not None and id(exc) not in seen:  # the chain keeps type and message
            seen.add(id(exc))
            exc.__traceback__ = None
            exc = exc.__cause__ or exc.__context__

    def _wait(self, timeout: float, woken: List[_codec.Latch], answer_due: bool,
              epoll: Optional["select.epoll"], lead: Optional[_codec.Lead] = None) -> int:
        """Set ``woken``'s latches once the interpreter lock is released, then wait up to
        ``timeout`` for the socket in ``epoll`` (the reader thread's set or the posters': see
        :meth:`connect`; None: with poll): READY_* bits (see _codec.wait_ready).

        ``answer_due``: a thread is blocked until an answer comes (for the reader thread: two or
        more, as one alone usually reads in its place). Then the first ``busy_poll`` seconds of
        the wait poll the socket without sleeping: an answer that comes meanwhile spares the
        wake-up of a sleeping thread (which costs about as much as the broker's whole answer:
        docs/performance-notes.md). Polling that keeps missing (a distant broker) pauses
        (see _POLL_MISSES). ``lead``: the caller's, released if the wait ends with nothing
        (READY_LEFT: see _codec.wait_ready).
        """
        if epoll is None:
            return _READY_SOCKET if _wait_readable(self._fd, timeout, woken) else 0
        spin = 0.0
        if answer_due and self._busy_poll:
            if self._poll_paused:
                self._poll_paused -= 1
            else:
                spin = self._busy_poll
        ready = _wait_ready(epoll.fileno(), self._fd, timeout, woken, spin, lead)
        if spin and not ready & _READY_HANDED:
            if ready & _READY_SPUN:
                self._poll_misses = 0
                self._poll_pause = _POLL_PAUSE_MIN
            else:
                self._poll_misses += 1
                if self._poll_misses >= _POLL_MISSES:
                    logger.debug("%r: busy polling pauses for %d waits (answers came after %g s of it)",
                                 self, self._poll_pause, spin)
                    self._poll_misses = 0
                    self._poll_paused = self._poll_pause
                    self._poll_pause = min(2 * self._poll_pause, _POLL_PAUSE_MAX)
        return ready

    def _read_once(self, woken: List[_codec.Latch]) -> int:
        """Caller holds _read_lock: read what the socket holds (-1: nothing) and hand up its
        whole events; the latches of threads they answered go to ``woken``.

        Raises:
            ConnectionLost: the broker closed the connection.
            OSError: the read failed.
        """
        size = _recv_now(self._fd, self._view)
        if size <= 0:
            if not size:
                raise ConnectionLost(f"{self.address[0]}:{self.address[1]} closed the connection")
            return size
        tls = self.tls
        if tls is not None:
            events = self._frames.feed(tls.decrypt(self._view[:size]))
        else:
            if not self.bytes_in:
                check_first_answer(self._view[:size], f"{self.address[0]}:{self.address[1]}")
            events = self._frames.feed(self._view[:size])
        self.bytes_in += size
        self.events_in += len(events)
        if events:
            # Only whole events prove the link alive (protocol §10): a stream stuck inside a
            # bogus length must still be detected as dead.
            self._received = True
        self._hand_up(events, woken)
        if tls is not None and tls.peer_closed:
            raise ConnectionLost(f"{self.address[0]}:{self.address[1]} closed the connection (TLS close_notify)")
        return size

    def _hand_up(self, events: List[bytes], woken: List[_codec.Latch]) -> None:
        """Caller holds _read_lock: answer heartbeats and hand ``events`` up in order."""
        # Consecutive events of one type go up together: the broker sends ACKs and PUSHes in
        # many small events, and the costs of handling one are then paid once per read rather
        # than once per event.
        on_events = self._on_events
        run: List[bytes] = []
        run_type = -1
        for event in events:
            event_type = event[4] & 0x3F
            if event_type == _HEARTBEAT_REQ_TYPE:
                self.send_control(_codec.HEARTBEAT_RSP)
            elif event_type == _HEARTBEAT_RSP_TYPE:
                self._probe_unanswered = False  # the broker hears this connection (check_heard)
            else:
                if event_type != run_type and run:
                    latches = on_events(run_type, run)
                    if latches:
                        woken += latches
                    run = []
                run_type = event_type
                run.append(event)
        if run:
            latches = on_events(run_type, run)
            if latches:
                woken += latches

    def wait_for(self, latch: Answer, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``latch`` (a blocking post's answer, or a post
        future's: see :class:`Answer`); True once set.

        Unless another thread waits too (or the caller is the reader thread, in a callback run
        as it hands up events), the caller reads the socket meanwhile in the reader
        thread's place, waiting in the posters' epoll set (polling it first: see _wait), so the
        ACK wakes this thread, not the reader thread that would then have to wake it (one
        context switch per post instead of two or three, each several microseconds). The
        reader thread waits for this one to finish meanwhile (out of its own set, kicked out
        if it was in: it would wake for this answer too). Events go up under _read_lock as the
        reader would hand them up. If the reader thread (or anyone) sets the latch, the kick
        eventfd of the posters' set wakes this thread. A failure read here fails the transport
        as on the reader thread, and this call goes on waiting. Anything else raised while
        reading (what a signal handler raised in the main thread, such as KeyboardInterrupt or
        an alarm's exception) may have come halfway through handing up events: it fails the
        transport too (the session reconnects and re-sends what is unanswered), then propagates.
        """
        blocked = self._blocked
        try:
            # Inside the try: a signal handler's exception comes after a call, so once the
            # append is made the finally pops it.
            blocked.append(None)  # from here until pop(), the wait sets stay open (_close_wait_sets)
            if self._epoll is None or len(blocked) > 1 or threading.get_ident() == self._reader_ident:
                return bool(latch.wait(timeout))
            deadline = time.monotonic() + timeout
            woken: List[_codec.Latch] = []
            leading: Optional[bool] = None  # not known yet: see the finally
            try:
                leading = self._lead.acquire()
                if not leading:
                    return bool(latch.wait(timeout))
                if self._read_closed:
                    return bool(latch.wait(timeout))
                if self._lead.reader_waiting():
                    os.eventfd_write(self._reader_kick, 1)  # out of its set: see _read_loop
                if self._wave:
                    self._release_wave()  # this post may be held, and nobody else waits to send
                if not latch.kick_to(self._kick):
                    leading = self._read_until(latch, deadline, woken)
            finally:
                if leading is None:
                    # An exception (a signal handler's) came as the lead was taken, before it
                    # was recorded: taken, it is this thread's (no other thread takes it while
                    # this one waits alone) unless the transport closed (its reader keeps it).
                    leading = self._lead.locked() and not self._closed
                # One call a step, each in a finally of the one before: an exception (a signal
                # handler's, after a call) skips none of the others. A lead left taken would
                # stop every read; an answered post's latch left unset, its poster.
                try:
                    if leading:
                        self._lead.release()
                finally:
                    try:
                        _codec.set_latches(woken)
                    finally:
                        latch.kick_to(-1)
            return bool(latch.wait(max(0.0, deadline - time.monotonic())))
        finally:
            blocked.pop()
            if self._read_closed and not blocked:
                self._close_wait_sets()  # the reader thread left them to the last waiter

    def _read_until(self, latch: Answer, deadline: float, woken: List[_codec.Latch]) -> bool:
        """Caller holds _lead: read in the reader thread's place until ``latch`` is answered.
        Returns whether the caller still holds the lead: a wait that ended with nothing let go
        of it before any Python code (a signal handler) could run, and taking it again may fail."""
        while not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            # Any wake-up reads: a kick may come from a thread that left data (below).
            ready = self._wait(min(remaining, _LEAD_SLICE), woken, True, self._epoll, self._lead)
            if ready & _READY_LEFT:
                # Signal handlers have run: take the lead again unless someone else has (or the
                # transport closed meanwhile), and kick the reader thread out of its set again.
                if self._closed or self._lead_done(latch, woken) or not self._lead.acquire():
                    return False
                if self._lead.reader_waiting():
                    os.eventfd_write(self._reader_kick, 1)
                continue
            if ready:
                failure: Optional[BaseException] = None
                with self._read_lock:
                    if self._read_closed:
                        return True
                    try:
                        while self._read_once(woken) >= _STREAMING_READ:
                            if self._lead_done(latch, woken):
                                # Answered (or no longer alone) amid a stream: more may be
                                # waiting, and no new edge comes for it: the reader reads on.
                                os.eventfd_write(self._reader_kick, 1)
                                return True
                    except BaseException as e:  # noqa: B902 - the transport fails as if the reader read it
                        failure = e
                if failure is not None:
                    if isinstance(failure, (Error, OSError)):
                        # The connection's failure (bad data, a broken socket): as on the reader
                        # thread; the post goes on waiting (re-sent after the reconnect).
                        # Outside _read_lock: the owner's failure handling may wait for the reader.
                        self._read_failed(failure)
                        return True
                    # Not the connection's: what a signal handler raised in this (main) thread
                    # (KeyboardInterrupt, an alarm's exception) or a bug, maybe halfway through
                    # handing up events. Drop the connection (the session reconnects and re-sends
                    # what is unanswered) and let the caller have it.
                    self._fail(ConnectionLost(f"reading from {self.address[0]}:{self.address[1]} was interrupted "
                                              f"({failure!r})"), failure)
                    raise failure
            if self._lead_done(latch, woken):
                return True
        return True

    def _lead_done(self, latch: Answer, woken: List[_codec.Latch]) -> bool:
        """Whether a thread reading in the reader's place stops: answered (a latch is in
        ``woken`` until set), or others wait too (see _blocked)."""
        return latch in woken or latch.is_set() or len(self._blocked) > 1

    def _read_failed(self, exc: BaseException) -> None:
        """A read or what it handed up failed (on the reader thread or a thread reading in its
        place): fail the transport, once."""
        cause = exc.__cause__
        if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
            exc, cause = ConnectionLost(f"read from {self.address[0]}:{self.address[1]} failed: {exc}"), exc
        self._fail(exc, cause)

    # ---- closing ------------------------------------------------------------------
    def _shutdown(self, failure: Optional[BaseException] = None) -> Optional[FailureHandler]:
        """Close the transport for good, once: the first caller gets the owner's failure
        handler (to call with ``failure``, recorded as :attr:`failure`), later ones None.

        The handler is taken under the lock, in the same step that closes: as soon as the
        transport is closed the reader thread may finish and release the owner (its callbacks
        become no-ops), possibly before a thread whose write failed has logged and reported
        the failure. That thread then reported nothing, and its session, never told, kept
        waiting for a connection already gone (posts answered TIMEOUT after ack_timeout)."""
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            self.failure = failure
            report = self._on_failure
            self._queue.clear()
            self._rouse_writer()
            self._has_room.notify_all()
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return report

    def _fail(self, exc: BaseException, cause: Optional[BaseException] = None) -> None:
        if cause is not None and exc.__cause__ is None:
            exc.__cause__ = cause
        report = self._shutdown(exc)
        if report is not None:
            # Before negotiation ends the connect attempt's caller gets the error itself.
            logger.log(logging.WARNING if self._negotiated else logging.INFO, "connection to %s:%s lost: %s",
                       self.address[0], self.address[1], exc)
            report(exc)

    def close(self) -> None:
        """Shut the connection down (idempotent); the threads exit promptly."""
        self._shutdown()

    def join(self, timeout: float) -> None:
        """Wait (bounded) for the threads to exit; no-op from one of them."""
        deadline = time.monotonic() + timeout
        for thread in (self._reader, self._writer):
            # Not started: connect() stopped between making and starting it (a Ctrl-C).
            if thread is not None and thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
