"""The batch and streaming writers: each Spark task posts its partition through one session.

A task posts every Arrow batch as it arrives and waits for its ACKs before taking the next
(meanwhile Spark's JVM prepares that one), then fails with the NACK statuses if any. The GUID of each message is
a function of (write scope, partition, row index), or of a key column, so that a retried task
reproduces its GUIDs and the broker drops the duplicates (see ``docs/spark.md`` for the exact
guarantee). The per-row work is in the codec: payloads taken from the Arrow buffers, the
GUIDs of a batch derived in one call; see docs/spark.md for where the rest of the time goes.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

import bmq
from bmq import _codec

from . import _session
from ._options import WriteOptions
from ._schema import WriteLayout

__all__ = ["BlazingMQWriter", "BlazingMQStreamWriter", "PartitionCommit"]

_log = logging.getLogger(__name__)

_BATCH_ID_PROPERTY = "streaming.sql.batchId"
_QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclasses.dataclass(frozen=True)
class PartitionCommit(WriterCommitMessage):
    """What one task wrote, sent back to the driver.

    Attributes:
        partition: the Spark partition id.
        attempt: the task attempt number that succeeded.
        messages: messages posted and acknowledged with SUCCESS.

    Thread-safety: immutable.
    """

    partition: int
    attempt: int
    messages: int


# Property types the client infers right from the Python value (bool, an int that fits 32 bits,
# str, bytes); the others must be named in ``property_types``.
_INFERRED = frozenset((bmq.PropertyType.BOOL, bmq.PropertyType.INT32, bmq.PropertyType.STRING, bmq.PropertyType.BINARY))


# (row indexes, their property values, the property_types of their post_many call)
_Group = Tuple[List[int], List[Optional[Dict[str, Any]]], Optional[Dict[str, "bmq.PropertyType"]]]


def _by_type_overrides(properties: List[Optional[Dict[str, Tuple[int, Any]]]]) -> List[_Group]:
    """Rows grouped by the type overrides they need: ``(row indexes, values, property_types)``.

    ``post_many``'s ``property_types`` applies to every message of a call and must name only
    properties each message has, so rows lacking a SHORT/CHAR/INT64 property (a null) go into
    another call. Usually every row has the same properties: one group.
    """
    groups: Dict[Tuple[str, ...], _Group] = {}
    for row, typed in enumerate(properties):
        overridden = tuple(name for name, (kind, _) in typed.items() if kind not in _INFERRED) if typed else ()
        group = groups.get(overridden)
        if group is None:
            types = {name: bmq.PropertyType(typed[name][0]) for name in overridden} if typed and overridden else None
            group = groups[overridden] = ([], [], types)
        group[0].append(row)
        group[1].append({name: value for name, (_, value) in typed.items()} if typed else None)
    return list(groups.values())


class _PartitionPoster:
    """Posts one task's Arrow batches and collects their ACK futures.

    Thread-safety: used by the one thread running the task.
    """

    def __init__(self, queue: "bmq.Queue", layout: WriteLayout, options: WriteOptions, scope: bytes, partition: int):
        self._queue = queue
        self._layout = layout
        self._options = options
        self._position_prefix = scope + b"/" + partition.to_bytes(4, "big")
        self._key_prefix = options.queue.encode() + b"\0"
        self._failed: List[Any] = []
        # GUIDs of keyed rows posted by this task: a repeated key is one message (the first),
        # and the client refuses a GUID repeated within a post or still waiting for its ACK.
        self._keyed: Set[bytes] = set()
        self.posted = 0
        self.duplicates = 0

    def post(self, batch: Any) -> None:
        """Post every row of ``batch`` and wait for their ACKs (a NACK is raised by :meth:`finish`).

        Waiting here rather than posting the next batch meanwhile: the poster and the
        session's reader thread would then contend for the interpreter lock, 0.4-0.6 µs of CPU
        per row more (+40%) for no more rows/s on 2 cores, where the broker and Spark's JVM
        want the CPU too; and Spark's JVM prepares the next batch while this one waits anyway.

        With a ``guidColumn``, a row whose key this task already posted is dropped.

        Raises:
            ValueError: a null payload or GUID key.
            bmq.Error: the client failed to post.
        """
        if batch.num_rows == 0:
            return
        payloads = self._layout.payloads(batch)
        properties = self._layout.properties(batch)
        keys = self._layout.guid_keys(batch)
        if keys is None:
            # No row is dropped here, so ``posted`` is the partition's index of the first row.
            guids = _codec.derived_guids(self._position_prefix, self.posted, len(payloads))
        else:
            kept, guids = self._first_occurrences(keys)
            if len(kept) < len(payloads):
                self.duplicates += len(payloads) - len(kept)
                payloads = [payloads[row] for row in kept]
                properties = None if properties is None else [properties[row] for row in kept]
            if not payloads:
                return
        groups = None if properties is None else _by_type_overrides(properties)
        if groups is None or len(groups) == 1:
            # Every row in one call: the payloads stay a column (no bytes object per row).
            self._post(payloads, groups[0][1] if groups else None, groups[0][2] if groups else None, guids)
        else:
            for rows, values, types in groups:
                self._post([payloads[row] for row in rows], values, types,
                           b"".join(guids[16 * row : 16 * row + 16] for row in rows))
        self.posted += len(payloads)

    def _post(self, payloads: Sequence[bytes], properties: Any, types: Any, guids: bytes) -> None:
        """``post_many``, keeping the failed Acks for :meth:`finish` (which names them all).

        ``post_many`` rather than ``post_many_async``: a future per message, made and resolved,
        costs ~3 µs per row, more than the rest of the task's work together.
        """
        try:
            self._queue.post_many(payloads, properties, property_types=types, guids=guids,
                                  timeout=self._options.ack_timeout + 5.0)
        except bmq.PostError as error:
            self._failed += [error.acks[i] for i in error.failed]

    def _first_occurrences(self, keys: Sequence[bytes]) -> Tuple[List[int], bytes]:
        """The indexes of the rows whose key is new to this task, and their GUIDs."""
        rows: List[int] = []
        guids: List[bytes] = []
        for row, key in enumerate(keys):
            guid = bmq.deterministic_guid(self._key_prefix + key)
            if guid not in self._keyed:
                self._keyed.add(guid)
                rows.append(row)
                guids.append(guid)
        return rows, b"".join(guids)

    def finish(self) -> None:
        """Fail if some message was not acknowledged with SUCCESS.

        Raises:
            bmq.PostError: some messages were not acknowledged with SUCCESS (``.acks``).
        """
        if self._failed:
            statuses = collections.Counter(ack.status.name for ack in self._failed)
            raise bmq.PostError(
                f"blazingmq: {len(self._failed)} of {self.posted} messages to {self._options.queue} "
                f"were not accepted by the broker: {dict(statuses)}",
                self._failed,
            )


def _write_partition(
    options: WriteOptions, layout: WriteLayout, scope: bytes, batches: Iterator[Any]
) -> PartitionCommit:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    attempt = context.attemptNumber() if context is not None else 0
    with _session.open_producer(options) as queue:
        poster = _PartitionPoster(queue, layout, options, scope, partition)
        for batch in batches:
            poster.post(batch)
        poster.finish()
    _log.info(
        "blazingmq: partition %d (attempt %d) posted %d messages (%d rows dropped for a repeated guidColumn key)",
        partition,
        attempt,
        poster.posted,
        poster.duplicates,
    )
    return PartitionCommit(partition, attempt, poster.posted)


def _check(options: WriteOptions, schema: StructType) -> WriteLayout:
    layout = WriteLayout.of(schema, options.property_columns, options.guid_column)
    _session.probe(options)
    return layout


def _total(messages: List[Optional[WriterCommitMessage]]) -> int:
    return sum(message.messages for message in messages if isinstance(message, PartitionCommit))


class BlazingMQWriter(DataSourceArrowWriter):
    """Writer of ``df.write.format("blazingmq")``: created on the driver, run in every task.

    Creating it checks the DataFrame's columns and that the broker accepts the queue, so a
    mistake fails before any data is sent. Its write id (random, fixed at creation) is the
    scope of the deterministic GUIDs: a retried task re-posts the same GUIDs.

    Thread-safety: Spark calls each method from one thread.
    """

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool):
        if overwrite:
            raise ValueError("blazingmq: a queue cannot be overwritten; use mode('append')")
        self._options = options
        self._layout = _check(options, schema)
        self._scope = uuid.uuid4().bytes

    @property
    def write_id(self) -> str:
        """The hex scope of this write's GUIDs."""
        return self._scope.hex()

    def write(self, iterator: Iterator[Any]) -> PartitionCommit:
        """Post one partition (an iterator of Arrow record batches) and wait for its ACKs.

        Raises:
            bmq.PostError: some messages were NACKed (the task fails and Spark may retry it).
            bmq.ConnectionError: the broker cannot be reached.
        """
        return _write_partition(self._options, self._layout, self._scope, iterator)

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        """Log the total written (runs on the driver)."""
        _log.info("blazingmq: write %s posted %d messages to %s", self.write_id, _total(messages), self._options.queue)

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        """Log the failure: messages already acknowledged stay in the queue (runs on the driver)."""
        _log.warning(
            "blazingmq: write %s failed; %d messages of finished tasks are already in %s",
            self.write_id,
            _total(messages),
            self._options.queue,
        )


