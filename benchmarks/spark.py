"""Rows/s of Spark writing to and stream-reading from BlazingMQ, beside bmq's own rates.

All are measured in the same run against the same broker: ``--broker``, ``--bmqbrkr`` (the real
broker from ../shared/bmqbrkr), or else the embedded broker started as its own process so that
it does not share the benchmark's interpreter lock with the clients:

* ``post_many``: one process, one session, ``Queue.post_many`` in chunks, every ACK awaited;
* the write patterns, from ``local[2]`` (2 executor threads, ``--spark-threads``; each task a Python worker with
  its own session), after warm-up writes that start the Python workers, for each ``--partitions`` count N (2 by default; see :func:`write_results`):
  ``post_many_Np``, the broker's ingest of the same rows from N processes, each its own session
  posting its share with ``post_many`` in chunks of 10,000 (an Arrow batch's rows), started
  together; ``spark_discard_Np``, Spark's floor for writing: the same DataFrame in N partitions
  into a Python data source whose writer reads and drops the Arrow batches;
  ``spark_write_Np``, ``df.write.format("blazingmq")`` of that DataFrame; and the streaming
  twins ``spark_stream_discard_Np`` / ``spark_stream_write_Np``: the same rows from a Python
  streaming source (N partitions per micro-batch, 250,000 rows per micro-batch,
  ``Trigger.AvailableNow``) into a dropping stream writer or ``writeStream.format("blazingmq")``,
  timed from ``start()`` to the query's end. All five run one after the other, ``--repeat``
  times (medians printed). Each Spark write's ratio is to the lower of its floor and
  ``post_many_Np`` of the same round (median, and range over the rounds); ``*_executor_cpu_us_per_row`` is the CPU of the Python worker
  processes per row (against ``post_many_Np_cpu_us_per_row``, the posting processes' own),
  ``*_jvm_cpu_us_per_row`` the JVM's, ``*_spark_cpu_ratio_vs_ceilings`` the CPU per row of
  Spark's side of the ceilings (the floor, the posting processes) over the write's without the
  broker (the ratio where Spark's CPUs are the limit);
* ``consume``: bmq's own consumer draining a pre-filled queue (``messages()`` + ``confirm_many``);
* ``consume_batches``: the same with ``get_batch()`` + ``MessageBatch.confirm()`` (what the
  streaming source itself uses), the fastest way bmq consumes;
* ``spark_stream``: ``spark.readStream.format("blazingmq")`` (default options: micro-batches of
  up to 200,000 messages, 2 partitions each) draining a backlog of the same number of messages
  with ``Trigger.AvailableNow`` into the ``noop`` sink, which measures the source alone, timed
  from ``start()`` to the end of the micro-batch holding the last row, after a warm-up stream
  (``--warmup-rows``, 400,000 by default: long enough for the JVM's JIT to compile the row path);
  its ratio to ``spark_floor`` is the figure to watch (``_ratio_vs_consume_batches``: to bmq's own
  consumer). ``_steady_rows_per_s`` leaves out the first
  micro-batch, which also pays the query's start (~1.5-2.5 s here: Spark launching the source's
  Python process, compiling the query's code), i.e. what a longer stream sustains.
  ``_run_rows_per_s`` is timed to the query's
  end instead, which adds the ``pollTimeout`` (2 s here) the run waits to see the queue empty;
* ``spark_floor``: Spark's own limit for that stream on this machine: a Python streaming source
  with no broker and no session whose partitions carry only their row range, each executor
  building the same rows (bmq's schema and row builder, bmq's default batch size, 2 partitions),
  drained the same way into the same sink. ``spark_stream_ratio_vs_spark_floor`` is the share of
  it bmq's source reaches; the rest is BlazingMQ's part (the session, the broker on the same
  cores). ``spark_floor_built_on_driver`` builds the rows on the driver and ships them as Arrow
  IPC slices instead, which is what shipping rows from the driver costs Spark;
* ``spark_stream_parquet`` / ``spark_floor_parquet``: the same into the ``parquet`` file sink of
  the ``data`` column (a realistic pipeline: every row is written to disk before its messages
  are confirmed);
* ``*_cpu_us_per_row``: CPU microseconds per row of each process over the run, by role (the JVM,
  the source's driver-side Python process, the executors' Python workers, the broker), sampled
  from ``/proc`` (see ``_cpu.py``).

By default Spark and the broker share the machine's cores, and no ceiling above pays for the
broker (the read floor has none; of the two write ceilings, the floor pays no broker and the
ingest no Spark), so each write also prints its combined bound (see :func:`write_results`).
``--broker-cpus 1 --spark-cpus 0`` puts the broker alone on its CPUs, as on a cluster where it
runs on other hosts, and everything else on the others: this process (pinned before it starts
anything), and so Spark's JVM, the Python workers it forks, bmq's own clients and the posting
processes, which inherit the mask; every ceiling and every bmq figure of the run then has the
same CPUs. ``cpus_allowed_<role>`` prints the ``Cpus_allowed_list`` of each role's threads as
read during the runs. ``--spark-threads`` (N of ``local[N]``) stays 2 by default, pinned or not:
the partitions of every read and write, so that only the broker's place changes between the two
setups; more task threads than CPUs only help a task that waits (on the broker's ACKs), which
the 2 posting processes of the ingest ceiling also do.

Usage: ``python benchmarks/spark.py [--rows N] [--stream-rows N] [--payload BYTES] [--partitions 2,4]
[--write-only | --stream-only] [--repeat N] [--broker ADDR | --bmqbrkr [HOME]]
[--broker-cpus CPUS --spark-cpus CPUS] [--spark-threads N] [--json FILE]``
"""
from __future__ import annotations

