"""The PUT path: every PUT event is built here, and kept from hand-off until its final answer.

:class:`PendingPuts` builds the PUT events of fresh posts (:meth:`PendingPuts.post`), of
messages recovered from a previous process's outbox (:meth:`PendingPuts.resend_recovered`)
and of retransmissions after a reconnect (:meth:`PendingPuts.restore`, with the original GUIDs:
the codec re-encodes deterministically, protocol §11.3). It is the pending-ACK table, the
retransmission list, the memory bound for messages buffered while disconnected, and the one
owner of the durable outbox (append, remove, close).
"""
from __future__ import annotations

import collections
import logging
import operator
import threading
import time
from concurrent.futures import Future
from itertools import chain, repeat
from typing import (TYPE_CHECKING, Any, Callable, Deque, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple,
                    Union)

from . import _codec, _properties
from ._dispatch import AwaitAnswer, PostFuture, new_futures, resolve_futures, thread_condition
from ._outbox import OutboxRecord
from ._types import ACK_STATUS_FROM_WIRE, Ack, AckStatus, QUEUE_OPEN, QueueState
from .exceptions import (
    ArgumentTypeError,
    BandwidthLimitError,
    ConnectionLost,
    Error,
    InvalidArgumentError,
    SessionClosedError,
    TimeoutError,
)

if TYPE_CHECKING:  # pragma: no cover
    from ._options import SessionOptions
    from ._telemetry import SendTrace
    from ._outbox import Outbox
    from ._queue import Queue
    from ._transport import Answer, Transport

__all__ = ["Batch", "Completion", "OnePost", "PendingPuts", "PostRequest"]

logger = logging.getLogger(__name__)

_ACK_REQUESTED = _codec.PUT_ACK_REQUESTED
_new_tuple = tuple.__new__
_status_of = operator.itemgetter(0)
_guid_of = operator.itemgetter(2)
_RETRANSMIT_CHUNK = 10000
# PUT events close at 1 MiB (a larger message goes alone): bmqbrkr finds each message of an
# event by walking the event's buffers from its start, so its CPU per message grows with the
# event's size (measured: docs/performance-notes.md).
_PUT_EVENT_TARGET = 1 << 20

OnAck = Optional[Callable[[Ack], None]]
# Called once with a post call's answers, in order, when its last message is answered.
OnDone = Optional[Callable[[List[Ack]], None]]
# A post call's encoded properties: one area (or None) for every message, or one per message.
Areas = Union[None, bytes, List[Optional[bytes]]]
_BYTES_LIKE = (bytes, bytearray, memoryview)
_PayloadColumn = _codec.PayloadColumn
Payloads = Union[Tuple[bytes, ...], _codec.PayloadColumn]


class Completion:
    """How the caller of one post call learns its answers: exactly one of three strategies.

    * ``Completion.LATCH``: the caller blocks on the call's latch and reads its Acks
      (``post``, ``post_many``);
    * ``Completion.futures(on_ack)``: one future per message (a one-message call is its own
      future, :class:`OnePost`), ``on_ack`` also called per Ack on the dispatcher thread
      (``post_async``, ``post_many_async``);
    * ``Completion.callback(on_done)``: no future, ``on_done(acks)`` once on the dispatcher
      thread with every Ack in order (``post_many_callback``).
    """

    __slots__ = ("waits", "on_ack", "on_done")
    LATCH: "Completion"
    FUTURES: "Completion"

    def __init__(self, waits: bool, on_ack: OnAck = None, on_done: OnDone = None) -> None:
        self.waits = waits  # the caller blocks on a latch (nobody waits for the write itself otherwise)
        self.on_ack = on_ack
        self.on_done = on_done

    @classmethod
    def futures(cls, on_ack: OnAck) -> "Completion":
        return cls.FUTURES if on_ack is None else cls(False, on_ack)

    @classmethod
    def callback(cls, on_done: Callable[[List[Ack]], None]) -> "Completion":
        return cls(False, None, on_done)


Completion.LATCH = Completion(True)
Completion.FUTURES = Completion(False)


class PostRequest(NamedTuple):
    """One post call as a value: what :class:`bmq.Queue` hands the session, and the session the
    PUT path (:meth:`PendingPuts.post`)."""

    queue: "Queue"  # the queue posted to
    payloads: Sequence[Any]  # bytes-like payloads, in order (or a _codec.PayloadColumn)
    completion: Completion  # how the caller learns the answers
    properties: Any = None  # one mapping (or None) for every message, or one per message
    property_types: Any = None  # {name: PropertyType} overriding inferred types
    compression: Any = None  # as given to the post call (None: the session's default)
    guids: Optional[bytes] = None  # the caller's GUIDs (16 bytes per message), or None to make them
    single: bool = False  # a one-message call: its payload is named ``data`` in errors




