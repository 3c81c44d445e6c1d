"""The PySpark data source ``magnetar``: batch and streaming reads of topics (their Arrow archive and live tail) and writes to topics.

``from spark import register; register(session)`` is all a user types before
``session.read.format("magnetar")``."""


def register(session) -> None:
    """Registers the ``magnetar`` format with a SparkSession (spark/source.py)."""
    from spark.source import register as register_source

    register_source(session)
