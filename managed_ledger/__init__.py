"""Managed ledgers: a topic's ordered ledgers and their record, the cursors' ledgers'
references, retention, the ledger collector, compaction and reads of archived ledgers.
A sibling of ``subscriptions/`` and ``bundles/``: it implements subscriptions' ports
(``PositionSource``, ``EntrySource``, ``CompactedSource``) without importing them."""
