"""A Spark driver program for the tests that need Spark in processes of its own: executors in
their own JVMs (``local-cluster``), an executor or the driver killed.

The ``connect`` scenario goes through Spark Connect (``remote("local[2]")`` starts a Connect
server in the process, which a regular SparkSession must not share).

The tests run it as a subprocess (``python spark_driver.py SCENARIO --broker ... --work DIR``)
and read what it did from ``DIR/result.json``. One run of the ``cluster`` scenario does
several things in one ``local-cluster[2,1,1024]`` application (starting one costs ~30 s on a
loaded 2-core machine): a batch write, a Trigger.AvailableNow read into parquet, and a write
during which the executor running one task is SIGKILLed. The ``stream`` scenario is a
streaming copy of a queue into parquet that the test kills (SIGKILL of the driver's process
group) and runs again from its checkpoint.

The executors' Python workers import bmq from this checkout: ``PYSPARK_PYTHON`` is this
interpreter and ``PYTHONPATH`` (the executors' too) starts with the checkout. The session is
set up as the tests' own (``spark_support.py``, beside this script).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from spark_support import prepare_environment, spark_session


def _environment() -> None:
    prepare_environment()
    import pyspark

    # local-cluster starts executors with SPARK_HOME/bin/spark-class: pyspark's package has it.
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))


def _session(master: str) -> Any:
    return spark_session(master, "bmq-tests-driver", {
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.executor.memory": "768m",
        "spark.task.maxFailures": "4",
    })


def _executor_jvm() -> int:
    """The pid of the executor JVM this Python worker runs under (worker -> daemon -> JVM)."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("not under a Spark executor JVM")


def _record(path: str, **fields: Any) -> None:
    """Append one JSON line (an ``O_APPEND`` write of one line: whole lines from many processes)."""
    with open(path, "a") as f:
        f.write(json.dumps(fields) + "\n")