def _payload_tuple(payloads: Sequence[Any], single: bool) -> Payloads:
    """The payloads as a tuple of immutable bytes (they are kept for re-sending), or the
    :class:`bmq._codec.PayloadColumn` given (immutable already: no Python object per payload).

    A tuple, not a list: a tuple of bytes leaves the garbage collector's tracking at its first
    collection, and a post's payloads live until its ACK (a list per post_async() made the
    collector's passes cost as much as the rest of the post).

    Raises:
        ArgumentTypeError: a payload that is not bytes-like (``bytes(5)`` would silently make five
            NUL bytes, so nothing is coerced).
        InvalidArgumentError: an empty payload.
    """
    if type(payloads) is _PayloadColumn:
        if payloads.first_empty >= 0:
            raise InvalidArgumentError(f"payloads[{payloads.first_empty}] is empty: BlazingMQ messages need a payload")
        return payloads
    if len(payloads) == 1 and type(payloads[0]) is bytes and payloads[0]:  # a single post's
        return (payloads[0],)
    if set(map(type, payloads)) <= {bytes}:  # the common case, checked at C speed
        result = tuple(payloads)
    else:
        converted = []
        for i, p in enumerate(payloads):
            if not isinstance(p, _BYTES_LIKE):
                name = "data" if single else f"payloads[{i}]"
                raise ArgumentTypeError(f"{name} must be bytes, bytearray or memoryview, not {type(p).__name__}")
            converted.append(p if type(p) is bytes else bytes(p))
        result = tuple(converted)
    if not all(result):
        name = "data" if single else f"payloads[{result.index(b'')}]"
        raise InvalidArgumentError(f"{name} is empty: BlazingMQ messages need a payload")
    return result


def _nbytes(payloads: Sequence[bytes], first: int, count: int) -> int:
    """Bytes of payloads ``first .. first + count - 1`` (a column counts them without a copy)."""
    if type(payloads) is _PayloadColumn:
        return payloads.nbytes_of(first, count)  # type: ignore[attr-defined, no-any-return]
    return sum(map(len, payloads[first:first + count]))


def _build(queue_ids: Any, guids: bytes, payloads: Any, properties: Any, compression: int, new_style: Any,
           check_only: bool = False) -> List[bytes]:
    """The PUT events of messages asking for ACKs, back to back in one bytes object (a list of
    it; empty if ``check_only``)."""
    return _codec.build_put_events(queue_ids, guids, payloads, properties, flags=_ACK_REQUESTED,
                                   compression=compression, new_style_properties=new_style,
                                   target_event_size=_PUT_EVENT_TARGET, joined=True, check_only=check_only)


def _encode_properties(properties: Any, property_types: Any, count: int, new_style: bool) -> Any:
    """One encoded area for every message (a mapping or None), or a list of one per message."""
    if properties is None or isinstance(properties, Mapping):
        return _properties.encode(properties, property_types, new_style)
    areas = _properties.encode_each(list(properties), property_types, new_style)
    if len(areas) != count:
        raise InvalidArgumentError(f"{len(areas)} property mappings for {count} payloads")
    return areas


class Batch:
    """The messages of one post call: what resolving and retransmitting them needs.

    Messages share one object, so the table holds no per-message Python object (many live
    objects make the garbage collector expensive). A blocking caller waits on ``finished``
    and reads ``acks``; an asynchronous one gets ``futures``, or, given ``on_done``, no
    future at all: ``on_done(acks)`` runs on the dispatcher thread once all are answered. ``await_answer`` (given for one
    message) is how either waits: reading the socket itself where it can.
    """

    __slots__ = ("queue", "count", "keys", "payloads", "properties", "new_style", "compression", "deadline",
                 "on_ack", "on_done", "futures", "acks", "cursor", "_index", "remaining", "finished", "trace",
                 "_await")

    def __init__(self, queue: "Queue", keys: Sequence[bytes], payloads: Sequence[bytes], properties: "Areas",
                 new_style: bool, compression: int, deadline: float, completion: Completion = Completion.FUTURES,
                 trace: Optional["SendTrace"] = None, await_answer: Optional[AwaitAnswer] = None) -> None:
        count = len(keys)
        self.queue = queue
        self.count = count
        self.keys = keys  # the GUIDs, in order
        self.payloads = payloads
        # One area (or None) for every message, or a list of one per message: not expanded to
        # one reference per message (see properties_at).
        self.properties = properties
        # The encoding the properties areas were built in: a retransmission must say the same.
        self.new_style = new_style
        self.compression = compression
        self.deadline = deadline
        self.on_ack = completion.on_ack
        self.on_done = on_done = completion.on_done
        asynchronous = not completion.waits
        self.futures: "Optional[List[Future[Ack]]]" = (new_futures(count, await_answer)
                                                        if asynchronous and on_done is None else None)
        self.acks: Optional[List[Optional[Ack]]] = None  # made with the first answer (see answers)
        # Answers mostly come in order: the first unanswered position is tried before an index
        # of the GUIDs, made only if one comes out of order. While all came in order, the
        # answered ones are exactly those before the cursor.
        self.cursor = 0
        self._index: Optional[Dict[bytes, int]] = None
        self.remaining = count
        # A blocking caller's latch, set by whoever settles the last message. The reader thread
        # sets it only once it has let go of the interpreter lock (see handle_acks).
        self.finished: Optional[_codec.Latch] = None if asynchronous else _codec.Latch()
        self._await = await_answer  # how to wait for ``finished`` (PendingPuts.await_answer)
        self.trace = trace  # the OpenTelemetry span of the post call, ended with its last answer

    def position(self, guid: bytes) -> int:
        """Where ``guid`` (one of this call's) is among its messages."""
        i = self.cursor
        keys = self.keys
        if i < len(keys) and keys[i] == guid:
            return i
        if self._index is None:
            self._index = dict(zip(keys, range(len(keys))))
        return self._index[guid]

    def payload_at(self, i: int) -> bytes:
        """The payload of message ``i``."""
        return self.payloads[i]

    def properties_at(self, i: int) -> Optional[bytes]:
        """The encoded properties area of message ``i`` (None: none)."""
        areas = self.properties
        return areas[i] if isinstance(areas, list) else areas

    def answers(self) -> List[Optional[Ack]]:
        """The answers so far by position (None: none yet), made when first asked for: a
        buffered message costs no slot in it."""
        acks = self.acks
        if acks is None:
            acks = self.acks = [None] * self.count
        return acks

    def answer(self, i: int, ack: Ack) -> int:
        """Record message ``i``'s final answer; return its payload's size (no longer kept)."""
        answers = self.answers()
        if i == self.cursor:
            self.cursor = i + 1
        # One statement without a call: an interrupt cannot come between the answer and its
        # count (_salvage counts on it).
        answers[i], self.remaining = ack, self.remaining - 1
        return len(self.payloads[i])

    def wait(self, timeout: float) -> List[Ack]:
        """The acks of a blocking batch, in order.

        Raises:
            TimeoutError: not all of them within ``timeout``; ``guids``: every GUID of the call.
        """
        assert self.finished is not None
        if not (self._await or _codec.Latch.wait)(self.finished, timeout):
            error = TimeoutError(
                f"{self.remaining} of {self.count} message(s) not acknowledged within {timeout:g} s; they are still "
                f"in flight (answered by the broker later, or TIMEOUT after ack_timeout): to retry without "
                f"duplicates, post them again with the same GUIDs (error.guids)")
            error.guids = tuple(self.keys)
            raise error
        return self.answers()  # type: ignore[return-value]


