"""The ``blazingmq`` Spark data source end to end: local[2] Spark, embedded broker, real client.

One SparkSession serves the whole module (see conftest.py); each test uses its own queues.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, List, Set, Tuple

import pytest

pytestmark = pytest.mark.spark

try:
    import pyarrow as pa
    from pyspark import TaskContext
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F
except ImportError as e:  # pyspark is the optional 'spark' extra; CI must have it
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"pyspark>=4 and pyarrow are needed: pip install 'bmq[spark]' ({e})", allow_module_level=True)

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pyspark < 4.2
    SupportsTriggerAvailableNow = None

import bmq  # noqa: E402
from bmq.broker import Broker  # noqa: E402
from bmq.spark import BlazingMQDataSource  # noqa: E402
from bmq.spark._writer import BlazingMQWriter  # noqa: E402
from spark_support import drain  # noqa: E402
from support import until  # noqa: E402


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with Broker() as running:
        yield running


def new_queue(name: str) -> str:
    return f"bmq://bmq.test.mem.priority/spark-{name}-{uuid.uuid4().hex[:8]}"


def post(broker: Broker, uri: str, payloads: List[bytes]) -> None:
    with bmq.Session(broker=broker.address) as session:
        session.open_queue(uri, write=True).post_many(payloads)


def write(df: DataFrame, broker: Broker, uri: str, **options: str) -> None:
    writer = df.write.format("blazingmq").option("broker", broker.address).option("queue", uri)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.mode("append").save()


# ---- batch write ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_write_100k_rows_from_4_partitions_with_properties(spark: SparkSession, broker: Broker) -> None:
    uri = new_queue("write")
    df = spark.range(100_000, numPartitions=4).select(
        F.format_string("row-%d", "id").alias("data"),
        F.create_map(F.lit("n"), F.col("id")).alias("properties"),
        (F.col("id") % 7).cast("int").alias("mod"),
        (F.col("id") % 2 == 0).alias("even"),
    )
    write(df, broker, uri, propertyColumns="mod,even")
    received = drain(broker.address, uri, 100_000)
    assert len(received) == 100_000
    by_payload = {message.data: message for message in received}
    assert len(by_payload) == 100_000
    for index in (0, 1, 49_999, 99_999):
        message = by_payload[f"row-{index}".encode()]
        assert message.properties == {"n": index, "mod": index % 7, "even": index % 2 == 0}
        assert message.property_types == {
            "n": bmq.PropertyType.INT64,
            "mod": bmq.PropertyType.INT32,
            "even": bmq.PropertyType.BOOL,
        }
    assert all(m.properties["n"] == int(m.data[4:]) for m in received)


class _FailOnceWriter(BlazingMQWriter):
    """Posts half of partition 0, waits for the ACKs, then fails its first attempt."""

    def write(self, iterator: Iterator[Any]):  # type: ignore[override]
        context = TaskContext.get()
        if context.partitionId() != 0 or context.attemptNumber() > 0:
            return super().write(iterator)
        table = pa.Table.from_batches(list(iterator))
        committed = super().write(iter(table.slice(0, table.num_rows // 2).to_batches()))
        assert committed.messages == table.num_rows // 2
        raise RuntimeError("injected failure after posting half the partition")


class _FailOnceSource(BlazingMQDataSource):
    @classmethod
    def name(cls) -> str:
        return "blazingmq_fail_once"

    def writer(self, schema, overwrite):  # type: ignore[no-untyped-def]
        from bmq.spark._options import WriteOptions

        return _FailOnceWriter(WriteOptions.parse(self.options), schema, overwrite)


def test_retried_task_duplicates_are_removed_by_the_broker(spark: SparkSession, broker: Broker) -> None:
    # Spark's workers cannot import this test module: ship its classes by value.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(_FailOnceSource)
    uri = new_queue("retry")
    df = spark.range(4_000, numPartitions=4).select(F.format_string("r%d", "id").alias("data"))
    (
        df.write.format("blazingmq_fail_once")
        .option("broker", broker.address)
        .option("queue", uri)
        .mode("append")
        .save()
    )
    stored = broker.queue_messages(uri)
    payloads = [message.payload for message in stored]
    assert len(payloads) == 4_000
    assert set(payloads) == {f"r{i}".encode() for i in range(4_000)}


def test_repeated_guid_column_keys_are_one_message(spark: SparkSession, broker: Broker) -> None:
    uri = new_queue("dupkeys")
    rows = [("a", "k1"), ("b", "k1"), ("c", "k2"), ("d", "k2"), ("e", "k3")]
    df = spark.createDataFrame(rows, "data string, key string").coalesce(1)
    write(df, broker, uri, guidColumn="key")
    assert sorted(message.payload for message in broker.queue_messages(uri)) == [b"a", b"c", b"e"]


# ---- errors before any data is sent -----------------------------------------------------------


def test_wrong_column_type_fails_before_sending(spark: SparkSession, broker: Broker) -> None:
    uri = new_queue("types")
    with pytest.raises(Exception, match="'data' must be binary or string"):
        write(spark.range(10).select(F.col("id").alias("data")), broker, uri)
    with pytest.raises(Exception, match="a property must be"):
        scored = spark.range(10).select(F.lit("x").alias("data"), F.rand().alias("score"))
        write(scored, broker, uri, propertyColumns="score")
    assert broker.queue_messages(uri) == []


@pytest.fixture()
def unreachable() -> Iterator[str]:
    """The address of a port bound but not listening: connecting to it is refused at once."""
    import socket

    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        yield f"tcp://127.0.0.1:{placeholder.getsockname()[1]}"


def assert_failed_on_the_driver(error: BaseException, address: str) -> None:
    """The documented message, raised while Spark planned on the driver, not from a task."""
    text = str(error)
    assert f"blazingmq: cannot reach the broker at {address}" in text
    assert "PythonException" not in type(error).__name__
    assert "Python worker" not in text


def test_unreachable_broker_is_named(spark: SparkSession, unreachable: str) -> None:
    df = spark.range(3).select(F.lit("x").alias("data"))
    with pytest.raises(Exception) as failed:
        (
            df.write.format("blazingmq")
            .option("broker", unreachable)
            .option("queue", new_queue("nobroker"))
            .option("connectTimeout", "2")
            .mode("append")
            .save()
        )
    assert_failed_on_the_driver(failed.value, unreachable)


def test_batch_read_of_an_unreachable_broker_fails_on_the_driver(spark: SparkSession, unreachable: str) -> None:
    reader = (
        spark.read.format("blazingmq")
        .option("broker", unreachable)
        .option("queue", new_queue("nobroker"))
        .option("idleTimeout", "1")
    )
    with pytest.raises(Exception) as failed:
        reader.load().collect()
    assert_failed_on_the_driver(failed.value, unreachable)


def test_stream_of_an_unreachable_broker_fails_when_the_query_starts(
    spark: SparkSession, unreachable: str, tmp_path: Path
) -> None:
    stream = spark.readStream.format("blazingmq").option("broker", unreachable).option("queue", new_queue("nobroker"))
    query = stream.load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c")).start()
    try:
        with pytest.raises(Exception) as failed:
            query.awaitTermination(timeout=60)
    finally:
        query.stop()
    assert "initialize source" in str(failed.value)  # the source's set-up, before any micro-batch
    assert query.lastProgress is None
    assert_failed_on_the_driver(failed.value, unreachable)


# ---- batch read -----------------------------------------------------------------------------------


def test_batch_read_drains_up_to_max_messages_then_the_rest(spark: SparkSession, broker: Broker) -> None:
    uri = new_queue("read")
    with bmq.Session(broker=broker.address) as session:
        queue = session.open_queue(uri, write=True)
        queue.post_many([f"m{i}".encode() for i in range(50)], properties=[{"i": i, "tag": "t"} for i in range(50)])

    def read(**options: str) -> List[Any]:
        reader = spark.read.format("blazingmq").option("broker", broker.address).option("queue", uri)
        for name, value in {"idleTimeout": "1", "propertySchema": "i INT, tag STRING", **options}.items():
            reader = reader.option(name, value)
        return reader.load().collect()

    first = read(maxMessages="30")
    assert len(first) == 30
    row = first[0]
    assert row.data == b"m0" and row.i == 0 and row.tag == "t" and row.properties == {"i": "0", "tag": "t"}
    assert row.queue == uri and len(row.guid) == 32
    peeked = read(maxMessages="100", confirm="false")
    assert sorted(r.data for r in peeked) == sorted(f"m{i}".encode() for i in range(30, 50))
    rest = read(maxMessages="100", numPartitions="2")
    assert sorted(r.data for r in rest) == sorted(f"m{i}".encode() for i in range(30, 50))
    assert broker.queue_messages(uri) == []


def test_batch_read_with_a_subscription_takes_only_matching_messages(spark: SparkSession, broker: Broker) -> None:
    uri = new_queue("read-subscription")
    with bmq.Session(broker=broker.address) as session:
        session.open_queue(uri, write=True).post_many(
            [f"m{i}".encode() for i in range(20)], properties=[{"i": i} for i in range(20)])
    rows = (spark.read.format("blazingmq").option("broker", broker.address).option("queue", uri)
            .option("idleTimeout", "1").option("subscription", "i % 5 == 0").load().collect())
    assert sorted(r.data for r in rows) == [b"m0", b"m10", b"m15", b"m5"]
    assert len(broker.queue_messages(uri)) == 16  # the others stay


# ---- streaming ------------------------------------------------------------------------------------


def _start_copy(spark: SparkSession, broker: Broker, source: str, target: str, checkpoint: Path, fail_on: bytes = b""):
    stream = (
        spark.readStream.format("blazingmq")
        .option("broker", broker.address)
        .option("queue", source)
        .option("maxMessagesPerBatch", 2_000)
        .option("pollTimeout", "0.2")
        .load()
    )
    if fail_on:
        # Deterministic failure in the middle of the stream: the sink task fails (and its retry too).
        stream = stream.withColumn(
            "data",
            F.when(F.col("data") == F.lit(fail_on), F.raise_error(F.lit("injected stream failure")).cast("binary"))
            .otherwise(F.col("data")),
        )
    return (
        stream.select("data", "guid")
        .writeStream.format("blazingmq")
        .option("broker", broker.address)
        .option("queue", target)
        .option("guidColumn", "guid")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )


@pytest.mark.slow
def test_stream_moves_20k_messages_and_loses_none_across_a_failure(
    spark: SparkSession, broker: Broker, tmp_path: Path
) -> None:
    source, target = new_queue("stream-a"), new_queue("stream-b")
    expected: Set[bytes] = {f"s{i:05d}".encode() for i in range(20_000)}
    post(broker, source, sorted(expected))
    checkpoint = tmp_path / "checkpoint"

    failing = _start_copy(spark, broker, source, target, checkpoint, fail_on=b"s12345")
    with pytest.raises(Exception, match="injected stream failure"):
        failing.awaitTermination(timeout=120)
    before_restart = len(broker.queue_messages(target))
    assert 0 < before_restart < 20_000  # the failure happened mid-stream

    restarted = _start_copy(spark, broker, source, target, checkpoint)
    try:
        assert broker.wait_for(lambda: len(broker.queue_messages(target)) >= 20_000, timeout=120)
    finally:
        restarted.stop()
    received = drain(broker.address, target, 20_000)
    payloads = [message.data for message in received]
    # None lost; the copy's GUIDs come from the source GUIDs, so the broker also removed the
    # duplicates the replay produced.
    assert set(payloads) == expected
    assert len(payloads) == 20_000
    # Batches committed before the stop were confirmed on the source; the rest is still there
    # for the next run (at-least-once), never more than the last uncommitted batches.
    assert len(broker.queue_messages(source)) <= 2 * 2_000



def run_available_now(spark: SparkSession, address: str, uri: str, timeout: float,
                      during: Callable[[], ContextManager[None]] = contextlib.nullcontext,
                      **options: str) -> Tuple[Any, List[bytes]]:
    """Run a Trigger.AvailableNow query of ``uri`` into a memory table until it ends by itself
    (inside ``during()``, entered once the query started); the finished query and the ``data``
    of every row it wrote. Skips on pyspark < 4.2, which runs AvailableNow as one unconfirmed
    batch without telling the source (docs/spark.md)."""
    if SupportsTriggerAvailableNow is None:
        pytest.skip("Trigger.AvailableNow needs pyspark>=4.2")
    name = f"available_now_{uuid.uuid4().hex[:8]}"
    reader = spark.readStream.format("blazingmq").option("broker", address).option("queue", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = reader.load().writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    try:
        with during():
            assert query.awaitTermination(timeout=timeout)
    finally:
        query.stop()
    assert query.exception() is None
    return query, [row.data for row in spark.sql(f"select data from {name}").collect()]


def test_available_now_stream_confirms_every_batch_and_stops(spark: SparkSession, broker: Broker) -> None:
    uri = new_queue("available-now")
    post(broker, uri, [f"a{i}".encode() for i in range(25)])
    query, rows = run_available_now(spark, broker.address, uri, 60, maxMessagesPerBatch="10", pollTimeout="0.2")
    assert sorted(rows) == sorted(f"a{i}".encode() for i in range(25))
    assert [progress["numInputRows"] for progress in query.recentProgress if progress["numInputRows"]] == [10, 10, 5]
    # The last batch too was confirmed (the CONFIRMs may still be on their way to the broker).
    assert broker.wait_for(lambda: broker.queue_messages(uri) == [], timeout=30)


@pytest.mark.parametrize("kind", ["embedded", "bmqbrkr"])
def test_stream_with_a_subscription_moves_only_matching_messages(spark: SparkSession, request: pytest.FixtureRequest,
                                                                 kind: str) -> None:
    target = request.getfixturevalue("broker" if kind == "embedded" else "bmqbrkr")
    uri = new_queue("stream-subscription")
    with bmq.Session(broker=target.address) as session:
        session.open_queue(uri, write=True).post_many(
            [f"s{i}".encode() for i in range(30)], properties=[{"tag": "keep" if i % 3 else "skip"} for i in range(30)])
    _, rows = run_available_now(spark, target.address, uri, 60, subscription='tag == "keep"', pollTimeout="0.5")
    assert sorted(rows) == sorted(f"s{i}".encode() for i in range(30) if i % 3)


@pytest.mark.parametrize("kind", ["embedded", "bmqbrkr"])
def test_available_now_drains_a_queue_ten_batches_deep(spark: SparkSession, request: pytest.FixtureRequest,
                                                        kind: str) -> None:
    target = request.getfixturevalue("broker" if kind == "embedded" else "bmqbrkr")
    uri = new_queue("available-now-deep")
    payloads = [f"d{i}".encode() for i in range(10_000)]
    post(target, uri, payloads)
    _, rows = run_available_now(spark, target.address, uri, 240, maxMessagesPerBatch="1000")
    assert sorted(rows) == sorted(payloads)  # all of them, each once
    # ... and every one confirmed: nothing is left for the next consumer.
    assert drain(target.address, uri, 0) == []


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """``processes`` busy loops competing for the CPU (the machine a job shares with others)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


