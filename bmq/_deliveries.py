"""Deliveries: the consuming side of a session — PUSH events in, CONFIRM events out.

The reader thread gives every PUSH event to :meth:`Deliveries.handle_push`, which routes each
message by ``(qId, subscription id)`` to its :class:`~bmq.Queue` (its inbox, or its
``on_message`` callback). :meth:`Deliveries.confirm` turns the messages an application confirms
into as few CONFIRM events as the protocol allows and hands them to the writer. Confirms are
never buffered: while disconnected they are dropped (logged) and the broker redelivers, as the
official SDKs do.

Thread-safety: ``handle_push`` runs on the reader thread and reads the registry's ``readers``
without the lock on its hot path; ``confirm`` may be called from any thread.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable, List, Optional, Tuple

from . import _codec
from ._connection import Connection
from ._queue import Queue
from ._registry import QueueRegistry
from ._telemetry import Telemetry
from ._types import Message, MessageBatch, QUEUE_CLOSED, QueueState
from .exceptions import ConnectionLost, ProtocolError, QueueStateError

__all__ = ["Deliveries"]

logger = logging.getLogger("bmq._session")  # the session's logger: one place to look

# Confirms per CONFIRM event: far below the event size limit (24 bytes each), large enough
# that a confirm_many of a whole batch costs a handful of writer hand-offs.
_CONFIRM_CHUNK = 20000
# Bound once (see bmq/_queue.py): confirm() compares it by identity per message.


class Deliveries:
    """PUSH routing and CONFIRM building of one session (see the module docstring).

    Args:
        owner: the session; messages of another session's queues are refused.
        registry: the session's queues; ``lock`` guards it (and the confirm counters).
        write_timeout: ``channel_write_timeout``: how long a confirm waits above the high watermark.
        telemetry: starts a consumer span per delivery and ends it at the confirm, or None.
        on_error: told (on the reader thread) of a PUSH event that could not be decoded whole.
    """

    def __init__(self, owner: object, registry: QueueRegistry, lock: "threading.RLock",
                 write_timeout: float, telemetry: Optional[Telemetry] = None,
                 on_error: Callable[[str], None] = lambda text: None) -> None:
        self._owner = owner
        self._on_error = on_error
        self._registry = registry
        self._lock = lock
        self._write_timeout = write_timeout
        self._telemetry = telemetry

    def _sole_reader(self, queue_id: int, sid: int) -> Optional[Queue]:
        """The reader of a PUSH whose subscription id is not registered (None: dropped)."""
        with self._lock:
            target = self._registry.sole_reader(queue_id)
        if target is None:
            logger.warning("PUSH for unknown queue %d / subscription %d dropped", queue_id, sid)
        return target

    def handle_push(self, event: bytes) -> None:
        """Reader thread: deliver every message of a PUSH event to the queue it is for."""
        if self._registry.batch_queues:  # decoded by columns (single readers get the batch's messages)
            self._handle_push_columns(event)
            return
        readers = self._registry.readers
        telemetry = self._telemetry
        # Consecutive messages for one queue are handed over together (one call, one count).
        queue: Optional[Queue] = None
        run: List[Message] = []
        undecodable: List[Tuple[bytes, ProtocolError]] = []
        try:
            for queue_id, guid, sub_ids, _, area, new_style, payload in _codec.iter_push_messages(event, undecodable):
                for sid in sub_ids:
                    # Not readers.get(): on free-threaded 3.13 it costs ~16 us a message while the
                    # thread that opened the queue lives (docs/free-threading.md).
                    target = readers[key] if (key := (queue_id, sid)) in readers else self._sole_reader(queue_id, sid)
                    if target is None:
                        continue
                    if target is not queue:
                        if run:
                            queue.deliver(run)  # type: ignore[union-attr]
                        queue, run = target, []
                    message = Message(payload, guid, target, area, new_style, sid)
                    if telemetry is not None:
                        telemetry.delivered(message, target.on_message is None)
                    run.append(message)
        except ProtocolError as exc:
            self._undecodable(f"a PUSH event from the broker could not be decoded and was skipped: {exc}")
        if run:
            queue.deliver(run)  # type: ignore[union-attr]
        for guid, error in undecodable:
            self._undecodable(f"message {guid.hex().upper()} from the broker could not be decoded and was "
                              f"skipped: {error}")

    def _undecodable(self, text: str) -> None:
        """A PUSH message that could not be decoded (its payload does not decompress, its
        properties do not parse) is skipped, the others of its event delivered, and the
        connection kept, as the C++ SDK keeps it. Dropping the connection would not help: the
        broker delivers such a message again first on the next one, and the consumer would
        reconnect for ever. A skipped message stays unconfirmed: it holds a place of
        ``max_unconfirmed_messages`` until the next reconnect, when the broker delivers it
        again. (Batch readers decode an event whole: there, the whole event is skipped.)"""
        text += " (it stays unconfirmed)"
        logger.error("%s", text)
        self._on_error(text)

    def _handle_push_columns(self, event: bytes) -> None:
        """:meth:`handle_push` for a session with batch readers: one MessageBatch per run of
        messages for one queue (a reader of single messages gets the batch's messages)."""
        readers = self._registry.readers
        try:
            for queue_id, sub_ids, _, guids, payloads, offsets, areas in _codec.push_columns(event):
                for sid in sub_ids:
                    target = readers[key] if (key := (queue_id, sid)) in readers else self._sole_reader(queue_id, sid)
                    if target is None:
                        continue
                    batch = MessageBatch(target, guids, payloads, offsets, areas, ((0, sid),))
                    if target.batches:
                        target.deliver_batch(batch)
                        continue
                    messages = batch.messages()
                    if self._telemetry is not None:
                        for message in messages:
                            self._telemetry.delivered(message, target.on_message is None)
                    target.deliver(messages)
        except ProtocolError as exc:
            self._undecodable(f"a PUSH event from the broker could not be decoded and was skipped: {exc}")

    def confirm(self, messages: Iterable[Message], conn: Optional[Connection]) -> None:
        """CONFIRM ``messages`` on ``conn`` (None: not connected, they are dropped).

        Raises:
            QueueStateError: a queue is closed, or a message came from another session.
            BandwidthLimitError: the connection stayed above its high watermark for ``write_timeout``.
        """
        if self._telemetry is not None:
            messages = list(messages)  # read twice: confirmed, then their spans ended
        items: List[Tuple[int, bytes, int]] = []
        # Messages mostly come queue by queue: each queue is checked (and counted) once per run.
        runs: List[Tuple[Any, int]] = []  # (queue counters, index in items where its run starts)
        last = None
        queue_id = sub_id = 0
        for message in messages:
            queue = message._queue
            if queue is not last:
                self._check_confirmable(queue)
                runs.append((queue.counters, len(items)))
                queue_id, sub_id, last = queue.queue_id, queue.sub_id, queue
            items.append((queue_id, message.guid, sub_id))
        if not items:
            return
        if conn is None:
            logger.info("not connected: %d confirm(s) dropped (the broker will redeliver)", len(items))
            return
        for start in range(0, len(items), _CONFIRM_CHUNK):
            data = _codec.build_confirm_event(items[start:start + _CONFIRM_CHUNK])
            try:
                conn.transport.send(data, self._write_timeout, coalesce=True)
            except ConnectionLost:
                logger.info("connection lost: confirms dropped (the broker will redeliver)")
                return
        ends = [start for _, start in runs[1:]] + [len(items)]
        with self._lock:  # confirms come from any thread: one lock per call keeps counts exact
            for (queue_counters, start), end in zip(runs, ends):
                queue_counters.confirmed += end - start
        if self._telemetry is not None:
            self._telemetry.confirmed(messages)  # type: ignore[arg-type]

    def confirm_batch(self, batch: MessageBatch, conn: Optional[Connection]) -> None:
        """CONFIRM every message of ``batch`` on ``conn`` (see :meth:`confirm`)."""
        queue = batch._queue
        self._check_confirmable(queue)
        if conn is None:
            logger.info("not connected: %d confirm(s) dropped (the broker will redeliver)", len(batch))
            return
        step = 16 * _CONFIRM_CHUNK
        for start in range(0, len(batch.guids), step):
            data = _codec.build_confirm_run(queue.queue_id, batch.guids[start:start + step], queue.sub_id)
            try:
                conn.transport.send(data, self._write_timeout, coalesce=True)
            except ConnectionLost:
                logger.info("connection lost: confirms dropped (the broker will redeliver)")
                return
        with self._lock:
            queue.counters.confirmed += len(batch)

    def _check_confirmable(self, queue: Queue) -> None:
        if queue.session is not self._owner:
            raise QueueStateError(f"a message of {queue.uri} from another session cannot be confirmed here")
        if queue.state is QUEUE_CLOSED:
            raise QueueStateError(f"{queue.uri} is closed: cannot confirm")