def _stalling_source() -> Any:
    """A ``blazingmq`` source whose writer records each attempt's acknowledged PUTs in the file
    of option ``ackLog``, and whose first attempt of partition 0 stalls after posting half its
    rows (acknowledged) so that its executor can be killed mid-write."""
    import pyarrow as pa
    from pyspark import TaskContext

    from bmq.spark import BlazingMQDataSource
    from bmq.spark._options import WriteOptions
    from bmq.spark._writer import BlazingMQWriter

    class StallingWriter(BlazingMQWriter):
        def __init__(self, options: WriteOptions, schema: Any, overwrite: bool, ack_log: str):
            super().__init__(options, schema, overwrite)
            self.ack_log = ack_log

        def write(self, iterator: Iterator[Any]):  # type: ignore[no-untyped-def]
            context = TaskContext.get()
            partition, attempt = context.partitionId(), context.attemptNumber()
            if partition != 0 or attempt > 0:
                committed = super().write(iterator)
                _record(self.ack_log, partition=partition, attempt=attempt, acked=committed.messages)
                return committed
            table = pa.Table.from_batches(list(iterator))
            half = super().write(iter(table.slice(0, table.num_rows // 2).to_batches()))
            _record(self.ack_log, partition=partition, attempt=attempt, acked=half.messages,
                    stalled=_executor_jvm())
            threading.Event().wait(600)  # until the test's SIGKILL of this executor
            raise RuntimeError("the executor was not killed")

    class StallingSource(BlazingMQDataSource):
        @classmethod
        def name(cls) -> str:
            return "blazingmq_stalling"

        def writer(self, schema, overwrite):  # type: ignore[no-untyped-def]
            return StallingWriter(WriteOptions.parse(self.options), schema, overwrite, self.options["ackLog"])

    return StallingSource


def _kill_stalled_executor(ack_log: Path, killed: Dict[str, int]) -> None:
    """SIGKILL the executor JVM whose task stalled mid-write, once it has said so."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if ack_log.exists():
            for line in ack_log.read_text().splitlines():
                stalled = json.loads(line).get("stalled")
                if stalled:
                    os.kill(stalled, signal.SIGKILL)
                    killed["pid"] = stalled
                    return
        time.sleep(0.1)  # polling a file another process writes: nothing to wait on


def cluster(args: argparse.Namespace) -> Dict[str, Any]:
    from pyspark.sql import functions as F

    spark = _session(args.master)
    result: Dict[str, Any] = {"master": spark.sparkContext.master, "timings": {}}
    rows = args.rows

    def frame(prefix: str) -> Any:
        return spark.range(rows, numPartitions=4).select(F.format_string(f"{prefix}%d", "id").alias("data"))

    started = time.monotonic()
    frame("w").write.format("blazingmq").option("broker", args.broker).option("queue", args.queue + "-write") \
        .mode("append").save()
    result["timings"]["write"] = time.monotonic() - started
    import bmq

    with bmq.Admin(args.broker) as admin:
        result["written"] = admin.queue_stats(args.queue + "-write").messages

    started = time.monotonic()
    out = str(Path(args.work) / "available-now")
    query = (spark.readStream.format("blazingmq").option("broker", args.broker).option("queue", args.queue + "-write")
             .load()
             .select("data").writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", out + "-checkpoint").trigger(availableNow=True).start())
    query.awaitTermination(300)
    query.stop()
    result["available_now"] = sorted(row.data.decode() for row in spark.read.parquet(out).collect())
    result["timings"]["available_now"] = time.monotonic() - started

    started = time.monotonic()
    spark.dataSource.register(_stalling_source())
    ack_log = Path(args.work) / "acks.jsonl"
    killed: Dict[str, int] = {}
    killer = threading.Thread(target=_kill_stalled_executor, args=(ack_log, killed), daemon=True)
    killer.start()
    frame("k").write.format("blazingmq_stalling").option("broker", args.broker) \
        .option("queue", args.queue + "-kill").option("ackLog", str(ack_log)).mode("append").save()
    killer.join()
    result["killed_executor"] = killed.get("pid")
    result["acks"] = [json.loads(line) for line in ack_log.read_text().splitlines()]
    result["timings"]["kill"] = time.monotonic() - started
    spark.stop()
    return result


def stream(args: argparse.Namespace) -> Dict[str, Any]:
    """Copy the queue into parquet with a checkpoint: until killed, or (``--available-now``)
    until caught up, then report every row the parquet sink committed."""
    spark = _session(args.master)
    out = str(Path(args.work) / "stream")
    writer = (spark.readStream.format("blazingmq").option("broker", args.broker).option("queue", args.queue)
              .option("maxMessagesPerBatch", str(args.batch)).option("pollTimeout", "0.2").load()
              .select("data").writeStream.format("parquet").option("path", out)
              .option("checkpointLocation", out + "-checkpoint"))
    if args.available_now:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination(300)
        query.stop()
        rows: Optional[List[str]] = [row.data.decode() for row in spark.read.parquet(out).collect()]
    else:
        query = writer.trigger(processingTime="0 seconds").start()
        query.awaitTermination()  # the test kills this process while the query runs
        rows = None
    spark.stop()
    return {"rows": rows}


def connect(args: argparse.Namespace) -> Dict[str, Any]:
    """Through Spark Connect (``remote("local[2]")``: a Connect server in this process, which
    no regular SparkSession may share): a write, a batch read of another queue, an
    AvailableNow read of the written one; the rows each read gave."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from bmq.spark import BlazingMQDataSource, activate

    spark = SparkSession.builder.remote(args.master).getOrCreate()
    result: Dict[str, Any] = {"session": type(spark).__module__}
    spark.dataSource.register(BlazingMQDataSource)  # the class goes to the server by value
    activate(spark)  # does nothing for a Connect session
    frame = spark.range(args.rows, numPartitions=2).select(F.format_string("c%d", "id").alias("data"))
    frame.write.format("blazingmq").option("broker", args.broker).option("queue", args.queue + "-write") \
        .mode("append").save()
    rows = (spark.read.format("blazingmq").option("broker", args.broker).option("queue", args.queue + "-read")
            .option("idleTimeout", "1").load().collect())
    result["batch_read"] = sorted(row.data.decode() for row in rows)
    query = (spark.readStream.format("blazingmq").option("broker", args.broker).option("queue", args.queue + "-write")
             .option("maxMessagesPerBatch", str(args.batch)).load()
             .writeStream.format("memory").queryName("connect_available_now").trigger(availableNow=True).start())
    query.awaitTermination(300)
    query.stop()
    result["available_now"] = sorted(row.data.decode() for row in spark.sql("select data from connect_available_now")
                                     .collect())
    spark.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=["cluster", "stream", "connect"])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--queue", required=True, help="queue URI (the cluster scenario adds suffixes)")
    parser.add_argument("--work", required=True, help="directory for outputs and result.json")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2_000, help="maxMessagesPerBatch of the stream")
    parser.add_argument("--available-now", action="store_true")
    args = parser.parse_args()
    _environment()
    result = {"cluster": cluster, "stream": stream, "connect": connect}[args.scenario](args)
    (Path(args.work) / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
