"""The ``blazingmq`` data source: wires the options to the readers and writers."""
from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from . import _session
from ._options import ReadOptions, StreamOptions, WriteOptions
from ._reader import BlazingMQReader
from ._schema import check_read_schema, read_schema
from ._stream import BlazingMQStreamReader
from ._writer import BlazingMQStreamWriter, BlazingMQWriter

__all__ = ["BlazingMQDataSource"]


class BlazingMQDataSource(DataSource):
    """BlazingMQ queues as a Spark data source, registered under the format name ``blazingmq``.

    Register it once per SparkSession, then use it like any format::

        spark.dataSource.register(BlazingMQDataSource)
        df.write.format("blazingmq").option("queue", "bmq://bmq.test.mem.priority/q").mode("append").save()

    Options (all strings, names case-insensitive): ``broker`` (default
    ``tcp://localhost:30114``), ``queue`` (required), ``connectTimeout``; for writes
    ``propertyColumns``, ``guidColumn``, ``ackTimeout``; for batch reads ``maxMessages``,
    ``idleTimeout``, ``numPartitions``, ``confirm``; for streaming reads
    ``maxMessagesPerBatch``, ``maxBytesPerBatch``, ``pollTimeout``, ``numPartitions``; for reads
    ``propertySchema``. ``docs/spark.md`` gives the guarantees of each direction.

    Thread-safety: Spark creates and uses instances from one thread per process.
    """

    @classmethod
    def name(cls) -> str:
        """The format name: ``blazingmq``."""
        return "blazingmq"

    def schema(self) -> str:
        """The DDL of read rows: data, properties, guid, queue, received + ``propertySchema``."""
        return read_schema(self.options.get("propertySchema") or "")

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader (see :class:`~bmq.spark._reader.BlazingMQReader`); checks the broker first.

        Spark calls this on the driver while it plans the read, so an unreachable broker
        fails the read there, before any task runs.

        Raises:
            ValueError: a missing or malformed option.
            bmq.ConnectionError: the broker cannot be reached.
        """
        check_read_schema(schema)
        options = ReadOptions.parse(self.options)
        _session.probe_broker(options)
        return BlazingMQReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A streaming reader consuming on the driver (see :class:`~bmq.spark._stream.BlazingMQStreamReader`).

        Spark calls this on the driver when the query starts; checking the broker here makes
        an unreachable broker fail the query then, not at its first micro-batch.

        Raises:
            ValueError: a missing or malformed option.
            bmq.ConnectionError: the broker cannot be reached.
        """
        check_read_schema(schema)
        options = StreamOptions.parse(self.options)
        _session.probe_broker(options)
        return BlazingMQStreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> BlazingMQWriter:
        """A batch writer; checks the columns and the broker first."""
        return BlazingMQWriter(WriteOptions.parse(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> BlazingMQStreamWriter:
        """A streaming writer; checks the columns and the broker first."""
        if overwrite:
            raise ValueError("blazingmq: a queue cannot be overwritten; use outputMode('append')")
        return BlazingMQStreamWriter(WriteOptions.parse(self.options), schema)