@contextlib.contextmanager
def cpu_load_once_consumed(address: str, uri: str, processes: int) -> Iterator[None]:
    """:func:`cpu_load` from the moment the broker has a consumer of ``uri`` (the load then
    slows the broker's deliveries, not Spark's start of the query's Python worker, which
    Spark gives 10 s to connect back)."""
    with bmq.Admin(address) as admin:
        assert until(lambda: admin.queue_stats(uri).consumers > 0, timeout=120)
    with cpu_load(processes):
        yield


def test_available_now_reads_a_whole_backlog_on_a_loaded_machine(spark: SparkSession, bmqbrkr: Any) -> None:
    # Two busy loops on top of Spark and bmqbrkr, and a pollTimeout far below the broker's
    # delays under such load (to start delivering, to send the next window after confirms):
    # silence while the broker holds messages must not end the run.
    uri = new_queue("available-now-loaded")
    payloads = [f"l{i}".encode() for i in range(50_000)]
    post(bmqbrkr, uri, payloads)
    _, rows = run_available_now(spark, bmqbrkr.address, uri, 240,
                                during=lambda: cpu_load_once_consumed(bmqbrkr.address, uri, 2),
                                maxMessagesPerBatch="10000", pollTimeout="0.05")
    assert sorted(rows) == sorted(payloads)
    assert drain(bmqbrkr.address, uri, 0) == []


