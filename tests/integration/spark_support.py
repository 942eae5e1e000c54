"""Spark set-up shared by the Spark tests (``conftest.py``'s ``spark`` fixture, the test
modules) and the driver program they run in processes of their own (``spark_driver.py``).

Importable from both: pytest puts this directory on ``sys.path`` for the test modules and
conftest.py beside them, and Python puts a script's own directory there for the driver. It
imports nothing from pytest, and pyspark only when a session is made.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import bmq

ROOT = Path(__file__).resolve().parents[2]


def prepare_environment() -> None:
    """Spark starts its Python workers with ``PYSPARK_PYTHON``: this interpreter, with
    ``PYTHONPATH`` starting at this checkout, so that they import its ``bmq`` (with its built
    extension). Call before the JVM starts."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)


def spark_session(master: str, app_name: str, config: Optional[Dict[str, str]] = None) -> Any:
    """A SparkSession on ``master`` with bmq's ``blazingmq`` data source registered: no UI, two
    shuffle partitions, 30 s for a stream to stop, only errors in its log; ``config``: more
    Spark settings."""
    from pyspark.sql import SparkSession

    from bmq.spark import BlazingMQDataSource

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
    )
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(BlazingMQDataSource)
    return session


def drain(address: str, uri: str, expected: int, timeout: float = 60.0) -> List[bmq.Message]:
    """Every message a bmq consumer receives from ``uri`` (each confirmed) until ``expected``
    came and the queue then stays quiet for a moment (so that extra messages would be seen)."""
    received: List[bmq.Message] = []
    with bmq.Session(broker=address) as session:
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=5000))
        while True:
            message = queue.get(timeout=timeout if len(received) < expected else 0.5)
            if message is None:
                break
            received.append(message)
            if len(received) % 1000 == 0:
                session.confirm_many(received[-1000:])
        session.confirm_many(received[len(received) - len(received) % 1000 :])
    return received
