"""The Arrow archive of closed ledgers and the PySpark data source that reads it."""
