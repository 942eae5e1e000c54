"""``Session``, ``SessionOptions`` and ``QueueOptions`` of :mod:`bmq.compat`: the official
SDK's signatures, defaults and checks, over :class:`bmq.compat._ext.ExtSession`."""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict, Optional, Tuple, Union

import bmq

from ._ext import (
    DEFAULT_CONSUMER_PRIORITY,
    DEFAULT_MAX_UNCONFIRMED_BYTES,
    DEFAULT_MAX_UNCONFIRMED_MESSAGES,
    DEFAULT_SUSPENDS_ON_BAD_HOST_HEALTH,
    ExtSession,
)
from ._messages import Ack, Message, MessageHandle
from ._monitors import BasicHealthMonitor
from ._timeouts import OptionalFields, Timeouts
from ._typing import PropertyTypeDict, PropertyValueDict
from .exceptions import Error
from .session_events import SessionEvent

__all__ = ["Session", "SessionOptions", "QueueOptions"]

CompressionAlgorithmType = bmq.CompressionAlgorithmType
PropertyType = bmq.PropertyType


class _DefaultTimeout(float):
    """The "not given" timeout: the session's (or bmq's) default applies."""

    def __repr__(self) -> str:
        return "..."


DEFAULT_TIMEOUT = _DefaultTimeout()
_OPTION_NAMES = ("max_unconfirmed_messages", "max_unconfirmed_bytes", "consumer_priority",
                 "suspends_on_bad_host_health")


def _timeout(value: Optional[float]) -> Optional[float]:
    """None for "not given"; else a number of seconds > 0.

    Raises:
        ValueError: not > 0 (or absurdly large).
    """
    if value is None or value is DEFAULT_TIMEOUT:
        return None
    if 0.0 < value < 2**63:
        return float(value)
    raise ValueError(f"a timeout must be a number of seconds > 0.0, not {value!r}")


def _property_types(properties: Optional[PropertyValueDict],
                    overrides: Optional[PropertyTypeDict]) -> Optional[Dict[str, Any]]:
    """The property types to post with: the official defaults (bool BOOL, int INT64, str
    STRING, bytes BINARY) with ``overrides`` applied; None when bmq's inference agrees.

    Raises:
        Error: a value of another type, or an override of a property not given.
    """
    types: Dict[str, Any] = {}
    if properties is not None and len(properties) > 255:
        raise Error(f"{len(properties)} properties: a message has at most 255")
    for name, value in (properties or {}).items():
        if not isinstance(name, str) or not 0 < len(name) < 4096:
            raise Error(f"property name {name!r}: a str of 1 to 4095 characters is needed")
        if isinstance(value, int) and not isinstance(value, bool):
            types[name] = PropertyType.INT64
        elif not isinstance(value, (bool, str, bytes)):
            raise Error(f"property {name!r}: values of type {type(value).__name__!r} are not supported "
                        "(bool, int, str and bytes are)")
    for name, kind in (overrides or {}).items():
        if properties is None or name not in properties:
            raise Error(f"property type override for {name!r}, which is not among the properties")
        if not _fits(kind, properties[name]):
            raise Error(f"property {name!r}: {properties[name]!r} is not a valid {getattr(kind, 'name', kind)} value")
        types[name] = kind
    return types or None


_INT_RANGES = {PropertyType.SHORT: 2**15, PropertyType.INT32: 2**31, PropertyType.INT64: 2**63}


def _fits(kind: Any, value: Any) -> bool:
    """Whether ``value`` can be sent as a property of type ``kind`` (checked in ``post`` so that
    the batch sent later does not meet it)."""
    if kind in _INT_RANGES:
        return isinstance(value, int) and not isinstance(value, bool) and -_INT_RANGES[kind] <= value < _INT_RANGES[kind]
    if kind is PropertyType.BOOL:
        return isinstance(value, bool)
    if kind is PropertyType.CHAR:
        return (isinstance(value, bytes) and len(value) == 1) or (isinstance(value, int) and -128 <= value < 256)
    if kind is PropertyType.STRING:
        return isinstance(value, str)
    if kind is PropertyType.BINARY:
        return isinstance(value, bytes)
    return False