# ---- threads ---------------------------------------------------------------------------------------


def test_three_dataframes_written_at_once_from_a_thread_pool(spark: SparkSession, bmqbrkr: Any) -> None:
    # Spark finds the format through the JVM thread's active session: each pool thread sets it.
    from concurrent.futures import ThreadPoolExecutor

    from bmq.spark import activate

    uris = [new_queue(f"thread{index}") for index in range(3)]

    def write_one(index: int) -> None:
        frame = spark.range(2_000, numPartitions=2).select(F.format_string(f"t{index}-%d", "id").alias("data"))
        write(frame, bmqbrkr, uris[index])

    with ThreadPoolExecutor(3, initializer=activate, initargs=(spark,)) as pool:
        list(pool.map(write_one, range(3)))
    for index, uri in enumerate(uris):
        payloads = [message.data for message in drain(bmqbrkr.address, uri, 2_000)]
        assert sorted(payloads) == sorted(f"t{index}-{i}".encode() for i in range(2_000))


# ---- the example -------------------------------------------------------------------------------


@pytest.mark.slow
def test_spark_pipeline_example_moves_every_order(spark: SparkSession, broker: Broker) -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"
    spec = importlib.util.spec_from_file_location("example_spark_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(broker.address) == module.ROWS
    assert not spark.sparkContext._jsc.sc().isStopped()  # the caller's session is left running
