"""The pending-ACK table: every PUT from hand-off until its final answer.

It is also the retransmission list: after a reconnect every entry is re-sent with its
original GUID (the codec re-encodes deterministically, FACTS §11.3), and the memory bound
for messages buffered while disconnected.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import _codec
from ._dispatch import new_futures, resolve_future
from ._types import ACK_STATUS_FROM_WIRE, Ack, AckStatus
from .exceptions import BandwidthLimitError, ConnectionLost, Error, SessionClosedError

if TYPE_CHECKING:  # pragma: no cover
    from ._options import SessionOptions
    from ._outbox import Outbox
    from ._queue import Queue
    from ._transport import Transport

__all__ = ["PendingPuts"]

logger = logging.getLogger(__name__)

_ACK_REQUESTED = _codec.PUT_ACK_REQUESTED
_OPEN = "open"
_RETRANSMIT_CHUNK = 10000

OnAck = Optional[Callable[[Ack], None]]


class _Entry:
    """What is needed to resolve and to retransmit one PUT (its GUID is the table key)."""

    __slots__ = ("queue", "future", "payload", "properties", "compression", "deadline", "on_ack")

    def __init__(self, queue: "Queue", future: "Future[Ack]", payload: Any, properties: Optional[bytes],
                 compression: int, deadline: float, on_ack: OnAck) -> None:
        self.queue = queue
        self.future = future
        self.payload = payload
        self.properties = properties
        self.compression = compression
        self.deadline = deadline
        self.on_ack = on_ack


class PendingPuts:
    """Unacknowledged PUTs keyed by GUID.

    Args:
        options: the session's options (ack_timeout, channel_write_timeout, max_pending_bytes).
        submit: runs an ``on_ack`` callback on the dispatcher thread.
        outbox: the durable outbox, or None.

    Thread-safety: thread-safe; futures are resolved outside the internal lock.
    """

    def __init__(self, options: "SessionOptions", submit: Callable[..., None], outbox: Optional["Outbox"]) -> None:
        self._options = options
        self._submit = submit
        self._outbox = outbox
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._pending: Dict[bytes, _Entry] = {}
        self._bytes = 0
        self._transport: Optional["Transport"] = None  # None while the state is not restored
        self._closed = False

    def __len__(self) -> int:
        return len(self._pending)

    # ---- posting ----------------------------------------------------------------------
    def track_and_send(
        self,
        queue: "Queue",
        guids: bytes,
        payloads: Sequence[Any],
        properties: Sequence[Optional[bytes]],
        compression: int,
        events: List[bytes],
        on_ack: OnAck,
    ) -> "List[Future[Ack]]":
        """Record built PUT events, then hand them to the writer unless reconnecting.

        Raises:
            BandwidthLimitError: no room within ``channel_write_timeout`` (nothing kept).
            SessionClosedError: the session stopped while waiting for room.
        """
        count = len(payloads)
        data = events[0] if len(events) == 1 else b"".join(events)
        futures = new_futures(count)
        deadline = time.monotonic() + self._options.ack_timeout
        keys = [guids[i:i + 16] for i in range(0, 16 * count, 16)]
        size = sum(map(len, payloads))
        with self._lock:
            try:
                self._wait_for_room(size)
            except Error:
                if self._outbox is not None:
                    self._outbox.done(keys)
                raise
            pending = self._pending
            for key, future, payload, props in zip(keys, futures, payloads, properties):
                pending[key] = _Entry(queue, future, payload, props, compression, deadline, on_ack)
            self._bytes += size
            transport = self._transport if queue.state == _OPEN else None
        if transport is not None:
            try:
                transport.send(data, self._options.channel_write_timeout)
            except BandwidthLimitError:
                self._unrecord(keys)
                raise
            except ConnectionLost:
                pass  # kept: re-sent after the reconnect
        return futures

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
            self._room.wait(remaining)
        if self._closed:
            raise SessionClosedError("the session stopped")

    def _unrecord(self, keys: List[bytes]) -> None:
        with self._lock:
            for key in keys:
                entry = self._pending.pop(key, None)
                if entry is not None:
                    self._bytes -= len(entry.payload)
            self._room.notify_all()
        if self._outbox is not None:
            self._outbox.done(keys)

    # ---- answers ------------------------------------------------------------------------
    def handle_acks(self, event: bytes) -> None:
        """Reader thread: resolve the futures of an ACK event's messages."""
        acks = _codec.iter_acks(event)
        done = []
        with self._lock:
            pop = self._pending.pop
            freed = 0
            for status, _, guid, _ in acks:
                entry = pop(guid, None)
                if entry is not None:
                    done.append((status, guid, entry))
                    freed += len(entry.payload)
            self._bytes -= freed
            if freed:
                self._room.notify_all()
        if self._outbox is not None and done:
            self._outbox.done([guid for _, guid, _ in done])
        submit = self._submit
        for status, guid, entry in done:
            ack = Ack(ACK_STATUS_FROM_WIRE[status], guid, entry.queue.uri)
            resolve_future(entry.future, ack)
            if entry.on_ack is not None:
                submit(entry.on_ack, ack)

    def _take(self, predicate: Callable[[_Entry], bool], stop_at_first_miss: bool = False) -> List[Tuple[bytes, _Entry]]:
        with self._lock:
            taken = []
            for guid, entry in self._pending.items():
                if predicate(entry):
                    taken.append((guid, entry))
                elif stop_at_first_miss:
                    break
            for guid, entry in taken:
                del self._pending[guid]
                self._bytes -= len(entry.payload)
            if taken:
                self._room.notify_all()
        return taken

    def _complete(self, entries: List[Tuple[bytes, _Entry]], status: AckStatus) -> None:
        """Resolve removed entries locally; final answers leave the outbox, NOT_CONNECTED
        (the session stopped) stays there for the next session."""
        if self._outbox is not None and status is not AckStatus.NOT_CONNECTED and entries:
            self._outbox.done([guid for guid, _ in entries])
        for guid, entry in entries:
            ack = Ack(status, guid, entry.queue.uri)
            resolve_future(entry.future, ack)
            if entry.on_ack is not None:
                self._submit(entry.on_ack, ack)

    def expire(self) -> None:
        """Resolve entries older than ``ack_timeout`` as TIMEOUT."""
        now = time.monotonic()
        # Insertion order is deadline order, so stop at the first one still in time.
        expired = self._take(lambda entry: entry.deadline <= now, stop_at_first_miss=True)
        if expired:
            logger.warning("%d message(s) not acknowledged within %g s", len(expired), self._options.ack_timeout)
            self._complete(expired, AckStatus.TIMEOUT)

    def cancel_queue(self, queue: "Queue", status: AckStatus) -> None:
        """Resolve every entry of a closed queue with ``status``."""
        self._complete(self._take(lambda entry: entry.queue is queue), status)

    def flush(self, timeout: Optional[float]) -> int:
        """Wait until the table is empty or ``timeout`` passes; return what is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._room.wait(remaining if remaining is not None else 1.0)
            return len(self._pending)

    # ---- connection changes -------------------------------------------------------------
    def suspend(self) -> None:
        """The connection is gone: keep new posts until :meth:`restore`."""
        with self._lock:
            self._transport = None

    def restore(self, transport: "Transport", new_style: bool, is_current: Callable[[], bool]) -> None:
        """Every queue is reopened: re-send all entries with their GUIDs, then let posts through.

        Raises:
            ConnectionLost: the connection went away meanwhile (``is_current()`` is False).
        """
        with self._lock:
            if not is_current():
                raise ConnectionLost("connection lost while restoring state")
            entries = list(self._pending.items())
            self._transport = transport
        if entries:
            logger.warning("re-sending %d unacknowledged message(s)", len(entries))
        for compression in {entry.compression for _, entry in entries}:
            group = [(guid, entry) for guid, entry in entries if entry.compression == compression]
            for data in self._retransmission(group, compression, new_style):
                transport.send_control(data)

    @staticmethod
    def _retransmission(group: List[Tuple[bytes, _Entry]], compression: int, new_style: bool) -> Iterable[bytes]:
        for start in range(0, len(group), _RETRANSMIT_CHUNK):
            part = group[start:start + _RETRANSMIT_CHUNK]
            events = _codec.build_put_events(
                [entry.queue.queue_id for _, entry in part],
                b"".join(guid for guid, _ in part),
                [entry.payload for _, entry in part],
                [entry.properties for _, entry in part],
                flags=_ACK_REQUESTED,
                compression=compression,
                new_style_properties=new_style,
            )
            yield b"".join(events)

    def close(self) -> None:
        """The session stopped: resolve everything as NOT_CONNECTED (kept in the outbox)."""
        with self._lock:
            self._closed = True
            self._transport = None
        self._complete(self._take(lambda entry: True), AckStatus.NOT_CONNECTED)
        if self._outbox is not None:
            self._outbox.close()
