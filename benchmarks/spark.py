"""Rows/s of Spark writing to and stream-reading from BlazingMQ, beside bmq's own rates.

All are measured in the same run against the same broker: ``--broker``, ``--bmqbrkr`` (the real
broker from ../shared/bmqbrkr), or else the embedded broker started as its own process so that
it does not share the benchmark's interpreter lock with the clients:

* ``post_many``: one process, one session, ``Queue.post_many`` in chunks, every ACK awaited;
* ``spark``: ``df.write.format("blazingmq")`` of the same rows from ``local[2]`` (2 executor
  threads, 2 partitions, each a Python worker with its own session), after a warm-up write
  that starts the Python workers;
* ``consume``: bmq's own consumer draining a pre-filled queue (``messages()`` + ``confirm_many``);
* ``consume_batches``: the same with ``get_batch()`` + ``MessageBatch.confirm()`` (what the
  streaming source itself uses), the fastest way bmq consumes;
* ``spark_stream``: ``spark.readStream.format("blazingmq")`` (default options: micro-batches of
  up to 200,000 messages, 2 partitions each) draining a backlog of the same number of messages
  with ``Trigger.AvailableNow`` into the ``noop`` sink, which measures the source alone, timed
  from ``start()`` to the end of the micro-batch holding the last row, after a warm-up stream
  (``--warmup-rows``, 400,000 by default: long enough for the JVM's JIT to compile the row path);
  its ratio to ``consume`` is the figure to watch. ``_steady_rows_per_s`` leaves out the first
  micro-batch, which also pays the query's start (~1.5-2.5 s here: Spark launching the source's
  Python process, compiling the query's code), i.e. what a longer stream sustains.
  ``_run_rows_per_s`` is timed to the query's
  end instead, which adds the ``pollTimeout`` (2 s here) the run waits to see the queue empty;
* ``spark_floor``: Spark's own limit for that stream on this machine: a Python streaming source
  handing over the same rows (bmq's schema, bmq's Arrow builder, 2 partitions) with no broker
  and no session, drained the same way. ``spark_stream_ratio_vs_spark_floor`` is the share of
  it bmq's source reaches; the rest is BlazingMQ's part (the session, the broker on the same
  cores);
* ``spark_stream_parquet``: the same into the ``parquet`` file sink (a realistic pipeline: every
  row is written to disk before its messages are confirmed).

Usage: ``python benchmarks/spark.py [--rows N] [--stream-rows N] [--payload BYTES] [--bmqbrkr
[--bmqbrkr-home DIR]] [--json FILE]``
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict

import bmq
from bmq.broker import broker_address
from _report import RealBrokerProcess, default_bmqbrkr_home, drain_in_batches, fill_queue

# Child processes import the same (installed) bmq as this script.
ROOT = Path(bmq.__file__).resolve().parents[1]


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


def consume_rate(broker: str, rows: int, payload: int) -> float:
    uri = _queue("consume")
    fill_queue(broker, uri, rows, b"x" * payload)
    with bmq.Session(broker=broker) as session:
        start = time.perf_counter()
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=40_000))
        drain_in_batches(session, queue, rows, 5_000)
        return rows / (time.perf_counter() - start)


def consume_batches_rate(broker: str, rows: int, payload: int) -> float:
    uri = _queue("consume-batches")
    fill_queue(broker, uri, rows, b"x" * payload)
    with bmq.Session(broker=broker) as session:
        start = time.perf_counter()
        queue = session.open_queue(uri, read=True, batches=True,
                                   options=bmq.QueueOptions(max_unconfirmed_messages=40_000))
        received = 0
        while received < rows:
            batch = queue.get_batch(5_000, timeout=30.0)
            if batch is None:
                raise RuntimeError(f"consumer stalled at {received}/{rows}")
            batch.confirm()
            received += len(batch)
        return rows / (time.perf_counter() - start)


def spark_session() -> Any:
    """A ``local[2]`` SparkSession whose Python workers import this script's bmq."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    from bmq.spark import BlazingMQDataSource

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BlazingMQDataSource)
    return spark


def spark_rate(spark: Any, broker: str, rows: int, payload: int) -> float:
    from pyspark.sql import functions as F

    def write(count: int) -> float:
        df = spark.range(count, numPartitions=2).select(F.expr(f"repeat('x', {payload})").alias("data"))
        start = time.perf_counter()
        df.write.format("blazingmq").option("broker", broker).option("queue", _queue("spark")).mode("append").save()
        return time.perf_counter() - start

    write(10_000)  # warm-up: starts the Python workers and their imports
    return rows / write(rows)


