"""The rows the ``magnetar`` data source reads and writes: one row per message, the
user-facing columns of the archive schema (archive/format.py), in one place. The
README's Spark schema table is this table.

The archive keeps four more columns that only rebuilding stored entries byte for byte
needs (``entry_metadata``, ``single_metadata``, ``entry_payload``, ``entry_checksum``)
and ``batch_size``; Spark never sees them. Rows read from the live tail through a
broker (``includeUnarchived``) have the same columns and the same values an archive
file would give them.

Every column is nullable in Spark's schema: Spark checks a record batch's Arrow schema
field by field (nullability included) against the one it derives from this schema, and
nullable fields accept every batch; the non-null columns are never null in practice.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType,
                               TimestampType)

# name, Spark type, meaning.
COLUMNS: tuple[tuple[str, object, str], ...] = (
    ("topic", StringType(), "persistent://tenant/namespace/name (a partition's own name)"),
    ("partition", IntegerType(), "partition index; -1 for a topic that is not partitioned"),
    ("ledger_id", LongType(), "message id: the ledger"),
    ("entry_id", LongType(), "message id: the entry in the ledger"),
    ("batch_index", IntegerType(), "message id: index in the producer's batch; -1 when not batched"),
    ("publish_time", TimestampType(), "when the producer published it"),
    ("event_time", TimestampType(), "the application's event time; null when not set"),
    ("key", StringType(), "partition key; null when not set"),
    ("ordering_key", BinaryType(), "ordering key; null when not set"),
    ("properties", MapType(StringType(), StringType()), "message properties"),
    ("producer_name", StringType(), "the producer's name"),
    ("sequence_id", LongType(), "the producer's sequence id of the message"),
    ("payload", BinaryType(), "the message bytes"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _type, _meaning in COLUMNS)

SCHEMA = StructType([StructField(name, data_type, nullable=True, metadata={"comment": meaning})
                     for name, data_type, meaning in COLUMNS])

# What Spark checks a returned record batch against (pyspark's own conversion, so the
# two cannot drift): timestamps in microseconds, UTC.
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")

# The columns a writer reads from a DataFrame: ``payload`` is required (binary or
# string); the others are optional.
WRITE_PAYLOAD_COLUMN = "payload"
WRITE_OPTIONAL_COLUMNS = ("key", "ordering_key", "properties", "event_time")


def to_spark_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """An archive record batch (archive.format.SCHEMA) as a batch of ARROW_SCHEMA: the
    user-facing columns, cast (milliseconds to microseconds, map field names)."""
    columns = [batch.column(name).cast(field.type) for name, field in zip(COLUMN_NAMES, ARROW_SCHEMA)]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
