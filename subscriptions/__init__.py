"""Subscriptions: durable cursors and the exclusive, failover, shared, key-shared and broadcast modes."""
