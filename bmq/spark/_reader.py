"""The batch reader: each partition drains messages in its own task until a limit or idleness.

Semantics (also in ``docs/spark.md``): a partition takes messages until it has its share of
``maxMessages`` or none arrived for ``idleTimeout`` seconds, handing them to Spark as Arrow
record batches of up to ``_CHUNK`` rows (what has arrived when Spark asks for more). Its messages are confirmed only after Spark has
taken the partition's last batch; a task that fails or stops early confirms
nothing, and the broker redelivers. With ``confirm=false`` nothing is confirmed at all (a
snapshot that leaves the queue as it was, once the sessions close).
"""
from __future__ import annotations

import datetime
import logging
import time
from typing import Iterator, List

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

import bmq

from . import _session
from ._options import ReadOptions
from ._schema import RowBuilder

__all__ = ["BlazingMQReader"]

_log = logging.getLogger(__name__)
# Rows per record batch handed to Spark: large enough that the per-batch costs vanish, small
# enough that rows reach Spark while the drain goes on.
_CHUNK = 10_000


class BlazingMQReader(DataSourceReader):
    """Reader of ``spark.read.format("blazingmq")``: a destructive drain (see module docs).

    Thread-safety: Spark calls each method from one thread.
    """

    def __init__(self, options: ReadOptions, schema: StructType):
        self._options = options
        self._schema = schema

    def partitions(self) -> List[InputPartition]:
        """``numPartitions`` partitions, each with its share of ``maxMessages``."""
        count = self._options.num_partitions
        share, extra = divmod(self._options.max_messages, count)
        return [InputPartition(share + (1 if index < extra else 0)) for index in range(count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Drain up to this partition's share of messages, yielding them as record batches.

        Raises:
            bmq.ConnectionError: the broker cannot be reached.
            bmq.BrokerError: the broker refused to open the queue.
        """
        share = partition.value
        if share <= 0:
            return
        options = self._options
        make_batch = RowBuilder(self._schema)

        def rows(parts: List[bmq.MessageBatch]) -> pa.RecordBatch:
            return make_batch(bmq.MessageBatch.join(parts), datetime.datetime.now(datetime.timezone.utc))

        # Nothing is confirmed before the end, so the whole share may be unconfirmed at once.
        session, queue = _session.open_consumer(options, max_messages=share, max_bytes=share * bmq.MAX_PAYLOAD_SIZE)
        try:
            taken: List[bmq.MessageBatch] = []  # all, confirmed at the end
            pending: List[bmq.MessageBatch] = []  # not yet handed to Spark
            count = waiting = 0
            deadline = time.monotonic() + options.idle_timeout
            while count < share:
                part = queue.get_batch(min(share - count, _CHUNK - waiting),
                                       timeout=max(0.0, deadline - time.monotonic()))
                if part is None:
                    break
                taken.append(part)
                pending.append(part)
                count, waiting = count + len(part), waiting + len(part)
                deadline = time.monotonic() + options.idle_timeout
                if waiting >= _CHUNK:
                    yield rows(pending)
                    pending, waiting = [], 0
            if pending:
                yield rows(pending)
            if options.confirm:
                for part in taken:
                    part.confirm()
            _log.info("blazingmq: read %d messages from %s (confirm=%s)", count, options.queue, options.confirm)
        finally:
            session.stop()
