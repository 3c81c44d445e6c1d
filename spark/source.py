"""The ``magnetar`` Python data source (pyspark.sql.datasource) and its registration.

    from spark import register
    register(spark)
    df = (spark.read.format("magnetar").option("adminUrl", "http://127.0.0.1:8080")
          .option("topic", "persistent://public/default/clicks").load())

Options: spark/options.py. Rows: spark/schema.py (README: "Spark").
"""

from __future__ import annotations

import os
import sys

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter
from pyspark.sql.types import StructType

from spark.options import parse_read_options
from spark.schema import SCHEMA

NAME = "magnetar"


class MagnetarDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        from spark.reader import MagnetarBatchReader

        return MagnetarBatchReader(parse_read_options(self.options))

    def streamReader(self, schema: StructType):
        from spark.stream import MagnetarStreamReader

        return MagnetarStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark.writer import MagnetarWriter, parse_write_options

        return MagnetarWriter(parse_write_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool):
        from spark.writer import MagnetarStreamWriter, parse_write_options

        return MagnetarStreamWriter(parse_write_options(self.options))


def register(session) -> None:
    """Registers the ``magnetar`` format with a SparkSession, and points the session's
    Python workers at this interpreter unless ``PYSPARK_PYTHON`` chose one.

    Spark starts its Python workers (which plan and read this source) with
    ``PYSPARK_PYTHON``, else whatever ``python3`` is first on the PATH: usually not the
    virtual environment that has pyarrow and this project, and the first read fails
    inside a worker with ModuleNotFoundError. The interpreter is fixed per function when
    it is registered (``SparkContext.pythonExec``), so setting it here, before
    registering, is enough; the user's explicit choice wins."""
    context = session.sparkContext
    if "PYSPARK_PYTHON" not in os.environ and getattr(context, "pythonExec", None) != sys.executable:
        context.pythonExec = sys.executable
    session.dataSource.register(MagnetarDataSource)