import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import (AbstractSet, Any, Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple, TypedDict,
                    cast)

import bmq
from bmq.spark._options import StreamOptions
from _cpu import ChildCpu, cpus_allowed
from _report import add_broker_options, broker_starter, drain_batches, drain_in_batches, fill_queue, make_parser

# Child processes import the same (installed) bmq as this script.
ROOT = Path(bmq.__file__).resolve().parents[1]


# The Cpus_allowed_list values seen, by role, over every measured run (see ChildCpu.affinity):
# printed at the end as the proof of where --spark-cpus / --broker-cpus let each process run.
_CPUS_ALLOWED: Dict[str, Set[str]] = {}


def _note(cpu: ChildCpu) -> None:
    for role, lists in cpu.affinity.items():
        _CPUS_ALLOWED.setdefault(role, set()).update(lists)


def _queue(name: str) -> str:
    return f"bmq://bmq.test.mem.priority/bench-{name}-{uuid.uuid4().hex[:8]}"


def post_many_rate(broker: str, rows: int, payload: int, chunk: int = 10_000) -> float:
    data = [b"x" * payload] * chunk
    with bmq.Session(broker=broker) as session:
        queue = session.open_queue(_queue("post-many"), write=True)
        start = time.perf_counter()
        for first in range(0, rows, chunk):
            queue.post_many(data[: min(chunk, rows - first)])
        return rows / (time.perf_counter() - start)


def consume_rate(broker: str, rows: int, payload: int, batches: bool = False) -> float:
    """Rows/s of bmq's own consumer draining a queue filled with ``rows`` messages, from opening
    it to the last confirm: ``messages()`` + ``confirm_many``, or with ``batches``
    ``get_batch()`` + ``MessageBatch.confirm()`` (what the streaming source uses)."""
    uri = _queue("consume-batches" if batches else "consume")
    fill_queue(broker, uri, rows, b"x" * payload)
    with bmq.Session(broker=broker) as session:
        start = time.perf_counter()
        queue = session.open_queue(uri, read=True, batches=batches,
                                   options=bmq.QueueOptions(max_unconfirmed_messages=40_000))
        if batches:
            drain_batches(queue, rows, 5_000)
        else:
            drain_in_batches(session, queue, rows, 5_000)
        return rows / (time.perf_counter() - start)


