"""Option value classes: SessionOptions, QueueOptions, ReconnectPolicy (keyword-only, frozen)."""
from __future__ import annotations

import dataclasses
import random
import ssl
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple, Union

from . import _expression
from ._outbox import FSYNC_POLICIES
from ._tls import client_context
from ._types import CompressionAlgorithmType
from .exceptions import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:  # pragma: no cover
    from ._health import HostHealthMonitor
    from ._stats import SessionStats
    from .events import SessionEvent

__all__ = ["SessionOptions", "QueueOptions", "ReconnectPolicy", "Subscription"]

# kw_only needs 3.10; on 3.9 the classes stay frozen and callers are still told to use keywords.
# The decorator is spelled out on each class so that type checkers see the dataclass.
_KW_ONLY: Any = {"kw_only": True} if sys.version_info >= (3, 10) else {}

_MIB = 1024 * 1024
_PRIORITY_MIN = -1_073_741_824
_PRIORITY_MAX = 1_073_741_823


def tls_context_of(tls: Any) -> "Optional[ssl.SSLContext]":
    """What ``SessionOptions(tls=...)`` takes, as the client context to use (None: plaintext).

    Raises:
        ArgumentTypeError: not a context, True or None. InvalidArgumentError: a server context.
    """
    if tls is None or tls is False:
        return None
    if tls is True:
        return client_context()
    if not isinstance(tls, ssl.SSLContext):
        raise ArgumentTypeError(f"tls must be an ssl.SSLContext, True or None, not {type(tls).__name__}")
    if tls.protocol == ssl.PROTOCOL_TLS_SERVER:
        raise InvalidArgumentError("tls must be a client context (ssl.PROTOCOL_TLS_CLIENT), not a server's")
    return tls


#: ``(mechanism, data)``: an authentication mechanism (e.g. ``"BASIC"``) and its data.
Credential = Tuple[str, Union[str, bytes]]


def check_credential(credential: Any) -> Tuple[str, bytes]:
    """``(MECHANISM, data bytes)`` of a credential.

    Raises:
        ArgumentTypeError: not a ``(str, str | bytes)`` pair (the message never shows the data).
    """
    if (not isinstance(credential, tuple) or len(credential) != 2 or not isinstance(credential[0], str)
            or not credential[0] or not isinstance(credential[1], (str, bytes))):
        raise ArgumentTypeError(f"a credential must be a (mechanism: str, data: str | bytes) pair, "
                                f"not a {type(credential).__name__}")
    mechanism, data = credential
    return mechanism.upper(), data.encode() if isinstance(data, str) else data


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidArgumentError(message)


def _positive(name: str, value: Any) -> None:
    _require(isinstance(value, (int, float)) and value > 0, f"{name} must be a positive number, not {value!r}")


