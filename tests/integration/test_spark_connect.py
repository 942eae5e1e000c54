"""The ``blazingmq`` data source through Spark Connect: a thin client talking gRPC to a Connect
server, whose Python workers run the source. ``SparkSession.builder.remote("local[2]")``
starts that server in the client's process, where no regular SparkSession may run, so the
client is a driver program of its own (``spark_driver.py connect``); real bmqbrkr.

Needs the Connect client's packages: ``pip install 'bmq[spark-connect]'``.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Dict, List

import pytest

# Spark starts slowly on a loaded 2-core machine.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

try:
    import grpc  # noqa: F401  (the Connect client's transport, brought by bmq[spark-connect])
    import pyspark  # noqa: F401
except ImportError as e:  # the optional extras; CI must have them
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"the Spark Connect client is needed: pip install 'bmq[spark-connect]' ({e})", allow_module_level=True)

import bmq  # noqa: E402
from test_spark_cluster import run_driver  # noqa: E402

ROWS = 3_000


def payloads_in(address: str, uri: str) -> List[bytes]:
    """What the broker holds for ``uri``, read without consuming it (a consumer that confirms
    nothing, stopped once the queue is quiet for 1 s)."""
    received: List[bytes] = []
    with bmq.Session(broker=address) as session:
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=10_000),
                                   batches=True)
        while (batch := queue.get_batch(10_000, timeout=1.0)) is not None:
            received.extend(batch.payload(index) for index in range(len(batch)))
    return received


@pytest.fixture(scope="module")
def connect_run(bmqbrkr: Any, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """One Connect client: a write, a batch read (of 500 messages posted first), an AvailableNow
    read of what it wrote."""
    queue = f"bmq://bmq.test.mem.priority/connect-{uuid.uuid4().hex[:8]}"
    with bmq.Session(broker=bmqbrkr.address) as session:
        session.open_queue(queue + "-read", write=True).post_many([f"r{i}".encode() for i in range(500)])
    result = run_driver("connect", Path(tmp_path_factory.mktemp("connect")), "--broker", bmqbrkr.address,
                        "--queue", queue, "--master", "local[2]", "--rows", str(ROWS), "--batch", "1000")
    result["queue"] = queue
    return result


def test_the_client_is_a_spark_connect_session(connect_run: Dict[str, Any]) -> None:
    assert connect_run["session"].startswith("pyspark.sql.connect")


def test_write_and_available_now_read_through_spark_connect(connect_run: Dict[str, Any], bmqbrkr: Any) -> None:
    # The write put every row once (the AvailableNow read got each once) and the read
    # confirmed them all (nothing left).
    assert connect_run["available_now"] == sorted(f"c{i}" for i in range(ROWS))
    assert payloads_in(bmqbrkr.address, connect_run["queue"] + "-write") == []


def test_batch_read_through_spark_connect(connect_run: Dict[str, Any], bmqbrkr: Any) -> None:
    assert connect_run["batch_read"] == sorted(f"r{i}" for i in range(500))
    assert payloads_in(bmqbrkr.address, connect_run["queue"] + "-read") == []
