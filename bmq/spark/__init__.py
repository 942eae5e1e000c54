"""BlazingMQ for Apache Spark: the ``blazingmq`` data source (batch and streaming).

Needs Spark 4's Python data source API: ``pip install 'bmq[spark]'`` (pyspark, pyarrow,
pandas). Spark's Python workers must run an interpreter where ``bmq`` is installed: set
``PYSPARK_PYTHON`` (and ``PYSPARK_DRIVER_PYTHON``) to it, e.g. ``sys.executable``.

Example::

    from bmq.spark import BlazingMQDataSource

    spark.dataSource.register(BlazingMQDataSource)
    stream = (spark.readStream.format("blazingmq")
              .option("broker", "tcp://localhost:30114")
              .option("queue", "bmq://bmq.test.mem.priority/in").load())

In a thread other than the one that created the SparkSession, call ``activate(spark)`` first
(Spark looks the format up through the JVM's thread-local active session).

See ``docs/spark.md`` for the options and the exact delivery guarantees.
"""
from __future__ import annotations

try:
    import pyarrow  # noqa: F401  (Spark's Python data source workers need it too)
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter  # noqa: F401  (4.1+)
except ImportError as e:  # pragma: no cover - exercised in a process without pyspark
    raise ImportError(
        "bmq.spark needs pyspark>=4.1 and pyarrow; install them with: pip install 'bmq[spark]' "
        f"({e})"
    ) from e

from ._source import BlazingMQDataSource
from ._threads import activate

__all__ = ["BlazingMQDataSource", "activate"]
