"""Admin REST about transactions, as Pulsar's ``/admin/v3/transactions`` paths (the
basics; superuser only when authorization is on, as every path naming no tenant):

    GET /admin/v3/transactions/coordinators                 {id: stats} of every coordinator:
                                                            those served here, and the others'
                                                            asked of the brokers serving them
                                                            (broker/admin/fanout.py, as
                                                            Pulsar gathers them)
    GET /admin/v3/transactions/coordinators?coordinatorId=N the stats of coordinator N
                                                            (307 to the broker serving it)
    GET /admin/v3/transactions/coordinatorStats             Pulsar's path for the same {id: stats}
    GET /admin/v3/transactions/coordinatorStats?coordinatorId=N
                                                            coordinator N's stats alone (as
                                                            Pulsar answers; 307 to its broker)
    GET /admin/v3/transactions/transactionMetadata/{most}/{least}
                                                            an open or ending transaction
                                                            (307 to its coordinator's broker;
                                                            404 once it ended)
    GET /admin/v3/transactions/slowTransactions/{timeout}   {txnId: metadata} of transactions
                                                            open longer than ``timeout`` ms, on
                                                            every coordinator: those served
                                                            here, the others' asked of the
                                                            brokers serving them (as Pulsar
                                                            gathers them); ?coordinatorId=N:
                                                            coordinator N's (307 to its broker)

The per-topic stats (transactionBufferStats, pendingAckStats, transactionInBufferStats,
transactionInPendingAckStats) are broker/admin/transaction_stats.py.

Coordinator stats (Pulsar's TransactionCoordinatorStats, the fields this design has):
``state`` ("Ready": loaded and served here), ``ongoingTxnSize`` (open or ending),
``recoverStartTime`` / ``recoverEndTime`` (when this broker loaded it, epoch ms).
Pulsar's ``leastSigBits`` and ``lowWaterMark`` have no counterpart (ids come from an
etcd counter; nothing is kept per low-water mark) and are left out.

Transaction metadata (Pulsar's TransactionMetadata): ``txnId`` "(most,least)",
``status`` (OPEN, COMMITTING, ABORTING), ``openTimestamp`` (epoch ms; 0 for a record
written before it was kept), ``timeoutAt`` (the timeout in ms, as Pulsar reports it), ``owner`` (the role that
opened it; null with authentication off), ``producedPartitions`` {topic:
TransactionInBufferStats} and ``ackedPartitions`` {topic: {subscription:
TransactionInPendingAckStats}}, each asked of the broker serving the topic (as Pulsar's
broker asks them; an empty object for a topic or subscription that no longer exists).
slowTransactions reports at most ``SLOW_TRANSACTIONS_MAX`` per coordinator, the oldest.
"""

from __future__ import annotations

import time
from urllib.parse import quote

from aiohttp import web

from broker.admin import fanout
from broker.admin.common import path_integer, query_integer
from broker.admin.transaction_stats import in_buffer_stats, in_pending_ack_stats
from broker.admin.topic_access import redirect_unless_owner
from broker.admin.keys import SERVICE
from broker.service import BrokerService
from broker.transaction_coordinator import Coordinator, assign_partition
from common.errors import NotAllowed, SubscriptionNotFound, TopicNotFound, TransactionNotFound
from common.topic_name import TopicName
from transactions.records import TxnId, TxnRecord

_U64_MAX = 2**64 - 1
BASE = "/admin/v3/transactions"
# Slow transactions reported per coordinator (the oldest first): each one's metadata
# asks every topic and subscription it names.
SLOW_TRANSACTIONS_MAX = 1_000


def coordinator_stats(coordinator: Coordinator) -> dict:
    return {"state": "Ready", "ongoingTxnSize": len(coordinator.records),
            "recoverStartTime": coordinator.loaded_at_ms, "recoverEndTime": coordinator.loaded_at_ms}


async def transaction_metadata(service: BrokerService, record: TxnRecord, remote: fanout.PartitionCalls) -> dict:
    """Pulsar's TransactionMetadata of an open or ending transaction, its per-topic
    parts asked of each topic's broker (this one's own answered here), as Pulsar's
    coordinator broker asks them: an empty object for a topic or subscription that no
    longer exists."""
    txn_id = record.txn_id
    ids = f"{txn_id.most}/{txn_id.least}"

    async def part(topic: str, subscription: str | None) -> dict:
        name = TopicName.parse(topic)
        owner = await service.owner_of(name)
        if owner.is_self:
            try:
                loaded = await service.get_topic(name, create=False)
                if subscription is None:
                    return in_buffer_stats(loaded, txn_id)
                return in_pending_ack_stats(loaded, subscription, txn_id)
            except (TopicNotFound, SubscriptionNotFound):
                return {}
        where = f"{name.tenant}/{name.namespace}/{quote(name.local_name, safe='')}"
        path = f"{BASE}/transactionInBufferStats/{where}/{ids}" if subscription is None else \
            f"{BASE}/transactionInPendingAckStats/{where}/{quote(subscription, safe='')}/{ids}"
        got = await remote.call("GET", owner, name, path=path)
        return got if isinstance(got, dict) else {}

    produced_parts = list(record.partitions)
    acked_parts = list(record.subscriptions)
    answers = await fanout.bounded_gather([part(topic, None) for topic in produced_parts]
                                          + [part(topic, subscription) for topic, subscription in acked_parts])
    produced = dict(zip(produced_parts, answers[:len(produced_parts)]))
    acked: dict[str, dict[str, dict]] = {}
    for (topic, subscription), stats in zip(acked_parts, answers[len(produced_parts):]):
        acked.setdefault(topic, {})[subscription] = stats
    return {"txnId": f"({txn_id.most},{txn_id.least})", "status": record.status.value,
            "openTimestamp": record.opened_ms,
            "timeoutAt": record.deadline_ms - record.opened_ms if record.opened_ms else None,
            "owner": record.owner, "producedPartitions": produced, "ackedPartitions": acked}

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


