"""Value types of the public API: Ack, AckStatus, Message, MessageBatch, PropertyType,
CompressionAlgorithmType."""
from __future__ import annotations

from enum import Enum, IntEnum
import bisect
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _codec

if TYPE_CHECKING:  # pragma: no cover
    from ._options import Subscription
    from ._queue import Queue

__all__ = ["Ack", "AckStatus", "Message", "MessageBatch", "PropertyType", "CompressionAlgorithmType"]


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


#: QueueState's members bound once, for the per-message paths (post, delivery, get) to compare by
#: identity: reading a member through its class costs ~50 ns on 3.11, several times a message.
QUEUE_OPEN, QUEUE_PENDING, QUEUE_CLOSING, QUEUE_CLOSED = (QueueState.OPEN, QueueState.PENDING,
                                                          QueueState.CLOSING, QueueState.CLOSED)


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
    __slots__ = ("data", "guid", "_area", "_new_style", "_decoded", "_queue", "_trace", "_sid")
    _trace: Any
    _decoded: Dict[str, Tuple[int, Any]]

    def __init__(
        self,
        data: bytes,
        guid: bytes,
        queue: "Queue",
        properties_area: Optional[bytes],
        new_style: bool,
        sid: int = -1,
    ) -> None:
        self.data = data
        self.guid = guid
        self._area = properties_area
        self._new_style = new_style
        self._queue = queue
        self._sid = sid

    @property
    def subscription(self) -> Union[str, "Subscription", None]:
        """The entry of the queue's ``QueueOptions.subscriptions`` this message matched: the
        expression text or :class:`bmq.Subscription` as given; None for a queue without
        subscriptions. A message matching several subscriptions comes once, for the one the
        broker chose (the highest priority)."""
        # Not .get(): on free-threaded 3.13 it costs ~16 us (docs/free-threading.md).
        subscription_of = self._queue.subscription_of
        entry: Union[str, "Subscription", None] = subscription_of[self._sid] if self._sid in subscription_of else None
        return entry

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


# (properties area, new-style properties) of the messages of a batch that have properties.
_Areas = Optional[Dict[int, Tuple[bytes, bool]]]