class QueueOptions(OptionalFields):
    """Consumption options of a queue; every field None by default.

    ``open_queue`` gives a None field its default (the ``DEFAULT_*`` class attributes);
    ``configure_queue`` leaves a None field as it was. Fields may be set after construction.

    Args:
        max_unconfirmed_messages: messages delivered and not yet confirmed, at most.
        max_unconfirmed_bytes: bytes delivered and not yet confirmed, at most.
        consumer_priority: higher priorities get the messages; within [-2**30, 2**30 - 1].
        suspends_on_bad_host_health: suspend the queue while the host is unhealthy (needs a
            session with a host health monitor).

    Thread-safety: a plain value.
    """

    DEFAULT_MAX_UNCONFIRMED_MESSAGES = DEFAULT_MAX_UNCONFIRMED_MESSAGES
    """``max_unconfirmed_messages`` when not given."""
    DEFAULT_MAX_UNCONFIRMED_BYTES = DEFAULT_MAX_UNCONFIRMED_BYTES
    """``max_unconfirmed_bytes`` when not given."""
    DEFAULT_CONSUMER_PRIORITY = DEFAULT_CONSUMER_PRIORITY
    """``consumer_priority`` when not given."""
    DEFAULT_SUSPENDS_ON_BAD_HOST_HEALTH = DEFAULT_SUSPENDS_ON_BAD_HOST_HEALTH
    """``suspends_on_bad_host_health`` when not given."""

    _FIELDS = _OPTION_NAMES

    def __init__(
        self,
        max_unconfirmed_messages: Optional[int] = None,
        max_unconfirmed_bytes: Optional[int] = None,
        consumer_priority: Optional[int] = None,
        suspends_on_bad_host_health: Optional[bool] = None,
    ) -> None:
        self.max_unconfirmed_messages = max_unconfirmed_messages
        self.max_unconfirmed_bytes = max_unconfirmed_bytes
        self.consumer_priority = consumer_priority
        self.suspends_on_bad_host_health = suspends_on_bad_host_health


_SESSION_OPTION_NAMES = ("message_compression_algorithm", "timeouts", "host_health_monitor", "num_processing_threads",
                         "blob_buffer_size", "channel_high_watermark", "event_queue_watermarks", "stats_dump_interval")


class SessionOptions(OptionalFields):
    """Options of a session for :meth:`Session.with_options`; every field None by default
    (the session's default then applies). See :class:`Session` for each.

    Thread-safety: a plain value.
    """

    _FIELDS = _SESSION_OPTION_NAMES

    def __init__(
        self,
        message_compression_algorithm: Optional[bmq.CompressionAlgorithmType] = None,
        timeouts: Optional[Timeouts] = None,
        host_health_monitor: Optional[BasicHealthMonitor] = None,
        num_processing_threads: Optional[int] = None,
        blob_buffer_size: Optional[int] = None,
        channel_high_watermark: Optional[int] = None,
        event_queue_watermarks: Optional[Tuple[int, int]] = None,
        stats_dump_interval: Optional[float] = None,
    ) -> None:
        self.message_compression_algorithm = message_compression_algorithm
        self.timeouts = timeouts
        self.host_health_monitor = host_health_monitor
        self.num_processing_threads = num_processing_threads
        self.blob_buffer_size = blob_buffer_size
        self.channel_high_watermark = channel_high_watermark
        self.event_queue_watermarks = event_queue_watermarks
        self.stats_dump_interval = stats_dump_interval


