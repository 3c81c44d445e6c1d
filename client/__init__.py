"""An asyncio client of Pulsar's binary protocol, built on ``protocol/``: connections,
lookups, producers and consumers with explicit flow control. For the gateway, and later
Spark and the benchmarks; the official ``pulsar-client`` stays the reference client for
users. It sits in the storage layer as a sibling of ``ledger/`` (the client of bookies):
it imports only ``protocol/`` and ``common/``."""
