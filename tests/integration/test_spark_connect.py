"""The ``blazingmq`` data source through Spark Connect: a thin client talking gRPC to a Connect
server, whose Python workers run the source (``SparkSession.builder.remote("local[2]")``
starts that server in this process; bmq is installed where it runs, as on a real server).

Needs the Connect client's packages: ``pip install 'bmq[spark-connect]'``.
"""
from __future__ import annotations

import os
import uuid
from typing import Any, Iterator, List

import pytest

pytestmark = pytest.mark.spark

try:
    import grpc  # noqa: F401  (the Connect client's transport, brought by bmq[spark-connect])
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
except ImportError as e:  # the optional extras; CI must have them
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"the Spark Connect client is needed: pip install 'bmq[spark-connect]' ({e})", allow_module_level=True)

import bmq  # noqa: E402
from bmq.spark import BlazingMQDataSource, activate  # noqa: E402


@pytest.fixture(scope="module")
def connect(spark: Any) -> Iterator[Any]:
    """A Spark Connect session. The ``spark`` fixture first sets the Python workers'
    interpreter and path; the local Connect server then runs on its SparkContext (one per
    JVM), as a real server runs on its own."""
    session = SparkSession.builder.remote("local[2]").getOrCreate()
    assert session.__class__.__module__.startswith("pyspark.sql.connect")
    session.dataSource.register(BlazingMQDataSource)  # sent to the server with the class by value
    try:
        yield session
    finally:
        session.stop()


def new_queue(name: str) -> str:
    return f"bmq://bmq.test.mem.priority/connect-{name}-{uuid.uuid4().hex[:8]}"


def payloads_in(address: str, uri: str) -> List[bytes]:
    """What the broker holds for ``uri``, read without consuming it (a consumer that confirms
    nothing, stopped once the queue is quiet for 1 s)."""
    received: List[bytes] = []
    with bmq.Session(broker=address) as session:
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=10_000))
        while (batch := queue.get_batch(10_000, timeout=1.0)) is not None:
            received.extend(batch[index].data for index in range(len(batch)))
    return received


def test_write_through_spark_connect(connect: Any, bmqbrkr: Any) -> None:
    uri = new_queue("write")
    frame = connect.range(3_000, numPartitions=2).select(F.format_string("c%d", "id").alias("data"))
    frame.write.format("blazingmq").option("broker", bmqbrkr.address).option("queue", uri).mode("append").save()
    assert sorted(payloads_in(bmqbrkr.address, uri)) == sorted(f"c{i}".encode() for i in range(3_000))


def test_batch_read_through_spark_connect(connect: Any, bmqbrkr: Any) -> None:
    uri = new_queue("read")
    with bmq.Session(broker=bmqbrkr.address) as session:
        session.open_queue(uri, write=True).post_many([f"r{i}".encode() for i in range(500)])
    rows = (connect.read.format("blazingmq").option("broker", bmqbrkr.address).option("queue", uri)
            .option("idleTimeout", "1").load().collect())
    assert sorted(row.data for row in rows) == sorted(f"r{i}".encode() for i in range(500))
    assert payloads_in(bmqbrkr.address, uri) == []  # read and confirmed


def test_available_now_read_through_spark_connect(connect: Any, bmqbrkr: Any) -> None:
    uri, name = new_queue("available-now"), f"connect_{uuid.uuid4().hex[:8]}"
    with bmq.Session(broker=bmqbrkr.address) as session:
        session.open_queue(uri, write=True).post_many([f"a{i}".encode() for i in range(5_000)])
    query = (connect.readStream.format("blazingmq").option("broker", bmqbrkr.address).option("queue", uri)
             .option("maxMessagesPerBatch", "2000").load()
             .writeStream.format("memory").queryName(name).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(240)
    finally:
        query.stop()
    assert query.exception() is None
    rows = connect.sql(f"select data from {name}").collect()
    assert sorted(row.data for row in rows) == sorted(f"a{i}".encode() for i in range(5_000))
    assert payloads_in(bmqbrkr.address, uri) == []


def test_activate_is_a_no_op_for_a_connect_session(connect: Any) -> None:
    activate(connect)  # a Connect client has no JVM: nothing to set, nothing raised