@dataclasses.dataclass(frozen=True, **_KW_ONLY)
class ReconnectPolicy:
    """How a session reconnects after losing its connection.

    The n-th attempt (from 0) waits ``min(max_delay, initial_delay * multiplier**n)``, scaled
    by a random factor in ``[1 - jitter, 1 + jitter]`` so that many clients do not reconnect
    in lock-step.

    Attributes:
        enabled: reconnect at all; when False a lost connection stops the session.
        initial_delay: seconds before the first attempt.
        max_delay: cap of the delay, seconds.
        multiplier: growth factor between attempts.
        jitter: relative random spread, 0 to 1.
        max_attempts: give up (and stop the session) after this many failed attempts; None = never.
            With several broker addresses an attempt tries each once, and the first after a
            lost connection goes at once (see :class:`bmq.Session`).

    Thread-safety: immutable.
    """

    enabled: bool = True
    initial_delay: float = 0.05
    max_delay: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.2
    max_attempts: Optional[int] = None

    def __post_init__(self) -> None:
        _require(self.initial_delay >= 0, "initial_delay must be >= 0")
        _positive("max_delay", self.max_delay)
        _require(self.multiplier >= 1, "multiplier must be >= 1")
        _require(0 <= self.jitter <= 1, "jitter must be within [0, 1]")
        _require(self.max_attempts is None or self.max_attempts > 0, "max_attempts must be > 0 or None")

    def delay(self, attempt: int, rng: Optional[random.Random] = None) -> float:
        """Seconds to wait before attempt number ``attempt`` (0-based).

        Args:
            attempt: how many attempts already failed.
            rng: random source (for reproducible tests); the module's by default.

        Returns:
            The jittered delay.
        """
        base = min(self.max_delay, self.initial_delay * self.multiplier ** min(attempt, 64))
        spread = (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        return base * spread


@dataclasses.dataclass(frozen=True, init=False)
class Subscription:
    """One subscription of a reader queue: an expression and the consumer parameters
    BlazingMQ attaches to it (C++ ``bmqt::Subscription``).

    ``Subscription("n > 5", consumer_priority=2, max_unconfirmed_messages=10)``. A parameter
    left None takes the queue's (:class:`QueueOptions`) value. Messages matching several
    subscriptions of a queue go to the one of highest priority; a full subscription holds the
    messages it matches rather than letting lower priorities take them (as bmqbrkr routes).

    Args:
        expression: the expression (see docs/subscriptions.md), checked at once.
        consumer_priority: within [-1073741824, 1073741823], or None.
        max_unconfirmed_messages: messages of this subscription delivered and not yet
            confirmed, at most; or None.
        max_unconfirmed_bytes: likewise in bytes; or None.

    Raises:
        InvalidArgumentError: a wrong expression (naming it, the offset and the reason) or
            parameter.
        ArgumentTypeError: an expression that is not a str.

    Thread-safety: immutable.
    """

    expression: str
    consumer_priority: Optional[int] = None
    max_unconfirmed_messages: Optional[int] = None
    max_unconfirmed_bytes: Optional[int] = None

    def __init__(self, expression: str, *, consumer_priority: Optional[int] = None,
                 max_unconfirmed_messages: Optional[int] = None, max_unconfirmed_bytes: Optional[int] = None) -> None:
        _expression.check(expression)
        _check_consumer(consumer_priority, max_unconfirmed_messages, max_unconfirmed_bytes, optional=True)
        object.__setattr__(self, "expression", expression)
        object.__setattr__(self, "consumer_priority", consumer_priority)
        object.__setattr__(self, "max_unconfirmed_messages", max_unconfirmed_messages)
        object.__setattr__(self, "max_unconfirmed_bytes", max_unconfirmed_bytes)


def _check_consumer(priority: Any, messages: Any, size: Any, optional: bool = False) -> None:
    def absent(value: Any) -> bool:
        return optional and value is None

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    _require(absent(messages) or (whole(messages) and messages >= 0), "max_unconfirmed_messages must be an int >= 0")
    _require(absent(size) or (whole(size) and size >= 0), "max_unconfirmed_bytes must be an int >= 0")
    _require(absent(priority) or (whole(priority) and _PRIORITY_MIN <= priority <= _PRIORITY_MAX),
             f"consumer_priority must be an int within [{_PRIORITY_MIN}, {_PRIORITY_MAX}]")


@dataclasses.dataclass(frozen=True, **_KW_ONLY)
class QueueOptions:
    """How a reader queue consumes; unused for write-only queues except host-health suspension.

    Attributes:
        max_unconfirmed_messages: messages delivered but not yet confirmed, at most.
        max_unconfirmed_bytes: bytes delivered but not yet confirmed, at most.
        consumer_priority: higher priorities get messages first; within
            [-1073741824, 1073741823].
        suspends_on_bad_host_health: suspend this queue while the session's host health
            monitor says unhealthy.
        subscriptions: expression texts (BlazingMQ subscription language, e.g. ``"n > 5"``,
            see docs/subscriptions.md) or :class:`Subscription` objects (an expression with
            its own priority and limits); each becomes one subscription. Empty = receive
            everything. Each text is checked here (syntax, limits, types): a wrong one raises
            :class:`bmq.InvalidArgumentError` naming the expression, the offset and the reason.

    Thread-safety: immutable.
    """

    max_unconfirmed_messages: int = 1000
    max_unconfirmed_bytes: int = 32 * _MIB
    consumer_priority: int = 0
    suspends_on_bad_host_health: bool = False
    subscriptions: Sequence[Union[str, Subscription]] = ()  # kept as a tuple

    def __post_init__(self) -> None:
        _check_consumer(self.consumer_priority, self.max_unconfirmed_messages, self.max_unconfirmed_bytes)
        if isinstance(self.subscriptions, (str, Subscription)):
            raise ArgumentTypeError("subscriptions must be a sequence of expression strings or Subscriptions, "
                                    "not one")
        object.__setattr__(self, "subscriptions", tuple(self.subscriptions))
        for entry in self.subscriptions:
            if not isinstance(entry, Subscription):
                _expression.check(entry)  # bmqbrkr accepts what it cannot use: refuse it here

    def consumer_of(self, entry: Union[str, Subscription]) -> Tuple[int, int, int]:
        """``(consumer_priority, max_unconfirmed_messages, max_unconfirmed_bytes)`` of one
        entry of :attr:`subscriptions`: its own where set, else these options'.

        Args:
            entry: a text or a :class:`Subscription`.

        Returns:
            The three parameters.
        """
        if not isinstance(entry, Subscription):
            return self.consumer_priority, self.max_unconfirmed_messages, self.max_unconfirmed_bytes

        def pick(value: Optional[int], default: int) -> int:
            return default if value is None else value

        return (pick(entry.consumer_priority, self.consumer_priority),
                pick(entry.max_unconfirmed_messages, self.max_unconfirmed_messages),
                pick(entry.max_unconfirmed_bytes, self.max_unconfirmed_bytes))


def _compression(value: Union[CompressionAlgorithmType, str, None]) -> CompressionAlgorithmType:
    """Normalise a compression argument (``None``, ``"zlib"``, ``"none"`` or the enum)."""
    if value is None:
        return CompressionAlgorithmType.NONE
    if isinstance(value, CompressionAlgorithmType):
        return value
    if isinstance(value, str):
        try:
            return CompressionAlgorithmType[value.upper()]
        except KeyError:
            pass
    raise InvalidArgumentError(f"unknown compression {value!r}: use 'zlib', 'none' or CompressionAlgorithmType")


@dataclasses.dataclass(frozen=True, **_KW_ONLY)
class SessionOptions:
    """Everything configurable about a :class:`bmq.Session`.

    Attributes:
        connect_timeout: seconds for TCP connect plus negotiation.
        disconnect_timeout: seconds to wait for the broker's DisconnectResponse on stop.
        open_queue_timeout: seconds for OpenQueue (+ ConfigureStream for readers).
        configure_queue_timeout: seconds for a configure.
        close_queue_timeout: seconds for a close (deconfigure + CloseQueue).
        ack_timeout: seconds after which a PUT without ACK resolves as ``AckStatus.TIMEOUT``.
        channel_write_timeout: seconds a poster waits while the connection is above its high
            watermark before :class:`bmq.BandwidthLimitError`.
        channel_high_watermark: bytes queued for the socket above which posters wait.
        max_pending_bytes: payload bytes kept for retransmission (unacknowledged or buffered
            while disconnected) above which posters wait, then get BandwidthLimitError.
        compression: default compression of posts (``"zlib"``/``"none"`` or the enum).
        user_agent: sent to the broker in the negotiation.
        on_event: callback for :mod:`bmq.events` objects, run on the dispatcher thread.
        reconnect: the :class:`ReconnectPolicy`.
        host_health_monitor: a :class:`bmq.HostHealthMonitor`, or None.
        event_queue_high_watermark: callbacks queued for the dispatcher above which a
            SlowConsumerHighWaterMark event is emitted.
        event_queue_low_watermark: ... back at or below which SlowConsumerNormal is emitted.
        outbox_dir: directory of a durable outbox (see :mod:`bmq` docs), or None.
        credential: how the session authenticates (protocol §8.7), or None to connect as an
            anonymous client: a ``(mechanism, data)`` pair such as ``("BASIC", "user:password")``
            (``data`` is str or bytes), or a callable returning one, called at each connect and
            each re-authentication so that a rotating secret is read afresh. It never appears
            in reprs, logs or exception texts.
        stats_interval: seconds between statistics reports (:meth:`bmq.Session.stats`): a table
            logged at INFO by the ``bmq.stats`` logger, and the snapshot given to ``on_stats``;
            None (the default) reports nothing.
        on_stats: called with each periodic :class:`bmq.SessionStats` on the dispatcher thread.
        opentelemetry: trace every post (a PRODUCER span until its ACK, its context in a
            ``traceparent`` property) and every delivered message (a CONSUMER span until its
            confirm, continuing the producer's trace), and count them through the OpenTelemetry
            meter, with the application's providers; needs ``pip install 'bmq[otel]'``. See
            docs/observability.md.
        outbox_fsync: when the outbox forces its writes to disk: ``"batch"`` (default: once
            per post/post_many call, before it is sent, so an acknowledged-or-recoverable
            message survives a machine crash), ``"always"`` (also every ACK removal) or
            ``"never"`` (survives a killed process, not an OS crash; several times faster).
            Costs are measured in docs/outbox.md.
        busy_poll: seconds a thread blocked on an answer (a blocking ``post()``, a post
            future's ``result()``) polls the socket before it sleeps, with the interpreter lock
            released. A broker on the same host answers within it, and the thread is then
            running when the answer comes instead of being woken (against bmqbrkr on a 2-core
            machine: one thread's blocking post p50 84 -> 41 us, at the cost of the polling's
            CPU). Polling pauses by itself while answers keep coming later than that (a distant
            broker). 0 never polls: for hosts where a core spent waiting is worth more than
            the latency. At most 0.01; Linux only (elsewhere threads always sleep).
        tls: TLS to the broker from the first byte of each connection (a TLS terminator in
            front of bmqbrkr, or a broker's own TLS listener), then the usual authentication
            and negotiation; every reconnect handshakes again. An ``ssl.SSLContext`` for the
            client side (:func:`bmq.tls_context` makes one from a CA file and an optional
            client certificate: certificate and host name verification on, TLS 1.2 at least),
            True for the system's CAs with those defaults, or None/False for plaintext. The
            host name checked is the one given in the broker address (also when it resolved
            to several IP addresses).

    Thread-safety: immutable.
    """

    connect_timeout: float = 30.0
    disconnect_timeout: float = 5.0
    open_queue_timeout: float = 30.0
    configure_queue_timeout: float = 30.0
    close_queue_timeout: float = 30.0
    ack_timeout: float = 120.0
    channel_write_timeout: float = 5.0
    channel_high_watermark: int = 64 * _MIB
    max_pending_bytes: int = 512 * _MIB
    compression: Union[CompressionAlgorithmType, str, None] = CompressionAlgorithmType.NONE
    user_agent: str = ""
    on_event: Optional[Callable[["SessionEvent"], None]] = None
    reconnect: ReconnectPolicy = ReconnectPolicy()
    host_health_monitor: Optional["HostHealthMonitor"] = None
    event_queue_high_watermark: int = 2000
    event_queue_low_watermark: int = 50
    outbox_dir: Optional[str] = None
    outbox_fsync: str = "batch"
    credential: Union[Credential, Callable[[], Credential], None] = dataclasses.field(default=None, repr=False)
    stats_interval: Optional[float] = None
    on_stats: Optional[Callable[["SessionStats"], None]] = None
    opentelemetry: bool = False
    busy_poll: float = 0.0002
    tls: Union[bool, "ssl.SSLContext", None] = None

    def __post_init__(self) -> None:
        for name in (
            "connect_timeout",
            "disconnect_timeout",
            "open_queue_timeout",
            "configure_queue_timeout",
            "close_queue_timeout",
            "ack_timeout",
        ):
            _positive(name, getattr(self, name))
        _require(self.channel_write_timeout >= 0, "channel_write_timeout must be >= 0")
        _require(isinstance(self.busy_poll, (int, float)) and not isinstance(self.busy_poll, bool)
                 and 0 <= self.busy_poll <= 0.01,
                 f"busy_poll must be a number of seconds within [0, 0.01], not {self.busy_poll!r}")
        _positive("channel_high_watermark", self.channel_high_watermark)
        _positive("max_pending_bytes", self.max_pending_bytes)
        _require(
            0 <= self.event_queue_low_watermark < self.event_queue_high_watermark,
            "need 0 <= event_queue_low_watermark < event_queue_high_watermark",
        )
        _require(isinstance(self.user_agent, str), "user_agent must be a str")
        # "" would silently put the outbox in the current directory.
        _require(self.outbox_dir is None or str(self.outbox_dir) != "",
                 "outbox_dir must be a directory path or None, not an empty string")
        _require(self.outbox_fsync in FSYNC_POLICIES,
                 f"outbox_fsync must be one of {', '.join(FSYNC_POLICIES)}, not {self.outbox_fsync!r}")
        _require(self.on_event is None or callable(self.on_event), "on_event must be callable")
        _require(self.on_stats is None or callable(self.on_stats), "on_stats must be callable")
        if self.stats_interval is not None:
            _positive("stats_interval", self.stats_interval)
        if self.credential is not None and not callable(self.credential):
            check_credential(self.credential)
        object.__setattr__(self, "compression", _compression(self.compression))
        object.__setattr__(self, "tls", tls_context_of(self.tls))
