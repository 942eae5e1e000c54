"""The streaming reader: one consuming session on the driver, confirms what Spark has finished.

Spark runs a :class:`~pyspark.sql.datasource.SimpleDataSourceStreamReader` in one long-lived
Python process on the driver for the whole query: :meth:`read` plans a micro-batch (Spark
calls it only once the previous batch has ended) and :meth:`commit` is told when Spark has
durably finished one. Both run in that process, so the session that received a message is the
one that confirms it, as BlazingMQ requires.

Offsets are ``{"run": <id of this reader>, "seq": <messages handed out by it>}``. A batch of
this run is kept (messages and rows) until confirmed, so :meth:`readBetweenOffsets` replays it
exactly. A batch of an earlier run (a query restarted from its checkpoint) cannot be replayed:
its messages were never confirmed, the broker redelivers them to this run's session when the
old one goes away, and they come back in a later batch (at-least-once).
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.types import StructType

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pyspark < 4.2 asks the source nothing and runs AvailableNow as one batch
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

import bmq

from . import _session
from ._options import StreamOptions
from ._schema import message_row_factory

__all__ = ["BlazingMQStreamReader"]

_log = logging.getLogger(__name__)

Offset = Dict[str, Any]
# How long a micro-batch that has messages waits for the next one before it is cut.
_LINGER = 0.05


@dataclasses.dataclass
class _Batch:
    """Messages handed to Spark for offsets ``(start_seq, end_seq]`` and not yet committed."""

    start_seq: int
    end_seq: int
    messages: List[Any]
    rows: List[Tuple[Any, ...]]


class BlazingMQStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reader of ``spark.readStream.format("blazingmq")``: at-least-once delivery.

    Each micro-batch takes up to ``maxMessagesPerBatch`` messages (and about
    ``maxBytesPerBatch`` payload bytes) that are already waiting, after waiting at most
    ``pollTimeout`` seconds for the first. Messages are confirmed once Spark has finished
    their batch: in :meth:`commit`, or in the next :meth:`read`, which Spark calls at every
    trigger once the previous batch has ended (so a run's last batch is confirmed too). The
    consumer's unconfirmed limits are two batches, so that the next batch is already
    delivered while one is processed.

    Spark constructs the reader in several processes (planning workers, executors); only the
    driver-side streaming process calls :meth:`read`, which connects lazily.

    Thread-safety: Spark calls the methods from one thread; a lock guards the state anyway
    because :meth:`stop` may come from elsewhere.
    """

    def __init__(self, options: StreamOptions, schema: StructType):
        self._options = options
        self._schema = schema
        self._run = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._connection: Optional[Tuple[Any, Any]] = None
        self._make_row: Optional[Callable[[Any, datetime.datetime], Tuple[Any, ...]]] = None
        self._seq = 0
        self._batches: List[_Batch] = []
        self._available_now = False
        self._caught_up = False

    def __getstate__(self) -> Dict[str, Any]:
        # Spark pickles the reader into executor tasks (for replays it cannot serve from the
        # driver); a copy starts empty, as a reader of its own run.
        return {"options": self._options, "schema": self._schema}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["options"], state["schema"])  # type: ignore[misc]

    def prepareForTriggerAvailableNow(self) -> None:
        """Make this run end once it has caught up with the queue (Trigger.AvailableNow).

        A queue has no end offset to record. The run has caught up when a :meth:`read` gets no
        message at all: that read first confirms every earlier batch, so the broker may deliver
        up to the consumer's whole window, and then waits ``pollTimeout`` for a first message.
        A read that only drains what had already arrived locally proves nothing (the broker may
        still be sending the rest of the window), so batches go on until such an empty read;
        it returns ``start`` and Spark ends the run with every batch confirmed.
        """
        with self._lock:
            self._available_now = True

    def initialOffset(self) -> Offset:
        """The offset before the first message of a new query."""
        return self._offset(0)

    def read(self, start: Offset) -> Tuple[Iterator[Tuple[Any, ...]], Offset]:
        """Confirm the batches Spark has finished, then take the next micro-batch of waiting messages.

        Spark plans a batch only after the previous one has ended (its sink done and the end
        recorded in the commit log), so everything up to ``start`` can be confirmed here: the
        last batch of a run is then confirmed even though Spark only commits a batch when it
        plans the next one with data.

        Returns:
            The rows and the end offset; ``start`` itself when no message came (or an
            AvailableNow run has caught up with the queue).

        Raises:
            bmq.ConnectionError: the broker cannot be reached.
            bmq.BrokerError: the broker refused to open the queue.
        """
        with self._lock:
            if self._mine(start):
                if start["seq"] != self._seq:
                    # Spark plans from the last end offset it was given; anything else means
                    # it lost track of a batch, whose messages must not be skipped silently.
                    raise RuntimeError(
                        f"blazingmq: asked to read from {start}, but this reader is at seq {self._seq}"
                    )
                self._confirm_through(self._seq)
            if self._caught_up:
                return iter(()), start
            messages = self._take()
            if not messages:
                self._caught_up = self._available_now
                return iter(()), start
            if self._make_row is None:
                self._make_row = message_row_factory(self._schema)
            now = datetime.datetime.now(datetime.timezone.utc)
            rows = [self._make_row(message, now) for message in messages]
            batch = _Batch(self._seq, self._seq + len(messages), messages, rows)
            self._batches.append(batch)
            self._seq = batch.end_seq
            if _log.isEnabledFor(logging.DEBUG):
                _log.debug("blazingmq: batch (%d, %d] of %s", batch.start_seq, batch.end_seq, self._options.queue)
            return iter(rows), self._offset(batch.end_seq)

    def readBetweenOffsets(self, start: Offset, end: Offset) -> Iterator[Tuple[Any, ...]]:
        """Replay the rows between two offsets of an uncommitted batch.

        Returns:
            The same rows :meth:`read` returned for this range in this run; nothing for a
            range of an earlier run or another process (those messages are redelivered by
            the broker and come back in a later batch).
        """
        with self._lock:
            if not self._mine(end):
                _log.warning(
                    "blazingmq: not replaying %s..%s from an earlier run of the query; the broker "
                    "redelivers its unconfirmed messages to this run",
                    start,
                    end,
                )
                return iter(())
            low = start["seq"] if self._mine(start) else 0
            rows = [row for batch in self._batches if low < batch.end_seq <= end["seq"] for row in batch.rows]
            return iter(rows)

    def commit(self, end: Offset) -> None:
        """Confirm every message up to ``end``: Spark has finished with them.

        An offset of an earlier run is ignored (that run's session is gone).
        """
        with self._lock:
            if self._mine(end):
                self._confirm_through(end["seq"])

    def stop(self) -> None:
        """Close the session; unconfirmed messages go back to the broker for redelivery."""
        with self._lock:
            connection, self._connection = self._connection, None
            self._batches = []
        if connection is not None:
            connection[0].stop()

    def _offset(self, seq: int) -> Offset:
        return {"run": self._run, "seq": seq}

    def _mine(self, offset: Optional[Offset]) -> bool:
        return offset is not None and offset.get("run") == self._run

    def _confirm_through(self, seq: int) -> None:
        done = [batch for batch in self._batches if batch.end_seq <= seq]
        if not done or self._connection is None:
            return
        self._connection[0].confirm_many([message for batch in done for message in batch.messages])
        self._batches = [batch for batch in self._batches if batch.end_seq > seq]
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("blazingmq: confirmed up to seq %d of %s", seq, self._options.queue)

    def _take(self) -> List[Any]:
        """The next batch's messages: up to the batch limits, waiting ``pollTimeout`` for the
        first and then taking more as long as they keep coming (a gap of ``_LINGER`` ends the
        batch). Stopping at the first moment the local inbox is empty would make many tiny
        batches while the broker is still delivering the window, and each batch costs Spark a
        planning round of its own."""
        if self._connection is None:
            limit = self._options.max_bytes_per_batch
            self._connection = _session.open_consumer(
                self._options,
                max_messages=2 * self._options.max_messages_per_batch,
                # A batch may end one message past its byte budget.
                max_bytes=2 * (limit + bmq.MAX_PAYLOAD_SIZE),
            )
        queue = self._connection[1]
        message = queue.get(timeout=self._options.poll_timeout)
        messages: List[Any] = []
        size = 0
        while message is not None:
            messages.append(message)
            size += len(message.data)
            if len(messages) >= self._options.max_messages_per_batch or size >= self._options.max_bytes_per_batch:
                return messages
            message = queue.get(timeout=_LINGER)
        return messages
