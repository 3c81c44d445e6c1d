"""The local SparkSession settings that tests, ``make pipeline`` and the benchmark share
(one place): local[2] (the machines have two cores), two shuffle partitions (the
default 200 is for clusters), no UI, UTC, Python filter pushdown on, the Python
workers on this interpreter, and generous Python worker timeouts: Spark's Python
workers connect back to the JVM over loopback, and on a loaded machine (six test runs
on two cores) the default waits run out before a worker starts."""

from __future__ import annotations

import os
import sys

SETTINGS: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    # Python workers: reused between tasks (startup is most of a small task), and
    # timeouts far above a loaded machine's worker start (seconds, not minutes).
    "spark.python.worker.reuse": "true",
    "spark.python.worker.faulthandler.enabled": "true",
    "spark.python.authenticate.socketTimeout": "300s",
    "spark.network.timeout": "600s",
    "spark.executor.heartbeatInterval": "60s",
    "spark.sql.execution.pyspark.udf.idleTimeoutSeconds": "600",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


# For short sessions (the tests): the driver's JVM (which runs the executors in local
# mode) compiles with C1 only and collects with the serial collector. About half of a short
# session's JVM CPU is the JIT's C2 compiler threads and G1's collector threads, which
# a few small queries never pay back: measured on the 2-core machine (a session, a
# grouped sum of 200,000 rows and a Python UDF over 20,000), 27.0 -> 13.3 and 31.4 -> 18.9
# CPU-s in the JVM. Not in SETTINGS: `make pipeline` and the benchmark run long enough for C2.
SHORT_RUN_SETTINGS: dict[str, str] = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def local_session(app_name: str = "magnetar", extra: dict[str, str] | None = None):
    """A local SparkSession with SETTINGS (and ``extra``), the ``magnetar`` source registered."""
    # The JVM starts Python workers with PYSPARK_PYTHON; without it they run whatever
    # ``python3`` is first on PATH, which has neither pyarrow nor this project.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")      # loopback only
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in {**SETTINGS, **(extra or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    from spark import register

    register(session)
    return session
