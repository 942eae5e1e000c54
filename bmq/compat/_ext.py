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
import dataclasses
import functools
import threading
import traceback
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

import bmq
import bmq.events

from . import session_events as se
from ._messages import Message, make_ack, make_handle, make_message
from .exceptions import BrokerTimeoutError, Error

__all__ = ["ExtSession", "ensure_stop_session", "STOPPED"]

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

    __slots__ = ("uri", "queue", "read", "write", "options", "acks_pending", "acks_done")

    def __init__(self, uri: str, queue: bmq.Queue, read: bool, write: bool, options: Tuple[int, int, int, bool]) -> None:
        self.uri = uri
        self.queue = queue
        self.read = read
        self.write = write
        self.options = options  # (max messages, max bytes, priority, suspends)
        self.acks_pending = 0
        self.acks_done = threading.Condition(threading.Lock())


class AckCallback:
    """An ``on_ack`` of one post: runs it once with the compat Ack, then forgets it (nothing of
    the application's is kept alive by bmq's references to this object)."""

    __slots__ = ("_user", "_record")

    def __init__(self, user: Any, record: QueueRecord) -> None:
        self._user = user
        self._record = record

    def __call__(self, ack: bmq.Ack) -> None:
        user, self._user = self._user, None
        record = self._record
        try:
            run_callback(user, make_ack(ack, record.uri))
        finally:
            del user
            with record.acks_done:
                record.acks_pending -= 1
                if not record.acks_pending:
                    record.acks_done.notify_all()


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
        with self._lock:
            self._queues.pop(uri, None)
        try:
            record.queue.close(timeout)
        except bmq.Error as e:
            raise failure("close", uri, e) from e
        finally:
            if threading.get_ident() != self._dispatcher:
                with record.acks_done:
                    record.acks_done.wait_for(lambda: not record.acks_pending, timeout or 30.0)

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
        callback = None
        if on_ack is not None:
            callback = AckCallback(on_ack, record)
            with record.acks_done:
                record.acks_pending += 1
        try:
            record.queue.post_async(payload, properties, property_types=property_types, on_ack=callback)
        except BaseException as e:
            if callback is not None:
                with record.acks_done:
                    record.acks_pending -= 1
            if not isinstance(e, bmq.Error):
                raise
            if isinstance(e, bmq.SessionClosedError) or self._stopped:
                raise Error(STOPPED) from e
            if record.queue.suspended:
                raise Error(f"Failed to post message: QUEUE_SUSPENDED: {e}") from e
            raise Error(f"Failed to post message: {status_of(e)}: {e}") from e

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
            self._session.stop()
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
