"""The Session: connection life cycle, control requests, queue registry, PUT retention and HA.

Threads (DESIGN.md): callers build PUT events themselves and hand them to the transport's
writer; the transport's reader resolves futures and fills queue inboxes; the dispatcher
runs user callbacks; the supervisor reconnects, reopens queues, retransmits and expires ACKs.
"""
from __future__ import annotations

import itertools
import logging
import ssl
import threading
import time
import warnings
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, cast

from . import _codec, _schema
from . import events as ev
from ._deliveries import Deliveries
from ._dispatch import Dispatcher, EventQueue, fail_future
from ._handles import QueueHandles
from ._options import QueueOptions, SessionOptions, _compression
from ._outbox import Outbox, OutboxRecord
from ._puts import PendingPuts, PostRequest, Record
from ._connection import BrokerAddresses, Connection, Endpoint, client_identity
from ._queue import Queue
from ._recovery import Recovery, SessionServices
from ._state import ConnectionState
from ._registry import QueueRegistry
from ._stats import SessionStats
from ._telemetry import Telemetry
from ._requests import ControlRequests, Request
from ._types import (Ack, AckStatus, CompressionAlgorithmType, Message, MessageBatch, QUEUE_OPEN, QUEUE_PENDING,
                     QueueState, SessionState)
from ._uri import parse_uri
from .exceptions import ConnectionError as BmqConnectionError
from .exceptions import (
    BrokerError,
    ClosedByBroker,
    ConnectionLost,
    Error,
    InvalidArgumentError,
    OutboxError,
    QueueStateError,
    SessionClosedError,
    TimeoutError,
    TLSError,
)

__all__ = ["Session"]

logger = logging.getLogger(__name__)

# Waiting for an ACK blocks a little longer than ack_timeout: the supervisor resolves the
# future as TIMEOUT at ack_timeout, so the caller sees that rather than a bare TimeoutError.
_ACK_WAIT_MARGIN = 5.0
_EVENT_BACKLOG = 10000
_session_ids = itertools.count(1)
# An enum member read through its class costs ~50 ns on 3.11: the post path compares the
# (singleton) members it binds here by identity.


class QueueServices:
    """What a :class:`Queue` asks of its Session, by name (the Session's own methods stay private):
    bound methods, so a post pays no extra call."""

    __slots__ = ("session", "post", "ack_wait_limit", "configure", "close", "dispatch")

    def __init__(self, session: "Session") -> None:
        self.session = session
        self.post = session._post
        self.ack_wait_limit = session._ack_wait_limit
        self.configure = session._configure_queue
        self.close = session._close_queue
        self.dispatch = session._dispatcher.submit  # not session._dispatch: one call per delivery, not two


