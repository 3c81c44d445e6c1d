"""Admin REST about brokers, as Pulsar's ``/admin/v2/brokers`` paths:

    GET /admin/v2/brokers/health                 "ok" while this broker serves (503 once it stops)
    GET /admin/v2/brokers/leaderBroker           {"brokerId", "serviceUrl"} of the leader
    GET /admin/v2/brokers/configuration/runtime  {name: value} of the broker's settings, as strings
    GET /admin/v2/brokers/{cluster}              the cluster's brokers' web addresses ("host:port")
    POST /admin/v2/brokers/drain                 (Magnetar) hand every bundle of this broker to
                                                 others and take no more; answers when done.
                                                 From the broker's own host only (a Kubernetes
                                                 preStop hook: `magnetar admin brokers drain`)

Brokers register in etcd with their load reports and elect a leader (the bundles
layer); the list and the leader come from there. Another cluster's broker list is
answered empty rather than guessed.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

from broker.admin.keys import SERVICE
from broker.service import BrokerService
from common.errors import NotAllowed, ServiceNotReady


def _is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def _web_address(web_service_url: str) -> str:
    return web_service_url.split("://", 1)[-1]


def runtime_configuration(service: BrokerService) -> dict[str, str]:
    """A few settings under the names Pulsar's broker.conf gives them."""
    config = service.config
    ledger = config.managed_ledger
    values: dict[str, object] = {
        "clusterName": config.cluster,
        "brokerId": service.broker_id,
        "bindAddress": config.host,
        "advertisedAddress": config.advertised_address or config.host,
        "brokerServicePort": config.port,
        "webServicePort": config.http_port,
        "managedLedgerDefaultEnsembleSize": ledger.ensemble_size,
        "managedLedgerDefaultWriteQuorum": ledger.write_quorum_size,
        "managedLedgerDefaultAckQuorum": ledger.ack_quorum_size,
        "managedLedgerMaxEntriesPerLedger": ledger.ledger_entries_max,
        "managedLedgerMaxSizePerLedgerMbytes": ledger.ledger_bytes_max // (1024 * 1024),
        "managedLedgerMaxLedgerRolloverTimeMinutes": int(ledger.ledger_age_s_max // 60),
        "managedLedgerCacheSizeMB": config.entry_cache_bytes_max // (1024 * 1024),
        "managedLedgerCursorFlushIntervalSeconds": config.cursor_flush_interval_s,
        "maxMessageSize": config.max_message_size,
        "maxPendingPublishRequestsPerConnection": config.pending_sends_per_connection_max,
        "maxMessagePublishBufferSizeInMB": config.pending_send_bytes_per_broker_max // (1024 * 1024),
        "keepAliveIntervalSeconds": config.keepalive_interval_s,
        "dispatcherMaxReadBatchSize": config.dispatch_entries_max,
        "dispatcherMaxReadSizeBytes": config.dispatch_bytes_max,
        "allowAutoTopicCreation": str(config.allow_auto_topic_creation).lower(),
        "allowAutoTopicCreationType": "non-partitioned",
    }
    return {name: str(value) for name, value in values.items()}

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.post("/admin/v2/brokers/drain")
async def drain(request: web.Request) -> web.Response:
    # Only from the broker's own host: anyone who can reach the HTTP port (clients
    # do, for lookups) could otherwise empty a broker.
    service = request.app[SERVICE]
    if not _is_loopback(request.remote):
        raise NotAllowed("drain is accepted from the broker's own host only")
    await service.hand_over()
    owned = service.ownership.serving() if service.ownership is not None else []
    return web.json_response({"brokerId": service.broker_id, "bundlesOwned": len(owned)})


@routes.get("/admin/v2/brokers/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if service.shutting_down:
        raise ServiceNotReady("broker is shutting down")
    if not service.serving:
        raise ServiceNotReady("broker is starting")
    return web.Response(text="ok")


@routes.get("/admin/v2/brokers/leaderBroker")
async def leader_broker(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    leader = service.leader.leader() if service.leader is not None else None
    if leader is None:
        if service.leader is not None:
            raise ServiceNotReady("no leader elected right now")
        return web.json_response({"brokerId": service.broker_id, "serviceUrl": service.config.web_service_url})
    return web.json_response({"brokerId": leader.broker_id, "serviceUrl": leader.web_service_url,
                              "brokerServiceUrl": leader.service_url})


@routes.get("/admin/v2/brokers/configuration/runtime")
async def runtime(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(runtime_configuration(service))


@routes.get("/admin/v2/brokers/{cluster}")
async def cluster_brokers(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    cluster = request.match_info["cluster"]
    await service.resources.cluster(cluster)
    if cluster != service.config.cluster:
        return web.json_response([])
    if service.broker_reports is None:
        return web.json_response([_web_address(service.config.web_service_url)])
    from bundles.records import LoadReport

    addresses = sorted(_web_address(LoadReport.decode(r.value).web_service_url)
                       for r in service.broker_reports.records.values())
    return web.json_response(addresses)
