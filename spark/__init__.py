"""The PySpark data source ``magnetar``: batch and streaming reads of topics (their Arrow archive and live tail) and writes to topics."""