def _progress_end(progress: Dict[str, Any]) -> float:
    """Wall-clock time (epoch seconds) at which a micro-batch's trigger ended."""
    started = datetime.datetime.strptime(progress["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    started = started.replace(tzinfo=datetime.timezone.utc).timestamp()
    return started + progress["durationMs"]["triggerExecution"] / 1000


def spark_stream_rate(spark: Any, broker: str, rows: int, payload: int, sink: str) -> Dict[str, float]:
    """Drain a queue of ``rows`` messages with ``Trigger.AvailableNow`` into ``sink``.

    Returns ``rows_per_s`` (from ``start()`` to the end of the micro-batch holding the last
    row), ``run_rows_per_s`` (to the query's end, which also includes the ``pollTimeout`` it
    waits to see that the queue is empty), ``steady_rows_per_s`` (the micro-batches after the
    first: without the query's start) and ``batches``.
    """
    uri = _queue("stream")
    fill_queue(broker, uri, rows, b"x" * payload)
    with tempfile.TemporaryDirectory(prefix="bmq-spark-bench-") as scratch:
        writer = (spark.readStream.format("blazingmq").option("broker", broker).option("queue", uri)
                  .option("pollTimeout", "2").load()
                  .writeStream.format(sink).trigger(availableNow=True)
                  .option("checkpointLocation", os.path.join(scratch, "checkpoint")))
        if sink != "noop":
            writer = writer.option("path", os.path.join(scratch, "out"))
        rates = _drain(writer, rows)
        if sink != "noop" and spark.read.parquet(os.path.join(scratch, "out")).count() != rows:
            raise RuntimeError(f"the {sink} sink did not get {rows} rows")
    return rates


def _drain(writer: Any, rows: int) -> Dict[str, float]:
    """Start ``writer``'s query, wait for its end, check that it read ``rows`` rows, and
    return the rates :func:`spark_stream_rate` describes."""
    started = time.time()
    query = writer.start()
    if not query.awaitTermination(timeout=1800):
        query.stop()
        raise RuntimeError("the streaming read did not finish within 30 minutes")
    ended = time.time()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming read failed: {query.exception()}")
    batches = [progress for progress in query.recentProgress if progress["numInputRows"]]
    read = sum(progress["numInputRows"] for progress in batches)
    if read != rows:
        raise RuntimeError(f"the streaming read took {read} rows, not {rows}")
    # After the first micro-batch, which also pays the query's start (Spark launching the
    # source's Python process, generating and compiling the query's code), what a stream
    # sustains: the rate a backlog far larger than this one would approach.
    steady = sum(progress["numInputRows"] for progress in batches[1:])
    steady_s = _progress_end(batches[-1]) - _progress_end(batches[0])
    return {"rows_per_s": rows / (_progress_end(batches[-1]) - started), "run_rows_per_s": rows / (ended - started),
            "steady_rows_per_s": steady / steady_s if steady else 0.0, "batches": len(batches)}


def spark_floor_rate(spark: Any, rows: int, payload: int, batch_rows: int = 200_000) -> Dict[str, float]:
    """Spark's own limit for this stream: a Python streaming source that hands over the same
    rows (bmq's read schema, built by bmq's Arrow builder, cut into 2 partitions as bmq's
    source does) without any broker or session, drained like :func:`spark_stream_rate`.
    What is left between the two is BlazingMQ's part: the session, and the broker sharing
    the machine's cores."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class Slice(InputPartition):  # type: ignore[misc]
        def __init__(self, index: int, stream: bytes) -> None:
            super().__init__(index)
            self.stream = stream

    class FloorReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
        def __init__(self, schema: Any) -> None:
            from bmq.spark._schema import message_batch_factory

            self.make = message_batch_factory(schema)

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def initialOffset(self) -> Dict[str, int]:
            return {"rows": 0}

        def latestOffset(self, start: Any = None, limit: Any = None) -> Dict[str, int]:
            done = start["rows"] if start else 0
            return {"rows": min(rows, done + batch_rows)}

        def partitions(self, start: Dict[str, int], end: Dict[str, int]) -> list:
            import array
            import types

            from bmq.spark._stream import _slices

            count = end["rows"] - start["rows"]
            if not count:
                return []
            messages = bmq.MessageBatch(types.SimpleNamespace(uri=_queue("floor")), bmq._codec.GuidGenerator(1).generate(count),
                                        b"x" * payload * count,
                                        array.array("i", range(0, payload * count + 1, payload)).tobytes(), None)
            records = self.make(messages, datetime.datetime.now(datetime.timezone.utc))
            return [Slice(index, stream) for index, stream in enumerate(_slices(records, 2))]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa

            with pa.ipc.open_stream(partition.stream) as reader:
                yield from reader

        def commit(self, end: Any) -> None:
            pass

    class Floor(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "bmq-bench-floor"

        def schema(self) -> str:
            from bmq.spark._schema import read_schema

            return read_schema("")

        def streamReader(self, schema: Any) -> Any:
            return FloorReader(schema)

    spark.dataSource.register(Floor)
    with tempfile.TemporaryDirectory(prefix="bmq-spark-floor-") as scratch:
        return _drain(spark.readStream.format("bmq-bench-floor").load().writeStream.format("noop")
                      .trigger(availableNow=True).option("checkpointLocation", os.path.join(scratch, "checkpoint")),
                      rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes per row")
    parser.add_argument("--stream-rows", type=int, default=1_000_000, help="messages for the streaming reads")
    parser.add_argument("--warmup-rows", type=int, default=400_000, help="messages of the warm-up stream")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--broker", help="tcp://host:port (default: an embedded broker)")
    where.add_argument("--bmqbrkr", action="store_true", help="start the real bmqbrkr from ../shared/bmqbrkr")
    parser.add_argument("--bmqbrkr-home", type=Path, default=None,
                        help="directory of the bmqbrkr 'run' script (default: ../shared/bmqbrkr)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        if args.bmqbrkr:
            real = RealBrokerProcess(args.bmqbrkr_home or default_bmqbrkr_home())
            stack.callback(real.stop)
            broker, where = real.address, "bmqbrkr"
        else:
            broker = stack.enter_context(broker_address(args.broker, separate_process=True))
            where = args.broker or "embedded (own process)"
        results: Dict[str, Any] = {
            "rows": args.rows,
            "stream_rows": args.stream_rows,
            "payload_bytes": args.payload,
            "post_many_rows_per_s": round(post_many_rate(broker, args.rows, args.payload)),
            "consume_rows_per_s": round(consume_rate(broker, args.stream_rows, args.payload)),
            "consume_batches_rows_per_s": round(consume_batches_rate(broker, args.stream_rows, args.payload)),
        }
        spark = spark_session()
        stack.callback(spark.stop)
        results["spark_rows_per_s"] = round(spark_rate(spark, broker, args.rows, args.payload))
        # Warm-up: Python workers, and the JVM's JIT (a stream runs for hours: its steady state
        # is what matters, and the JVM's per-row cost halves once the row conversion is compiled).
        spark_stream_rate(spark, broker, args.warmup_rows, args.payload, "noop")
        floor = spark_floor_rate(spark, args.stream_rows, args.payload)
        results["spark_floor_rows_per_s"] = round(floor["rows_per_s"])
        results["spark_floor_steady_rows_per_s"] = round(floor["steady_rows_per_s"])
        results["spark_floor_ratio_vs_consume"] = round(floor["rows_per_s"] / results["consume_rows_per_s"], 3)
        for sink, key in (("noop", "spark_stream"), ("parquet", "spark_stream_parquet")):
            rates = spark_stream_rate(spark, broker, args.stream_rows, args.payload, sink)
            results[f"{key}_rows_per_s"] = round(rates["rows_per_s"])
            results[f"{key}_ratio_vs_consume"] = round(rates["rows_per_s"] / results["consume_rows_per_s"], 3)
            results[f"{key}_ratio_vs_consume_batches"] = round(
                rates["rows_per_s"] / results["consume_batches_rows_per_s"], 3)
            results[f"{key}_run_rows_per_s"] = round(rates["run_rows_per_s"])
            results[f"{key}_steady_rows_per_s"] = round(rates["steady_rows_per_s"])
            results[f"{key}_steady_ratio_vs_consume"] = round(
                rates["steady_rows_per_s"] / results["consume_rows_per_s"], 3)
            results[f"{key}_batches"] = rates["batches"]
            if sink == "noop":
                results[f"{key}_ratio_vs_spark_floor"] = round(rates["rows_per_s"] / floor["rows_per_s"], 3)
                # A stream of one micro-batch has no steady part (None then).
                results[f"{key}_steady_ratio_vs_spark_floor"] = round(
                    rates["steady_rows_per_s"] / floor["steady_rows_per_s"], 3) if floor["steady_rows_per_s"] else None
        results.update({"spark_executors": 2, "broker": where, "cpu_count": os.cpu_count(),
                        "python": platform.python_version()})
    width = max(len(key) for key in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
