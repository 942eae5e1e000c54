"""The streaming reader: one consuming session on the driver, confirms what Spark has finished.

Spark runs a :class:`~pyspark.sql.datasource.DataSourceStreamReader` in one long-lived Python
process on the driver for the whole query: :meth:`latestOffset` plans a micro-batch (Spark
calls it only once the previous batch has ended), :meth:`partitions` hands the batch to the
executors and :meth:`commit` is told when Spark has durably finished one. The session lives in
that process, so the session that received a message is the one that confirms it, as
BlazingMQ requires.

The data path is Arrow from end to end: the driver turns a batch's messages into packed Arrow
record batches (payloads, raw GUIDs and properties, see :class:`~bmq.spark._schema.RowBuilder`;
one per part the batch was taken in, never joined) and cuts them into slices, Arrow IPC streams that
:meth:`partitions` hands to Spark as its partitions; :meth:`read`, in the executors' Python
workers, completes the rows (GUIDs in hex, the queue and ``received`` columns) and gives them
to Spark as record batches, which Spark takes without converting a value in Python. Several
partitions let Spark's cores take one batch in parallel. The driver does only what needs the
session, so that one driver feeds as many rows as it can: what it ships is the least the
rows can be made from.

Offsets are ``{"run": <id of this reader>, "seq": <messages handed out by it>}``. A batch of
this run is kept (messages and slices) until confirmed, so :meth:`partitions` gives the
same rows each time it is asked for a range. A batch of an earlier run (a query restarted
from its checkpoint) cannot be replayed: its messages were never confirmed, the broker
redelivers them to this run's session when the old one goes away, and they come back in a
later batch (at-least-once).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import logging
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pyspark < 4.2 asks the source nothing and runs AvailableNow as one batch
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

import bmq

from . import _session
from ._options import StreamOptions
from ._schema import RowBuilder

__all__ = ["BlazingMQStreamReader"]

_log = logging.getLogger(__name__)

Offset = Dict[str, Any]
# A taken batch: its messages in the parts they were taken in (none when none came), the Arrow
# IPC slices of its packed rows and when it was received.
_Taken = Tuple[List[bmq.MessageBatch], List[pa.Buffer], datetime.datetime]
# How long a micro-batch that has messages waits for the next one before it is cut.
_LINGER = 0.05
# A batch Spark waits for with nothing prefetched (a run's first, or the first after the queue
# was idle) stops at this share of the limits, but no lower than _HEAD_START_FLOOR messages:
# Spark's fixed cost of starting on a batch (~0.9 s for a query's first) then overlaps with
# the prefetch of the next one, instead of following the take of a full batch.
_HEAD_START_SHARE = 8
_HEAD_START_FLOOR = 1000
# How long an AvailableNow run waits on for messages the broker holds but does not deliver
# (another consumer holds them unconfirmed) before it ends anyway.
_UNDELIVERED_PATIENCE = 30.0
# The reception time of a batch that has no message.
_NEVER = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)


@dataclasses.dataclass
class _Batch:
    """Messages handed to Spark for offsets ``(start_seq, end_seq]`` and not yet committed."""

    start_seq: int
    end_seq: int
    parts: List[bmq.MessageBatch]
    slices: List[pa.Buffer]
    received: datetime.datetime


class ArrowSlice(InputPartition):
    """One partition of a micro-batch: consecutive packed rows as an Arrow IPC stream (see
    :meth:`RowBuilder.pack`), with what completes them: the queue's URI and when they came.

    Spark pickles partitions from the driver to the executors; the IPC stream pickles as one
    buffer (an Arrow buffer, with no copy of its own before pickle's) and is read back without
    copying each value.
    """

    def __init__(self, index: int, stream: pa.Buffer, queue_uri: str, received: datetime.datetime):
        super().__init__(index)
        self.stream = stream
        self.queue_uri = queue_uri
        self.received = received


def _slices(records: pa.Table, count: int) -> List[pa.Buffer]:
    """``records`` cut into up to ``count`` runs of consecutive rows, each an Arrow IPC stream
    (of one record batch per chunk of ``records`` it spans)."""
    count = min(count, records.num_rows)
    share, extra = divmod(records.num_rows, count)
    slices = []
    offset = 0
    for index in range(count):
        length = share + (1 if index < extra else 0)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, records.schema) as writer:
            writer.write_table(records.slice(offset, length))  # writes only the slice's part of the buffers
        slices.append(sink.getvalue())
        offset += length
    return slices


class BlazingMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reader of ``spark.readStream.format("blazingmq")``: at-least-once delivery.

    Each micro-batch takes up to ``maxMessagesPerBatch`` messages (and about
    ``maxBytesPerBatch`` payload bytes) that are already waiting, after waiting at most
    ``pollTimeout`` seconds for the first, and is split into up to ``numPartitions`` Spark
    partitions. Messages are confirmed once Spark has finished their batch: in
    :meth:`commit`, or in the next :meth:`latestOffset`, which Spark calls at every trigger
    once the previous batch has ended (so a run's last batch is confirmed too). The
    consumer's unconfirmed limits are two batches: the one Spark processes and the next one,
    which a prefetch thread takes and converts meanwhile.

    Spark constructs the reader in several processes (planning workers, executors); only the
    driver-side streaming process calls :meth:`latestOffset`, which connects lazily.
    Executors only call :meth:`read`, which needs no session.

    Thread-safety: Spark calls the methods from one thread; a lock guards the state anyway
    because :meth:`stop` may come from elsewhere. The prefetch thread only touches the
    queue and hands its result back through a future.
    """

    def __init__(self, options: StreamOptions, schema: StructType):
        self._options = options
        self._schema = schema
        self._run = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._connection: Optional[Tuple[Any, Any]] = None
        self._rows: Optional[RowBuilder] = None
        self._seq = 0
        self._batches: List[_Batch] = []
        self._available_now = False
        self._caught_up = False
        # AvailableNow: what the broker held for this reader when the run started (None: it
        # could not tell), and the messages this run has received.
        self._backlog: Optional[int] = None
        self._received = 0
        self._stopping = threading.Event()
        self._prefetcher: Optional[threading.Thread] = None
        self._next_batch: Optional["concurrent.futures.Future[_Taken]"] = None
        self._wanted = threading.Event()

    def __getstate__(self) -> Dict[str, Any]:
        # Spark pickles the reader into executor tasks, which only call read(); a copy starts
        # empty, as a reader of its own run.
        return {"options": self._options, "schema": self._schema}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["options"], state["schema"])  # type: ignore[misc]

    def prepareForTriggerAvailableNow(self) -> None:
        """Make this run end once it has caught up with the queue (Trigger.AvailableNow).

        A queue has no end offset to record; what stands for it is the count of messages
        the broker holds for this reader now (see :func:`~bmq.spark._session.held_messages`).
        The run has caught up when a :meth:`latestOffset` gets no message at all and either
        the run has received that many messages or the broker holds none for it any more.
        Such a call first confirms every earlier batch, so the broker may deliver up to the
        consumer's whole window, and then waits ``pollTimeout`` for a first message. Silence
        alone proves nothing while the broker holds messages: it may not have started
        delivering (its start-up delay after the queue opens, longer on a loaded machine),
        or be slow to send the next window. So a call that gets nothing asks the broker and
        waits on while it holds messages, up to ``_UNDELIVERED_PATIENCE`` seconds (messages
        another consumer holds are never delivered to this one). When the broker cannot
        tell (a ``subscription`` reader, no admin answer), silence is taken for caught up.
        The call that has caught up returns ``start`` and Spark ends the run with every
        batch confirmed.
        """
        backlog = _session.held_messages(self._options)
        with self._lock:
            self._available_now = True
            self._backlog = backlog

    def initialOffset(self) -> Offset:
        """The offset before the first message of a new query."""
        return self._offset(0)

    def latestOffset(self, start: Optional[Offset] = None, limit: Any = None) -> Offset:
        """Confirm the batches Spark has finished, then take the next micro-batch of waiting messages.

        Spark plans a batch only after the previous one has ended (its sink done and the end
        recorded in the commit log), so everything up to ``start`` can be confirmed here: the
        last batch of a run is then confirmed even though Spark only commits a batch when it
        plans the next one with data.

        Args:
            start: the end offset of the previous batch (pyspark < 4.2 passes none: then
                this reader's own position).
            limit: Spark's read limit, always ``ReadAllAvailable`` as this reader keeps the
                default; a batch is bounded by the reader's options whatever the limit, as
                a queue has no end to read up to.

        Returns:
            The end offset of the new batch; ``start`` itself when no message came (or an
            AvailableNow run has caught up with the queue).

        Raises:
            bmq.ConnectionError: the broker cannot be reached.
            bmq.BrokerError: the broker refused to open the queue.
        """
        with self._lock:
            if start is None:
                start = self._offset(self._seq)
            if self._mine(start):
                if start["seq"] != self._seq:
                    # Spark plans from the last end offset it was given; anything else means
                    # it lost track of a batch, whose messages must not be skipped silently.
                    raise RuntimeError(
                        f"blazingmq: asked to read from {start}, but this reader is at seq {self._seq}"
                    )
                self._confirm_through(self._seq)
            if self._caught_up:
                return start
            parts, slices, received = self._prefetched()
            if not parts:
                # The prefetch may have found nothing only because the consumer's window was
                # full; now that every finished batch is confirmed, look again.
                parts, slices, received = self._next(self._queue())
            if not parts and self._available_now:
                parts, slices, received = self._until_caught_up()
            if not parts:
                self._caught_up = self._available_now
                return start
            self._received += sum(map(len, parts))
            batch = _Batch(self._seq, self._seq + sum(map(len, parts)), parts, slices, received)
            self._batches.append(batch)
            self._seq = batch.end_seq
            self._prefetch()
            if _log.isEnabledFor(logging.DEBUG):
                _log.debug("blazingmq: batch (%d, %d] of %s", batch.start_seq, batch.end_seq, self._options.queue)
            return self._offset(batch.end_seq)

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        """The rows between two offsets: each uncommitted batch's ``numPartitions`` slices.

        A batch is cut into slices once, when it is taken, so a range asked for again gives
        the same rows in the same partitions (and this call, on Spark's critical path, only
        hands out bytes).

        Returns:
            The slices of this run's batches in ``(start, end]``; none for a range of an
            earlier run or another process (those messages are redelivered by the broker
            and come back in a later batch), or for an empty range.
        """
        with self._lock:
            if not self._mine(end):
                if end != start:
                    _log.warning(
                        "blazingmq: not replaying %s..%s from an earlier run of the query; the broker "
                        "redelivers its unconfirmed messages to this run",
                        start,
                        end,
                    )
                return []
            low = start["seq"] if self._mine(start) else 0
            batches = [batch for batch in self._batches if low < batch.end_seq <= end["seq"]]
        slices = [(data, batch.parts[0].queue_uri, batch.received) for batch in batches for data in batch.slices]
        return [ArrowSlice(index, *parts) for index, parts in enumerate(slices)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one slice (in an executor's Python worker), completed from its packed rows."""
        assert isinstance(partition, ArrowSlice)
        rows = self._row_builder()
        with pa.ipc.open_stream(partition.stream) as reader:
            for packed in reader:
                yield rows.unpack(packed, partition.queue_uri, partition.received)

    def commit(self, end: Offset) -> None:
        """Confirm every message up to ``end``: Spark has finished with them.

        An offset of an earlier run is ignored (that run's session is gone).
        """
        with self._lock:
            if self._mine(end):
                self._confirm_through(end["seq"])

    def stop(self) -> None:
        """Close the session; unconfirmed messages go back to the broker for redelivery."""
        self._stopping.set()  # a latestOffset() waiting for an AvailableNow backlog gives up
        with self._lock:
            connection, self._connection = self._connection, None
            self._batches = []
            prefetcher, self._prefetcher = self._prefetcher, None
            self._next_batch = None
            self._wanted.set()  # a prefetch ends at the next gap in deliveries ...
        if connection is not None:
            connection[0].stop()  # ... or at once, its queue being closed
        if prefetcher is not None:
            prefetcher.join()

    def _until_caught_up(self) -> _Taken:
        """An AvailableNow run's next batch after a ``pollTimeout`` of silence: none once the
        run has caught up with the queue (see :meth:`prepareForTriggerAvailableNow`), else
        waits on for messages while the broker holds some for this reader."""
        deadline = time.monotonic() + _UNDELIVERED_PATIENCE
        while self._backlog is None or self._received < self._backlog:
            held = _session.held_messages(self._options)
            if not held or self._stopping.is_set():
                break
            if time.monotonic() > deadline:
                _log.warning(
                    "blazingmq: %s: the broker holds %d messages but delivered none for %.0f s (another "
                    "consumer holds them?); ending the AvailableNow run", self._options.queue, held,
                    _UNDELIVERED_PATIENCE,
                )
                break
            _log.info("blazingmq: %s: nothing delivered in %.2f s while the broker holds %d messages; waiting on",
                      self._options.queue, self._options.poll_timeout, held)
            taken = self._next(self._queue())
            if taken[0]:
                return taken
        return [], [], _NEVER

    def _row_builder(self) -> RowBuilder:
        if self._rows is None:
            self._rows = RowBuilder(self._schema)
        return self._rows

    def _offset(self, seq: int) -> Offset:
        return {"run": self._run, "seq": seq}

    def _mine(self, offset: Optional[Offset]) -> bool:
        return offset is not None and offset.get("run") == self._run

    def _confirm_through(self, seq: int) -> None:
        done = [batch for batch in self._batches if batch.end_seq <= seq]
        if not done or self._connection is None:
            return
        for batch in done:
            for part in batch.parts:
                part.confirm()
        self._batches = [batch for batch in self._batches if batch.end_seq > seq]
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("blazingmq: confirmed up to seq %d of %s", seq, self._options.queue)

    def _prefetch(self) -> None:
        """Start taking the next batch while Spark processes this one.

        Spark runs a micro-batch's tasks between two :meth:`latestOffset` calls, and this
        process would otherwise sit idle then; taking and converting the next batch meanwhile
        takes that work off the next call. The consumer's window (two batches) has room for
        it, and its messages are confirmed no earlier than if taken later.
        """
        queue, wanted = self._queue(), threading.Event()
        future: "concurrent.futures.Future[_Taken]" = concurrent.futures.Future()

        def prefetch() -> None:
            try:
                future.set_result(self._next(queue, wanted))
            except BaseException as e:  # handed to latestOffset(), which raises it in Spark's thread
                future.set_exception(e)

        # A daemon thread: a process that ends without stop() must not wait for a prefetch.
        self._prefetcher = threading.Thread(target=prefetch, name="bmq-spark-prefetch", daemon=True)
        self._wanted, self._next_batch = wanted, future
        self._prefetcher.start()

    def _prefetched(self) -> _Taken:
        """The prefetched batch (asking it to end at the next gap in deliveries), or none."""
        future, self._next_batch = self._next_batch, None
        if future is None:
            return [], [], _NEVER
        self._wanted.set()
        return future.result()

    def _next(self, queue: Any, wanted: Optional[threading.Event] = None) -> _Taken:
        """The next batch's messages, its packed rows as the slices of its partitions and when
        it was received (no parts and no slices when no message came); see :meth:`_take` for
        ``wanted``.

        The parts are packed one by one and never joined: a join would copy every payload
        once more, the driver's largest cost per row for large payloads."""
        parts = self._take(queue, wanted)
        if not parts:
            return [], [], _NEVER
        received = datetime.datetime.now(datetime.timezone.utc)
        rows = self._row_builder()
        packed = pa.Table.from_batches([rows.pack(part) for part in parts])
        return parts, _slices(packed, self._options.num_partitions), received

    def _queue(self) -> Any:
        """The consumer's queue, opened by the first call (only :meth:`latestOffset` calls it,
        so a prefetch running after :meth:`stop` cannot open a session again)."""
        if self._connection is None:
            limit = self._options.max_bytes_per_batch
            self._connection = _session.open_consumer(
                self._options,
                max_messages=2 * self._options.max_messages_per_batch,
                # A batch may end one message past its byte budget.
                max_bytes=2 * (limit + bmq.MAX_PAYLOAD_SIZE),
            )
        return self._connection[1]

    def _take(self, queue: Any, wanted: Optional[threading.Event] = None) -> List[bmq.MessageBatch]:
        """The next batch's messages, up to the batch limits, in the parts they were taken in
        (none when none came).

        Without ``wanted`` (Spark is waiting): waits ``pollTimeout`` for the first message,
        then takes more as long as they keep coming; a gap of ``_LINGER`` ends the batch.
        Stopping at the first moment the local inbox is empty would make many tiny batches
        while the broker is still delivering the window, and each batch costs Spark a
        planning round of its own. A prefetch (``wanted`` given) rides out gaps until
        ``wanted`` is set: Spark is busy until then, so the batch may as well grow. A batch
        Spark waits for is cut smaller (see ``_HEAD_START_SHARE``).
        """
        limit, byte_limit = self._options.max_messages_per_batch, self._options.max_bytes_per_batch
        if wanted is None:
            limit = min(limit, max(_HEAD_START_FLOOR, limit // _HEAD_START_SHARE))
            byte_limit = min(byte_limit, max(_HEAD_START_FLOOR * 1024, byte_limit // _HEAD_START_SHARE))
        parts: List[bmq.MessageBatch] = []
        count = size = 0
        timeout = _LINGER if wanted is not None else self._options.poll_timeout
        while count < limit and size < byte_limit:
            part = queue.get_batch(limit - count, timeout=timeout, max_bytes=byte_limit - size)
            if part is None:
                if wanted is None or wanted.is_set():
                    break
                continue
            parts.append(part)
            count, size = count + len(part), size + len(part.payloads)
            timeout = _LINGER
        return parts