class BlazingMQStreamWriter(DataSourceStreamArrowWriter):
    """Writer of ``writeStream.format("blazingmq")``: one call of :meth:`write` per task per micro-batch.

    GUIDs are scoped by (query id, batch id), which Spark keeps across restarts from the
    checkpoint: a micro-batch replayed with the same rows re-posts the same GUIDs.

    Thread-safety: Spark calls each method from one thread.
    """

    def __init__(self, options: WriteOptions, schema: StructType):
        self._options = options
        self._layout = _check(options, schema)

    def write(self, iterator: Iterator[Any]) -> PartitionCommit:
        """Post one partition of the current micro-batch and wait for its ACKs.

        Raises:
            bmq.PostError: some messages were NACKed.
            bmq.ConnectionError: the broker cannot be reached.
        """
        context = TaskContext.get()
        query = (context.getLocalProperty(_QUERY_ID_PROPERTY) if context else None) or ""
        batch = (context.getLocalProperty(_BATCH_ID_PROPERTY) if context else None) or ""
        return _write_partition(self._options, self._layout, f"{query}/{batch}".encode(), iterator)

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        """Log the micro-batch's total (runs on the driver)."""
        _log.info("blazingmq: micro-batch %d posted %d messages to %s", batchId, _total(messages), self._options.queue)

    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        """Log the failure of a micro-batch (runs on the driver)."""
        _log.warning(
            "blazingmq: micro-batch %d failed after %d messages to %s", batchId, _total(messages), self._options.queue
        )
