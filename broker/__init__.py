"""Brokers: Pulsar's binary protocol, topics on managed ledgers, the admin REST API."""
