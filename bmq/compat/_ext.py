"""The engine under :class:`bmq.compat.Session`: one :class:`bmq.Session` and the official
SDK's rules on top of it (queues named by URI, errors as ``Failed to ... : STATUS: detail``,
callbacks that print their exceptions, sessions stopped at interpreter exit).

This object never refers to the public Session that owns it, so an application's Session is
garbage collected as soon as the application drops it, even while its threads run.

Threads: bmq's dispatcher thread runs every callback (events, messages, acks), in order, as the
official SDK's single processing thread does.
"""
from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import itertools
import logging
import os
import threading
import traceback
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import bmq
import bmq.events

from . import session_events as se
from ._messages import Message, make_ack, make_handle, make_message
from .exceptions import BrokerTimeoutError, Error

__all__ = ["ExtSession", "Poster", "Sent", "ensure_stop_session", "STOPPED"]

logger = logging.getLogger(__name__)

STOPPED = "Method called after session was stopped"
NOT_OPENED = "Queue not opened"
DEFAULT_MAX_UNCONFIRMED_MESSAGES = 1000
DEFAULT_MAX_UNCONFIRMED_BYTES = 32 * 1024 * 1024
DEFAULT_CONSUMER_PRIORITY = 0
DEFAULT_SUSPENDS_ON_BAD_HOST_HEALTH = False

# bmq event class -> compat event class (bmq's AuthenticationFailed has no counterpart: Error).
_EVENTS: Dict[type, type] = {
    getattr(bmq.events, name): getattr(se, name)
    for name in ("Connected", "Disconnected", "ConnectionLost", "Reconnected", "StateRestored", "QueueReopened",
                 "QueueReopenFailed", "QueueSuspended", "QueueSuspendFailed", "QueueResumed", "QueueResumeFailed",
                 "HostUnhealthy", "HostHealthRestored", "SlowConsumerHighWaterMark", "SlowConsumerNormal", "Error")
}


def run_callback(callback: Any, *args: Any) -> None:
    """Call user code; print what it raises to stderr (the official SDK's rule) and go on."""
    try:
        callback(*args)
    except Exception:
        traceback.print_exc()


def ensure_stop_session(ref: "weakref.ref[ExtSession]") -> None:
    """At interpreter exit: stop the session if the application has not.

    Args:
        ref: the session engine, weakly.
    """
    ext = ref()
    if ext is not None:
        ext.stop()


# Taken now: the exit hook keeps working if the module attribute is replaced later.
_STOP_AT_EXIT = ensure_stop_session


def status_of(exc: BaseException) -> str:
    """The official SDK's status name for a bmq exception."""
    if isinstance(exc, bmq.InvalidURIError):
        return "INVALID_URI"
    if isinstance(exc, (bmq.InvalidArgumentError, bmq.ArgumentTypeError)):
        return "INVALID_ARGUMENT"
    if isinstance(exc, bmq.TimeoutError):
        return "TIMEOUT"
    if isinstance(exc, bmq.BrokerError):
        return exc.category[2:] if exc.category.startswith("E_") else exc.category
    if isinstance(exc, bmq.ConnectionError):
        return "NOT_CONNECTED"
    return "UNKNOWN"


def failure(action: str, uri: str, exc: BaseException) -> Error:
    """``Failed to ACTION URI queue: STATUS: detail`` (a BrokerTimeoutError for a timeout)."""
    if isinstance(exc, bmq.SessionClosedError):
        return Error(STOPPED)
    status = status_of(exc)
    cls = BrokerTimeoutError if status == "TIMEOUT" else Error
    return cls(f"Failed to {action} {uri} queue: {status}: {exc}")


class QueueRecord:
    """One open queue: the bmq queue, the options as the application sees them, and the
    ``on_ack`` callbacks not yet run (``close_queue`` waits for them)."""

    __slots__ = ("uri", "queue", "read", "write", "options", "acks_pending", "acks_lock", "acks_done")

    def __init__(self, uri: str, queue: bmq.Queue, read: bool, write: bool, options: Tuple[int, int, int, bool]) -> None:
        self.uri = uri
        self.queue = queue
        self.read = read
        self.write = write
        self.options = options  # (max messages, max bytes, priority, suspends)
        self.acks_pending = 0
        self.acks_lock = threading.Lock()
        self.acks_done = threading.Event()  # set while acks_pending is 0
        self.acks_done.set()

    def ack_expected(self) -> None:
        """One more ``on_ack`` to run before ``close_queue`` returns."""
        with self.acks_lock:
            self.acks_pending += 1
            if self.acks_pending == 1:
                self.acks_done.clear()


