"""Writing and reading from threads other than the one that created the SparkSession.

Spark (classic, not Connect) finds a Python data source registered with
``spark.dataSource.register`` through the JVM's *active* session, a thread-local of the JVM
thread that py4j pairs with each Python thread. Only the thread that created the session has
it set: in any other thread (a ``ThreadPoolExecutor``'s, or a ``pyspark.InheritableThread``,
whose JVM thread the gateway creates) ``df.write.format("blazingmq")`` fails with
``[DATA_SOURCE_NOT_FOUND] Failed to find the data source: blazingmq``.
"""
from __future__ import annotations

from typing import Any

__all__ = ["activate"]


def activate(spark: Any) -> None:
    """Make ``spark`` the active session of the calling thread, in Spark's JVM too, so that
    the ``blazingmq`` format (and any Python data source registered on it) is found there.

    Call it first in each thread that writes or reads (a pool's ``initializer`` does it once
    per thread)::

        with ThreadPoolExecutor(3, initializer=bmq.spark.activate, initargs=(spark,)) as pool:
            pool.map(lambda df: df.write.format("blazingmq")...save(), frames)

    A Spark Connect session needs nothing (the server resolves the format in the session the
    client names); for one, this does nothing.

    Thread-safety: sets only the calling thread's state.
    """
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: no JVM on the client
        return
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