class OnePost(PostFuture):
    """One ``post_async`` message: its pending record and the future its caller holds, in one
    object (what :class:`Batch` and the future of a one-message batch kept in six: a buffered
    100-byte ``post_async``'s memory more than halved: docs/performance-notes.md). It answers what
    :class:`PendingPuts` asks of a :class:`Batch` of one message.

    Once answered it lets go of its payload and properties: a caller may keep the future.
    """

    __slots__ = ("queue", "payload", "areas", "_encoding", "deadline", "on_ack", "trace")
    count = 1
    cursor = 0
    finished = None
    on_done = None

    def __init__(self, queue: "Queue", payload: bytes, areas: Optional[bytes], new_style: bool,
                 compression: int, deadline: float, on_ack: OnAck, trace: Optional["SendTrace"],
                 await_answer: AwaitAnswer) -> None:
        super().__init__(thread_condition(), await_answer)
        self.queue = queue
        self.payload: Optional[bytes] = payload
        self.areas = areas
        self._encoding = compression << 1 | new_style  # one small int: one slot fewer for both
        self.deadline = deadline
        self.on_ack = on_ack
        self.trace = trace

    @property
    def new_style(self) -> bool:
        return bool(self._encoding & 1)

    @property
    def compression(self) -> int:
        return self._encoding >> 1

    @property
    def futures(self) -> "Tuple[OnePost]":
        """Itself: the future of its one message (read when it is settled)."""
        return (self,)

    @property
    def remaining(self) -> int:
        return 0 if self._result is not None else 1

    def answers(self) -> List[Optional[Ack]]:
        return [self._result]

    def position(self, guid: bytes) -> int:
        return 0

    def payload_at(self, i: int) -> bytes:
        return self.payload  # type: ignore[return-value]  # asked only while pending

    def properties_at(self, i: int) -> Optional[bytes]:
        return self.areas  # type: ignore[no-any-return]

    def answer(self, i: int, ack: Ack) -> int:
        """As :meth:`Batch.answer`. The ack is kept as the result, the state left RUNNING:
        resolving it (outside the pending table's lock) makes it visible."""
        self._result = ack
        size = len(self.payload)  # type: ignore[arg-type]
        self.payload = self.areas = None
        return size


Record = Union[Batch, OnePost]
_Settled = Deque[Tuple[Record, int, Ack]]  # a deque: _notify takes from its front


