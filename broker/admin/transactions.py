"""Admin REST about transactions, as Pulsar's ``/admin/v3/transactions`` paths (the
basics; superuser only when authorization is on, as every path naming no tenant):

    GET /admin/v3/transactions/coordinators                 {id: stats} of every coordinator:
                                                            those served here, and the others'
                                                            asked of the brokers serving them
                                                            (broker/admin/fanout.py, as
                                                            Pulsar gathers them)
    GET /admin/v3/transactions/coordinators?coordinatorId=N the stats of coordinator N
                                                            (307 to the broker serving it)
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
written before it was kept), ``timeoutAt`` (the timeout in ms, as Pulsar reports it),
``producedPartitions`` {topic: {"startPosition": "L:E" or null, "aborted": false}}
(Pulsar's TransactionInBufferStats: the first entry it may own there) and
``ackedPartitions`` {topic: {subscription: {"cumulativeAckPosition": "L:E" or null}}};
the per-topic parts are filled where this broker has the topic loaded, else empty.
"""

from __future__ import annotations

import time

from aiohttp import web

from broker.admin import fanout
from broker.admin.common import path_integer, query_integer
from broker.admin.transaction_stats import position_text, start_position
from broker.admin.topic_access import redirect_unless_owner
from broker.service import BrokerService
from broker.transaction_coordinator import Coordinator, assign_partition
from common.errors import NotAllowed, TransactionNotFound
from common.topic_name import TopicName
from transactions.records import TxnId, TxnRecord

_U64_MAX = 2**64 - 1
BASE = "/admin/v3/transactions"


def coordinator_stats(coordinator: Coordinator) -> dict:
    return {"state": "Ready", "ongoingTxnSize": len(coordinator.records),
            "recoverStartTime": coordinator.loaded_at_ms, "recoverEndTime": coordinator.loaded_at_ms}


def transaction_metadata(service: BrokerService, record: TxnRecord) -> dict:
    produced: dict[str, dict] = {}
    for topic in record.partitions:
        loaded = service.loaded_topic(TopicName.parse(topic))
        produced[topic] = {} if loaded is None else {
            "startPosition": position_text(start_position(loaded, record.txn_id)), "aborted": False}
    acked: dict[str, dict[str, dict]] = {}
    for topic, subscription in record.subscriptions:
        loaded = service.loaded_topic(TopicName.parse(topic))
        stats: dict = {}
        if loaded is not None:
            pending = loaded.transactions.pending.get(subscription)
            cumulative = pending.cumulative if pending is not None else None
            held = cumulative[1][0] if cumulative is not None and cumulative[0] == record.txn_id else None
            stats = {"cumulativeAckPosition": position_text(held)}
        acked.setdefault(topic, {})[subscription] = stats
    return {"txnId": f"({record.txn_id.most},{record.txn_id.least})", "status": record.status.value,
            "openTimestamp": record.opened_ms,
            "timeoutAt": record.deadline_ms - record.opened_ms if record.opened_ms else None,
            "producedPartitions": produced, "ackedPartitions": acked}


def add_routes(app: web.Application, service: BrokerService) -> None:
    def coordinators_service():
        if service.transactions is None:
            raise NotAllowed("transactions are disabled on this broker (transactions_enabled)")
        return service.transactions

    async def chosen(request: web.Request) -> list[Coordinator]:
        """The coordinator ?coordinatorId names (redirected to its broker), or every one
        served here."""
        coordinators = coordinators_service()
        if "coordinatorId" not in request.query:
            return coordinators.served()
        coordinator_id = query_integer(request, "coordinatorId", default=0, minimum=0,
                                       maximum=coordinators.count - 1)
        await redirect_unless_owner(service, assign_partition(coordinator_id), request)
        return [await coordinators.coordinator(coordinator_id)]

    async def get_coordinators(request: web.Request) -> web.Response:
        coordinators = coordinators_service()
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

    async def get_metadata(request: web.Request) -> web.Response:
        coordinators = coordinators_service()
        most = path_integer(request, "most", minimum=0, maximum=_U64_MAX)
        least = path_integer(request, "least", minimum=0, maximum=_U64_MAX)
        txn_id = TxnId(most, least)
        if most >= coordinators.count:
            raise TransactionNotFound(f"transaction {txn_id}: there is no coordinator {most}")
        await redirect_unless_owner(service, assign_partition(most), request)
        coordinator = await coordinators.coordinator(most)
        return web.json_response(transaction_metadata(service, coordinator.record(txn_id)))

    def slow_here(coordinator: Coordinator, timeout_ms: int) -> dict[str, dict]:
        now_ms = int(time.time() * 1000)
        slow = {}
        for record in list(coordinator.records.values()):
            if record.opened_ms and now_ms - record.opened_ms > timeout_ms:
                metadata = transaction_metadata(service, record)
                slow[metadata["txnId"]] = metadata
        return slow

    async def get_slow(request: web.Request) -> web.Response:
        timeout_ms = path_integer(request, "timeout", minimum=0, maximum=2**63 - 1)
        coordinators = coordinators_service()
        if "coordinatorId" in request.query:
            slow: dict[str, dict] = {}
            for coordinator in await chosen(request):
                slow.update(slow_here(coordinator, timeout_ms))
            return web.json_response(slow)

        # Every coordinator: this broker's own, the others asked (with ?coordinatorId,
        # so the broker asked answers for that one alone) of the brokers serving them.
        async def one(coordinator_id: int) -> dict:
            partition = assign_partition(coordinator_id)
            owner = await service.owner_of(partition)
            if owner.is_self:
                return slow_here(await coordinators.coordinator(coordinator_id), timeout_ms)
            got = await remote.call("GET", owner, partition, path=f"{BASE}/slowTransactions/{timeout_ms}",
                                    query={"coordinatorId": str(coordinator_id)})
            return got if isinstance(got, dict) else {}

        answer: dict[str, dict] = {}
        async with fanout.PartitionCalls(service, request) as remote:
            for part in await fanout.bounded_gather(one(n) for n in range(coordinators.count)):
                answer.update(part)
        return web.json_response(answer)

    app.router.add_get(f"{BASE}/coordinators", get_coordinators)
    app.router.add_get(f"{BASE}/transactionMetadata/{{most}}/{{least}}", get_metadata)
    app.router.add_get(f"{BASE}/slowTransactions/{{timeout}}", get_slow)