def spark_session(threads: int = 2) -> Any:
    """A ``local[threads]`` SparkSession whose Python workers import this script's bmq."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    from bmq.spark import BlazingMQDataSource

    spark = SparkSession.builder.master(f"local[{threads}]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BlazingMQDataSource)
    return spark


def _progress_end(progress: Dict[str, Any]) -> float:
    """Wall-clock time (epoch seconds) at which a micro-batch's trigger ended."""
    started = datetime.datetime.strptime(progress["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    return started.replace(tzinfo=datetime.timezone.utc).timestamp() + progress["durationMs"]["triggerExecution"] / 1000


class StreamRates(TypedDict):
    """What :func:`spark_stream_rate` and :func:`spark_floor_rate` measure of one stream."""

    #: From ``start()`` to the end of the micro-batch holding the last row.
    rows_per_s: float
    #: To the query's end (which includes the ``pollTimeout`` a bmq stream waits to see the queue empty).
    run_rows_per_s: float
    #: The micro-batches after the first, which also pays the query's start (0 for one micro-batch).
    steady_rows_per_s: float
    #: Micro-batches that took rows.
    batches: int
    #: Rows and trigger milliseconds of each of those micro-batches.
    batch_rows_and_ms: List[Tuple[int, int]]
    #: CPU microseconds per row of each role's processes over the whole run (see :class:`ChildCpu`).
    cpu_us_per_row: Dict[str, float]


def spark_stream_rate(spark: Any, broker: str, rows: int, payload: int, sink: str) -> StreamRates:
    """Drain a queue of ``rows`` messages with ``Trigger.AvailableNow`` into ``sink``: its rates."""
    uri = _queue("stream")
    fill_queue(broker, uri, rows, b"x" * payload)
    source = (spark.readStream.format("blazingmq").option("broker", broker).option("queue", uri)
              .option("pollTimeout", "2").load())
    return _drain_into(source, sink, rows, "bmq-spark-bench-")


def _drain_into(source: Any, sink: str, rows: int, prefix: str) -> StreamRates:
    """Drain the streaming DataFrame ``source`` of ``rows`` rows into ``sink`` with
    ``Trigger.AvailableNow``, in a scratch directory named with ``prefix`` (the checkpoint,
    and a file sink's output, whose rows are counted); its rates, see :func:`_drain`."""
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        writer = (_sink_columns(source, sink).writeStream.format(sink).trigger(availableNow=True)
                  .option("checkpointLocation", os.path.join(scratch, "checkpoint")))
        if sink != "noop":
            writer = writer.option("path", os.path.join(scratch, "out"))
        rates = _drain(writer, rows)
        if sink != "noop" and source.sparkSession.read.parquet(os.path.join(scratch, "out")).count() != rows:
            raise RuntimeError(f"the {sink} sink did not get {rows} rows")
    return rates


def _sink_columns(frame: Any, sink: str) -> Any:
    """What a query keeps of the stream: all its columns for ``noop`` (which measures the
    source alone), the ``data`` column for a file sink (a pipeline archiving payloads)."""
    return frame if sink == "noop" else frame.select("data")


def _await_end(query: Any, what: str) -> None:
    """Wait for ``query`` to end (30 minutes at most, then it is stopped and this raises)."""
    if not query.awaitTermination(timeout=1800):
        query.stop()
        raise RuntimeError(f"the {what} did not finish within 30 minutes")


def _batches_of(query: Any, rows: int, what: str) -> List[Dict[str, Any]]:
    """The progress of each micro-batch that took rows of the ended ``query``.

    Raises:
        RuntimeError: the query failed, or took other than ``rows`` rows.
    """
    if query.exception() is not None:
        raise RuntimeError(f"the {what} failed: {query.exception()}")
    batches = [progress for progress in query.recentProgress if progress["numInputRows"]]
    taken = sum(progress["numInputRows"] for progress in batches)
    if taken != rows:
        raise RuntimeError(f"the {what} took {taken} rows, not {rows}")
    return batches


def _drain(writer: Any, rows: int) -> StreamRates:
    """Start ``writer``'s query, wait for its end, check that it read ``rows`` rows, and
    return its :class:`StreamRates`."""
    with ChildCpu() as cpu:
        started = time.time()
        query = writer.start()
        _await_end(query, "streaming read")
        ended = time.time()
    _note(cpu)
    batches = _batches_of(query, rows, "streaming read")
    # After the first micro-batch, which also pays the query's start (Spark launching the
    # source's Python process, generating and compiling the query's code), what a stream
    # sustains: the rate a backlog far larger than this one would approach.
    steady = sum(progress["numInputRows"] for progress in batches[1:])
    steady_s = _progress_end(batches[-1]) - _progress_end(batches[0])
    return {"rows_per_s": rows / (_progress_end(batches[-1]) - started), "run_rows_per_s": rows / (ended - started),
            "steady_rows_per_s": steady / steady_s if steady else 0.0, "batches": len(batches),
            "batch_rows_and_ms": [(progress["numInputRows"], progress["durationMs"]["triggerExecution"])
                                  for progress in batches],
            "cpu_us_per_row": {role: round(seconds / rows * 1e6, 2) for role, seconds in sorted(cpu.seconds.items())}}


def _available_now_reader(total: int, batch_rows: int, partitions: Callable[[int, int], List[Any]],
                          read: Callable[[Any], Iterator[Any]]) -> Any:
    """A Python stream reader of ``total`` rows, ``batch_rows`` per micro-batch at most, for
    ``Trigger.AvailableNow`` (offsets ``{"rows": n}``): ``partitions(first, end)`` cuts the
    rows ``first`` to ``end`` (excluded) into input partitions, ``read(partition)`` yields a
    partition's Arrow batches (on an executor)."""
    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def initialOffset(self) -> Dict[str, int]:
            return {"rows": 0}

        def latestOffset(self, start: Any = None, limit: Any = None) -> Dict[str, int]:
            return {"rows": min(total, (start["rows"] if start else 0) + batch_rows)}

        def partitions(self, start: Dict[str, int], end: Dict[str, int]) -> List[Any]:
            return partitions(start["rows"], end["rows"])

        def read(self, partition: Any) -> Iterator[Any]:
            return read(partition)

        def commit(self, end: Any) -> None:
            pass

    return Reader()


def _register_source(spark: Any, source_name: str, source_schema: str,
                     stream_reader: Callable[[Mapping[str, str], Any], Any], *, dropping_writers: bool = False) -> None:
    """Register the Python data source ``source_name`` of ``source_schema`` whose stream
    reader is ``stream_reader(options, schema)``; ``dropping_writers``: with a batch and a
    stream writer that read every Arrow batch and drop it (Spark's floor for writing)."""
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                        WriterCommitMessage)

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return source_name

        def schema(self) -> str:
            return source_schema

        def streamReader(self, schema: Any) -> Any:
            return stream_reader(self.options, schema)

    def drop(iterator: Any) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    class Discard(DataSourceArrowWriter):
        write = staticmethod(drop)

    class StreamDiscard(DataSourceStreamArrowWriter):
        write = staticmethod(drop)

    class DroppingSource(Source):
        def writer(self, schema: Any, overwrite: bool) -> Any:
            return Discard()

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return StreamDiscard()

    spark.dataSource.register(DroppingSource if dropping_writers else Source)


def spark_floor_rate(spark: Any, rows: int, payload: int, sink: str = "noop", on_driver: bool = False) -> StreamRates:
    """Spark's own limit for this stream: a Python streaming source that hands over the same
    rows (bmq's read schema, built by bmq's Arrow builder, in micro-batches as large as bmq's
    source makes by default: 200,000 rows or 32 MiB of payload, cut into 2 partitions as bmq's
    source does) without any broker or session, drained
    into the same ``sink`` like :func:`spark_stream_rate`. Its partitions carry only their row
    range and each executor builds its rows itself, as a source with nothing to fetch would
    (``on_driver``: the driver builds each batch and ships it as Arrow IPC slices, as bmq's
    source must, the rows coming from its one session). What is left between the two is
    BlazingMQ's part: the session, and the broker sharing the machine's cores."""
    from pyspark.sql.datasource import InputPartition

    from bmq.spark._schema import read_schema

    defaults = StreamOptions.parse({"queue": "bmq://bmq.test.mem.priority/floor"})
    batch_rows = min(defaults.max_messages_per_batch, max(1, defaults.max_bytes_per_batch // max(1, payload)))

    class Slice(InputPartition):
        def __init__(self, index: int, first: int, count: int, stream: bytes = b"") -> None:
            super().__init__(index)
            self.first, self.count, self.stream = first, count, stream

    def build(schema: Any, count: int) -> Any:
        import array
        import types

        from bmq.spark._schema import RowBuilder

        # The row builder reads no more of the batch's queue than its URI.
        queue = cast(bmq.Queue, types.SimpleNamespace(uri=_queue("floor")))
        messages = bmq.MessageBatch(queue, bmq._codec.GuidGenerator(1).generate(count), b"x" * payload * count,
                                    array.array("i", range(0, payload * count + 1, payload)).tobytes(), None)
        return RowBuilder(schema)(messages, datetime.datetime.now(datetime.timezone.utc))

    def floor_reader(options: Mapping[str, str], schema: Any) -> Any:
        def partitions(first: int, end: int) -> List[Any]:
            count = end - first
            if not count:
                return []
            if on_driver:
                import pyarrow as pa

                from bmq.spark._stream import _slices

                records = pa.Table.from_batches([build(schema, count)])
                return [Slice(index, 0, 0, stream) for index, stream in enumerate(_slices(records, 2))]
            half = count // 2
            return [Slice(0, first, half), Slice(1, first + half, count - half)]

        def read(partition: Any) -> Iterator[Any]:
            import pyarrow as pa

            if partition.stream:
                with pa.ipc.open_stream(partition.stream) as reader:
                    yield from reader
            else:
                yield build(schema, partition.count)

        return _available_now_reader(rows, batch_rows, partitions, read)

    _register_source(spark, "bmq-bench-floor", read_schema(""), floor_reader)
    return _drain_into(spark.readStream.format("bmq-bench-floor").load(), sink, rows, "bmq-spark-floor-")


# ---- write patterns ---------------------------------------------------------------------

_CHUNK = 10_000  # rows per post_many call: what one Arrow batch of Spark's carries
_STREAM_BATCH_ROWS = 250_000  # rows per micro-batch of the streaming writes


def _post_share(broker: str, uri: str, rows: int, payload: int, ready: Any, go: Any, results: Any) -> None:
    """One process of :func:`post_many_processes_rate`: open, say ready, wait for ``go``, post."""
    data = [b"x" * payload] * _CHUNK
    with bmq.Session(broker=broker) as session:
        queue = session.open_queue(uri, write=True)
        ready.put(None)
        go.wait()
        cpu = time.process_time()
        for first in range(0, rows, _CHUNK):
            queue.post_many(data[: min(_CHUNK, rows - first)])
        results.put(time.process_time() - cpu)


def post_many_processes_rate(broker: str, rows: int, payload: int, processes: int) -> Dict[str, float]:
    """The broker's ingest of ``rows`` messages posted by ``processes`` processes at once (each
    its own session, ``post_many`` of 10,000 at a time, every ACK awaited): ``rows_per_s`` from
    the start signal to the last process's end, ``cpu_us_per_row`` of the posting processes,
    ``broker_cpu_us_per_row`` (0 for a broker this script did not start) and their sum
    ``total_cpu_us_per_row``."""
    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    uri = _queue("post-many-n")
    shares = [rows // processes + (index < rows % processes) for index in range(processes)]
    children = [context.Process(target=_post_share, args=(broker, uri, share, payload, ready, go, results))
                for share in shares]
    for child in children:
        child.start()
    try:
        for _ in children:
            ready.get(timeout=60)
        with ChildCpu() as everyone:
            start = time.perf_counter()
            go.set()
            cpu = sum(results.get(timeout=600) for _ in children)
            elapsed = time.perf_counter() - start
    finally:
        for child in children:
            child.join(60)
    _note(everyone)
    return {"rows_per_s": rows / elapsed, "cpu_us_per_row": cpu / rows * 1e6,
            "broker_cpu_us_per_row": everyone.seconds.get("broker", 0.0) / rows * 1e6,
            "total_cpu_us_per_row": (cpu + everyone.seconds.get("broker", 0.0)) / rows * 1e6}


def _timed(rows: int, run: Any) -> Dict[str, float]:
    """``run()``'s rows/s, and the CPU per row of Spark's Python workers, of its JVM, of the
    broker (if this script started it) and of all of these and this process together."""
    own = time.process_time()
    with ChildCpu() as cpu:
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
    own = time.process_time() - own
    _note(cpu)
    python = cpu.seconds.get("executors", 0.0) + cpu.seconds.get("python_planning", 0.0)
    return {"rows_per_s": rows / elapsed, "executor_cpu_us_per_row": python / rows * 1e6,
            "jvm_cpu_us_per_row": cpu.seconds.get("jvm", 0.0) / rows * 1e6,
            "broker_cpu_us_per_row": cpu.seconds.get("broker", 0.0) / rows * 1e6,
            "total_cpu_us_per_row": (sum(cpu.seconds.values()) + own) / rows * 1e6}


def _register_write_floors(spark: Any) -> None:
    """``bmq-bench-write``: a data source whose writers read every Arrow batch and drop it
    (Spark's floor for writing), and whose streaming source gives ``rows`` rows of ``payload``
    bytes in ``partitions`` partitions per micro-batch (options; the input of the streaming
    writes)."""
    from pyspark.sql.datasource import InputPartition

    class Rows(InputPartition):
        def __init__(self, count: int, payload: int) -> None:
            super().__init__(count)
            self.count, self.payload = count, payload

    def rows_reader(options: Mapping[str, str], schema: Any) -> Any:
        payload, parts = int(options["payload"]), int(options["partitions"])

        def partitions(first: int, end: int) -> List[Any]:
            count = end - first
            return [Rows(count // parts + (index < count % parts), payload) for index in range(parts) if count]

        def read(partition: Any) -> Iterator[Any]:
            import array

            import pyarrow as pa

            for first in range(0, partition.count, _CHUNK):
                count = min(_CHUNK, partition.count - first)
                ends = array.array("i", range(0, partition.payload * count + 1, partition.payload))
                yield pa.RecordBatch.from_arrays(
                    [pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(ends),
                                                                pa.py_buffer(b"x" * partition.payload * count)])],
                    names=["data"])

        return _available_now_reader(int(options["rows"]), _STREAM_BATCH_ROWS, partitions, read)

    _register_source(spark, "bmq-bench-write", "data string", rows_reader, dropping_writers=True)


def spark_write_rate(spark: Any, broker: str, rows: int, payload: int, partitions: int, sink: str) -> Dict[str, float]:
    """``df.write`` of ``rows`` rows of ``payload`` bytes in ``partitions`` partitions into
    ``sink`` (``blazingmq`` or the dropping ``bmq-bench-write``), see :func:`_timed`."""
    from pyspark.sql import functions as F

    df = spark.range(rows, numPartitions=partitions).select(F.expr(f"repeat('x', {payload})").alias("data"))
    writer = df.write.format(sink).mode("append")
    if sink == "blazingmq":
        writer = writer.option("broker", broker).option("queue", _queue("spark"))
    return _timed(rows, writer.save)


def spark_stream_write_rate(spark: Any, broker: str, rows: int, payload: int, partitions: int,
                            sink: str) -> Dict[str, float]:
    """``rows`` rows from ``bmq-bench-write``'s streaming source (``partitions`` partitions per
    micro-batch) into ``sink`` with Trigger.AvailableNow, from ``start()`` to the query's end."""
    with tempfile.TemporaryDirectory(prefix="bmq-spark-write-") as scratch:
        writer = (spark.readStream.format("bmq-bench-write").option("rows", rows).option("payload", payload)
                  .option("partitions", partitions).load()
                  .writeStream.format(sink).trigger(availableNow=True)
                  .option("checkpointLocation", os.path.join(scratch, "checkpoint")))
        if sink == "blazingmq":
            writer = writer.option("broker", broker).option("queue", _queue("spark-stream"))

        def run() -> None:
            query = writer.start()
            _await_end(query, "streaming write")
            _batches_of(query, rows, "streaming write")

        return _timed(rows, run)


def _purge(broker: str) -> None:
    """Empty the benchmark's domain (nothing consumes the written queues, and the domain holds
    10,000,000 messages at most); a broker without the admin command keeps them."""
    with contextlib.suppress(bmq.Error), bmq.Admin(broker) as admin:
        admin.purge_domain("bmq.test.mem.priority")


def write_results(spark: Any, broker: str, rows: int, payload: int, partitions: List[int],
                  repeat: int, shared_cores: Optional[int] = None) -> Dict[str, Any]:
    """Every write pattern (see the module's docstring) for each partition count, ``repeat``
    rounds of all of them one after the other (so that each round's ratios compare figures taken
    under the same load from the machine's other jobs): the median of each figure, and each
    Spark write's median ratio with its range over the rounds.

    ``shared_cores``: when Spark and the broker share these cores (the co-located default), also
    the combined bound of each write: a Spark write to the broker does the work of both ceilings
    (Spark's floor with its source, and the broker's ingest) on the same cores, so it cannot pass
    ``1 / (1/floor + 1/ingest)`` rows/s. That model holds if each ceiling kept every core busy,
    which ``_cpu_bound_rows_per_s`` (the cores divided by the two ceilings' CPU per row added,
    ``_ceilings_total_cpu_us_per_row``) checks: the two bounds agree then. Where they do not (a
    ceiling waiting on round trips, or other jobs taking the cores), the time-based figure is a
    model, not a bound, and ``_cpu_ratio_vs_ceilings`` (the ceilings' CPU per row added, over
    the write's own) is the share of these cores' possible rate the write reaches."""
    _register_write_floors(spark)
    # Warm-up: Python workers and their imports, both sinks, both kinds of write.
    for sink in ("bmq-bench-write", "blazingmq"):
        spark_write_rate(spark, broker, 20_000, payload, max(partitions), sink)
        spark_stream_write_rate(spark, broker, 20_000, payload, max(partitions), sink)
    results: Dict[str, Any] = {}
    for count in partitions:
        rounds: Dict[str, List[float]] = {}
        for _ in range(repeat):
            ingest = post_many_processes_rate(broker, rows, payload, count)
            figures = {f"post_many_{count}p_{figure}": value for figure, value in ingest.items()}
            for kind, measure in (("spark", spark_write_rate), ("spark_stream", spark_stream_write_rate)):
                floor = measure(spark, broker, rows, payload, count, "bmq-bench-write")
                write = measure(spark, broker, rows, payload, count, "blazingmq")
                for name, rates in (("discard", floor), ("write", write)):
                    for figure, value in rates.items():
                        figures[f"{kind}_{name}_{count}p_{figure}"] = value
                figures[f"{kind}_write_{count}p_ratio_vs_ceiling"] = (
                    write["rows_per_s"] / min(floor["rows_per_s"], ingest["rows_per_s"]))
                # Spark's side of the write (all but the broker) against the same side of the
                # two ceilings (the floor's, and the posting processes'): the ratio when Spark's
                # CPUs are the limit, steadier than rows/s while other jobs take the cores.
                figures[f"{kind}_write_{count}p_spark_cpu_ratio_vs_ceilings"] = (
                    (floor["total_cpu_us_per_row"] + ingest["cpu_us_per_row"])
                    / (write["total_cpu_us_per_row"] - write["broker_cpu_us_per_row"]))
                if shared_cores:
                    both = 1 / (1 / floor["rows_per_s"] + 1 / ingest["rows_per_s"])
                    cpu = floor["total_cpu_us_per_row"] + ingest["total_cpu_us_per_row"]
                    figures[f"{kind}_write_{count}p_combined_bound_rows_per_s"] = both
                    figures[f"{kind}_write_{count}p_ratio_vs_combined_bound"] = write["rows_per_s"] / both
                    figures[f"{kind}_{count}p_ceilings_total_cpu_us_per_row"] = cpu
                    figures[f"{kind}_write_{count}p_cpu_bound_rows_per_s"] = shared_cores * 1e6 / cpu
                    figures[f"{kind}_write_{count}p_cpu_ratio_vs_ceilings"] = cpu / write["total_cpu_us_per_row"]
            for key, value in figures.items():
                rounds.setdefault(key, []).append(value)
            _purge(broker)
        for key, values in rounds.items():
            middle = statistics.median(values)
            if "_ratio_vs_" in key:
                results[key] = round(middle, 3)
                results[f"{key}_range"] = f"{min(values):.3f}-{max(values):.3f}"
            else:
                results[key] = round(middle) if key.endswith("rows_per_s") else round(middle, 2)
    return results


def _cpu_set(text: Optional[str]) -> Optional[Set[int]]:
    """``"0"``, ``"1,3"`` or ``"0-1"`` as a set of CPU numbers; None stays None."""
    if text is None:
        return None
    cpus: Set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _pin_this_process(cpus: AbstractSet[int]) -> None:
    """Confine every thread of this process to ``cpus``: Spark's JVM, the Python workers it
    forks and the benchmark's posting processes are all started from here afterwards and
    inherit the mask, so no process of the Spark side escapes it."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes per row")
    parser.add_argument("--stream-rows", type=int, default=1_000_000, help="messages for the streaming reads")
    parser.add_argument("--warmup-rows", type=int, default=400_000, help="messages of the warm-up stream")
    parser.add_argument("--partitions", default="2", help="comma-separated partition counts of the writes")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--write-only", action="store_true", help="run only the write patterns")
    only.add_argument("--stream-only", action="store_true",
                      help="run only the streaming reads, their floors and bmq's consumers")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the write patterns (medians reported)")
    add_broker_options(parser)
    parser.add_argument("--broker-cpus", help="CPUs (e.g. 1 or 2-3) for the broker this script starts, "
                                              "and nothing else; needs --spark-cpus")
    parser.add_argument("--spark-cpus", help="CPUs (e.g. 0) for everything else: this process, Spark's JVM "
                                             "and Python workers, bmq's own clients and posting processes")
    parser.add_argument("--spark-threads", type=int, default=2,
                        help="N of Spark's local[N] (default 2, the partitions of the reads and writes)")
    args = parser.parse_args()
    broker_cpus, spark_cpus = _cpu_set(args.broker_cpus), _cpu_set(args.spark_cpus)
    if (broker_cpus is None) != (spark_cpus is None):
        parser.error("--broker-cpus and --spark-cpus go together")
    if broker_cpus is not None and spark_cpus is not None and (args.broker or broker_cpus & spark_cpus):
        parser.error("--broker-cpus needs a broker this script starts, on CPUs apart from --spark-cpus")

    where, start_broker = broker_starter(args, broker_cpus)
    with contextlib.ExitStack() as stack:
        process = start_broker()
        stack.callback(process.stop)
        broker = process.address
        if spark_cpus is not None:
            _pin_this_process(spark_cpus)
        # Co-located (the default, with a broker of ours): the cores Spark and the broker share.
        shared = None if args.broker or broker_cpus is not None else len(os.sched_getaffinity(0))
        setup = {"broker": where,
                 "broker_cpus": args.broker_cpus or "shared", "spark_cpus": args.spark_cpus or "shared",
                 "spark_master": f"local[{args.spark_threads}]", "cpu_count": os.cpu_count(),
                 "python": platform.python_version()}
        partitions = [int(count) for count in args.partitions.split(",")]
        results: Dict[str, Any]
        if args.write_only:
            spark = spark_session(args.spark_threads)
            stack.callback(spark.stop)
            results = {"rows": args.rows, "payload_bytes": args.payload,
                       **write_results(spark, broker, args.rows, args.payload, partitions, args.repeat, shared),
                       **setup, **_affinity()}
            _print(results, args.json)
            return
        results = {"rows": args.rows, "stream_rows": args.stream_rows, "payload_bytes": args.payload}
        if not args.stream_only:
            results["post_many_rows_per_s"] = round(post_many_rate(broker, args.rows, args.payload))
        results["consume_rows_per_s"] = round(consume_rate(broker, args.stream_rows, args.payload))
        results["consume_batches_rows_per_s"] = round(
            consume_rate(broker, args.stream_rows, args.payload, batches=True))
        spark = spark_session(args.spark_threads)
        stack.callback(spark.stop)
        if not args.stream_only:
            results.update(write_results(spark, broker, args.rows, args.payload, partitions, args.repeat, shared))
        # Warm-up: Python workers, and the JVM's JIT (a stream runs for hours: its steady state
        # is what matters, and the JVM's per-row cost halves once the row conversion is compiled).
        spark_stream_rate(spark, broker, args.warmup_rows, args.payload, "noop")
        for sink, key in (("noop", "spark_stream"), ("parquet", "spark_stream_parquet")):
            floor_key = "spark_floor" if sink == "noop" else "spark_floor_parquet"
            floor = spark_floor_rate(spark, args.stream_rows, args.payload, sink)
            results[f"{floor_key}_rows_per_s"] = round(floor["rows_per_s"])
            results[f"{floor_key}_steady_rows_per_s"] = round(floor["steady_rows_per_s"])
            on_driver = spark_floor_rate(spark, args.stream_rows, args.payload, sink, on_driver=True)
            results[f"{floor_key}_cpu_us_per_row"] = floor["cpu_us_per_row"]
            results[f"{floor_key}_built_on_driver_rows_per_s"] = round(on_driver["rows_per_s"])
            rates = spark_stream_rate(spark, broker, args.stream_rows, args.payload, sink)
            results[f"{key}_rows_per_s"] = round(rates["rows_per_s"])
            results[f"{key}_ratio_vs_consume_batches"] = round(
                rates["rows_per_s"] / results["consume_batches_rows_per_s"], 3)
            results[f"{key}_run_rows_per_s"] = round(rates["run_rows_per_s"])
            results[f"{key}_steady_rows_per_s"] = round(rates["steady_rows_per_s"])
            results[f"{key}_batches"] = rates["batches"]
            results[f"{key}_cpu_us_per_row"] = rates["cpu_us_per_row"]
            results[f"{key}_ratio_vs_spark_floor"] = round(rates["rows_per_s"] / floor["rows_per_s"], 3)
            # A stream of one micro-batch has no steady part (None then).
            results[f"{key}_steady_ratio_vs_spark_floor"] = round(
                rates["steady_rows_per_s"] / floor["steady_rows_per_s"], 3) if floor["steady_rows_per_s"] else None
            # What Spark's side spends per row (every role but the broker), floor over bmq: the
            # ratio a run reaches when Spark's CPUs, not the broker's, are the limit (the broker
            # on its own CPUs), steadier than rows/s while other jobs take the cores.
            results[f"{key}_spark_cpu_ratio_vs_spark_floor"] = round(
                _spark_side(floor["cpu_us_per_row"]) / _spark_side(rates["cpu_us_per_row"]), 3)
        results.update({**setup, **_affinity()})
    _print(results, args.json)


def _spark_side(cpu_us_per_row: Dict[str, float]) -> float:
    """The CPU per row of every role but the broker's."""
    return sum(value for role, value in cpu_us_per_row.items() if role != "broker")


def _affinity() -> Dict[str, str]:
    """``cpus_allowed_<role>``: the ``Cpus_allowed_list`` values seen for each role's threads
    over the measured runs, and this process's (``driver``)."""
    seen = {**_CPUS_ALLOWED, "driver": cpus_allowed(os.getpid())}
    return {f"cpus_allowed_{role}": " ".join(sorted(lists)) for role, lists in sorted(seen.items())}


def _print(results: Dict[str, Any], json_path: Any) -> None:
    width = max(len(key) for key in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value}")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
