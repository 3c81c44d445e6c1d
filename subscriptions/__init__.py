"""Subscriptions: durable cursors and the exclusive, shared, failover and broadcast modes."""