def _bmq_options(compression: bmq.CompressionAlgorithmType, timeouts: Timeouts,
                 monitor: Optional[BasicHealthMonitor], channel_high_watermark: Optional[int],
                 event_queue_watermarks: Optional[Tuple[int, int]],
                 stats_dump_interval: Optional[float]) -> bmq.SessionOptions:
    given: Dict[str, Any] = {"compression": compression}
    for name in ("connect_timeout", "disconnect_timeout", "open_queue_timeout", "configure_queue_timeout",
                 "close_queue_timeout"):
        value = _timeout(getattr(timeouts, name))
        if value is not None:
            given[name] = value
    if monitor is not None:
        given["host_health_monitor"] = monitor._monitor
    if channel_high_watermark is not None:
        given["channel_high_watermark"] = channel_high_watermark
    if event_queue_watermarks is not None:
        given["event_queue_low_watermark"], given["event_queue_high_watermark"] = event_queue_watermarks
    if stats_dump_interval:
        given["stats_interval"] = stats_dump_interval
    try:
        return bmq.SessionOptions(**given)
    except bmq.InvalidArgumentError as e:
        raise ValueError(str(e)) from e


class Session:
    """A connection to a BlazingMQ broker, with the official ``blazingmq.Session``'s API.

    Connects in the constructor and emits ``Connected``; queues are named by URI; posts return
    at once and answer through ``on_ack``. Every callback (``on_session_event``, ``on_message``,
    ``on_ack``) runs on one thread of the session, in order; an exception it raises is printed
    to stderr and dispatching goes on. Unlike the official SDK, a callback may call any
    method of the session (``open_queue``, ``close_queue``, ``stop``...) without deadlock.

    Args:
        on_session_event: called with each :mod:`bmq.compat.session_events` event.
        on_message: called with ``(Message, MessageHandle)`` for each message delivered; needed
            to open queues with ``read=True``.
        broker: ``tcp://host:port``; the environment variable ``BMQ_BROKER_URI`` overrides it.
        message_compression_algorithm: how posted payloads are compressed (ZLIB: from 1 KiB).
        timeout: seconds for open, configure and close requests (a float), or a
            :class:`Timeouts` (connect and disconnect too); bmq's defaults otherwise.
        host_health_monitor: a :class:`BasicHealthMonitor`, or None (always healthy, and
            ``suspends_on_bad_host_health`` cannot be used).
        num_processing_threads: accepted and ignored (bmq runs callbacks on one thread).
        blob_buffer_size: accepted and ignored.
        channel_high_watermark: bytes queued for the socket above which posts wait (then raise).
        event_queue_watermarks: ``(low, high)`` callbacks waiting, for ``SlowConsumerNormal`` /
            ``SlowConsumerHighWaterMark``.
        stats_dump_interval: seconds between statistics logged (``bmq.stats`` logger); 0 or
            None: none.

    Raises:
        Error: the session could not start.
        BrokerTimeoutError: connecting timed out.
        ValueError: a timeout not > 0, a negative ``stats_dump_interval``, bad watermarks.
        TypeError: ``host_health_monitor`` is neither None nor a BasicHealthMonitor.

    Thread-safety: every method may be called from any thread, callbacks included.
    """

    def __init__(
        self,
        on_session_event: Callable[[SessionEvent], None],
        on_message: Optional[Callable[[Message, MessageHandle], None]] = None,
        broker: str = "tcp://localhost:30114",
        message_compression_algorithm: bmq.CompressionAlgorithmType = bmq.CompressionAlgorithmType.NONE,
        timeout: Union[Timeouts, float] = DEFAULT_TIMEOUT,
        host_health_monitor: Optional[BasicHealthMonitor] = None,
        num_processing_threads: Optional[int] = None,
        blob_buffer_size: Optional[int] = None,
        channel_high_watermark: Optional[int] = None,
        event_queue_watermarks: Optional[Tuple[int, int]] = None,
        stats_dump_interval: Optional[float] = None,
    ) -> None:
        if host_health_monitor is not None and not isinstance(host_health_monitor, BasicHealthMonitor):
            raise TypeError("host_health_monitor must be None or a BasicHealthMonitor, "
                            f"not {type(host_health_monitor).__name__}")
        if stats_dump_interval is not None and not 0.0 <= stats_dump_interval < 2**63:
            raise ValueError(f"stats_dump_interval must be >= 0, not {stats_dump_interval!r}")
        if not isinstance(timeout, Timeouts):
            timeout = Timeouts(open_queue_timeout=timeout, configure_queue_timeout=timeout,
                               close_queue_timeout=timeout)
        options = _bmq_options(message_compression_algorithm, timeout, host_health_monitor, channel_high_watermark,
                               event_queue_watermarks, stats_dump_interval)
        broker = os.environ.get("BMQ_BROKER_URI") or broker
        unhealthy = host_health_monitor is not None and not host_health_monitor._monitor.healthy
        self._ext = ExtSession(on_session_event, on_message, broker, options, unhealthy)
        self._has_on_message = on_message is not None

    @classmethod
    def with_options(
        cls,
        on_session_event: Callable[[SessionEvent], None],
        on_message: Optional[Callable[[Message, MessageHandle], None]] = None,
        broker: str = "tcp://localhost:30114",
        session_options: SessionOptions = SessionOptions(),
    ) -> "Session":
        """A session configured by a :class:`SessionOptions` (None fields: defaults).

        Args:
            on_session_event, on_message, broker: as :class:`Session`.
            session_options: the other options.

        Returns:
            The started session.

        Raises:
            Error, BrokerTimeoutError, ValueError, TypeError: as :class:`Session`.
        """
        o = session_options
        return cls(
            on_session_event,
            on_message,
            broker,
            o.message_compression_algorithm or bmq.CompressionAlgorithmType.NONE,
            DEFAULT_TIMEOUT if o.timeouts is None else o.timeouts,
            o.host_health_monitor,
            o.num_processing_threads,
            o.blob_buffer_size,
            o.channel_high_watermark,
            o.event_queue_watermarks,
            o.stats_dump_interval,
        )

    def _check_suspension(self, options: QueueOptions) -> None:
        if options.suspends_on_bad_host_health and not self._ext.monitor_host_health:
            raise Error("suspends_on_bad_host_health=True needs a session made with a host_health_monitor")

    def open_queue(
        self,
        queue_uri: str,
        read: bool = False,
        write: bool = False,
        options: QueueOptions = QueueOptions(),
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """Open the queue ``queue_uri``, which names it in later calls.

        Args:
            queue_uri: ``bmq://domain/queue`` (``?id=app`` for a fan-out reader).
            read: receive its messages through ``on_message``.
            write: post to it.
            options: consumption options; None fields take the ``QueueOptions.DEFAULT_*``.
            timeout: seconds; the session's open timeout when not given.

        Raises:
            Error: ``Failed to open URI queue: STATUS: detail`` (INVALID_URI, INVALID_FLAGS,
                INVALID_ARGUMENT, ALREADY_OPENED, a broker refusal); read without
                ``on_message``; suspension without a monitor; the session is stopped.
            BrokerTimeoutError: no answer within ``timeout``.
            ValueError: ``timeout`` not > 0.
        """
        self._ext.check_running()
        if read and not self._has_on_message:
            raise Error(f"cannot open {queue_uri} with read=True: the Session was made without on_message")
        self._check_suspension(options)
        values = (
            _default(options.max_unconfirmed_messages, DEFAULT_MAX_UNCONFIRMED_MESSAGES),
            _default(options.max_unconfirmed_bytes, DEFAULT_MAX_UNCONFIRMED_BYTES),
            _default(options.consumer_priority, DEFAULT_CONSUMER_PRIORITY),
            _default(options.suspends_on_bad_host_health, DEFAULT_SUSPENDS_ON_BAD_HOST_HEALTH),
        )
        self._ext.open_queue(queue_uri, read, write, values, _timeout(timeout))

    def close_queue(self, queue_uri: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Close the queue ``queue_uri``. When this returns, every ``on_ack`` of its posts has
        run (unless called from a callback).

        Args:
            queue_uri: an open queue's URI.
            timeout: seconds; the session's close timeout when not given.

        Raises:
            Error: not open (``Queue not opened``), stopped, or ``Failed to close ...``.
            BrokerTimeoutError: no answer within ``timeout``.
            ValueError: ``timeout`` not > 0.
        """
        self._ext.close_queue(queue_uri, _timeout(timeout))

    def configure_queue(self, queue_uri: str, options: QueueOptions, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Change the options of an open queue; None fields stay as they are.

        Args:
            queue_uri: an open queue's URI.
            options: the options to change.
            timeout: seconds; the session's configure timeout when not given.

        Raises:
            Error: not open (``Queue not opened``), stopped, suspension without a monitor, or
                ``Failed to configure URI queue: STATUS: detail`` (the options are then unchanged).
            BrokerTimeoutError: no answer within ``timeout``.
            ValueError: ``timeout`` not > 0.
        """
        self._ext.check_running()
        self._check_suspension(options)
        values = tuple(getattr(options, name) for name in _OPTION_NAMES)
        self._ext.configure_queue(queue_uri, values, _timeout(timeout))  # type: ignore[arg-type]

    def get_queue_options(self, queue_uri: str) -> QueueOptions:
        """The options of an open queue, every field set (a writer's consumption fields are the
        defaults: they do not apply to it).

        Args:
            queue_uri: an open queue's URI.

        Returns:
            A new :class:`QueueOptions`.

        Raises:
            Error: not open (``Queue not opened``), or the session is stopped.
        """
        return QueueOptions(*self._ext.queue_options(queue_uri))

    def stop(self) -> None:
        """Disconnect and stop the session's threads (idempotent). Every event, ``Disconnected``
        last, has been delivered when this returns; later calls raise ``Error``. May be called
        from a callback (the rest of the events then follow after it returns)."""
        self._ext.stop()

    def post(
        self,
        queue_uri: str,
        message: bytes,
        properties: Optional[PropertyValueDict] = None,
        property_type_overrides: Optional[PropertyTypeDict] = None,
        on_ack: Optional[Callable[[Ack], None]] = None,
    ) -> None:
        """Post ``message`` to an open queue; returns at once.

        Args:
            queue_uri: a queue opened with ``write=True``.
            message: the payload (bytes; bytearray and memoryview are taken too).
            properties: ``{name: value}``: bool is BOOL, int INT64, str STRING, bytes BINARY.
            property_type_overrides: ``{name: PropertyType}`` for some of ``properties``.
            on_ack: called with the :class:`Ack` on the session's callback thread.

        Raises:
            Error: not open (``Queue not opened``); ``Failed to construct message:
                QUEUE_READONLY`` / ``PAYLOAD_EMPTY``; a property of another type or an override
                without its property; the queue suspended (QUEUE_SUSPENDED); the connection
                stayed full for bmq's ``channel_write_timeout``; the session is stopped.
            TypeError: ``message`` is not bytes.
        """
        types = None
        if properties or property_type_overrides:
            types = _property_types(properties, property_type_overrides)
        self._ext.post(queue_uri, message, properties, types, on_ack)

    def confirm(self, message: Message) -> None:
        """Confirm ``message`` (as its :meth:`MessageHandle.confirm` does).

        Args:
            message: a message delivered by this session.

        Raises:
            Error: the session is stopped, or the confirm could not be sent.
        """
        self._ext.confirm(message)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        ext = getattr(self, "_ext", None)
        if ext is None or ext.stopped:
            return
        warnings.warn("stop() not invoked before destruction of Session: bmq.compat stops it now", UserWarning)
        ext.stop_in_background()


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value
