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
import socket
import threading
import time
from typing import Callable, Deque, List, Optional, Tuple

from . import _codec
from .exceptions import BandwidthLimitError, ConnectionError, ConnectionLost, InvalidURIError

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
# A coalescing send within this many seconds of the previous direct write goes to the writer
# thread: a stream of post_async() calls or confirms becomes few socket writes (one syscall costs
# more than building a small PUT), while the first of a burst is still written at once.
_BURST = 0.0002
# Queued events at which a coalescing send writes them all from its own thread (see send).
_SELF_FLUSH = 48
_HEARTBEAT_REQ_TYPE = _codec.EVENT_HEARTBEAT_REQ
_HEARTBEAT_RSP_TYPE = _codec.EVENT_HEARTBEAT_RSP
_counter = itertools.count(1)

EventHandler = Callable[[int, List[bytes]], Optional[List[_codec.Latch]]]
FailureHandler = Callable[[BaseException], None]


def parse_broker_address(broker: str) -> Tuple[str, int]:
    """``"tcp://host:port"`` (or ``"host:port"``) -> ``(host, port)``.

    Raises:
        InvalidURIError: not of that form: another scheme, a port that is not ASCII digits
            (``int()`` would take other scripts' digits) or outside 1..65535.
    """
    scheme, sep, text = broker.partition("://")
    if not sep:
        text = broker
    host, sep_port, port = text.rpartition(":")
    if (
        (sep and scheme != "tcp")
        or not sep_port
        or not host
        or "/" in host
        or not (port.isascii() and port.isdigit())
        or not 0 < int(port) < 65536
    ):
        raise InvalidURIError(f"bad broker address {broker!r}: expected the form 'tcp://HOST:PORT'")
    return host.strip("[]"), int(port)


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
    ) -> None:
        self.address = address
        self._on_events = on_events
        self._on_failure = on_failure
        self._high_watermark = high_watermark
        self._name = name or str(next(_counter))
        self._sock: Optional[socket.socket] = None
        self._fd = -1
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        # The writer thread waits on _not_empty: only then is a notify needed (Condition.notify
        # is Python code, and a stream of posts would pay it per message).
        self._writer_waiting = False
        self._has_room = threading.Condition(self._lock)
        self._queue: Deque[bytes] = collections.deque()
        self._queued = 0  # bytes queued or being written by the writer thread
        self._writing = False  # a thread is inside a socket write: the others queue
        self._last_direct = 0.0  # time.monotonic() after the last write from a sending thread
        self._closed = False
        # Traffic counters (bmq.Session.stats): bytes_out and high_watermark_wait under the lock,
        # the others by the reader thread alone.
        self.bytes_in = self.events_in = self.bytes_out = 0
        self.high_watermark_wait = 0.0
        self._heartbeat_interval: Optional[float] = None
        self._max_missed = 0
        self._reader: Optional[threading.Thread] = None
        self._writer: Optional[threading.Thread] = None

    def __repr__(self) -> str:
        return f"Transport({self.address[0]}:{self.address[1]}, name={self._name})"

    @property
    def closed(self) -> bool:
        """True once the connection failed or was closed."""
        return self._closed

    def connect(self, timeout: float) -> None:
        """Open the TCP connection and start the threads.

        Raises:
            ConnectionError: the broker cannot be reached (with host:port).
        """
        host, port = self.address
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ConnectionError(f"cannot connect to {host}:{port}: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        with self._lock:
            if self._closed:
                sock.close()
                raise ConnectionError(f"connection to {host}:{port} closed while connecting")
            self._sock = sock
            self._fd = sock.fileno()
        self._writer = threading.Thread(target=self._write_loop, name=f"bmq-writer-{self._name}", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=f"bmq-reader-{self._name}", daemon=True)
        self._writer.start()
        self._reader.start()

    def set_heartbeat(self, interval: float, max_missed: int) -> None:
        """Start dead-link detection: after ``max_missed`` silent intervals the connection
        fails with ConnectionLost; ``max_missed == 0`` only answers requests (protocol §10)."""
        self._max_missed = max_missed
        self._heartbeat_interval = interval if max_missed > 0 and interval > 0 else None

    # ---- writing ------------------------------------------------------------------
    def send(self, data: bytes, timeout: float, coalesce: bool = False) -> None:
        """Queue ``data`` for the socket, waiting while the queue is above the high watermark.

        Args:
            data: one or more whole events.
            timeout: seconds to wait for room.
            coalesce: nobody waits for this very write (an asynchronous post, a confirm): right
                after another write it goes to the writer thread, to share a socket write with
                what follows, unless 48 events are queued already: then this thread writes them
                (joined) and it. Otherwise it is written from this thread when nothing is queued.

        Raises:
            BandwidthLimitError: still no room after ``timeout``; nothing was queued.
            ConnectionLost: the connection is closed; nothing was queued.
        """
        size = len(data)
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
            if self._writing or self._closed or (
                    (queue or (coalesce and time.monotonic() - self._last_direct < _BURST))
                    and not (coalesce and len(queue) >= _SELF_FLUSH)):
                self._enqueue(data)
                return
            # Write from this thread: nothing is queued (a blocking post's latency pays no
            # hand-off), or a stream of coalescing sends has queued enough. The writer thread
            # needs the interpreter lock, which a thread that keeps posting holds: without this,
            # what is queued would wait for it while the broker idles.
            if queue:
                queue.append(data)
                self._queued += size
                batch, taken = self._take()
            else:
                batch, taken = [data], 0
            self._writing = True
        data, sent = self._write(batch, wait=False)
        with self._lock:
            self._writing = False
            self._last_direct = time.monotonic()
            self.bytes_out += sent
            self._queued -= taken
            if sent < len(data) and not self._closed:
                self._queue.appendleft(data[sent:] if sent else data)
                self._queued += len(data) - sent
            if self._queue and self._writer_waiting:
                self._not_empty.notify()
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
        self._queue.append(data)
        self._queued += len(data)
        if self._writer_waiting:
            self._not_empty.notify()

    def _write(self, batch: List[bytes], wait: bool) -> Tuple[bytes, int]:
        """This thread set ``_writing``: write ``batch`` joined (queued PUTs or CONFIRMs become
        one event: the broker pays per event). What the socket takes at once goes with the
        interpreter lock kept; with ``wait`` the rest is waited for with it released.
        Returns the data and how much of it was written.

        Raises:
            ConnectionLost: the write failed (the transport has failed; ``_writing`` is reset).
        """
        data = batch[0] if len(batch) == 1 else _codec.coalesce_events(batch)
        try:
            sent = _send_now(self._fd, data)
            if wait and sent < len(data):
                self._sock.sendall(memoryview(data)[sent:])  # type: ignore[union-attr]
                sent = len(data)
        except OSError as e:
            with self._lock:
                self._writing = False
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
        queue = self._queue
        while True:
            with self._lock:
                while (not queue or self._writing) and not self._closed:
                    self._writer_waiting = True
                    self._not_empty.wait()
                    self._writer_waiting = False
                if self._closed:
                    return
                self._writing = True
                batch, size = self._take()
            try:
                data, _ = self._write(batch, wait=True)
            except ConnectionLost:
                return
            with self._lock:
                self._writing = False
                self._queued -= size  # what was queued: joining events made data shorter
                self.bytes_out += len(data)
                self._has_room.notify_all()

    # ---- reading ------------------------------------------------------------------
    def _read_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        fd = self._fd
        frames = _codec.FrameReader()
        on_events = self._on_events
        # One reusable buffer: recv() would allocate (and the allocator map) 1 MiB per call.
        buffer = bytearray(_RECV_SIZE)
        view = memoryview(buffer)
        received = streaming = False
        missed = 0
        next_check = 0.0
        woken: List[_codec.Latch] = []  # set by the next wait_readable
        try:
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
                        if received:
                            missed, received = 0, False
                        elif missed >= self._max_missed:
                            raise ConnectionLost(f"no traffic from the broker for {missed} heartbeat intervals")
                        else:
                            self.send_control(_codec.HEARTBEAT_REQ)
                            missed += 1
                    wait = max(0.0, next_check - now)
                # After a large read the broker is likely streaming and more data waiting: read
                # first, sparing a select (a system call and an interpreter-lock hand-off). After
                # a small one (an ACK for a blocking post) wait first, sparing a read that finds
                # nothing.
                if streaming:
                    if woken:  # no wait comes before this read: wake them now
                        for latch in woken:
                            latch.set()
                        woken.clear()
                    size = _recv_now(fd, buffer)
                else:
                    size = -1
                if size < 0:
                    if not _wait_readable(fd, wait, woken):
                        continue
                    size = _recv_now(fd, buffer)
                    if size < 0:
                        continue
                streaming = size >= _STREAMING_READ
                if not size:
                    raise ConnectionLost(f"{self.address[0]}:{self.address[1]} closed the connection")
                events = frames.feed(view[:size])
                self.bytes_in += size
                self.events_in += len(events)
                if events:
                    # Only whole events prove the link alive (protocol §10): a stream stuck
                    # inside a bogus length must still be detected as dead.
                    received = True
                # Consecutive events of one type go up together: the broker sends ACKs and
                # PUSHes in many small events, and the costs of handling one are then paid once
                # per read rather than once per event.
                run: List[bytes] = []
                run_type = -1
                for event in events:
                    event_type = event[4] & 0x3F
                    if event_type == _HEARTBEAT_REQ_TYPE:
                        self.send_control(_codec.HEARTBEAT_RSP)
                    elif event_type != _HEARTBEAT_RSP_TYPE:
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
        except BaseException as e:  # noqa: B902 - whatever kills the reader must reach the owner
            if isinstance(e, OSError) and not isinstance(e, ConnectionError):
                e = ConnectionLost(f"read from {self.address[0]}:{self.address[1]} failed: {e}")
            self._fail(e, e.__cause__)
        finally:
            for latch in woken:  # answered before the failure: theirs are final
                latch.set()
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
            sock.close()

    # ---- closing ------------------------------------------------------------------
    def _shutdown(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self._queue.clear()
            self._not_empty.notify_all()
            self._has_room.notify_all()
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return True

    def _fail(self, exc: BaseException, cause: Optional[BaseException] = None) -> None:
        if cause is not None and exc.__cause__ is None:
            exc.__cause__ = cause
        if self._shutdown():
            logger.warning("connection to %s:%s lost: %s", self.address[0], self.address[1], exc)
            self._on_failure(exc)

    def close(self) -> None:
        """Shut the connection down (idempotent); the threads exit promptly."""
        self._shutdown()

    def join(self, timeout: float) -> None:
        """Wait (bounded) for the threads to exit; no-op from one of them."""
        deadline = time.monotonic() + timeout
        for thread in (self._reader, self._writer):
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