def finish_ack(record: QueueRecord) -> None:
    """One ``on_ack`` of ``record`` has run (``close_queue`` waits for none to be left)."""
    with record.acks_lock:
        record.acks_pending -= 1
        if not record.acks_pending:
            record.acks_done.set()


def run_acks(record: QueueRecord, callbacks: List[Any], acks: List[bmq.Ack]) -> None:
    """Run the ``on_ack`` of each message of one batch, in order (on the dispatcher thread, or
    after the session stopped)."""
    uri = record.uri
    for user, ack in zip(callbacks, acks):
        if user is not None:
            try:
                user(make_ack(ack, uri))
            except Exception:
                traceback.print_exc()
    count = len(callbacks)
    callbacks.clear()  # the dispatcher keeps its last arguments: let the application's functions go
    user = None
    with record.acks_lock:
        record.acks_pending -= count
        if not record.acks_pending:
            record.acks_done.set()


# One pending post: the queue, payload, properties, property types and the application's on_ack.
Item = Tuple[QueueRecord, Any, Any, Any, Any]

#: Most messages sent in one bmq call: the broker starts on a batch while the next gathers.
MAX_BATCH = 1000
#: Posts waiting for the poster thread above which a poster waits for room.
MAX_PENDING = 20000

_FAILED_STATUS = ((bmq.SessionClosedError, bmq.AckStatus.NOT_CONNECTED),
                  (bmq.QueueStateError, bmq.AckStatus.CANCELED),
                  (bmq.BandwidthLimitError, bmq.AckStatus.LIMIT_BYTES),
                  ((bmq.PropertyError, bmq.MessageTooLargeError, bmq.InvalidArgumentError, bmq.ArgumentTypeError),
                   bmq.AckStatus.INVALID_ARGUMENT))


def _ignore(acks: List[bmq.Ack]) -> None:
    """The answers of a batch posted without any ``on_ack``."""


class Sent:
    """One batch handed to bmq: its queue, the application's ``on_ack`` of each message (None
    where it gave none), and the batch's answers once all came (None until then)."""

    __slots__ = ("record", "callbacks", "acks")

    def __init__(self, record: QueueRecord, callbacks: List[Any]) -> None:
        self.record = record
        self.callbacks = callbacks
        self.acks: Optional[List[bmq.Ack]] = None