class MessageBatch:
    """Messages received together on a queue opened with ``batches=True``, column by column.

    A batch keeps the payloads of its messages in one buffer and their GUIDs in another, so
    taking, converting (to Arrow, NumPy, a file) and confirming tens of thousands of messages
    costs a few calls instead of a Python object per message. :meth:`messages` gives
    :class:`Message` objects where they are wanted. Made by the session
    (:meth:`Queue.get_batch`), not by applications.

    Attributes:
        payloads: every payload, back to back (decompressed).
        guids: the 16-byte GUIDs, back to back.
        queue_uri: the URI of the queue the messages were received on.

    Thread-safety: immutable; :meth:`confirm` may be called from any thread.
    """

    __slots__ = ("payloads", "guids", "_offsets", "_areas", "_queue", "_sids")

    def __init__(self, queue: "Queue", guids: bytes, payloads: bytes, offsets: bytes, areas: _Areas,
                 sids: Tuple[Tuple[int, int], ...] = ((0, -1),)) -> None:
        self._queue = queue
        self.guids = guids
        self.payloads = payloads
        self._offsets = offsets
        self._areas = areas
        #: (first index, subscription id) of each run of messages delivered for one subscription.
        self._sids = sids

    @classmethod
    def join(cls, batches: Sequence["MessageBatch"]) -> "MessageBatch":
        """One batch of the messages of ``batches`` (of one queue), in order.

        Raises:
            ValueError: no batches, or batches of different queues.
        """
        if not batches:
            raise ValueError("MessageBatch.join needs at least one batch")
        queue = batches[0]._queue
        if any(batch._queue is not queue for batch in batches):
            raise ValueError("MessageBatch.join: the batches come from different queues")
        if len(batches) == 1:
            return batches[0]
        areas: Dict[int, Tuple[bytes, bool]] = {}
        sids: List[Tuple[int, int]] = []
        base = 0
        for batch in batches:
            if batch._areas:
                areas.update((base + index, area) for index, area in batch._areas.items())
            for start, sid in batch._sids:
                if not sids or sids[-1][1] != sid:  # runs of one subscription stay one run
                    sids.append((base + start, sid))
            base += len(batch)
        return cls(
            queue,
            b"".join([batch.guids for batch in batches]),
            b"".join([batch.payloads for batch in batches]),
            _codec.join_offsets([batch._offsets for batch in batches]),
            areas or None,
            tuple(sids),
        )

    def __len__(self) -> int:
        return len(self.guids) >> 4

    @property
    def offsets(self) -> memoryview:
        """``len(batch) + 1`` native-endian int32 (format ``"i"``): message ``i``'s payload is
        ``payloads[offsets[i]:offsets[i + 1]]``.

        With :attr:`payloads` this is the layout of an Arrow binary column:
        ``pyarrow.Array.from_buffers(pyarrow.binary(), len(batch), [None,
        pyarrow.py_buffer(batch.offsets), pyarrow.py_buffer(batch.payloads)])`` wraps them
        without a copy.
        """
        return memoryview(self._offsets).cast("i")

    @property
    def queue_uri(self) -> str:
        """The URI of the queue the messages were received on."""
        return self._queue.uri

    @property
    def has_properties(self) -> bool:
        """True when some message of the batch has properties."""
        return bool(self._areas)

    def _index(self, index: int) -> int:
        if not -len(self) <= index < len(self):
            raise IndexError(f"message {index} of a batch of {len(self)}")
        return index % len(self)

    def payload(self, index: int) -> bytes:
        """The payload of message ``index``."""
        index = self._index(index)
        offsets = self.offsets
        return self.payloads[offsets[index]:offsets[index + 1]]

    def guid(self, index: int) -> bytes:
        """The 16-byte GUID of message ``index``."""
        index = self._index(index)
        return self.guids[16 * index:16 * index + 16]

    def properties(self, index: int) -> Dict[str, Any]:
        """The properties of message ``index`` (see :attr:`Message.properties`)."""
        return self._message(index).properties

    def all_properties(self) -> List[Dict[str, Any]]:
        """The properties of every message, in order (an empty dict for one without)."""
        areas = self._areas or {}
        return [self.properties(index) if index in areas else {} for index in range(len(self))]

    def messages(self) -> List[Message]:
        """The batch as :class:`Message` objects (each one confirmable on its own)."""
        return [self._message(index) for index in range(len(self))]

    def _message(self, index: int) -> Message:
        index = self._index(index)
        area, new_style = (self._areas or {}).get(index, (None, False))
        return Message(self.payload(index), self.guid(index), self._queue, area, new_style, self._sid(index))

    def _sid(self, index: int) -> int:
        sids = self._sids
        if len(sids) == 1:
            return sids[0][1]
        return sids[bisect.bisect_right(sids, (index, 2**63)) - 1][1]

    def confirm(self) -> None:
        """Confirm every message of the batch (see :meth:`Message.confirm`), in as few CONFIRM
        events as the protocol allows.

        Raises:
            SessionClosedError: the session is stopped.
            QueueStateError: the queue is closed.
        """
        self._queue._session._confirm_batch(self)

    def _split(self, count: int) -> Tuple["MessageBatch", "MessageBatch"]:
        """The first ``count`` messages and the rest (0 < count < len(self))."""
        offsets = self.offsets
        cut = offsets[count]
        head_areas = tail_areas = None
        if self._areas:
            head_areas = {index: area for index, area in self._areas.items() if index < count} or None
            tail_areas = {index - count: area for index, area in self._areas.items() if index >= count} or None
        head_sids = tuple(run for run in self._sids if run[0] < count)
        tail_sids = ((0, self._sid(count)),) + tuple((start - count, sid) for start, sid in self._sids if start > count)
        head = MessageBatch(self._queue, self.guids[:16 * count], self.payloads[:cut],
                            self._offsets[:4 * (count + 1)], head_areas, head_sids)
        tail = MessageBatch(self._queue, self.guids[16 * count:], self.payloads[cut:],
                            _codec.join_offsets([self._offsets[4 * count:]]), tail_areas, tail_sids)
        return head, tail

    def _count_within(self, size: int) -> int:
        """How many messages from the first have payloads totalling at most ``size`` bytes."""
        return bisect.bisect_right(self.offsets, size) - 1

    def __repr__(self) -> str:
        return f"MessageBatch(queue_uri={self.queue_uri!r}, messages={len(self)}, bytes={len(self.payloads)})"
