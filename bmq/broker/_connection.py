"""One client connection (reader and writer threads) and the broker's timer thread.

The reader hands the complete events of each ``recv`` to the broker (``Broker._handle_events``,
which also sends the ACKs of that chunk). Outgoing bytes go straight into the socket when
nothing is queued before them and the socket takes them without blocking; otherwise into a
queue that the writer thread drains, so a client that does not read slows down only itself.

Thread-safety: see each class.
"""
from __future__ import annotations

import collections
import fcntl
import heapq
import itertools
import logging
import socket
import ssl
import struct
import termios
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

from .. import _codec
from .._tls import TLSChannel
from ..exceptions import ProtocolError, TLSError
from ._queues import QueueHandle

if TYPE_CHECKING:  # pragma: no cover
    from ._server import Broker

__all__ = ["ClientSession", "Scheduler", "shutdown_socket"]

logger = logging.getLogger(__name__)

_OUTGOING_HIGH_WATERMARK = 64 * 1024 * 1024
_RECV_SIZE = 256 * 1024
# A client that starts no TLS handshake in this time (a plaintext client waiting for an answer)
# is dropped.
_TLS_HANDSHAKE_TIMEOUT = 10.0


class Scheduler:
    """A single timer thread running callables at given times (heartbeats, delays).

    Thread-safety: ``call_later`` and ``stop`` may be called from any thread.
    """

    def __init__(self) -> None:
        self._heap: List[Tuple[float, int, Callable[..., Any], tuple]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="bmq-broker-timer", daemon=True)
        self._thread.start()

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), fn, args))
            self._cond.notify()

    def stop(self, timeout: float) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, fn, args = heapq.heappop(self._heap)
            try:
                fn(*args)
            except Exception:  # a timer callback must never kill the timer thread
                logger.exception("broker timer callback %r failed", fn)


