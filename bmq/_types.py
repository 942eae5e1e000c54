"""Value types of the public API: Ack, AckStatus, Message, PropertyType, CompressionAlgorithmType."""
from __future__ import annotations

from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any, Dict, NamedTuple, Optional, Tuple

from . import _codec

if TYPE_CHECKING:  # pragma: no cover
    from ._queue import Queue

__all__ = ["Ack", "AckStatus", "Message", "PropertyType", "CompressionAlgorithmType"]


class AckStatus(Enum):
    """Outcome of a post, with the official SDK's members (values are bmqt::AckResult codes).

    SUCCESS comes from the broker; LIMIT_*, STORAGE_FAILURE, NOT_READY and UNKNOWN are broker
    NACKs (protocol §3.3: REFUSED / INVALID_ARGUMENT arrive as UNKNOWN). TIMEOUT is local: no ACK
    within ``SessionOptions.ack_timeout``. NOT_CONNECTED is local: the session stopped before
    the ACK arrived. CANCELED is local: the queue was closed before the ACK arrived.
    """

    SUCCESS = 0
    UNKNOWN = -1
    TIMEOUT = -2
    NOT_CONNECTED = -3
    CANCELED = -4
    NOT_SUPPORTED = -5
    REFUSED = -6
    INVALID_ARGUMENT = -7
    NOT_READY = -8
    LIMIT_MESSAGES = -100
    LIMIT_BYTES = -101
    STORAGE_FAILURE = -104
    UNRECOGNIZED = -1000

    def __repr__(self) -> str:
        return f"<AckStatus.{self.name}>"


# Wire status (4 bits) -> AckStatus, protocol §3.3; index with the raw status.
ACK_STATUS_FROM_WIRE: Tuple[AckStatus, ...] = (
    AckStatus.SUCCESS,
    AckStatus.LIMIT_MESSAGES,
    AckStatus.LIMIT_BYTES,
    AckStatus.UNKNOWN,
    AckStatus.UNKNOWN,
    AckStatus.UNKNOWN,
    AckStatus.STORAGE_FAILURE,
    AckStatus.NOT_READY,
) + (AckStatus.UNKNOWN,) * 8


class _StateEnum(str, Enum):
    """A state whose value is the lower-case string bmq used before the enum (so ``state ==
    "open"`` keeps working) and which prints as that string."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class QueueState(_StateEnum):
    """Life of a :class:`bmq.Queue` (the official SDK's queue states, simplified).

    PENDING: open for the application, waiting to be reopened after a reconnect.
    """

    OPENING = "opening"
    OPEN = "open"
    PENDING = "pending"
    CLOSING = "closing"
    CLOSED = "closed"


class SessionState(_StateEnum):
    """Life of a :class:`bmq.Session`."""

    STARTING = "starting"
    STARTED = "started"
    RECONNECTING = "reconnecting"
    STOPPING = "stopping"
    STOPPED = "stopped"


class PropertyType(IntEnum):
    """The seven message property types (values are the wire codes, protocol §6.2)."""

    BOOL = _codec.PROPERTY_BOOL
    CHAR = _codec.PROPERTY_CHAR
    SHORT = _codec.PROPERTY_SHORT
    INT32 = _codec.PROPERTY_INT32
    INT64 = _codec.PROPERTY_INT64
    STRING = _codec.PROPERTY_STRING
    BINARY = _codec.PROPERTY_BINARY


class CompressionAlgorithmType(Enum):
    """Payload compression (values are the wire CAT codes; only ZLIB exists, protocol §2.6)."""

    NONE = _codec.COMPRESSION_NONE
    ZLIB = _codec.COMPRESSION_ZLIB


class Ack(NamedTuple):
    """The broker's (or the session's local) answer to one posted message.

    Attributes:
        status: the :class:`AckStatus`.
        guid: the message's 16-byte GUID.
        queue_uri: the URI of the queue the message was posted to.

    Thread-safety: immutable; safe to share between threads.
    """

    status: AckStatus
    guid: bytes
    queue_uri: str

    @property
    def ok(self) -> bool:
        """True when ``status`` is SUCCESS."""
        return self.status is AckStatus.SUCCESS

    @property
    def guid_hex(self) -> str:
        """The GUID as 32 upper-case hex characters."""
        return self.guid.hex().upper()


class Message:
    """A message received from a queue opened with ``read=True``.

    Attributes:
        data: the payload (decompressed).
        guid: the message's 16-byte GUID.
        queue_uri: the URI of the queue it was received on.

    Properties are decoded on first access of :attr:`properties` / :attr:`property_types`.

    Thread-safety: safe to read from any thread; :meth:`confirm` may be called from any thread.
    """

    # Made once per delivered message, so only what every message needs is set here; _decoded
    # (the properties) and _trace (the OpenTelemetry consumer span, when the session traces)
    # are set when first needed and read with getattr.
    __slots__ = ("data", "guid", "_area", "_new_style", "_decoded", "_queue", "_trace")
    _trace: Any
    _decoded: Dict[str, Tuple[int, Any]]

    def __init__(
        self,
        data: bytes,
        guid: bytes,
        queue: "Queue",
        properties_area: Optional[bytes],
        new_style: bool,
    ) -> None:
        self.data = data
        self.guid = guid
        self._area = properties_area
        self._new_style = new_style
        self._queue = queue

    @property
    def queue_uri(self) -> str:
        """The URI of the queue the message was received on."""
        return self._queue.uri

    def _typed(self) -> Dict[str, Tuple[int, Any]]:
        decoded: Optional[Dict[str, Tuple[int, Any]]] = getattr(self, "_decoded", None)
        if decoded is None:
            decoded = {} if self._area is None else _codec.decode_properties(self._area, self._new_style)
            self._decoded = decoded
        return decoded

    @property
    def properties(self) -> Dict[str, Any]:
        """``{name: value}``; CHAR values are 1-byte ``bytes``, BINARY ``bytes``, STRING ``str``."""
        if self._area is None:  # most messages: nothing to decode (a Spark read asks for every row)
            return {}
        return {name: value for name, (_, value) in self._typed().items()}

    @property
    def property_types(self) -> Dict[str, PropertyType]:
        """``{name: PropertyType}`` of every property."""
        return {name: PropertyType(kind) for name, (kind, _) in self._typed().items()}

    @property
    def guid_hex(self) -> str:
        """The GUID as 32 upper-case hex characters."""
        return self.guid.hex().upper()

    def confirm(self) -> None:
        """Tell the broker this message is processed (it will not be redelivered).

        A confirm is sent at once and never buffered: while the session is reconnecting it is
        dropped (the broker redelivers the message), as the official SDKs do.

        Raises:
            SessionClosedError: the session is stopped.
            QueueStateError: the queue is closed.
        """
        self._queue._confirm((self,))

    def __repr__(self) -> str:
        return f"Message(queue_uri={self.queue_uri!r}, guid={self.guid_hex}, data={self.data[:32]!r})"
