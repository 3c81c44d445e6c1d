"""Route table of the broker's HTTP API: each resource module holds its routes as an
aiohttp ``RouteTableDef`` of module-level handlers, which find the broker in
``request.app[keys.SERVICE]`` (set here, before the tables are added).
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
    app.add_routes(lookup.routes)
    app.add_routes(permissions.routes)
    app.add_routes(brokers.routes)
    app.add_routes(bookies.routes)
    app.add_routes(bundles.routes)
    app.add_routes(clusters.routes)
    app.add_routes(tenants.routes)
    app.add_routes(namespaces.routes)
    app.add_routes(rates.routes)
    app.add_routes(topics.routes)
    app.add_routes(stats_history.routes)
    app.add_routes(topic_policies.routes)
    app.add_routes(subscriptions.routes)
    app.add_routes(messages.routes)
    app.add_routes(archive.routes)
    app.add_routes(schemas.routes)
    app.add_routes(console.routes)
    app.add_routes(transactions.routes)
    app.add_routes(transaction_stats.routes)