class Session:
    """A connection to a BlazingMQ broker: open queues, post, consume, confirm.

    Connects (and negotiates) in the constructor; use it as a context manager or call
    :meth:`stop`. A lost connection is re-established per ``options.reconnect``: queues are
    reopened with their last options and unacknowledged posts are re-sent with their original
    GUIDs (the broker de-duplicates), so a disconnect is invisible to callers.

    Several addresses (proxies in front of one cluster, say) make the session fail over: it
    connects to the first that answers, in the order given, and after a lost connection tries
    the next ones at once (the one just lost last), backing off per ``options.reconnect`` only
    once every address has failed. A host name that resolves to several IP addresses counts as
    each of them. Re-sent PUTs keep their GUIDs, so a cluster de-duplicates them whichever
    address they come through. :attr:`broker` names the address in use; ``Connected`` and
    ``Reconnected`` events and :meth:`stats` say it too.

    Args:
        broker: ``"tcp://host:port"``, or a sequence of them in order of preference.
        options: :class:`bmq.SessionOptions`; defaults when None. ``connect_timeout`` bounds
            each address's connect + negotiation.
        on_event: shorthand for ``SessionOptions(on_event=...)``.

    Raises:
        InvalidURIError: a malformed address.
        InvalidArgumentError: an empty list.
        ConnectionError: no address can be reached (the message names each and its error).
        ClosedByBroker, AuthenticationError: a broker answered and refused the session.
        TLSError: with ``options.tls``, the handshake failed (a certificate that did not
            verify, named; this client's refused; a plaintext endpoint), or TLS was met
            without it.
        TimeoutError: with one address, connect + negotiation took longer than ``connect_timeout``.
        OutboxError: ``options.outbox_dir`` cannot be used (names it and the OS reason).

    Thread-safety: every method may be called from any thread, including from callbacks
    (on_message, on_ack, on_event run on the dispatcher thread and may call any method,
    :meth:`stop` included).
    """

    def __init__(
        self,
        broker: Union[str, Sequence[str]] = "tcp://localhost:30114",
        options: Optional[SessionOptions] = None,
        *,
        on_event: Optional[Callable[[ev.SessionEvent], None]] = None,
    ) -> None:
        self.options = options = options or SessionOptions()
        self.brokers = BrokerAddresses(broker)
        """The configured broker addresses (``configured``: the strings given, in order)."""
        first = self.brokers.first
        # Off: the hot paths test this for None and nothing of OpenTelemetry is imported.
        self._telemetry = Telemetry(first.host, first.port) if options.opentelemetry else None
        self._compression = cast(CompressionAlgorithmType, options.compression).value  # the default, per post
        self._id = next(_session_ids)
        self._guids = _codec.GuidGenerator(self._id)
        self._requests = ControlRequests()
        self._queues = QueueRegistry()
        self._stopped = threading.Event()
        self._recovered: Dict[str, List[OutboxRecord]] = {}
        # Before any thread starts: an unusable outbox_dir (OutboxError) must leave nothing running.
        outbox = None
        if options.outbox_dir is not None:
            outbox = Outbox(options.outbox_dir, fsync=options.outbox_fsync)
            for item in outbox.pending():
                self._recovered.setdefault(item.queue_uri, []).append(item)
        # The PUT path owns the outbox from here on (appends, removes, closes it).
        self._puts = PendingPuts(options, self._dispatch, outbox)
        # The state machine: session state, current connection, the PUT path's transport.
        self._link = ConnectionState(self._puts, first, self._on_adopt)
        self._lock = self._link.lock  # the session's units keep their state in step under it
        self._dispatcher = Dispatcher(
            f"bmq-dispatcher-{self._id}",
            options.event_queue_high_watermark,
            options.event_queue_low_watermark,
            self._on_slow_consumer,
        )
        # Whatever stops the start from here (a failed connect, a Ctrl-C), the except below stops
        # every thread started and closes the outbox and the connection (the caller never gets
        # the session to stop).
        conn: Optional[Connection] = None
        try:
            self._dispatcher.start()
            self._events = EventQueue(self._dispatcher, on_event or options.on_event, _EVENT_BACKLOG)
            self._queue_services = QueueServices(self)
            self._handles = QueueHandles(self._call, self._lock, self._queues)
            self._deliveries = Deliveries(self, self._queues, self._lock, options.channel_write_timeout,
                                          self._telemetry, lambda text: self._events.emit(ev.Error(text)))
            self.outbox_recovered = sum(map(len, self._recovered.values()))
            """Messages found unacknowledged in ``outbox_dir`` at start; each is re-sent (with its
            GUID) when its queue is opened for writing."""
            services = SessionServices(self._id, options, self.brokers, self._connect, self._forget_queue,
                                       self._dispatch, self.stats, self.stop)
            self._recovery = Recovery(self._link, self._requests, self._queues, self._handles, self._puts,
                                      self._events, services)
            conn = self._connect(options.connect_timeout)
            self._link.adopt(conn)
            self._link.restored(conn)
            self._recovery.start()
            monitor = options.host_health_monitor
            if monitor is not None:
                self._handles.host_healthy = monitor.healthy
                monitor.add_listener(self._on_host_health)
            self._events.emit(ev.Connected(address=self.broker))
        except BaseException:
            adopted = self._link.current
            self._link.finish_stop()  # the supervisor and the ACK timer, if started, exit
            for made in {conn, adopted} - {None}:
                made.close()  # type: ignore[union-attr]
            if options.host_health_monitor is not None:
                options.host_health_monitor.remove_listener(self._on_host_health)
            self._dispatcher.stop()
            self._puts.close()
            self._stopped.set()
            raise

    @property
    def broker(self) -> str:
        """The broker address in use (``tcp://HOST:PORT``): that of the current connection, or
        of the last one while reconnecting (the first configured before any)."""
        return self._link.endpoint.address

    def __repr__(self) -> str:
        brokers = self.brokers.configured
        return f"Session({brokers[0] if len(brokers) == 1 else list(brokers)!r}, state={self._link.state})"

    def __enter__(self) -> "Session":
        self._check_running()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # ---- connection -----------------------------------------------------------------
    def _connect(self, timeout: float, after: Optional[Endpoint] = None) -> Connection:
        """Connect and negotiate a new connection (not yet adopted) to the first address of
        :meth:`BrokerAddresses.rotation` that answers, ``timeout`` seconds for each.

        Raises:
            The one address's error; with several, the first refusal by a broker that answered
            (ClosedByBroker, AuthenticationError), else a ConnectionError naming every failure.
        """
        failures: List[Tuple[Endpoint, BaseException]] = []
        for endpoint in self.brokers.rotation(after):
            try:
                return self._connect_to(endpoint, timeout)
            except (Error, OSError) as exc:
                if isinstance(exc, SessionClosedError):
                    raise
                failures.append((endpoint, exc))
                if len(self.brokers) > 1:
                    logger.info("cannot connect to %s: %s", endpoint.address, exc)
        if len(failures) == 1:
            raise failures[0][1]
        refused = [exc for _, exc in failures
                   if isinstance(exc, (ClosedByBroker, TLSError)) or not isinstance(exc, OSError)]
        if refused:
            raise refused[0]
        detail = "; ".join(f"{endpoint.address}: {exc}" for endpoint, exc in failures)
        raise BmqConnectionError(f"cannot connect to any of {len(failures)} broker addresses: {detail}") \
            from failures[-1][1]

    def _connect_to(self, endpoint: Endpoint, timeout: float) -> Connection:
        conn = Connection((endpoint.host, endpoint.port), self.options.channel_high_watermark, f"{self._id}",
                          self._puts.handle_acks, self._deliveries.handle_push, self._handle_control,
                          self._recovery.connection_lost, self.options.busy_poll, endpoint,
                          cast(Optional[ssl.SSLContext], self.options.tls))  # __post_init__ made it one
        with self._link.connecting(conn):  # so that stop() can abort a slow negotiation
            conn.establish(client_identity(self._id, self._guids, self.options.user_agent), endpoint.address,
                           timeout, self.options.credential)
        logger.info("connected to %s (session %d)", endpoint.address, self._id)
        return conn

    def _on_adopt(self, conn: Connection) -> None:
        """Under the state machine's lock, with every connection adopted."""
        if conn.endpoint is not None and self._telemetry is not None:
            self._telemetry.connected_to(conn.endpoint.host, conn.endpoint.port)
        if self.options.credential is not None:
            conn.keep_authenticated(self.options.credential, self.broker, self.options.connect_timeout,
                                    lambda exc: self._events.emit(ev.AuthenticationFailed(str(exc))))

    # ---- events ---------------------------------------------------------------------
    def _on_slow_consumer(self, slow: bool) -> None:
        self._events.emit(ev.SlowConsumerHighWaterMark() if slow else ev.SlowConsumerNormal())

    def _dispatch(self, fn: Callable[..., Any], *args: Any) -> None:
        self._dispatcher.submit(fn, *args)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the dispatcher thread, after the callbacks already queued there
        (messages, acks, events), never at the same time as another callback. What it raises is
        logged, as for any callback.

        Args:
            fn: the function to run.
            args: its arguments.

        Raises:
            SessionClosedError: the session is stopped (nothing would run it).

        Thread-safety: any thread, callbacks included.
        """
        self._check_running()
        self._dispatcher.submit(fn, *args)

    def next_event(self, timeout: Optional[float] = None) -> Optional[ev.SessionEvent]:
        """The oldest session event not yet returned, or None after ``timeout`` seconds.

        Events are also given to ``on_event``; this queue keeps the last 10,000. A stopped
        session still hands out the events it has left (ending with ``Disconnected``), then
        raises, like :meth:`bmq.Queue.get` on a closed queue; :meth:`stop` wakes waiters.

        Args:
            timeout: seconds to wait; None waits until an event arrives or the session stops.

        Raises:
            SessionClosedError: the session has stopped and no event is left.

        Thread-safety: any thread; each event goes to one caller.
        """
        event = self._events.next(timeout)
        if event is None and self._events.closed:
            raise SessionClosedError(f"session to {self.broker} is stopped and has no event left")
        return event

    # ---- control requests -------------------------------------------------------------
    def _check_running(self) -> None:
        self._link.check_running()

    def _request(self, body: Dict[str, Any], *, buffered: bool, stopping: bool = False,
                 queue: Optional[Queue] = None, future: "Optional[Future[Dict[str, Any]]]" = None) -> Request:
        """Send a control request; its future (``future`` if given) gets the response message
        or a BrokerError. Only ``stopping`` requests (the Disconnect) may be sent by a stopping
        session; ``queue``: the queue a ConfigureStream is for."""
        with self._lock:
            if not (stopping and self._link.state == SessionState.STOPPING):
                self._check_running()
            conn = self._link.current
            if conn is None and not buffered:
                raise ConnectionLost(f"not connected to {self.broker}")
            request = self._requests.add(body, buffered, queue, future)
        if conn is not None:
            try:
                conn.transport.send_control(request.data)
            except ConnectionLost:
                pass  # buffered: re-sent on reconnect; else failed by the failure path
        return request

    def _call(
        self, body: Dict[str, Any], timeout: float, what: str, *, buffered: bool = True, stopping: bool = False,
        queue: Optional[Queue] = None,
    ) -> Dict[str, Any]:
        future: "Future[Dict[str, Any]]" = Future()
        try:
            self._request(body, buffered=buffered, stopping=stopping, queue=queue, future=future)
            return future.result(timeout)
        except BaseException as e:
            # Given up on, for its time or for another reason (a Ctrl-C, even before _request
            # returned): a buffered request is not re-sent after a reconnect, its answer ignored.
            with self._lock:
                self._requests.discard(future)
            if not isinstance(e, FutureTimeoutError):
                raise
            error = TimeoutError(f"{what}: no response from {self.broker} within {timeout:g} s")
            if not stopping:
                self._replace_connection(str(error))
            raise error from None

    def _handle_control(self, event: bytes) -> None:
        message, _ = _schema.decode_event(event, "control")
        with self._lock:
            request = self._requests.take(message)
        if request is None:
            logger.info("ignoring control message without a pending request: %s", sorted(message))
            return
        ControlRequests.settle(request, message)

    # ---- queues -----------------------------------------------------------------------
    def open_queue(
        self,
        uri: str,
        *,
        read: bool = False,
        write: bool = False,
        options: Optional[QueueOptions] = None,
        on_message: Optional[Callable[[Message], None]] = None,
        timeout: Optional[float] = None,
        batches: bool = False,
    ) -> Queue:
        """Open a queue (OpenQueue, then ConfigureStream for readers) and return its handle.

        Args:
            uri: ``bmq://domain/queue``, with ``?id=appId`` for a fan-out reader.
            read: receive messages (pull with :meth:`Queue.get`, or push with ``on_message``).
            write: post messages.
            options: :class:`bmq.QueueOptions` (defaults when None).
            on_message: push mode: called with each :class:`bmq.Message` on the dispatcher thread.
            timeout: seconds; default ``open_queue_timeout``.
            batches: pull mode in batches: messages arrive as :class:`bmq.MessageBatch`
                objects, taken with :meth:`Queue.get_batch` (no Python object per message: the
                fastest way to consume, e.g. into Arrow); needs ``read`` and no ``on_message``.
                Such messages get no OpenTelemetry consumer span.

        Returns:
            The open :class:`bmq.Queue`.

        Raises:
            InvalidURIError: bad URI syntax.
            InvalidArgumentError: neither read nor write, a writer with ``?id=``,
                ``on_message`` without read, or ``batches`` without read or with ``on_message``.
            QueueStateError: this URI is already open (or being opened) in this session with other
                flags, options, ``on_message`` or ``batches`` (the message names the difference);
                or its open, under way in another thread, failed. With the same ones, the call
                waits for that open and returns the same handle.
            BrokerError: the broker refused.
            TimeoutError: no answer within ``timeout``.
            SessionClosedError: the session is stopped.
        """
        parsed = parse_uri(uri)
        if not (read or write):
            raise InvalidArgumentError("open_queue needs read=True and/or write=True")
        if write and parsed.app_id is not None:
            raise InvalidArgumentError(f"{uri}: a queue with '?id=' can only be opened for reading")
        if on_message is not None and not read:
            raise InvalidArgumentError("on_message needs read=True")
        if batches and (not read or on_message is not None):
            raise InvalidArgumentError("batches=True needs read=True and no on_message")
        timeout = self.options.open_queue_timeout if timeout is None else timeout
        if on_message is not None and self._telemetry is not None:
            on_message = self._telemetry.wrap_on_message(on_message)
        queue_options = options or QueueOptions()
        wanted: Dict[str, Any] = {"read": read, "write": write, "options": queue_options, "on_message": on_message,
                                  "batches": batches}
        queue = Queue(self._queue_services, parsed, read=read, write=write, options=queue_options,
                      on_message=on_message, queue_id=-1, sub_id=0, batches=batches)  # ids: register
        queue.opened_with = wanted
        try:
            with self._lock:
                self._check_running()
                existing = self._queues.get(uri)
                if existing is None:
                    self._queues.register(queue)
            if existing is not None:
                return self._join_open(existing, wanted, timeout)
            deadline = time.monotonic() + timeout
            generation = self._link.generation
            try:
                self._handles.open(queue, timeout, buffered=True)
            except BrokerError:
                if self._link.generation == generation:
                    raise
                # Reconnected between OpenQueue and ConfigureStream: the new connection never
                # saw the open, so start over on it.
                self._handles.open(queue, max(0.0, deadline - time.monotonic()), buffered=True)
            with self._lock:
                if queue.state == QueueState.OPENING:
                    queue.state = QueueState.OPEN if self._link.current is not None else QueueState.PENDING
                queue.opened.set()
        except BaseException as e:
            # An open that did not finish: whatever came between (an exception from a signal
            # handler, a Ctrl-C, included) the queue is not left registered, else every later
            # open of its URI would wait for this one.
            if not queue.opened.is_set():
                self._abandon_open(queue, e)
            raise
        logger.info("opened %s", queue)
        if write and self._recovered:
            self._resend_recovered(queue)
        return queue

    def _abandon_open(self, queue: Queue, error: BaseException) -> None:
        """Forget ``queue``, whose open did not finish with ``error`` (its other openers are
        told it failed), and if it had gone as far as the wire, see :meth:`_after_unfinished`."""
        with self._lock:
            registered = self._queues.get(queue.uri) is queue
        self._forget_queue(queue, AckStatus.CANCELED)  # marked closed: its other openers wake
        if registered:
            self._after_unfinished(f"open_queue({queue.uri!r})", error)

    def _after_unfinished(self, what: str, error: BaseException) -> None:
        """``what``, a sequence of requests for a queue handle (open, configure, close), ended
        with ``error`` before its end. A bmq error says where the two sides stand (the broker
        refused, the connection is gone, or the wait timed out: :meth:`_call` replaced the
        connection); anything else (a Ctrl-C while waiting for the broker's answer) leaves the
        broker acting on requests this side gave up on: a handle open, or subscriptions, that
        this side forgot, holding messages nobody takes or confirms. Replace the connection."""
        if not isinstance(error, Error):
            self._replace_connection(f"{what} stopped by {type(error).__name__} before its end")

    def _replace_connection(self, reason: str) -> None:
        """The broker may act, or have acted, on a request this side gave up on (an open, a
        close, options): the two would disagree for good. Replace the connection, as the C++
        SDK does when an open or close times out; the reconnect reopens every queue with what
        this side knows."""
        with self._lock:
            conn = self._link.current
        if conn is not None:
            logger.warning("%s; replacing the connection", reason)
            self._recovery.replace(conn, ConnectionLost(reason))

    def _join_open(self, queue: Queue, wanted: Dict[str, Any], timeout: float) -> Queue:
        """``open_queue`` of a URI open or being opened in this session: the same handle once
        its open is done, if asked with the same arguments.

        Raises:
            QueueStateError: other arguments (named), or the open under way failed.
            TimeoutError: the open under way took longer than ``timeout``.
        """
        have = dict(queue.opened_with, options=queue.options)
        differences = [f"{name}={have[name]!r} (asked: {value!r})" for name, value in wanted.items()
                       if (have[name] is not value if name == "on_message" else have[name] != value)]
        if differences:
            raise QueueStateError(f"{queue.uri} is already open in this session with {', '.join(differences)}: "
                                  f"open it with the same arguments to share that handle, or close it first")
        if not queue.opened.wait(timeout):
            raise TimeoutError(f"open_queue({queue.uri!r}): its open under way in another thread took longer than "
                               f"{timeout:g} s")
        if queue.state in (QueueState.OPEN, QueueState.PENDING):
            return queue
        self._check_running()
        raise QueueStateError(f"{queue.uri}: its open under way in another thread failed")

    def _lookup(self, uri: str) -> Queue:
        queue = self._queues.get(uri)
        if queue is None:
            self._check_running()
            parse_uri(uri)
            raise QueueStateError(f"{uri} is not open in this session")
        return queue

    def _check_current(self, queue: Queue) -> None:
        """Refuse to act through a closed Queue object: another one may now be open on its URI,
        and acting by URI would reach that one instead."""
        if queue.state == QueueState.CLOSED:
            self._check_running()
            raise QueueStateError(f"{queue.uri}: this Queue object is closed (a queue opened again on the same "
                                  f"URI is another Queue object: use the one open_queue returned)")

    def get_queue(self, uri: str) -> Queue:
        """The open :class:`bmq.Queue` for ``uri``.

        Raises:
            InvalidURIError: bad syntax.
            QueueStateError: not open.
        """
        return self._lookup(uri)

    def configure_queue(self, uri: str, options: QueueOptions, timeout: Optional[float] = None) -> None:
        """Apply new :class:`bmq.QueueOptions` to an open queue (kept for reopens).

        Raises:
            QueueStateError: not open.
            BrokerError, TimeoutError, SessionClosedError: as :meth:`open_queue`.
        """
        self._configure_queue(self._lookup(uri), options, timeout)

    def _configure_queue(self, queue: Queue, options: QueueOptions, timeout: Optional[float]) -> None:
        """:meth:`configure_queue` of this very handle (what ``Queue.configure`` calls)."""
        self._check_current(queue)
        uri = queue.uri
        timeout = self.options.configure_queue_timeout if timeout is None else timeout
        with self._lock:
            if queue.state not in (QueueState.OPEN, QueueState.PENDING):
                raise QueueStateError(f"{uri} is {queue.state}")
            if queue.state == QueueState.PENDING or not queue.read or queue.suspended:
                # Nothing to send now: the reopen (or the resume) applies the latest options.
                queue.keep_options(options)
                return
        try:
            self._handles.configure(queue, options, timeout, buffered=True)
            queue.keep_options(options)
        except BaseException as e:
            self._after_unfinished(f"configure_queue({uri!r})", e)
            raise

    def close_queue(self, uri: str, timeout: Optional[float] = None) -> None:
        """Close a queue: deconfigure (readers) then CloseQueue. While disconnected the close
        completes locally. Messages posted to it and not yet acknowledged resolve CANCELED.

        Raises:
            QueueStateError: not open. TimeoutError, SessionClosedError.
        """
        self._close_queue(self._lookup(uri), timeout)

    def _close_queue(self, queue: Queue, timeout: Optional[float]) -> None:
        """:meth:`close_queue` of this very handle (what ``Queue.close`` calls)."""
        self._check_current(queue)
        uri = queue.uri
        timeout = self.options.close_queue_timeout if timeout is None else timeout
        with self._lock:
            if queue.state in (QueueState.CLOSING, QueueState.CLOSED):
                raise QueueStateError(f"{uri} is already {queue.state}")
            connected = queue.state == QueueState.OPEN and self._link.current is not None
        try:
            queue.state = QueueState.CLOSING  # inside the try: its finally forgets the queue
            if connected:
                self._handles.close(queue, timeout)
        except BaseException as e:
            if connected:  # else nothing went out
                self._after_unfinished(f"close_queue({uri!r})", e)
            raise
        finally:
            try:
                self._forget_queue(queue, AckStatus.CANCELED)
            except BaseException:
                # Stopped part-way, or at its very start (a Ctrl-C as the close ends): once more,
                # else the queue would stay registered, CLOSING, and every later open of its
                # URI fail.
                self._forget_queue(queue, AckStatus.CANCELED)
                raise
        logger.info("closed %s", uri)

    def _forget_queue(self, queue: Queue, status: AckStatus) -> None:
        """Unregister ``queue`` and mark it closed, then settle its unanswered posts with
        ``status``; idempotent."""
        with self._lock:
            self._queues.forget(queue)
            queue.mark_closed()
        self._puts.cancel_queue(queue, status)

    # ---- posting ----------------------------------------------------------------------
    def post_async(
        self,
        uri: str,
        data: Union[bytes, bytearray, memoryview],
        properties: Optional[Mapping[str, Any]] = None,
        *,
        property_types: Optional[Mapping[str, Any]] = None,
        compression: Any = None,
        on_ack: Optional[Callable[[Ack], None]] = None,
        guid: Optional[bytes] = None,
    ) -> "Future[Ack]":
        """Post to an open queue by URI; return at once with a future of its Ack
        (:meth:`bmq.Queue.post_async` of that queue).

        Args:
            uri: the queue's URI (opened with ``write=True``).
            data, properties, property_types, compression, on_ack, guid: as
                :meth:`bmq.Queue.post_async`.

        Returns:
            A Future of the Ack.

        Raises:
            QueueStateError: ``uri`` not open for writing; the errors of ``Queue.post_async``.
        """
        return self._lookup(uri).post_async(data, properties, property_types=property_types,
                                            compression=compression, on_ack=on_ack, guid=guid)

    def post(
        self,
        uri: str,
        data: Union[bytes, bytearray, memoryview],
        properties: Optional[Mapping[str, Any]] = None,
        *,
        property_types: Optional[Mapping[str, Any]] = None,
        compression: Any = None,
        on_ack: Optional[Callable[[Ack], None]] = None,
    ) -> "Future[Ack]":
        """Deprecated meaning: post by URI without waiting, as :meth:`post_async` does.

        From bmq 0.3 ``Session.post`` will block and return the Ack, as :meth:`bmq.Queue.post`
        does (one meaning per name); until then it returns a Future and warns. Call
        :meth:`post_async` for a Future, or ``session.get_queue(uri).post(...)`` to block.

        Raises:
            QueueStateError: ``uri`` not open for writing (all errors as :meth:`post_async`).
        """
        warnings.warn("Session.post(uri, ...) returns a Future and will block and return the Ack from bmq 0.3, "
                      "as Queue.post does: call Session.post_async(uri, ...) for a Future",
                      DeprecationWarning, stacklevel=2)
        return self.post_async(uri, data, properties, property_types=property_types, compression=compression,
                               on_ack=on_ack)

    def _post(self, request: PostRequest) -> Record:
        """Check that ``request.queue`` takes posts now, then hand the call to the PUT path (in
        the calling thread): :meth:`PendingPuts.post` builds, records and sends it."""
        queue = request.queue
        if not queue.write:
            raise QueueStateError(f"{queue.uri} was not opened with write=True")
        state = queue.state
        if state is not QUEUE_OPEN and state is not QUEUE_PENDING:
            if state is QueueState.OPENING:  # Session.post(uri) racing with its open_queue()
                queue.opened.wait(self.options.open_queue_timeout)
            if queue.state not in (QueueState.OPEN, QueueState.PENDING):
                self._check_running()
                raise QueueStateError(f"{queue.uri} is {queue.state}")
        if queue.suspended:
            raise QueueStateError(f"{queue.uri} is suspended (host unhealthy)")
        compression = request.compression
        algorithm = self._compression if compression is None else _compression(compression).value
        trace = None
        if self._telemetry is not None:
            trace, properties = self._telemetry.start_send(queue.uri, request.payloads, request.properties)
            request = request._replace(properties=properties)
        try:
            # Read once: a reconnect may change the broker's features meanwhile.
            return self._puts.post(request, self._guids, self._link.new_style_properties, algorithm, trace)
        except BaseException as e:
            if trace is not None:
                trace.end((), e)  # nothing was sent: the span ends with the error
            if isinstance(e, OutboxError):
                self._check_running()  # stop() closed the outbox under us: say so
            raise

    def _resend_recovered(self, queue: Queue) -> None:
        with self._lock:
            entries = self._recovered.pop(queue.uri, [])
        self._puts.resend_recovered(queue, entries)

    def flush(self, timeout: Optional[float] = None) -> int:
        """Wait until every posted message is acknowledged and its answer given (or ``timeout``
        passes): its future resolved and its ``on_ack`` queued on the dispatcher thread, so a
        :meth:`call_soon` made after ``flush()`` returns 0 runs after every ``on_ack``.

        Returns:
            How many messages are still waiting for their ACK or its hand-over (0 when all
            are done).

        Thread-safety: any thread; from a callback on the dispatcher thread, the ``on_ack``
        callbacks it waits to be queued do not run until that callback returns.
        """
        return self._puts.flush(timeout)

    def _ack_wait_limit(self, timeout: Optional[float]) -> float:
        return self.options.ack_timeout + _ACK_WAIT_MARGIN if timeout is None else timeout

    # ---- consuming --------------------------------------------------------------------
    def confirm(self, message: Message) -> None:
        """Confirm one message (same as ``message.confirm()``)."""
        self.confirm_many((message,))

    def confirm_many(self, messages: Iterable[Message]) -> None:
        """Confirm many messages in as few CONFIRM events as possible.

        Confirms are never buffered: while reconnecting they are dropped (logged) and the
        broker redelivers those messages, as the official SDKs do.

        Raises:
            SessionClosedError: the session is stopped.
            QueueStateError: a queue is closed, or a message came from another session.
            BandwidthLimitError: the connection stayed above its high watermark for
                ``channel_write_timeout``.
        """
        self._check_running()
        self._deliveries.confirm(messages, self._link.current)

    def _confirm_batch(self, batch: MessageBatch) -> None:
        """:meth:`MessageBatch.confirm`: same rules as :meth:`confirm_many`."""
        self._check_running()
        self._deliveries.confirm_batch(batch, self._link.current)

    # ---- statistics -------------------------------------------------------------------
    def stats(self) -> SessionStats:
        """A snapshot of the session's statistics (:class:`bmq.SessionStats`): connections,
        traffic, writer queue, outbox, and per open queue posts, answers by status, messages in
        flight, deliveries, confirms and post→ACK latency percentiles. JSON-serialisable with
        ``as_dict()``; ``table()`` renders it for a log.

        Thread-safety: any thread; cheap (the counters are kept all along).
        """
        with self._lock:
            conn = self._link.current
            queues = {queue.uri: queue.counters.snapshot(queue.uri) for queue in self._queues}
            return SessionStats.of(self.broker, str(self._link.state), self._link.generation,
                                   conn.transport if conn is not None else None, self._puts.outbox_size(), queues)

    # ---- host health ------------------------------------------------------------------
    def _on_host_health(self, healthy: bool) -> None:
        self._dispatcher.submit(self._apply_host_health, healthy)

    def _apply_host_health(self, healthy: bool) -> None:
        if self._link.stopping or healthy == self._handles.host_healthy:
            return
        if not healthy:
            self._events.emit(ev.HostUnhealthy())
        for queue, error in self._handles.apply_host_health(healthy, self.options.configure_queue_timeout):
            if error is None:
                self._events.emit(ev.QueueResumed(queue.uri) if healthy else ev.QueueSuspended(queue.uri))
            else:
                self._events.emit((ev.QueueResumeFailed if healthy else ev.QueueSuspendFailed)(queue.uri, str(error)))
        if healthy:
            self._events.emit(ev.HostHealthRestored())

    # ---- stopping ---------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """True from a successful construction until :meth:`stop`."""
        return not self._link.stopping

    def stop(self, timeout: Optional[float] = None) -> None:
        """Disconnect and stop every thread; idempotent and bounded.

        Unacknowledged posts resolve as NOT_CONNECTED, pending requests fail with
        SessionClosedError, blocked :meth:`Queue.get` calls raise QueueStateError. Safe from a
        callback (the dispatcher then exits after that callback returns).

        Args:
            timeout: overall bound in seconds; default ``disconnect_timeout`` + 5.

        Raises:
            OutboxError: the outbox's final flush to disk failed (the session is stopped all
                the same).
        """
        timeout = self.options.disconnect_timeout + 5.0 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        try:
            first, conn = self._link.begin_stop()
            if not first:
                if self._link.stopper is not current and current not in self._own_threads():
                    self._stopped.wait(max(0.0, deadline - time.monotonic()))
                return
            if conn is not None:
                try:
                    self._call({"disconnect": {}}, min(self.options.disconnect_timeout, timeout), "disconnect",
                               buffered=False, stopping=True)
                except (Error, OSError) as e:
                    logger.info("no clean disconnect: %s", e)
        finally:
            # The thread that began the stop ends it, whatever came between (a Ctrl-C in the wait
            # for the Disconnect's answer: else the session's threads and socket stayed, and
            # every later stop() only waited for them), or in its next stop() if the exception
            # came as the shutdown began.
            if self._link.stopper is current and not self._stopped.is_set():
                self._shutdown(deadline)

    def _own_threads(self) -> List[threading.Thread]:
        threads = [self._dispatcher.thread, *self._recovery.threads]
        conn = self._link.current
        if conn is not None:
            threads += conn.transport.threads
        return threads

    def _shutdown(self, deadline: float) -> None:
        """Stop for good: every step runs whatever an earlier one raised (an outbox whose final
        fsync fails, or a Ctrl-C in a wait for a thread, must not leave posts unanswered, the
        dispatcher running and ``next_event()`` waiters waiting); the outbox's failure is raised
        once the session is stopped."""
        outbox_failure: Optional[OSError] = None
        requests: List[Request] = []
        queues: List[Queue] = []
        try:
            try:
                with self._lock:
                    conn = self._link.current  # bound before it is let go: see finish_stop
                    self._link.finish_stop()
                    requests = self._requests.take_all()
                    queues = self._queues.clear()
                monitor = self.options.host_health_monitor
                if monitor is not None:
                    monitor.remove_listener(self._on_host_health)
                if conn is not None:
                    conn.close()
                    conn.transport.join(max(0.0, deadline - time.monotonic()))
            finally:  # also after a Ctrl-C in that wait: nothing may be left unanswered
                closed = SessionClosedError(f"session to {self.broker} stopped")
                for request in requests:
                    fail_future(request.future, closed)
                # Queues first: a post racing with stop() then fails its state check, and one
                # already past it is refused or settled by the closed table (never left pending).
                for queue in queues:
                    queue.mark_closed()
                try:
                    self._puts.close()
                except OSError as e:  # the outbox is closed regardless; every post was answered
                    outbox_failure = e
            current = threading.current_thread()
            for thread in self._recovery.threads:
                if thread.is_alive() and thread is not current:
                    thread.join(max(0.0, deadline - time.monotonic()))
        finally:
            try:
                try:
                    self._events.emit(ev.Disconnected())
                finally:
                    try:
                        self._dispatcher.stop()  # after the event: the dispatcher runs it first
                    except BaseException:  # stopped at its start (a Ctrl-C): else its thread waits for good
                        self._dispatcher.stop()
                        raise
                if self._dispatcher.thread is not threading.current_thread():
                    self._dispatcher.thread.join(max(0.0, deadline - time.monotonic()))
            finally:
                self._stopped.set()
                self._events.close()  # next_event() waiters: no event can come any more
        logger.info("session %d to %s stopped", self._id, self.broker)
        if outbox_failure is not None:
            raise OutboxError(f"session to {self.broker} stopped, but its outbox could not be flushed to disk: "
                              f"{outbox_failure} (messages not acknowledged may not be re-sent by a next "
                              f"session)") from outbox_failure