class Poster:
    """Sends a session's posts in batches: ``post()`` appends to a list and returns; this
    thread takes what was appended meanwhile (up to ``MAX_BATCH`` messages at a time) and hands
    it to bmq's ``post_many_callback`` in as few calls as the queues and property types allow
    (one PUT event for many messages, no future per message), then goes on with the next batch
    while the broker works. When a batch's last ACK comes, bmq calls back on the session's
    dispatcher thread, where every other callback runs; there the ``on_ack`` callbacks of the
    batches answered so far run, oldest batch first. A lone post goes at once; while one batch
    is sent the next gathers.

    The posts of one thread are sent in order, and their ``on_ack`` run in that order. Checks
    that can fail are made in ``post()`` itself; what bmq still refuses here (rare: a property
    value out of its type's range, the connection full for ``channel_write_timeout``, the queue
    closed or the session stopped meanwhile) resolves that message's ``on_ack`` with a failed
    status and is logged.

    Args:
        name: the thread's name.
        write_timeout: seconds a poster waits for room before ``Error`` (BW_LIMIT).
        call_soon: runs a function on the session's dispatcher thread.

    Thread-safety: :meth:`add`, :meth:`flush`, :meth:`close` and :meth:`end_acks` from any
    thread.
    """

    def __init__(self, name: str, write_timeout: float, call_soon: Callable[..., None]) -> None:
        self._call_soon = call_soon
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)
        self._pending: List[Item] = []
        self._closed = False
        self._send_lock = threading.Lock()  # batches go out one at a time, in order
        self._write_timeout = write_timeout
        # The GUIDs of the acks of messages bmq refused (it makes those of the messages it sends).
        self._base = bmq.deterministic_guid(os.urandom(16))[:8]  # random, with the GUID version bits
        self._counter = itertools.count()
        # Batches sent whose on_ack callbacks have not run yet, oldest first (appended by the
        # sending thread, taken from the left by whoever delivers, under _delivering).
        self._inflight: "collections.deque[Sent]" = collections.deque()
        self._delivering = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def add(self, item: Item) -> None:
        """Queue one post for sending.

        Raises:
            Error: closed (the session stopped), or no room within ``write_timeout`` (BW_LIMIT).
        """
        with self._lock:
            if self._closed:
                raise Error(STOPPED)
            pending = self._pending
            if len(pending) >= MAX_PENDING:
                if not self._room.wait_for(lambda: len(self._pending) < MAX_PENDING or self._closed,
                                           self._write_timeout):
                    raise Error("Failed to post message: BW_LIMIT: the connection stayed full")
                if self._closed:
                    raise Error(STOPPED)
                pending = self._pending
            pending.append(item)
            if len(pending) == 1:
                self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if self._closed and not self._pending:
                    return
            self.flush()

    def flush(self) -> None:
        """Send everything queued so far (in the calling thread if it gets there first)."""
        with self._send_lock:
            while True:
                with self._lock:
                    items = self._pending[:MAX_BATCH]
                    del self._pending[:MAX_BATCH]
                    self._room.notify_all()
                if not items:
                    return
                self._send(items)

    def close(self) -> None:
        """Send what is queued, refuse more, and end the thread."""
        with self._lock:
            self._closed = True
            self._ready.notify()
            self._room.notify_all()
        self.flush()
        if threading.current_thread() is not self.thread:
            self.thread.join(10.0)

    def _send(self, items: List[Item]) -> None:
        start = 0
        while start < len(items):
            record, types = items[start][0], items[start][3]
            end = start + 1
            while end < len(items) and items[end][0] is record and items[end][3] is types:
                end += 1
            self._send_group(record, types, items[start:end])
            start = end

    def _send_group(self, record: QueueRecord, types: Any, items: List[Item]) -> None:
        payloads = [item[1] for item in items]
        properties: Any = [item[2] for item in items]
        if not any(properties):
            properties = None
        callbacks = [item[4] for item in items]
        if not any(callbacks):
            record.queue.post_many_callback(payloads, _ignore, properties, property_types=types)
            return
        sent = Sent(record, callbacks)
        self._inflight.append(sent)  # before bmq has it: its answers may come at once
        try:
            record.queue.post_many_callback(payloads, functools.partial(self._answered, sent), properties,
                                            property_types=types)
        except bmq.Error as e:
            if len(items) > 1 and not isinstance(e, (bmq.SessionClosedError, bmq.QueueStateError)):
                self._inflight.pop()  # the last one (batches go one at a time, _send_lock): resent below
                for item in items:  # one message may be the cause: send them one by one
                    self._send_group(record, types, [item])
                return
            status = next((status for kind, status in _FAILED_STATUS if isinstance(e, kind)), bmq.AckStatus.UNKNOWN)
            logger.error("%d message(s) posted to %s were not sent: %s", len(items), record.uri, e)
            # Answered now, delivered in turn (still the last in _inflight): on_ack keeps the
            # order of the posts.
            sent.acks = [bmq.Ack(status, self._base + next(self._counter).to_bytes(8, "big"), record.uri)
                         for _ in items]
            try:
                self._call_soon(self.deliver)
            except bmq.Error:
                pass  # the session is stopping: end_acks delivers it once every post is answered

    def _answered(self, sent: Sent, acks: List[bmq.Ack]) -> None:
        """Dispatcher thread: bmq's answers to one batch."""
        sent.acks = acks
        self.deliver()

    def deliver(self) -> None:
        """Run the ``on_ack`` callbacks of the oldest batches whose answers all came, in order."""
        with self._delivering:
            while self._inflight and self._inflight[0].acks is not None:
                sent = self._inflight.popleft()
                acks: List[bmq.Ack] = sent.acks  # type: ignore[assignment]
                # Only the messages posted with an on_ack were counted as expected.
                expected = [ack for user, ack in zip(sent.callbacks, acks) if user is not None]
                callbacks = [user for user in sent.callbacks if user is not None]
                sent.callbacks = []  # only run_acks holds the application's functions from here on
                run_acks(sent.record, callbacks, expected)

    def end_acks(self) -> None:
        """After the session stopped (every post answered): deliver what is left."""
        self.deliver()


