"""The gateway's Prometheus metrics (``magnetar_gateway_*``): counts read from the
service when scraped, and request latency by route, observed by a middleware."""

from __future__ import annotations

import time
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from common.histograms import LATENCY_BUCKETS_S
from gateway.service import GatewayService
from gateway.subscription_counts import KINDS


class _ServiceCollector:
    def __init__(self, service: GatewayService) -> None:
        self.service = service

    def collect(self):
        service = self.service
        for name, help_text, value in (
                ("messages_produced", "Messages stored through the gateway", service.messages_produced),
                ("messages_duplicate", "Idempotent produces the broker had stored already (not stored again)",
                 service.idempotent.duplicates),
                ("messages_pulled", "Messages handed out by pulls and pushes", service.messages_pulled),
                ("messages_acked", "Messages acknowledged through the gateway", service.messages_acked),
                ("messages_nacked", "Messages given back by nack", service.messages_nacked),
                ("messages_rejected", "Messages sent to the dead-letter topic by reject", service.messages_rejected),
                ("leases_extended", "Lease extensions", service.leases_extended),
                ("entries_returned_unused", "Entries given back to the broker unused (read ahead or left "
                 "by a pull that gave up; not counted as deliveries)", service.consumers.entries_returned_unused)):
            yield CounterMetricFamily(f"magnetar_gateway_{name}", help_text, value=value)
        for name, help_text, value in (
                ("leases_active", "Messages leased, deferred or being written", service.consumers.leases),
                ("consumers", "Broker consumers held", len(service.consumers.consumers)),
                ("producers", "Broker producers held", len(service.producers.producers)),
                ("idempotent_producers", "Named producers registered for idempotent produces in flight",
                 service.idempotent.open_producers),
                ("requests_in_flight", "HTTP requests being handled", service.requests_in_flight[0])):
            yield GaugeMetricFamily(f"magnetar_gateway_{name}", help_text, value=value)
        yield from _subscription_families(service)


_SUBSCRIPTION_HELP = {
    "pulled": "Messages handed out by pulls and pushes, by subscription",
    "acked": "Messages acknowledged through the gateway, by subscription",
    "nacked": "Messages given back by nack, by subscription",
    "extended": "Lease extensions, by subscription",
    "lease_ended": "Leases that ended without an ack (ran out, or a nack came due: the message goes back to "
                   "its subscription), by subscription",
}


def _subscription_families(service: GatewayService):
    """Per-subscription counters and leases held, labelled (topic, subscription) with
    the bounded label set of gateway/subscription_counts.py."""
    counts = service.subscription_counts
    families = {kind: CounterMetricFamily(f"magnetar_gateway_subscription_{kind}", _SUBSCRIPTION_HELP[kind],
                                          labels=["topic", "subscription"]) for kind in KINDS}
    leases: dict[tuple[str, str], int] = {}
    for key, consumer in list(service.consumers.consumers.items()):
        label = counts.label(key.topic, key.subscription)
        leases[label] = leases.get(label, 0) + consumer.table.active
    for label, values in counts.items():
        for kind, value in zip(KINDS, values):
            families[kind].add_metric(list(label), value)
    yield from families.values()
    active = GaugeMetricFamily("magnetar_gateway_subscription_leases_active",
                               "Messages leased to HTTP clients and not yet settled, by subscription",
                               labels=["topic", "subscription"])
    for label, count in sorted(leases.items()):
        active.add_metric(list(label), count)
    yield active


def register_gateway_metrics(service: GatewayService, registry: CollectorRegistry):
    """Registers the service's counts; returns the latency middleware."""
    registry.register(_ServiceCollector(service))
    latency = Histogram("magnetar_gateway_request_latency_seconds", "From request to response, by route",
                        ["method", "route", "status"], buckets=LATENCY_BUCKETS_S, registry=registry)

    @web.middleware
    async def middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            latency.labels(request.method, route, str(status)).observe(time.perf_counter() - started)
    return middleware