class PendingPuts:
    """Unacknowledged PUTs keyed by GUID.

    Args:
        options: the session's options (ack_timeout, channel_write_timeout, max_pending_bytes).
        submit: runs an ``on_ack`` callback on the dispatcher thread.
        outbox: the durable outbox, or None.

    Thread-safety: thread-safe; futures and events are resolved outside the internal lock.
    """

    def __init__(self, options: "SessionOptions", submit: Callable[..., None], outbox: Optional["Outbox"]) -> None:
        self._options = options
        self._submit = submit
        self._outbox = outbox
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        # Threads waiting on _room (for memory, or in flush): Condition.notify_all is Python
        # code, ~1 us, which answers would otherwise pay per read with nobody to wake.
        self._room_waiters = 0
        self._pending: Dict[bytes, Record] = {}
        # Messages answered (gone from _pending, under the lock) whose answers are still being
        # handed over outside it (futures resolved, on_ack/on_done queued on the dispatcher):
        # flush() waits for these too, else a call_soon() right after flush() could run before
        # the last on_ack (the settling thread, the reader, runs at once with the GIL off).
        self._handing_over = 0
        self._bytes = 0
        self._transport: Optional["Transport"] = None  # None while the state is not restored
        self._closed = False
        self._await_answer = self.await_answer  # made once: every one-message post keeps it

    def __len__(self) -> int:
        return len(self._pending)

    def await_answer(self, answer: "Answer", timeout: float) -> bool:
        """Wait up to ``timeout`` for a one-message post's answer: a blocking post's latch, or
        a post future (:class:`FutureLatch`), through the connection's transport while there is
        one (it may read the socket meanwhile: Transport.wait_for)."""
        transport = self._transport
        if transport is None:
            return bool(answer.wait(timeout))
        return transport.wait_for(answer, timeout)

    def outbox_size(self) -> int:
        """Messages in the durable outbox (0 without one)."""
        return len(self._outbox) if self._outbox is not None else 0

    # ---- posting ----------------------------------------------------------------------
    def post(self, request: PostRequest, generator: Any, new_style: bool, compression: int,
             trace: Optional["SendTrace"] = None) -> "Record":
        """Build the PUT events of one post call in the calling thread, write them to the
        outbox (if any), then :meth:`track_and_send` them.

        Args:
            request: the post call (payloads are copied into immutable bytes: they are kept for
                re-sending; without ``request.guids`` GUIDs are made with ``generator``).
            new_style: the property encoding the connection negotiated.
            compression: the compression algorithm's wire value.
            trace: the OpenTelemetry span of this call (ended with its last answer), or None.

        Raises:
            ArgumentTypeError, InvalidArgumentError, PropertyError: bad payloads, properties or
                GUIDs (nothing sent). OutboxError: the outbox could not record them (nothing
                sent); and what :meth:`track_and_send` raises.
        """
        queue, payloads, completion, properties, property_types, _, guids, single = request
        payloads = _payload_tuple(payloads, single)
        count = len(payloads)
        if properties is not None or property_types is not None:
            properties = _encode_properties(properties, property_types, count, new_style)
        caller_guids = guids is not None
        if guids is None:
            guids = generator.generate(count) if count else b""
        elif len(guids) != 16 * count:
            raise InvalidArgumentError(f"guids must be 16 bytes per message: {len(guids)} bytes for {count} messages")
        elif count > 1 and len(set(_codec.split_guids(guids))) != count:
            # Checked before the outbox records them: a refused post must leave nothing there
            # (a next process would re-send it).
            raise InvalidArgumentError("the same GUID appears twice in one post")
        # Disconnected (read without the lock: track_and_send builds them if that changed), the
        # events would be thrown away, the reconnect re-sending from the payloads: only check.
        events = _build(queue.queue_id, guids, payloads, properties, compression, new_style,
                        check_only=self._transport is None)
        if self._outbox is not None:
            per_message = properties if isinstance(properties, list) else (properties,) * count
            self._outbox.append([
                OutboxRecord(guids[16 * i:16 * i + 16], queue.uri, payload, props, new_style, compression)
                for i, (payload, props) in enumerate(zip(payloads, per_message))
            ])
        return self.track_and_send(queue, guids, payloads, properties, new_style, compression, events,
                                   completion, trace, caller_guids)

    def resend_recovered(self, queue: "Queue", entries: List[OutboxRecord]) -> None:
        """Send what a previous process left unacknowledged in the outbox for ``queue``, with the
        original GUIDs (the broker de-duplicates what had arrived). Each keeps the property
        encoding and compression it was stored with."""
        for compression, new_style in sorted({(e.compression, e.new_style_properties) for e in entries}):
            group = [e for e in entries if (e.compression, e.new_style_properties) == (compression, new_style)]
            guids = b"".join(entry.guid for entry in group)
            payloads = [entry.payload for entry in group]
            properties = [entry.properties for entry in group]
            events = _build(queue.queue_id, guids, payloads, properties, compression, new_style)
            self.track_and_send(queue, guids, payloads, properties, new_style, compression, events,
                                Completion.FUTURES)
        if entries:
            logger.warning("re-sent %d message(s) recovered from the outbox to %s", len(entries), queue.uri)

    def track_and_send(
        self,
        queue: "Queue",
        guids: bytes,
        payloads: Sequence[bytes],
        properties: Areas,
        new_style: bool,
        compression: int,
        events: List[bytes],
        completion: Completion,
        trace: Optional["SendTrace"] = None,
        caller_guids: bool = False,
    ) -> "Record":
        """Record built PUT events (``events``: as :func:`_build` makes them, one bytes object in a
        list, or empty if checked but not built: then built here if they can be sent), then hand
        them to the writer unless reconnecting.

        An asynchronous post of one message is recorded as a :class:`OnePost` (its own
        future), any other as a :class:`Batch`.

        ``caller_guids``: the GUIDs came from the caller (none repeats: :meth:`post` checked),
        so check that none is still pending (its first post would never be settled).

        The built call comes as parameters, not as one request object: every post would pay
        for making that object (docs/performance-notes.md).

        Raises:
            InvalidArgumentError: a still pending caller GUID (its outbox records removed).
            BandwidthLimitError: no room within ``channel_write_timeout`` (nothing kept).
            SessionClosedError: the session stopped (before or while waiting for room): after
                :meth:`close` nothing is recorded, as nothing would ever settle it.
        """
        count = len(payloads)
        keys = (guids,) if count == 1 else _codec.split_guids(guids)
        deadline = time.monotonic() + self._options.ack_timeout
        # One message's answer comes in one read, which the waiting thread (in post() or in its
        # future's result()) can make itself; many come in many reads, each then waking it
        # rather than the reader: only a one-message call waits through await_answer.
        batch: Record
        waits = completion.waits
        if count == 1 and not waits and completion.on_done is None:
            area = properties[0] if isinstance(properties, list) else properties
            batch = OnePost(queue, payloads[0], area, new_style, compression, deadline, completion.on_ack, trace,
                            self._await_answer)
        else:
            batch = Batch(queue, keys, payloads, properties, new_style, compression, deadline, completion, trace,
                          self._await_answer if count == 1 else None)
        size = len(payloads[0]) if count == 1 else _nbytes(payloads, 0, count)
        handed = False  # the event queued (or the connection lost): see the except below
        try:
            with self._lock:
                try:
                    if self._closed:
                        raise SessionClosedError("the session stopped")
                    if caller_guids and not self._pending.keys().isdisjoint(keys):
                        raise InvalidArgumentError("a GUID of this post is still waiting for its ACK")
                    if self._bytes + size > self._options.max_pending_bytes:
                        self._wait_for_room(size)
                except Error:
                    if self._outbox is not None:
                        self._outbox.remove(keys)
                    raise
                if count == 1:
                    self._pending[guids] = batch
                else:
                    self._pending.update(dict.fromkeys(keys, batch))
                self._bytes += size
                counters = queue.counters
                counters.posted += count
                counters.posted_bytes += size
                transport = self._transport if queue.state is QUEUE_OPEN else None
            if transport is not None:
                if not events:
                    events = _build(queue.queue_id, guids, payloads, properties, compression, new_style)
                (data,) = events
                try:
                    transport.send(data, self._options.channel_write_timeout, not waits)
                    handed = True
                except BandwidthLimitError:
                    self._unrecord(keys)
                    raise
                except ConnectionLost:
                    handed = True  # kept: re-sent after the reconnect
        except Error:
            raise
        except BaseException as e:
            # A signal handler's exception (a Ctrl-C in a posting loop) once the message was
            # recorded and before its event was surely queued: it would wait, unsent, for its
            # ACK timeout. Fail the connection, as an interrupted socket write does: the
            # reconnect re-sends every unanswered message.
            transport = self._transport
            if not handed and transport is not None and keys and keys[0] in self._pending:
                transport.fail_interrupted(e)
            raise
        return batch

    def _wait_for_room(self, size: int) -> None:
        """Caller holds the lock: bound the memory kept for retransmission."""
        limit = self._options.max_pending_bytes
        if self._bytes + size <= limit or not self._pending:
            return
        timeout = self._options.channel_write_timeout
        deadline = time.monotonic() + timeout
        while self._bytes + size > limit and self._pending and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BandwidthLimitError(
                    f"{self._bytes} bytes of messages await acknowledgement (limit {limit}) after {timeout:g} s"
                )
            self._wait_on_room(remaining)
        if self._closed:
            raise SessionClosedError("the session stopped")

    def _wait_on_room(self, timeout: float) -> None:
        """Caller holds the lock: wait up to ``timeout`` for answers or removals."""
        self._room_waiters += 1
        try:
            self._room.wait(timeout)
        finally:
            self._room_waiters -= 1

    def _unrecord(self, keys: Sequence[bytes]) -> None:
        with self._lock:
            for key in keys:
                batch = self._pending.pop(key, None)
                if batch is not None:
                    size = len(batch.payload_at(batch.position(key)))
                    self._bytes -= size
                    batch.queue.counters.posted -= 1  # never sent: not posted after all
                    batch.queue.counters.posted_bytes -= size
            self._room.notify_all()
        if self._outbox is not None:
            self._outbox.remove(keys)

    # ---- answers ------------------------------------------------------------------------
    @staticmethod
    def _settle(batch: "Record", guid: bytes, ack: Ack, settled: _Settled) -> int:
        """Record the final answer of ``guid``, popped from the table by the caller, who holds the
        lock unless ``batch`` is a :class:`OnePost` (then nobody else can reach it); return the
        bytes its payload no longer holds (for ``_bytes``)."""
        i = batch.position(guid)
        size = batch.answer(i, ack)
        if batch.futures is not None or batch.on_ack is not None or not batch.remaining:
            settled.append((batch, i, ack))
        return size

    def _notify(self, settled: _Settled, woken: Optional[List[_codec.Latch]] = None) -> None:
        """Outside the lock: resolve futures, wake blocking posters (or, given ``woken``, add
        their latches to it for the caller to set), then queue ``on_ack`` and ``on_done``
        callbacks, taking each entry from ``settled`` as its callbacks are queued.

        Called again after an exception part-way (a KeyboardInterrupt in a main thread), it
        finishes: futures and latches are set again (both idempotent) and only the entries
        still in ``settled`` have callbacks queued: none twice, the callbacks of the one entry
        the exception came in at most lost (docs/threads.md)."""
        answered = [(batch.futures[i], ack) for batch, i, ack in settled if batch.futures is not None]
        if answered:
            resolve_futures(*zip(*answered))
        finished = [batch.finished for batch, _, _ in settled if batch.finished is not None and not batch.remaining]
        if woken is None:
            _codec.set_latches(finished)
        else:
            woken += finished
        submit = self._submit
        take = settled.popleft
        while settled:
            batch, _, ack = take()
            # Without futures or on_ack a batch is in ``settled`` once: with its last answer.
            if batch.on_done is not None and not batch.remaining:
                submit(batch.on_done, batch.answers())
            if batch.on_ack is not None:
                submit(batch.on_ack, ack)
            if batch.trace is not None and not batch.remaining:
                batch.trace.end(batch.answers())

    def _hand_over(self, settled: _Settled, count: List[int], woken: Optional[List[_codec.Latch]] = None) -> None:
        """Outside the lock: :meth:`_notify`, then count ``count[0]`` answered messages (added
        to ``_handing_over`` under the lock that took them from the table) as handed over,
        waking flush(); ``count[0]`` is then 0, so that calling it again after an exception
        part-way finishes the hand-over without counting twice."""
        try:
            self._notify(settled, woken)
        finally:
            if count[0]:
                with self._lock:
                    self._handing_over, count[0] = self._handing_over - count[0], 0  # one statement: see _salvage
                    if self._room_waiters:
                        self._room.notify_all()

    def handle_acks(self, events: List[bytes]) -> List[_codec.Latch]:
        """Reader thread: settle the messages of ACK events (those that came in one read).

        Returns the latches of the blocking posts this answered, for the reader to set once
        it has released the interpreter lock (a poster woken before would only wait for it).

        An exception part-way (a KeyboardInterrupt in a main thread reading in the reader's
        place) is raised only once every message the read answers is settled and handed over
        (:meth:`_salvage`, :meth:`_hand_over`).
        """
        settled: _Settled = collections.deque()
        guids: Optional[List[bytes]] = [] if self._outbox is not None else None
        # A message's deadline is its post time + ack_timeout: latency = now + ack_timeout - deadline.
        answered = time.monotonic() + self._options.ack_timeout
        acked = _codec.iter_acks(events[0])
        for event in events[1:]:
            acked += _codec.iter_acks(event)
        # Bound before the table is touched (and filled in place, not assigned), so that
        # _salvage finds every record this read took whatever point an exception came at.
        records: List[Optional[Record]] = []
        batch: Optional[Batch] = None
        single = False
        handing = [0]  # messages added to _handing_over: see _hand_over
        settling = True
        woken: List[_codec.Latch] = []
        try:
            with self._lock:
                before = len(self._pending)
                keys = list(map(_guid_of, acked))
                batch = self._sole_batch(keys)
                if batch is not None:
                    self._settle_run(batch, keys, list(map(_status_of, acked)), answered, settled, guids)
                else:
                    records.extend(map(self._pending.pop, keys, repeat(None)))
                    if Batch in set(map(type, records)):  # a Batch's state is shared: settled here
                        self._bytes -= self._settle_each(acked, records, answered, settled, guids)
                    else:  # single posts: their payloads leave the count now, whatever comes after
                        single = True
                        self._bytes -= sum([len(record.payload_at(0)) for record in records if record is not None])
                taken = before - len(self._pending)
                count = taken if settled or single else 0
                self._handing_over, handing[0] = self._handing_over + count, count  # one statement: see _salvage
                if self._room_waiters and taken:  # room for posters, or flush()
                    self._room.notify_all()
            if single:
                # Single posts only: each taken from the table is this thread's alone. Settling
                # them outside the lock keeps it short: with the GIL off, posting threads meet
                # this one there (docs/free-threading.md).
                self._settle_each(acked, records, answered, settled, guids)  # bytes counted above
            settling = False
            self._hand_over(settled, handing, woken)
            if guids:
                # Failing, it leaves the answers final and given: only the outbox keeps records
                # a next process would re-send (the broker de-duplicates them within its window).
                self._outbox.remove(guids)  # type: ignore[union-attr]
            return woken
        except BaseException:
            if settling:
                taken_records = chain(records, repeat(None)) if batch is None else repeat(batch)
                self._salvage([(guid, record, ACK_STATUS_FROM_WIRE[status])
                               for (status, _, guid, _), record in zip(acked, taken_records)], settled, guids, handing)
            self._hand_over(settled, handing)  # what is left of it
            _codec.set_latches(woken)  # the reader would have set them
            raise

    def _salvage(self, answers: Iterable[Tuple[bytes, Optional[Record], AckStatus]], settled: _Settled,
                 guids: Optional[List[bytes]], handing: List[int]) -> None:
        """After an exception part-way through settling (a KeyboardInterrupt in a main thread
        reading in the reader's place, or stopping the session), before anything is handed
        over: give each ``(guid, record, status)`` of ``answers`` its answer if it has none
        yet, and put every answered one in ``settled`` once. Taken from the table, nothing else
        would ever answer them (no re-send, no TIMEOUT): their futures would never resolve,
        their blocking posters never wake. A message still in the table is taken now (its
        record None: not yet taken, or an unknown GUID). The queues' answer counters miss what
        this settles.

        Adds what is to be handed over to ``_handing_over`` and ``handing[0]`` unless the
        interrupted pass did (the two are set in one statement without a call, which a
        signal handler cannot split). Recounts ``_bytes`` from the table: the interrupted pass
        may have answered messages without subtracting their bytes.
        """
        listed = {(id(record), i) for record, i, _ in settled}
        finished = {id(record) for record, _, _ in settled}
        outbox = set(guids) if guids is not None else None
        taken = 0
        with self._lock:
            pending = self._pending
            for guid, record, status in answers:
                if guid in pending and (record is None or pending[guid] is record):
                    record = pending.pop(guid)  # the interrupted pass had not taken it yet
                if record is None:
                    continue  # unknown GUID: nothing waits for it
                taken += 1
                i = record.position(guid)
                ack = record.answers()[i]
                if ack is None:
                    self._settle(record, guid, Ack(status, guid, record.queue.uri), settled)
                elif (id(record), i) not in listed and (record.futures is not None or record.on_ack is not None
                                                       or (not record.remaining and id(record) not in finished)):
                    settled.append((record, i, ack))
                listed.add((id(record), i))
                finished.add(id(record))
                if outbox is not None and guid not in outbox:
                    outbox.add(guid)
                    guids.append(guid)  # type: ignore[union-attr]
            self._bytes = sum([len(record.payload_at(record.position(guid))) for guid, record in pending.items()])
            if not handing[0] and taken:
                self._handing_over, handing[0] = self._handing_over + taken, taken
            self._room.notify_all()

    def _sole_batch(self, keys: List[bytes]) -> Optional[Batch]:
        """Caller holds the lock: the post call whose next unanswered messages are ``keys``,
        in order, if there is one (how a post_many's ACKs come back), else None."""
        if len(keys) < 2:
            return None
        # Not ``dict.get``: on free-threaded 3.13 it costs ~16 us when another live thread
        # stored the entry (docs/free-threading.md); a subscript costs 0.1 us.
        try:
            batch = self._pending[keys[0]]
        except KeyError:
            return None
        if not isinstance(batch, Batch) or batch.count == 1:  # unknown, or alone in its post call
            return None
        first = batch.cursor
        # Answered so far exactly those before the cursor (all in order)? Then the GUIDs at the
        # cursor are still pending, and comparing them with the event's proves them all.
        if first != len(batch.keys) - batch.remaining:
            return None
        return batch if batch.keys[first:first + len(keys)] == keys else None

    def _settle_run(self, batch: Batch, keys: List[bytes], statuses: List[int], answered: float,
                    settled: _Settled, guids: Optional[List[bytes]]) -> None:
        """Caller holds the lock: settle ``keys``, the next unanswered messages of ``batch`` in
        order (see :meth:`_sole_batch`), answered with wire ``statuses``, by whole-list and
        slice operations rather than a Python step per message."""
        count = len(keys)
        collections.deque(map(self._pending.__delitem__, keys), maxlen=0)  # at C speed
        queue = batch.queue
        acks = _codec.make_acks(Ack, ACK_STATUS_FROM_WIRE, keys, statuses, queue.uri)
        counters = queue.counters
        counters.latencies.append(answered - batch.deadline)
        if statuses.count(0) == count:  # all SUCCESS
            counters.broker_answers[0] += count
        else:
            for status in statuses:
                counters.broker_answers[status] += 1
        first = batch.cursor  # _sole_batch checked: keys are the next ones in order
        answers = batch.answers()
        # One statement without a call: an interrupt cannot come between the answers and
        # their count (_salvage counts on it).
        answers[first:first + count], batch.remaining, batch.cursor = acks, batch.remaining - count, first + count
        self._bytes -= _nbytes(batch.payloads, first, count)
        if batch.futures is not None or batch.on_ack is not None:
            settled.extend(zip(repeat(batch), range(first, first + count), acks))
        elif not batch.remaining:
            settled.append((batch, first, acks[0]))
        if guids is not None:
            guids.extend(keys)

    def _settle_each(self, acked: List[Tuple[int, int, bytes, int]], records: List[Optional["Record"]],
                     answered: float, settled: _Settled, guids: Optional[List[bytes]]) -> int:
        """Settle ``acked`` message by message (single posts, several post calls in one event,
        unknown GUIDs), ``records`` being what the table held for each (popped by the caller);
        return the bytes their payloads no longer hold. Under the lock if a record is a
        :class:`Batch` (single posts are this thread's alone once taken from the table)."""
        last = None
        uri = ""
        answers: List[int] = []
        settle = self._settle
        freed = 0
        # Once per message acknowledged: the Ack is made without NamedTuple's Python-level __new__.
        for (status, _, guid, _), batch in zip(acked, records):
            if batch is not None:
                if batch is not last:  # one latency sample per post call in this event
                    counters = batch.queue.counters
                    counters.latencies.append(answered - batch.deadline)
                    last, uri, answers = batch, batch.queue.uri, counters.broker_answers
                freed += settle(batch, guid, _new_tuple(Ack, (ACK_STATUS_FROM_WIRE[status], guid, uri)), settled)
                answers[status] += 1
                if guids is not None:
                    guids.append(guid)
        return freed

    def _complete(self, predicate: Callable[["Record"], bool], status: AckStatus, in_order: bool = False) -> int:
        """Settle every message whose batch matches with a local ``status``; final answers
        leave the outbox, NOT_CONNECTED (the session stopped) stays for the next session.
        ``in_order`` stops at the first message that does not match.

        An exception part-way (a KeyboardInterrupt as the main thread closes a queue or stops
        the session) is raised once every matching message is settled and handed over."""
        settled: _Settled = collections.deque()
        taken: List[Tuple[bytes, Record]] = []  # bound first, filled in place: see _salvage
        handing = [0]
        settling = True
        try:
            with self._lock:
                taken += self._matching(predicate, in_order)
                for guid, batch in taken:
                    del self._pending[guid]
                    self._bytes -= self._settle(batch, guid, Ack(status, guid, batch.queue.uri), settled)
                    answers = batch.queue.counters.local_answers
                    answers[status.name] = answers.get(status.name, 0) + 1
                count = len(taken) if settled else 0
                self._handing_over, handing[0] = self._handing_over + count, count  # one statement: see _salvage
                if taken:
                    self._room.notify_all()
            settling = False
            if self._outbox is not None and status is not AckStatus.NOT_CONNECTED and taken:
                self._outbox.remove([guid for guid, _ in taken])
            self._hand_over(settled, handing)
        except BaseException:
            if settling:
                with self._lock:
                    rest = [guid for guid, _ in self._matching(predicate, in_order)]
                self._salvage(chain(((guid, batch, status) for guid, batch in taken),
                                    ((guid, None, status) for guid in rest)), settled, None, handing)
            self._hand_over(settled, handing)  # what is left of it: their answers are given whatever happens
            raise
        return len(taken)

    def _matching(self, predicate: Callable[["Record"], bool], in_order: bool) -> List[Tuple[bytes, Record]]:
        """Caller holds the lock: the pending messages whose batch matches, in post order;
        with ``in_order``, up to the first that does not."""
        matching = []
        for guid, batch in self._pending.items():
            if predicate(batch):
                matching.append((guid, batch))
            elif in_order:
                break
        return matching

    def expire(self) -> None:
        """Settle messages older than ``ack_timeout`` as TIMEOUT."""
        now = time.monotonic()
        # Insertion order is deadline order, so stop at the first one still in time.
        expired = self._complete(lambda batch: batch.deadline <= now, AckStatus.TIMEOUT, in_order=True)
        if expired:
            logger.warning("%d message(s) not acknowledged within %g s", expired, self._options.ack_timeout)

    def waiting_since(self) -> float:
        """When the oldest message still waiting for its ACK was posted (``time.monotonic()``),
        or 0.0 if none waits."""
        with self._lock:
            for batch in self._pending.values():  # insertion order is post order
                return batch.deadline - self._options.ack_timeout
        return 0.0

    def cancel_queue(self, queue: "Queue", status: AckStatus) -> None:
        """Settle every message of a closed queue with ``status``."""
        self._complete(lambda batch: batch.queue is queue, status)

    def flush(self, timeout: Optional[float]) -> int:
        """Wait until every message is answered and its answer handed over (its future
        resolved, its ``on_ack`` or ``on_done`` queued on the dispatcher) or ``timeout``
        passes; return how many are not (0: all)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._pending or self._handing_over:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._wait_on_room(remaining if remaining is not None else 1.0)
            return len(self._pending) + self._handing_over

    # ---- connection changes -------------------------------------------------------------
    def suspend(self) -> None:
        """The connection is gone: keep new posts until :meth:`restore`."""
        with self._lock:
            self._transport = None

    def restore(self, transport: "Transport") -> None:
        """Every queue is reopened: re-send all entries with their GUIDs, then let posts through
        (the caller, :meth:`ConnectionState.restored`, checked that ``transport``'s connection
        is the current one, under its lock).

        Raises:
            ConnectionLost: the connection went away meanwhile (nothing let through).
        """
        # One critical section: a post let through before the re-sends are queued would reach
        # the wire ahead of older messages of its queue, and the ACK timer settling (and
        # letting go of the payload of) a message being re-sent would break the re-send.
        with self._lock:
            entries = list(self._pending.items())
            if entries:
                logger.warning("re-sending %d unacknowledged message(s)", len(entries))
            for compression in {batch.compression for _, batch in entries}:
                group = [(guid, batch) for guid, batch in entries if batch.compression == compression]
                for data in self._retransmission(group, compression):
                    transport.send_control(data)
            self._transport = transport

    @staticmethod
    def _retransmission(group: List[Tuple[bytes, "Record"]], compression: int) -> Iterable[bytes]:
        for start in range(0, len(group), _RETRANSMIT_CHUNK):
            part = group[start:start + _RETRANSMIT_CHUNK]
            at = [batch.position(guid) for guid, batch in part]
            (data,) = _build(
                [batch.queue.queue_id for _, batch in part],
                b"".join(guid for guid, _ in part),
                [batch.payload_at(i) for (_, batch), i in zip(part, at)],
                [batch.properties_at(i) for (_, batch), i in zip(part, at)],
                compression,
                [batch.new_style for _, batch in part],
            )
            yield data

    def close(self) -> None:
        """The session stopped: resolve everything as NOT_CONNECTED (kept in the outbox)."""
        with self._lock:
            self._closed = True
            self._transport = None
        self._complete(lambda batch: True, AckStatus.NOT_CONNECTED)
        if self._outbox is not None:
            self._outbox.close()