class ExtSession:
    """A started :class:`bmq.Session` driven by the official SDK's rules (see the module).

    Args:
        on_session_event: the application's event callback.
        on_message: the application's message callback, or None.
        broker: the broker's address.
        options: the bmq session options (``on_event`` is set here).
        initially_unhealthy: the host health monitor said unhealthy at start.

    Raises:
        BrokerTimeoutError: the connection timed out. Error: it failed otherwise.

    Thread-safety: any thread.
    """

    def __init__(self, on_session_event: Callable[[se.SessionEvent], None],
                 on_message: Optional[Callable[..., None]], broker: str, options: bmq.SessionOptions,
                 initially_unhealthy: bool) -> None:
        self._on_session_event = on_session_event
        self._on_message = on_message
        self._lock = threading.Lock()
        self._queues: Dict[str, QueueRecord] = {}
        self._stopped = False
        self._stop_done = threading.Event()
        self._unhealthy_at_start = initially_unhealthy
        self._dispatcher: Optional[int] = None  # the dispatcher thread's ident, from the first event
        self.monitor_host_health = options.host_health_monitor is not None
        try:
            self._session = bmq.Session(broker, dataclasses.replace(options, on_event=self._on_event))
        except bmq.TimeoutError as e:
            raise BrokerTimeoutError(f"Failed to start session: TIMEOUT: {e}") from e
        except (bmq.Error, OSError) as e:
            raise Error(f"Failed to start session: {status_of(e)}: {e}") from e
        self._poster = Poster(f"bmq-compat-poster-{id(self):x}", options.channel_write_timeout,
                              self._session.call_soon)
        self._at_exit = functools.partial(_STOP_AT_EXIT, weakref.ref(self))
        atexit.register(self._at_exit)

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopped

    @property
    def bmq_session(self) -> bmq.Session:
        """The bmq session underneath."""
        return self._session

    # ---- callbacks (dispatcher thread) --------------------------------------------
    def _on_event(self, event: bmq.events.SessionEvent) -> None:
        if self._dispatcher is None:
            self._dispatcher = threading.get_ident()
        cls = _EVENTS.get(type(event), se.Error)
        if isinstance(event, bmq.events.QueueEvent):
            converted: se.SessionEvent = cls(event.queue_uri, event.message)
        else:
            converted = cls(event.message)
        run_callback(self._on_session_event, converted)
        if cls is se.Connected and self._unhealthy_at_start:
            self._unhealthy_at_start = False
            run_callback(self._on_session_event, se.HostUnhealthy(None))

    def _deliverer(self, uri: str) -> Callable[[bmq.Message], None]:
        on_message = self._on_message

        def deliver(inner: bmq.Message) -> None:
            message = make_message(inner, uri)
            try:
                on_message(message, make_handle(message, self))  # type: ignore[misc]
            except Exception:
                traceback.print_exc()

        return deliver

    # ---- queues -------------------------------------------------------------------
    def check_running(self) -> None:
        """Raise Error once the session is stopped."""
        if self._stopped:
            raise Error(STOPPED)

    def record(self, uri: str) -> QueueRecord:
        """The open queue ``uri``.

        Raises:
            Error: stopped, or no such queue open.
        """
        self.check_running()
        record = self._queues.get(uri)
        if record is None:
            raise Error(NOT_OPENED)
        return record

    def open_queue(self, uri: str, read: bool, write: bool, options: Tuple[int, int, int, bool],
                   timeout: Optional[float]) -> None:
        """Open ``uri``; ``options``: (max unconfirmed messages, bytes, priority, suspends).

        Raises:
            Error / BrokerTimeoutError: ``Failed to open URI queue: STATUS: detail``.
        """
        self.check_running()
        try:
            bmq.parse_uri(uri)
        except bmq.Error as e:
            raise failure("open", uri, e) from e
        if not (read or write):
            raise Error(f"Failed to open {uri} queue: INVALID_FLAGS: open_queue needs read=True and/or write=True")
        if uri in self._queues:
            raise Error(f"Failed to open {uri} queue: ALREADY_OPENED: {uri} is already open in this session")
        try:
            bmq_options = _bmq_queue_options(options)
            queue = self._session.open_queue(uri, read=read, write=write, options=bmq_options, timeout=timeout,
                                             on_message=self._deliverer(uri) if read else None)
        except bmq.Error as e:
            raise failure("open", uri, e) from e
        if not read:  # consumption options mean nothing to a writer
            options = (DEFAULT_MAX_UNCONFIRMED_MESSAGES, DEFAULT_MAX_UNCONFIRMED_BYTES, DEFAULT_CONSUMER_PRIORITY,
                       options[3])
        with self._lock:
            self._queues[uri] = QueueRecord(uri, queue, read, write, options)

    def configure_queue(self, uri: str, options: Tuple[Optional[int], Optional[int], Optional[int], Optional[bool]],
                        timeout: Optional[float]) -> None:
        """Apply the options given (None: unchanged).

        Raises:
            Error / BrokerTimeoutError: ``Failed to configure URI queue: STATUS: detail``.
        """
        record = self.record(uri)
        merged = tuple(old if new is None else new for new, old in zip(options, record.options))
        if not record.read:
            merged = record.options[:3] + merged[3:]
        try:
            bmq_options = _bmq_queue_options(merged)  # type: ignore[arg-type]
            record.queue.configure(bmq_options, timeout)
        except bmq.Error as e:
            raise failure("configure", uri, e) from e
        record.options = merged  # type: ignore[assignment]

    def queue_options(self, uri: str) -> Tuple[int, int, int, bool]:
        """The options of ``uri`` as last applied.

        Raises:
            Error: stopped, or not open.
        """
        return self.record(uri).options

    def close_queue(self, uri: str, timeout: Optional[float]) -> None:
        """Close ``uri``; then wait (outside callbacks) until every ``on_ack`` of it has run.

        Raises:
            Error / BrokerTimeoutError: ``Failed to close URI queue: STATUS: detail``.
        """
        record = self.record(uri)
        self._poster.flush()  # what was posted before goes before the close
        with self._lock:
            self._queues.pop(uri, None)
        try:
            record.queue.close(timeout)
        except bmq.Error as e:
            raise failure("close", uri, e) from e
        finally:
            if threading.get_ident() != self._dispatcher:
                record.acks_done.wait(timeout or 30.0)

    # ---- messages -----------------------------------------------------------------
    def post(self, uri: str, payload: Any, properties: Any, property_types: Any, on_ack: Any) -> None:
        """Post one message to ``uri`` (see :meth:`bmq.compat.Session.post`).

        Raises:
            Error: stopped, not open, not a writer, empty payload, suspended, refused.
            TypeError: ``payload`` is not bytes-like.
        """
        if self._stopped:
            raise Error(STOPPED)
        record = self._queues.get(uri)
        if record is None:
            raise Error(NOT_OPENED)
        if not record.write:
            raise Error("Failed to construct message: QUEUE_READONLY")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"the payload must be bytes, not {type(payload).__name__}")
        if not payload:
            raise Error("Failed to construct message: PAYLOAD_EMPTY")
        if len(payload) > bmq.MAX_PAYLOAD_SIZE:
            raise Error(f"Failed to construct message: PAYLOAD_TOO_BIG: {len(payload)} bytes")
        if record.queue.suspended:
            raise Error("Failed to post message: QUEUE_SUSPENDED: the host is unhealthy")
        if on_ack is not None:
            record.ack_expected()
        try:
            self._poster.add((record, payload, properties, property_types, on_ack))
        except BaseException:
            if on_ack is not None:
                finish_ack(record)
            raise

    def confirm(self, message: Message) -> None:
        """Confirm ``message``.

        Raises:
            Error: stopped, or the confirm could not be sent.
        """
        if self._stopped:
            raise Error(STOPPED)
        try:
            message._inner.confirm()
        except bmq.Error as e:
            if isinstance(e, bmq.SessionClosedError) or self._stopped:
                raise Error(STOPPED) from e
            raise Error(f"Failed to confirm message: {status_of(e)}: {e}") from e

    # ---- stopping -----------------------------------------------------------------
    def stop(self) -> None:
        """Stop the session (idempotent): later calls raise ``Error(STOPPED)``; every event
        (``Disconnected`` last) has been delivered when this returns, except when called from
        a callback, where the rest follows after that callback returns."""
        with self._lock:
            first = not self._stopped
            self._stopped = True
        if not first:
            if threading.get_ident() != self._dispatcher:
                self._stop_done.wait(self._session.options.disconnect_timeout + 5.0)
            return
        atexit.unregister(self._at_exit)
        try:
            self._poster.close()  # what was posted before stop() goes out first
            self._session.stop()
            self._poster.end_acks()
        finally:
            self._stop_done.set()

    def stop_in_background(self) -> None:
        """Stop on a thread of its own (a Session collected on whichever thread dropped it)."""
        try:
            threading.Thread(target=self.stop, name="bmq-compat-stop").start()
        except RuntimeError:  # interpreter shutting down: no new threads
            self.stop()


def _bmq_queue_options(options: Tuple[int, int, int, bool]) -> bmq.QueueOptions:
    messages, size, priority, suspends = options
    return bmq.QueueOptions(max_unconfirmed_messages=messages, max_unconfirmed_bytes=size,
                            consumer_priority=priority, suspends_on_bad_host_health=bool(suspends))
