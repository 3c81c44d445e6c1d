"""Transactions (Pulsar's PIP-31): the coordinator's records, a topic's transaction
buffer and a subscription's pending acknowledgements. The cores here are pure; the
broker (broker/transaction_*.py) drives them over the protocol, the managed ledger and
etcd (``store.py`` is the one module here that touches the metadata store)."""
