"""The broker's Prometheus metrics, read from the service when /metrics is scraped
(so the hot paths only bump plain integer counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from broker.service import BrokerService


def register_broker_metrics(service: BrokerService, registry: CollectorRegistry) -> None:
    """Registers the service's gauges (read when scraped) in ``registry``."""
    def topics():
        return service.loaded_topics()

    gauges = [
        ("magnetar_broker_topics", "Topics loaded on this broker", lambda: len(topics())),
        ("magnetar_broker_connections", "Client connections", lambda: len(service.connections)),
        ("magnetar_broker_producers", "Producers attached",
         lambda: sum(len(t.producers) for t in topics())),
        ("magnetar_broker_consumers", "Consumers attached",
         lambda: sum(len(s.consumers) for t in topics() for s in t.subscriptions.values())),
        ("magnetar_broker_subscriptions", "Subscriptions of loaded topics",
         lambda: sum(len(t.subscriptions) for t in topics())),
        ("magnetar_broker_messages_in", "Messages published to loaded topics (since load)",
         lambda: sum(t.messages_in for t in topics())),
        ("magnetar_broker_bytes_in", "Bytes published to loaded topics (since load)",
         lambda: sum(t.bytes_in for t in topics())),
        ("magnetar_broker_messages_out", "Messages dispatched by loaded topics (since load)",
         lambda: sum(s.dispatcher.messages_dispatched for t in topics() for s in t.subscriptions.values())),
        ("magnetar_broker_entry_cache_bytes", "Bytes in the entry cache", lambda: service.cache.size_bytes),
        ("magnetar_broker_entry_cache_hits", "Entry cache hits", lambda: service.cache.hits),
        ("magnetar_broker_entry_cache_misses", "Entry cache misses", lambda: service.cache.misses),
    ]
    for name, help_text, function in gauges:
        Gauge(name, help_text, registry=registry).set_function(function)
