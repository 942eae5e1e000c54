"""Domains, queue storage, routing, consumers, flow control and de-duplication.

Everything here runs under the broker's single state lock (see :mod:`bmq.broker._server`);
nothing in this module locks, blocks or touches sockets. Deliveries are handed to a
``send_pushes(session, specs)`` callback owned by the server, which only enqueues bytes.

Thread-safety: not thread-safe by itself; every call must hold the broker lock.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Final, Iterable, List, NamedTuple, Optional, Set, Tuple

from .. import _codec, _expression, _uri
from .._protocol import ACK_LIMIT_BYTES, ACK_LIMIT_MESSAGES, ACK_SUCCESS, DEFAULT_APP_ID
from ..exceptions import InvalidURIError
from .._expression import Expression, ExpressionError

__all__ = [
    "Domain",
    "DEFAULT_DOMAINS",
    "StoredMessage",
    "Queue",
    "StatusError",
    "parse_uri",
    "INVALID_PRIORITY",
]

logger = logging.getLogger(__name__)

INVALID_PRIORITY = -(2**31)  # consumerPriority of a deconfigured ("not a consumer") stream

# RoutingConfiguration flags the real broker's queue engines report (protocol §9.2).
_ROUTING_FLAGS = {"priority": 2, "fanout": 10, "broadcast": 7}


class StatusError(Exception):
    """A control request the broker answers with a failure ``status``.

    Attributes:
        category: StatusCategory name, e.g. ``"E_UNKNOWN"``.
        code: numeric code.
        message: text for the client.
    """

    def __init__(self, category: str, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.category = category
        self.code = code
        self.message = message

    def as_status(self) -> Dict[str, Any]:
        """The ``status`` choice body."""
        return {"category": self.category, "code": self.code, "message": self.message}


def parse_uri(uri: str) -> Tuple[str, str, Optional[str]]:
    """``(domain, canonical_uri, app_id or None)`` of a queue URI (protocol §13).

    Raises:
        StatusError: E_REFUSED with the parser's message, as bmqbrkr answers a bad URI.
    """
    try:
        parsed = _uri.parse_uri(uri)
    except InvalidURIError as exc:
        raise StatusError("E_REFUSED", str(exc), -1) from exc
    return parsed.domain, parsed.canonical, parsed.app_id


@dataclass(frozen=True)
class Domain:
    """Configuration of one domain; every queue in it inherits these settings.

    Args:
        mode: ``"priority"``, ``"fanout"`` or ``"broadcast"``.
        app_ids: the appIds of a fan-out domain (each gets its own copy of every message).
        max_messages: per-queue message quota; a PUT beyond it is NACKed LIMIT_MESSAGES.
        max_bytes: per-queue quota on stored application data; NACK LIMIT_BYTES beyond it.
        deduplication_time_ms: how long a message GUID is remembered so that a retransmitted
            PUT is ACKed without storing a second copy; also sent in OpenQueueResponse.

    Thread-safety: immutable.
    """

    mode: str = "priority"
    app_ids: Tuple[str, ...] = ()
    max_messages: int = 1_000_000
    max_bytes: int = 4 * 1024**3
    deduplication_time_ms: int = 300_000

    def __post_init__(self) -> None:
        if self.mode not in _ROUTING_FLAGS:
            raise ValueError(f"unknown domain mode {self.mode!r}")
        if self.mode == "fanout" and not self.app_ids:
            raise ValueError("a fanout domain needs at least one appId")
        if self.mode != "fanout" and self.app_ids:
            raise ValueError("only fanout domains have appIds")
        if self.deduplication_time_ms <= 0:
            raise ValueError("deduplication_time_ms must be positive (the C++ SDK asserts it)")
        object.__setattr__(self, "app_ids", tuple(self.app_ids))

    @property
    def routing_flags(self) -> int:
        """RoutingConfiguration flags for OpenQueueResponse."""
        return _ROUTING_FLAGS[self.mode]


DEFAULT_DOMAINS: Dict[str, Domain] = {
    "bmq.test.mem.priority": Domain("priority"),
    "bmq.test.mem.fanout": Domain("fanout", app_ids=("foo", "bar", "baz")),
    "bmq.test.mem.broadcast": Domain("broadcast"),
    "bmq.test.persistent.priority": Domain("priority"),
    "bmq.test.persistent.fanout": Domain("fanout", app_ids=("foo", "bar", "baz")),
}


# How a queue holds a message internally: (guid, app_data, flags, compression, schema_wire_id).
# A plain tuple of atomic values on purpose: CPython's cyclic GC stops tracking exact tuples
# like this one, instead of rescanning every stored message over and over (more than half
# of the broker's time per message at high rates). StoredMessage is the public view of it.
Record = Tuple[bytes, bytes, int, int, int]
_GUID: Final = 0
_APP_DATA: Final = 1


class StoredMessage(NamedTuple):
    """One message as the broker holds it (what :meth:`Broker.queue_messages` returns).

    Attributes:
        guid: 16-byte MessageGUID.
        app_data: application data as it will be pushed (properties area + payload).
        flags: MESSAGE_PROPERTIES or 0.
        compression: CAT of ``app_data``.
        schema_wire_id: SchemaId; non-zero means new-style properties.

    Thread-safety: immutable.
    """

    guid: bytes
    app_data: bytes
    flags: int
    compression: int
    schema_wire_id: int

    def split(self) -> Tuple[Optional[bytes], bytes]:
        """``(properties area or None, payload)``, decompressed."""
        return _codec.split_app_data(self.app_data, self.flags, self.compression, self.schema_wire_id)

    @property
    def payload(self) -> bytes:
        """The payload, decompressed."""
        return self.split()[1]

    @property
    def properties(self) -> Dict[str, Tuple[int, Any]]:
        """``{name: (PROPERTY_*, value)}``; empty without properties."""
        area = self.split()[0]
        return {} if area is None else _codec.decode_properties(area, self.schema_wire_id != 0)

    def __repr__(self) -> str:
        return f"StoredMessage({_codec.guid_to_hex(self.guid)}, {len(self.app_data)} bytes)"


class Consumer:
    """One (subscription, consumer info) of a reader stream: flow control and priority.

    Thread-safety: guarded by the broker lock.
    """

    __slots__ = ("stream", "sid", "sub_ids", "priority", "max_messages", "max_bytes", "expression", "unconfirmed",
                 "unconfirmed_bytes", "group")

    def __init__(self, stream: "SubStream", sid: int, priority: int, max_messages: int, max_bytes: int,
                 expression: Expression, group: str = "") -> None:
        self.stream = stream
        self.sid = sid
        self.sub_ids = (sid,)  # what a PUSH to this consumer carries, built once
        self.priority = priority
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.expression = expression
        self.group = group  # the expression as sent: consumers with the same one form a group
        self.unconfirmed: Dict[bytes, Record] = {}
        self.unconfirmed_bytes = 0

    def has_capacity(self) -> bool:
        return len(self.unconfirmed) < self.max_messages and self.unconfirmed_bytes < self.max_bytes


class SubStream:
    """A reader's view of one appId of a queue, within one client's queue handle.

    Thread-safety: guarded by the broker lock.
    """

    __slots__ = ("handle", "sub_id", "app_id", "read_count", "consumers", "retired")

    def __init__(self, handle: "QueueHandle", sub_id: int, app_id: str) -> None:
        self.handle = handle
        self.sub_id = sub_id
        self.app_id = app_id
        self.read_count = 0
        self.consumers: List[Consumer] = []
        # Consumers replaced by a reconfigure that still hold unconfirmed messages.
        self.retired: List[Consumer] = []


class QueueHandle:
    """What one client session opened under one qId.

    Thread-safety: guarded by the broker lock.
    """

    __slots__ = ("session", "q_id", "queue", "uri", "write_count", "substreams")

    def __init__(self, session: Any, q_id: int, queue: "Queue", uri: str) -> None:
        self.session = session
        self.q_id = q_id
        self.queue = queue
        self.uri = uri
        self.write_count = 0
        self.substreams: Dict[int, SubStream] = {}

    def stream_for_app(self, app_id: str) -> Optional[SubStream]:
        for stream in self.substreams.values():
            if stream.app_id == app_id:
                return stream
        return None


PushSink = Callable[[Any, List[tuple]], None]


class _Group:
    """The consumers of one expression text within an app: only those of the highest priority
    receive, in turn.

    Thread-safety: guarded by the broker lock.
    """

    __slots__ = ("expression", "priority", "top", "rr")

    def __init__(self, members: List[Consumer]) -> None:
        self.expression = members[0].expression
        self.priority = max(c.priority for c in members)
        self.top = [c for c in members if c.priority == self.priority]
        self.rr = 0

    def next_with_capacity(self) -> Optional[Consumer]:
        """The next top consumer (round robin) with capacity, or None."""
        count = len(self.top)
        for step in range(count):
            consumer = self.top[(self.rr + step) % count]
            if consumer.has_capacity():
                self.rr = (self.rr + step + 1) % count
                return consumer
        return None


class _App:
    """Delivery state of one appId (the only one, ``__default``, outside fan-out).

    Thread-safety: guarded by the broker lock.
    """

    __slots__ = ("app_id", "pending", "redelivery", "outstanding", "consumers", "rr", "simple", "top", "groups",
                 "levels", "broadcast_order")

    def __init__(self, app_id: str) -> None:
        self.app_id = app_id
        # Deques, in arrival order: delivery takes from the front (a dict would rescan every slot
        # freed at its front, quadratic over a backlog) and storing a message hashes nothing.
        self.pending: Deque[Record] = collections.deque()  # not delivered yet
        self.redelivery: Deque[Record] = collections.deque()  # delivered, consumer went away
        self.outstanding: Dict[bytes, Consumer] = {}  # delivered, not confirmed
        self.consumers: List[Consumer] = []
        self.rr = 0
        self.simple = True  # every consumer takes every message (no subscription expression)
        self.top = INVALID_PRIORITY  # the highest consumerPriority among the consumers
        self.groups: List[_Group] = []  # consumers by expression text, as bmqbrkr groups them
        self.levels: List[List[int]] = []  # indexes into groups, by priority, highest first
        # Consumers not outranked within their group, highest priority first (configure order
        # within one priority): where a broadcast message is offered, one copy per stream.
        self.broadcast_order: List[Consumer] = []

    def set_consumers(self, consumers: List[Consumer]) -> None:
        self.consumers = consumers
        self.simple = all(c.expression.matches_all for c in consumers)
        self.top = max((c.priority for c in consumers), default=INVALID_PRIORITY)
        by_text: Dict[str, List[Consumer]] = {}
        for consumer in consumers:
            by_text.setdefault(consumer.group, []).append(consumer)
        self.groups = [_Group(members) for members in by_text.values()]
        priorities = sorted({group.priority for group in self.groups}, reverse=True)
        self.levels = [[i for i, group in enumerate(self.groups) if group.priority == p] for p in priorities]
        highest = {id(c) for group in self.groups for c in group.top}
        self.broadcast_order = sorted((c for c in consumers if id(c) in highest), key=lambda c: -c.priority)

    def held(self) -> int:
        return len(self.pending) + len(self.redelivery) + len(self.outstanding)


class Queue:
    """One queue: storage, per-appId delivery, dedup window and quotas.

    Thread-safety: guarded by the broker lock.
    """

    def __init__(self, uri: str, domain_name: str, domain: Domain, send_pushes: PushSink) -> None:
        self.uri = uri
        self.domain_name = domain_name
        self.domain = domain
        self._send_pushes = send_pushes
        # Storage and de-duplication in one table, in arrival order: the GUID of a held message
        # maps to its record, a GUID no longer held but still inside its dedup window to None.
        # One lookup per PUT answers "duplicate?" and stores the message.
        self._table: Dict[bytes, Optional[Record]] = {}
        self._dedup_order: Deque[Tuple[float, bytes]] = collections.deque()  # (window end, guid)
        self._overdue: Set[bytes] = set()  # held GUIDs whose window ended: forgotten on release
        self._refs: Dict[bytes, int] = {}  # fan-out only: guid -> number of apps still holding it
        self.held = 0  # messages held
        self.bytes = 0  # their application data
        self.apps: Dict[str, _App] = {
            app_id: _App(app_id) for app_id in (domain.app_ids or (DEFAULT_APP_ID,))
        }
        self._single_app = None if domain.app_ids else self.apps[DEFAULT_APP_ID]
        self._broadcasting = domain.mode == "broadcast"
        self._dedup_seconds = domain.deduplication_time_ms / 1000.0
        self._values: Dict[bytes, Dict[str, Tuple[int, Any]]] = {}  # guid -> properties, for expressions
        self._stopped = False  # set by _route

    # ---- storage ---------------------------------------------------------------------
    def expire_dedup(self, now: float) -> None:
        """Forget the GUIDs whose dedup window ended by ``now``; a message still held stays a
        duplicate until it is released."""
        order = self._dedup_order
        table = self._table
        while order and order[0][0] <= now:
            _, old = order.popleft()
            if table[old] is None:
                del table[old]
            else:
                self._overdue.add(old)

    def put(self, message: Record, now: float) -> int:
        """Store a PUT message unless it is a duplicate; the ACK status it gets.

        Call :meth:`expire_dedup` first and :meth:`deliver` after (once per batch of PUTs is
        enough for both). A duplicate (a retransmission) is ACKed SUCCESS again and not
        stored twice; a broadcast message goes to the consumers present right away.
        """
        guid = message[_GUID]
        table = self._table
        known = len(table)
        table.setdefault(guid, message)  # one lookup to test and store
        if len(table) == known:
            return ACK_SUCCESS
        size = len(message[_APP_DATA])
        if self._broadcasting:
            table[guid] = None  # remembered, not held
        else:
            status = ACK_SUCCESS
            if self.held >= self.domain.max_messages:
                status = ACK_LIMIT_MESSAGES
            elif self.bytes + size > self.domain.max_bytes:
                status = ACK_LIMIT_BYTES
            if status:
                del table[guid]  # refused: a retransmission may still be stored
                return status
        self._dedup_order.append((now + self._dedup_seconds, guid))
        if self._broadcasting:
            self._broadcast(message)
            return ACK_SUCCESS
        self.held += 1
        self.bytes += size
        app = self._single_app
        if app is not None:
            app.pending.append(message)
            return ACK_SUCCESS
        self._refs[guid] = len(self.apps)
        for app in self.apps.values():
            app.pending.append(message)
        return ACK_SUCCESS

    def deliver(self) -> None:
        """Deliver what :meth:`put` stored, within flow control and priorities."""
        for app in self.apps.values():
            self._dispatch(app)

    def _release(self, message: Record) -> None:
        """One app is done with ``message``; the last one frees it."""
        guid = message[_GUID]
        if self._single_app is None:
            remaining = self._refs[guid] - 1
            if remaining:
                self._refs[guid] = remaining
                return
            del self._refs[guid]
        if self._values:
            self._values.pop(guid, None)
        self.held -= 1
        self.bytes -= len(message[_APP_DATA])
        if self._overdue and guid in self._overdue:
            self._overdue.discard(guid)
            del self._table[guid]
        else:
            self._table[guid] = None  # a duplicate until its dedup window ends

    def held_messages(self, app_id: Optional[str]) -> List[StoredMessage]:
        """Messages held for ``app_id`` (all held messages when None), oldest first."""
        if app_id is None:
            return [StoredMessage(*m) for m in self._table.values() if m is not None]
        app = self.apps.get(app_id)
        if app is None:
            raise KeyError(f"queue {self.uri} has no appId {app_id!r}")
        held = [c.unconfirmed[guid] for guid, c in app.outstanding.items()]
        held += app.redelivery
        held += app.pending
        return [StoredMessage(*m) for m in sorted(held, key=_arrival_order(self._table))]

    def purge(self, app_id: Optional[str]) -> Tuple[int, int]:
        """Drop every message held for ``app_id`` (for every appId when None), delivered but
        unconfirmed ones included: their confirms are then ignored as unknown (an admin
        ``PURGE``).

        Returns:
            ``(messages, bytes)`` removed: held for the appId, or stored in the queue.

        Raises:
            KeyError: ``app_id`` is not an appId of the queue.
        """
        if app_id is not None and app_id not in self.apps:
            raise KeyError(app_id)
        held, held_bytes = self.held, self.bytes
        removed = 0
        removed_bytes = 0
        for app in ([self.apps[app_id]] if app_id is not None else list(self.apps.values())):
            messages: List[Record] = [*app.pending, *app.redelivery]
            app.pending.clear()
            app.redelivery.clear()
            for guid, consumer in app.outstanding.items():
                message = consumer.unconfirmed.pop(guid)
                consumer.unconfirmed_bytes -= len(message[_APP_DATA])
                if not consumer.unconfirmed and consumer in consumer.stream.retired:
                    consumer.stream.retired.remove(consumer)
                messages.append(message)
            app.outstanding.clear()
            for message in messages:
                removed_bytes += len(message[_APP_DATA])
                self._release(message)
            removed += len(messages)
        if app_id is None:
            return held - self.held, held_bytes - self.bytes
        return removed, removed_bytes

    # ---- consumers -------------------------------------------------------------------
    def app(self, app_id: str) -> Optional[_App]:
        return self.apps.get(app_id)

    def set_consumers(self, stream: SubStream, consumers: List[Consumer]) -> None:
        """Replace the consumers of ``stream`` (a configure); then deliver what can be."""
        app = self.apps[stream.app_id]
        kept = [c for c in app.consumers if c.stream is not stream]
        for old in stream.consumers:
            if old.unconfirmed:
                stream.retired.append(old)
        stream.consumers = consumers
        app.set_consumers(kept + consumers)
        self._dispatch(app)

    def remove_stream(self, stream: SubStream) -> None:
        """A reader stream went away: its unconfirmed messages go back for redelivery."""
        app = self.apps[stream.app_id]
        app.set_consumers([c for c in app.consumers if c.stream is not stream])
        returned: List[Record] = []
        for consumer in stream.consumers + stream.retired:
            for guid, message in consumer.unconfirmed.items():
                del app.outstanding[guid]
                returned.append(message)
            consumer.unconfirmed.clear()
            consumer.unconfirmed_bytes = 0
        stream.consumers = []
        stream.retired = []
        if returned and self.domain.mode != "broadcast":
            app.redelivery = collections.deque(sorted([*app.redelivery, *returned], key=_arrival_order(self._table)))
        self._dispatch(app)

    def confirm(self, stream: SubStream, guids: Iterable[bytes]) -> List[bytes]:
        """Confirm ``guids`` for ``stream``, then deliver what the freed capacity allows.

        Returns:
            The GUIDs that were not outstanding on ``stream`` (ignored, as bmqbrkr does).
        """
        app = self.apps[stream.app_id]
        outstanding = app.outstanding
        release = self._release
        unknown = []
        for guid in guids:
            consumer = outstanding.pop(guid, None)
            if consumer is None or consumer.stream is not stream:
                if consumer is not None:
                    outstanding[guid] = consumer  # another stream's: not ours to confirm
                unknown.append(guid)
                continue
            unconfirmed = consumer.unconfirmed
            message = unconfirmed.pop(guid)
            consumer.unconfirmed_bytes -= len(message[_APP_DATA])
            if not unconfirmed and consumer in stream.retired:
                stream.retired.remove(consumer)
            release(message)
        self._dispatch(app)
        return unknown

    # ---- routing ---------------------------------------------------------------------
    def _dispatch(self, app: _App) -> None:
        """Deliver pending messages of ``app`` within flow control and priorities."""
        consumers = app.consumers
        if not consumers or not (app.pending or app.redelivery):
            return
        if not app.simple:
            self._dispatch_selective(app)
            return
        # Every consumer takes every message: deliver from the front, round robin over the
        # top-priority consumers with capacity, until they are all full.
        out: Dict[Any, List[tuple]] = {}
        top = app.top
        count = len(consumers)
        outstanding = app.outstanding
        for source, flags in ((app.redelivery, _codec.PUSH_OUT_OF_ORDER), (app.pending, 0)):
            while source:
                rr = app.rr
                for step in range(count):
                    consumer = consumers[(rr + step) % count]
                    if (consumer.priority == top and len(consumer.unconfirmed) < consumer.max_messages
                            and consumer.unconfirmed_bytes < consumer.max_bytes):
                        app.rr = (rr + step + 1) % count
                        break
                else:
                    break  # every top-priority consumer is full: nothing else can go
                message = source.popleft()
                guid = message[_GUID]
                consumer.unconfirmed[guid] = message
                consumer.unconfirmed_bytes += len(message[_APP_DATA])
                outstanding[guid] = consumer
                _add_push(out, consumer, message, flags)
            if source:
                break  # keep arrival order: fresh messages wait behind redeliveries
        for session, specs in out.items():
            self._send_pushes(session, specs)

    def _dispatch_selective(self, app: _App) -> None:
        """:meth:`_dispatch` when some consumer has a subscription expression, routed as
        bmqbrkr's round-robin router does (``mqbblp::Routers``, 0.95.14).

        Consumers with one expression text form a group, which takes the priority of its
        highest consumers (only those receive). Each message, in order, goes through the
        priority levels from the highest: the first group that matches it and has a consumer
        with capacity takes it (round robin among its consumers). A group that matches but is
        full is marked unable to deliver (it is not evaluated again in this pass) and lower
        levels are not tried: the message waits. When no group able to deliver declined it
        (all the groups it met were marked full), the pass stops there, later messages wait
        behind it; otherwise the message is left pending and the pass goes on.
        """
        if not any(c.has_capacity() for c in app.consumers):
            return  # nothing can be delivered: spares evaluating a backlog at every PUT
        out: Dict[Any, List[tuple]] = {}
        able = [True] * len(app.groups)
        for source, flags in ((app.redelivery, _codec.PUSH_OUT_OF_ORDER), (app.pending, 0)):
            delivered = set()
            stopped = False
            for message in source:
                consumer = self._route(app, message, able)
                if consumer is None:
                    stopped = self._stopped
                    if stopped:
                        break
                    continue
                guid = message[_GUID]
                delivered.add(guid)
                consumer.unconfirmed[guid] = message
                consumer.unconfirmed_bytes += len(message[_APP_DATA])
                app.outstanding[guid] = consumer
                _add_push(out, consumer, message, flags)
            if delivered:
                kept = [message for message in source if message[_GUID] not in delivered]
                source.clear()
                source.extend(kept)
            if stopped:
                break
        for session, specs in out.items():
            self._send_pushes(session, specs)

    def _route(self, app: _App, message: Record, able: List[bool]) -> Optional[Consumer]:
        """The consumer ``message`` goes to (see :meth:`_dispatch_selective`), or None; sets
        ``self._stopped`` when the message stops the pass (bmqbrkr's e_NO_CAPACITY_ALL)."""
        get = None
        matched = False
        declined = False
        for level in app.levels:
            if matched:
                break
            for index in level:
                if not able[index]:
                    continue
                group = app.groups[index]
                if get is None:
                    get = self.property_values(message).get
                if not group.expression.evaluate(get):
                    declined = True
                    continue
                consumer = group.next_with_capacity()
                if consumer is not None:
                    return consumer
                able[index] = False
                matched = True
        self._stopped = not declined
        return None

    def property_values(self, message: Record) -> Dict[str, Tuple[int, Any]]:
        """``{name: (PROPERTY_* type, value)}`` of a stored message (what expressions see), cached."""
        guid = message[_GUID]
        values = self._values.get(guid)
        if values is None:
            try:
                values = StoredMessage(*message).properties
            except Exception:  # bmqbrkr reads what it can; an unreadable area has no properties
                values = {}
            if self._table.get(guid) is not None:  # held: worth keeping
                self._values[guid] = values
        return values

    def _broadcast(self, message: Record) -> None:
        """Deliver a broadcast message as bmqbrkr does: each reader stream gets one copy, for
        the first of its subscriptions (highest priority first) that matches it, among those
        not outranked by a higher-priority subscription of the same expression."""
        out: Dict[Any, List[tuple]] = {}
        for app in self.apps.values():
            get = None
            served: Set[int] = set()
            for consumer in app.broadcast_order:
                if id(consumer.stream) in served:
                    continue
                if not consumer.expression.matches_all:
                    if get is None:
                        get = self.property_values(message).get
                    if not consumer.expression.evaluate(get):
                        continue
                served.add(id(consumer.stream))
                _add_push(out, consumer, message, 0)
        for session, specs in out.items():
            self._send_pushes(session, specs)


def _add_push(out: Dict[Any, List[tuple]], consumer: Consumer, message: Record, flags: int) -> None:
    handle = consumer.stream.handle
    guid, app_data, message_flags, compression, schema_wire_id = message
    specs = out.get(handle.session)
    if specs is None:
        specs = out[handle.session] = []
    specs.append((handle.q_id, guid, consumer.sub_ids, app_data, message_flags | flags, compression, schema_wire_id))


def _arrival_order(messages: Dict[bytes, Any]) -> Callable[[Record], int]:
    """Sort key putting messages in the order the queue received them."""
    index = {guid: i for i, guid in enumerate(messages)}
    return lambda message: index.get(message[_GUID], len(index))


_MATCH_ALL = Expression("")
# bmqbrkr's words for its compile errors (bmqeval::ErrorType::toString), for its log line.
_BROKER_REASONS = {
    _expression.SYNTAX: "syntax error",
    _expression.NO_PROPERTIES: "expression does not use any property",
    _expression.TOO_COMPLEX: "subscription expression is too complex",
    _expression.TOO_LONG: "subscription expression is too long",
}


def compile_subscription(uri: str, expression: Dict[str, Any]) -> Expression:
    """The expression of one ConfigureStream subscription, compiled as bmqbrkr does.

    Only ``E_VERSION_1`` texts are compiled; others, and the empty text, match every message.
    One bmqbrkr cannot compile (syntax, limits) is accepted all the same: it is logged at
    WARNING with bmqbrkr's ``#BMQ_SUBSCRIPTION_FAILURE`` tag, rc and reason, and matches every
    message, as bmqbrkr 0.95.14 routes it (the client refuses such texts before sending them).
    """
    text = expression.get("text", "") or ""
    if not isinstance(text, str) or not text or expression.get("version") not in ("E_VERSION_1", 1):
        return _MATCH_ALL
    try:
        return Expression(text)
    except ExpressionError as exc:
        logger.warning('#BMQ_SUBSCRIPTION_FAILURE for queue %r: [ expression: "%s", rc: %d, reason: "%s" ] (%s); '
                       "it matches every message, as in bmqbrkr", uri, text, exc.code,
                       _BROKER_REASONS.get(exc.code, "unknown error"), exc.reason)
        return _MATCH_ALL


def make_consumers(stream: SubStream, subscriptions: Iterable[Dict[str, Any]]) -> List[Consumer]:
    """Consumers from ConfigureStream subscriptions (JSON-shaped dicts); an expression is
    compiled by :func:`compile_subscription` (never refused, as bmqbrkr)."""
    consumers = []
    for subscription in subscriptions:
        sent = subscription.get("expression") or {}
        expression = compile_subscription(stream.handle.uri, sent)
        group = f"{sent.get('version', '')}:{sent.get('text', '')}"
        for info in subscription.get("consumers") or ():
            priority = int(info.get("consumerPriority", INVALID_PRIORITY))
            if priority == INVALID_PRIORITY or int(info.get("consumerPriorityCount", 0)) <= 0:
                continue
            consumers.append(
                Consumer(
                    stream,
                    int(subscription.get("sId", 0)),
                    priority,
                    int(info.get("maxUnconfirmedMessages", 0)),
                    int(info.get("maxUnconfirmedBytes", 0)),
                    expression,
                    group,
                )
            )
    return consumers
