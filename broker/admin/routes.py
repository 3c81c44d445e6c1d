"""Route table of the broker's HTTP API: each resource module adds its own routes (the
topic and subscription modules as aiohttp ``RouteTableDef``s of module-level handlers,
which find the broker in ``request.app[keys.SERVICE]``; the others still through an
``add_routes(app, service)`` of closures).
Order matters only where a fixed path and a pattern overlap; each module registers its
fixed paths before its patterns."""

from __future__ import annotations

from aiohttp import web

from broker.admin import (
    archive,
    bookies,
    brokers,
    bundles,
    clusters,
    console,
    keys,
    lookup,
    messages,
    namespaces,
    permissions,
    rates,
    schemas,
    stats_history,
    subscriptions,
    tenants,
    topic_policies,
    topics,
    transaction_stats,
    transactions,
)
from broker.service import BrokerService


def add_routes(app: web.Application, service: BrokerService) -> None:
    keys.set_up(app, service)
    lookup.add_routes(app, service)
    permissions.add_routes(app, service)
    brokers.add_routes(app, service)
    bookies.add_routes(app, service)
    bundles.add_routes(app, service)
    clusters.add_routes(app, service)
    tenants.add_routes(app, service)
    namespaces.add_routes(app, service)
    rates.add_routes(app, service)
    app.add_routes(topics.routes)
    stats_history.add_routes(app, service)
    topic_policies.add_routes(app, service)
    app.add_routes(subscriptions.routes)
    messages.add_routes(app, service)
    archive.add_routes(app, service)
    schemas.add_routes(app, service)
    console.add_routes(app, service)
    transactions.add_routes(app, service)
    transaction_stats.add_routes(app, service)
