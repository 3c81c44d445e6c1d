"""The Arrow archive (tiered storage): closed ledgers as Arrow IPC files, their format,
writer and reader over fsspec. A storage-layer sibling of ``ledger/`` and ``bookie/``."""