class ClientSession:
    """One client connection as the broker sees it.

    Attributes:
        id: broker-wide client number (used by :class:`~bmq.broker.Faults`).
        peer: ``"host:port"`` of the client.
        client_identity: the ClientIdentity the client negotiated with (JSON-shaped dict;
            empty until negotiation).

    Thread-safety: ``send``/``close``/``pause_reading``/``resume_reading`` are safe from
    any thread; the rest is used by the session's reader thread under the broker lock.
    """

    def __init__(self, broker: "Broker", sock: socket.socket, peer: str, session_id: int,
                 tls: Optional[ssl.SSLContext] = None) -> None:
        self.id = session_id
        self.peer = peer
        self.client_identity: Dict[str, Any] = {}
        self.encoding = _codec.ENCODING_JSON
        self.negotiated = False
        self.admin = False  # negotiated as an admin client (E_TCPADMIN): admin commands only
        self.disconnected = False
        self.guid_generating = False
        self.reads_new_properties = True
        self.handles: Dict[int, QueueHandle] = {}
        self.closed_queue_ids: Set[int] = set()
        # Liveness as bmqbrkr judges it: any bytes from the client count, also bytes the reader
        # has not got to yet because it is busy (see Broker._heartbeat_tick).
        self.alive = True  # the reader received something since the last heartbeat check
        self.unread_at_check = 0  # bytes waiting in the kernel at the last heartbeat check
        self.reader_busy = False  # the reader is handling what it read, not waiting in recv()
        self.authenticated = False
        self.auth_mechanism: Optional[str] = None  # as the client first spelled it
        self._authentications = 0  # successful authentications so far (a lifetime's generation)
        # ACKs of the PUTs read in one recv(), sent as one ACK event (see _flush_acks).
        self.pending_acks: List[Tuple[int, int, bytes, int]] = []
        self.missed_heartbeats = 0
        self._broker = broker
        self._sock = sock
        # With TLS, what is sent is encrypted under _lock as it is queued or written, so the
        # order of the encrypted records is the order in which the bytes reach the socket.
        self._tls = TLSChannel(tls, server_side=True, peer=peer) if tls is not None else None
        self._frames = _codec.FrameReader(broker.max_event_size)
        self._out: collections.deque = collections.deque()
        self._out_bytes = 0
        # A plain lock entered directly ("with self._lock") on the hot path; the condition on it
        # wakes the writer and senders waiting below the high watermark.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Some thread is writing to the socket (the writer, or a sender writing directly):
        # nobody else may write until it is done, so that bytes keep their order.
        self._writing = False
        self._closing = False
        self._withheld: List[bytes] = []
        self._reading = threading.Event()
        self._reading.set()
        self._reader = threading.Thread(target=self._read_loop, name=f"bmq-broker-read-{session_id}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"bmq-broker-write-{session_id}", daemon=True)

    def __repr__(self) -> str:
        return f"<ClientSession {self.id} {self.peer}>"

    def start(self) -> None:
        """Start this client's reader and writer threads (broker-internal)."""
        # Writer first: the reader's exit path joins it.
        self._writer.start()
        self._reader.start()

    @property
    def is_open(self) -> bool:
        """False once the connection is being closed (by either side)."""
        return not self._closing

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for each of this client's threads to end."""
        for thread in (self._reader, self._writer):
            if thread is not threading.current_thread() and thread.ident is not None:
                thread.join(timeout)

    # ---- output ----------------------------------------------------------------------
    def send(self, data: bytes, block: bool = False) -> bool:
        """Send ``data`` in order with everything sent before; False if the session is closing.

        When nothing is queued or being written, the calling thread writes ``data`` itself as
        far as the socket takes it without blocking (no hand-off to the writer thread, the
        common case); what is left is queued for the writer.

        ``block`` (only for the session's own reader) waits while the client is above the
        outgoing high watermark, so a client that does not read slows only itself.
        """
        with self._lock:
            if block:
                while self._out_bytes > _OUTGOING_HIGH_WATERMARK and not self._closing:
                    self._cond.wait(1.0)
            if self._closing:
                return False
            if self._tls is not None:
                try:
                    data = self._tls.encrypt(data)
                except TLSError:
                    return False  # the connection failed: its reader is closing it
            if self._writing or self._out:
                self._out.append(data)
                self._out_bytes += len(data)
                self._cond.notify_all()
                return True
            self._writing = True
        try:
            sent = self._sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            sent = len(data)  # dropped with the connection
            logger.debug("client %s: write failed: %s", self.peer, exc)
            self.close()
        with self._lock:
            self._writing = False
            if sent < len(data):
                rest = data[sent:]
                self._out.appendleft(rest)  # before anything queued meanwhile
                self._out_bytes += len(rest)
            if self._out or self._closing:
                self._cond.notify_all()
        return True

    def _write_loop(self) -> None:
        sock = self._sock
        while True:
            with self._lock:
                # A direct write in progress owns the socket even when closing: wait for it.
                while self._writing or (not self._out and not self._closing):
                    self._cond.wait()
                if not self._out:
                    break
                chunks = list(self._out)
                self._out.clear()
                self._out_bytes = 0
                self._writing = True
                self._cond.notify_all()
            try:
                sock.sendall(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            except OSError as exc:
                logger.debug("client %s: write failed: %s", self.peer, exc)
                self.close()
                break
            finally:
                with self._lock:
                    self._writing = False
        shutdown_socket(sock)

    def close(self, flush: bool = False) -> None:
        """Close the connection; with ``flush`` after sending what is already queued."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            if not flush:
                self._out.clear()
                self._out_bytes = 0
            self._cond.notify_all()
        self._reading.set()
        if not flush:
            shutdown_socket(self._sock)

    def authenticate(self, refused: bool, mechanism: str) -> int:
        """Record the outcome of an AuthenticationRequest; the generation of a success."""
        if self.auth_mechanism is None:
            self.auth_mechanism = mechanism
        if not refused:
            self.authenticated = True
            self._authentications += 1
        return self._authentications

    def expire_authentication(self, generation: int) -> None:
        """The lifetime of authentication ``generation`` is over: close unless renewed since."""
        if self._authentications == generation and self.is_open:
            logger.info("client %s: credential expired without re-authentication, closing", self.peer)
            self.close()

    def send_then_close(self, data: bytes) -> None:
        """Send ``data`` (e.g. a refusal), then close the connection."""
        self.send(data)
        self.close(flush=True)

    def heard_since_last_check(self) -> bool:
        """Whether the client sent bytes since the previous call (the heartbeat timer's), as
        bmqbrkr counts it: bytes the reader received, or bytes still waiting in the kernel
        because the reader is busy handling an earlier read."""
        try:
            unread = struct.unpack("i", fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        except (OSError, ValueError):  # a closed socket: its reader sees the end
            unread = 0
        heard = self.alive or unread != self.unread_at_check
        self.alive = False
        self.unread_at_check = unread
        return heard

    # ---- fault hooks -------------------------------------------------------------------
    def pause_reading(self) -> None:
        """Stop reading this client's socket, so TCP backpressure builds (a fault)."""
        self._reading.clear()

    def resume_reading(self) -> None:
        """Read this client's socket again after :meth:`pause_reading`."""
        self._reading.set()

    def withhold(self, ack_event: bytes) -> None:
        """Keep ``ack_event`` back until :meth:`release_acks` (a fault)."""
        with self._cond:
            self._withheld.append(ack_event)

    def release_acks(self) -> int:
        """Send every withheld ACK event; return how many there were."""
        with self._cond:
            withheld, self._withheld = self._withheld, []
        for event in withheld:
            self.send(event)
        return len(withheld)

    # ---- input -----------------------------------------------------------------------
    def _read_loop(self) -> None:
        sock = self._sock
        tls = self._tls
        try:
            if tls is not None:
                tls.handshake(sock, _TLS_HANDSHAKE_TIMEOUT)
                sock.settimeout(None)
                logger.debug("client %s: %s, %s", self.peer, tls.version, tls.cipher)
                # The read that finished the handshake may have brought the client's first
                # records too (it writes right after its Finished): they are in the channel.
                early = self._frames.feed(tls.decrypt(b""))
                if early:
                    self._broker._handle_events(self, early)
            while True:
                if not self._reading.is_set():
                    self._reading.wait()
                if self._closing:
                    break
                data = sock.recv(_RECV_SIZE)
                if not data:
                    break
                self.alive = True
                self.reader_busy = True
                events = self._frames.feed(data if tls is None else tls.decrypt(data))
                self._broker._handle_events(self, events)
                self.reader_busy = False
        except ProtocolError as exc:
            logger.warning("client %s sent a malformed frame, closing its connection: %s", self.peer, exc)
        except (TLSError, TimeoutError) as exc:  # TLSError before OSError: it is one
            logger.warning("client %s: %s; closing its connection", self.peer, exc)
        except OSError as exc:
            logger.debug("client %s: read failed: %s", self.peer, exc)
        except Exception:  # a broker bug must cost one connection, not the broker
            logger.exception("client %s: internal error, closing its connection", self.peer)
        finally:
            self.close(flush=True)
            self._writer.join(5.0)
            try:
                sock.close()
            except OSError:
                pass
            self._broker._session_gone(self)


def shutdown_socket(sock: socket.socket) -> None:
    """Shut both directions down, waking any thread blocked on ``sock``; errors ignored."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
