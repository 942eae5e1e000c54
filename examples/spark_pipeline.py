"""A Spark pipeline over BlazingMQ: write a DataFrame to a queue, stream it to another queue
with a transformation, then read the result back as a batch.

Run it with ``python examples/spark_pipeline.py [tcp://host:port]``; without a broker address
it starts the embedded broker. Needs ``pip install 'bmq[spark]'`` (pyspark 4.2+ for the
streaming step's Trigger.AvailableNow) and Java 17+.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from typing import Optional

ROWS = 1_000


def main(broker: Optional[str] = None) -> int:
    """Run the pipeline against ``broker`` (default: an embedded one); return the rows read back.

    Raises:
        RuntimeError: the streaming query did not move every row.
    """
    if broker is None:
        from bmq.broker import Broker

        with Broker() as embedded:
            return main(embedded.address)

    # Spark's Python workers must run an interpreter that imports this same bmq.
    import bmq

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(bmq.__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from bmq.spark import BlazingMQDataSource

    owned = SparkSession.getActiveSession() is None  # leave a caller's session running
    spark = SparkSession.builder.master("local[2]").appName("bmq-example").getOrCreate()
    spark.dataSource.register(BlazingMQDataSource)
    run = uuid.uuid4().hex[:8]
    orders = f"bmq://bmq.test.mem.priority/orders-{run}"
    priced = f"bmq://bmq.test.mem.priority/priced-{run}"
    try:
        # 1. Batch write: payload from `data`, properties from a struct and a promoted column.
        (
            spark.range(ROWS, numPartitions=2)
            .select(
                F.format_string("order-%d", "id").alias("data"),
                F.struct((F.col("id") % 10).cast("int").alias("quantity")).alias("properties"),
                F.lit("eu").alias("region"),
            )
            .write.format("blazingmq")
            .option("broker", broker)
            .option("queue", orders)
            .option("propertyColumns", "region")
            .mode("append")
            .save()
        )

        # 2. Stream orders -> priced, adding a property; `guid` keys the copies' GUIDs so that
        #    redelivered orders are de-duplicated in the target queue. Trigger.AvailableNow
        #    (pyspark 4.2+) ends the query once it has caught up with the queue, with every
        #    batch confirmed: no stop() in the middle of a batch (which Spark logs as an
        #    aborted write, see docs/spark.md).
        with tempfile.TemporaryDirectory() as checkpoint:
            query = (
                spark.readStream.format("blazingmq")
                .option("broker", broker)
                .option("queue", orders)
                .option("propertySchema", "quantity INT, region STRING")
                .load()
                .select(
                    "data",
                    "guid",
                    F.struct(
                        F.col("quantity"),
                        F.col("region"),
                        (F.col("quantity") * F.lit(250)).alias("price_cents"),
                    ).alias("properties"),
                )
                .writeStream.format("blazingmq")
                .option("broker", broker)
                .option("queue", priced)
                .option("guidColumn", "guid")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
        # 3. Batch read of the result.
        rows = (
            spark.read.format("blazingmq")
            .option("broker", broker)
            .option("queue", priced)
            .option("maxMessages", ROWS)
            .option("propertySchema", "price_cents INT")
            .load()
            .cache()
        )
        count = rows.count()
        if count != ROWS:
            raise RuntimeError(f"expected {ROWS} priced orders, read {count}")
        return count
    finally:
        if owned:
            spark.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("broker", nargs="?", help="a broker, e.g. tcp://localhost:30114 (default: an embedded one)")
    print(f"{main(parser.parse_args().broker)} priced orders read back")
