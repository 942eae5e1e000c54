"""Rows/s of a Spark write to BlazingMQ, beside the single-process ``post_many`` rate.

Both are measured in the same run against the same broker: ``--broker``, or else the embedded
broker started as its own process (``python -m bmq.broker``) so that it does not share the
benchmark's interpreter lock with the ``post_many`` client:

* ``post_many``: one process, one session, ``Queue.post_many`` in chunks, every ACK awaited;
* ``spark``: ``df.write.format("blazingmq")`` of the same rows from ``local[2]`` (2 executor
  threads, 2 partitions, each a Python worker with its own session), after a warm-up write
  that starts the Python workers.

Usage: ``python benchmarks/spark.py [--rows N] [--payload BYTES] [--json FILE]``
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict

import bmq
from bmq.broker import broker_address

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


def spark_rate(broker: str, rows: int, payload: int) -> float:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from bmq.spark import BlazingMQDataSource

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BlazingMQDataSource)

    def write(count: int) -> float:
        df = spark.range(count, numPartitions=2).select(F.expr(f"repeat('x', {payload})").alias("data"))
        start = time.perf_counter()
        df.write.format("blazingmq").option("broker", broker).option("queue", _queue("spark")).mode("append").save()
        return time.perf_counter() - start

    try:
        write(10_000)  # warm-up: starts the Python workers and their imports
        return rows / write(rows)
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes per row")
    parser.add_argument("--broker", help="tcp://host:port (default: an embedded broker)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(broker_address(args.broker, separate_process=True))
        results: Dict[str, Any] = {
            "rows": args.rows,
            "payload_bytes": args.payload,
            "post_many_rows_per_s": round(post_many_rate(broker, args.rows, args.payload)),
            "spark_rows_per_s": round(spark_rate(broker, args.rows, args.payload)),
            "spark_executors": 2,
            "broker": args.broker or "embedded (own process)",
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        }
    width = max(len(key) for key in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