def coordinators_service(service: BrokerService):
    if service.transactions is None:
        raise NotAllowed("transactions are disabled on this broker (transactions_enabled)")
    return service.transactions


async def chosen(request: web.Request) -> list[Coordinator]:
    """The coordinator ?coordinatorId names (redirected to its broker), or every one
    served here."""
    service = request.app[SERVICE]
    coordinators = coordinators_service(service)
    if "coordinatorId" not in request.query:
        return coordinators.served()
    coordinator_id = query_integer(request, "coordinatorId", default=0, minimum=0,
                                   maximum=coordinators.count - 1)
    await redirect_unless_owner(service, assign_partition(coordinator_id), request)
    return [await coordinators.coordinator(coordinator_id)]


async def slow_here(service: BrokerService, coordinator: Coordinator, timeout_ms: int,
                    remote: fanout.PartitionCalls) -> dict[str, dict]:
    now_ms = int(time.time() * 1000)
    slow = sorted((record for record in list(coordinator.records.values())
                   if record.opened_ms and now_ms - record.opened_ms > timeout_ms), key=lambda r: r.opened_ms)
    answer = {}
    for record in slow[:SLOW_TRANSACTIONS_MAX]:
        metadata = await transaction_metadata(service, record, remote)
        answer[metadata["txnId"]] = metadata
    return answer


@routes.get(f"{BASE}/coordinators")
async def get_coordinators(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    coordinators = coordinators_service(service)
    if "coordinatorId" in request.query:
        return web.json_response({str(c.coordinator_id): coordinator_stats(c) for c in await chosen(request)})
    answer: dict[str, object] = {}
    async with fanout.PartitionCalls(service, request) as remote:
        for coordinator_id in range(coordinators.count):
            partition = assign_partition(coordinator_id)
            owner = await service.owner_of(partition)
            if owner.is_self:
                answer[str(coordinator_id)] = coordinator_stats(await coordinators.coordinator(coordinator_id))
                continue
            got = await remote.call("GET", owner, partition, path=f"{BASE}/coordinators",
                                    query={"coordinatorId": str(coordinator_id)})
            if isinstance(got, dict) and str(coordinator_id) in got:
                answer[str(coordinator_id)] = got[str(coordinator_id)]
    return web.json_response(answer)


@routes.get(f"{BASE}/coordinatorStats")
async def get_coordinator_stats(request: web.Request) -> web.Response:
    """Pulsar's coordinatorStats: with ?coordinatorId=N, N's stats alone."""
    if "coordinatorId" in request.query:
        (coordinator,) = await chosen(request)
        return web.json_response(coordinator_stats(coordinator))
    return await get_coordinators(request)


@routes.get(f"{BASE}/transactionMetadata/{{most}}/{{least}}")
async def get_metadata(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    coordinators = coordinators_service(service)
    most = path_integer(request, "most", minimum=0, maximum=_U64_MAX)
    least = path_integer(request, "least", minimum=0, maximum=_U64_MAX)
    txn_id = TxnId(most, least)
    if most >= coordinators.count:
        raise TransactionNotFound(f"transaction {txn_id}: there is no coordinator {most}")
    await redirect_unless_owner(service, assign_partition(most), request)
    coordinator = await coordinators.coordinator(most)
    record = coordinator.record(txn_id)
    async with fanout.PartitionCalls(service, request) as remote:
        return web.json_response(await transaction_metadata(service, record, remote))


@routes.get(f"{BASE}/slowTransactions/{{timeout}}")
async def get_slow(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    timeout_ms = path_integer(request, "timeout", minimum=0, maximum=2**63 - 1)
    coordinators = coordinators_service(service)
    async with fanout.PartitionCalls(service, request) as remote:
        if "coordinatorId" in request.query:
            slow: dict[str, dict] = {}
            for coordinator in await chosen(request):
                slow.update(await slow_here(service, coordinator, timeout_ms, remote))
            return web.json_response(slow)

        # Every coordinator: this broker's own, the others asked (with
        # ?coordinatorId, so the broker asked answers for that one alone) of the
        # brokers serving them.
        async def one(coordinator_id: int) -> dict:
            partition = assign_partition(coordinator_id)
            owner = await service.owner_of(partition)
            if owner.is_self:
                return await slow_here(service, await coordinators.coordinator(coordinator_id), timeout_ms,
                                       remote)
            got = await remote.call("GET", owner, partition, path=f"{BASE}/slowTransactions/{timeout_ms}",
                                    query={"coordinatorId": str(coordinator_id)})
            return got if isinstance(got, dict) else {}

        answer: dict[str, dict] = {}
        for part in await fanout.bounded_gather(one(n) for n in range(coordinators.count)):
            answer.update(part)
    return web.json_response(answer)
