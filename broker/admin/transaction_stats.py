"""Admin REST about one topic's part in transactions: Pulsar's per-topic
``/admin/v3/transactions`` stats, answered by the broker serving the topic (307 to it
from any other, as every topic admin path). Authorized as any path naming a tenant
(tenant admin; broker/admin/permissions.py). ``?authoritative`` is accepted and ignored.

    GET /admin/v3/transactions/transactionBufferStats/{tenant}/{namespace}/{topic}
        Pulsar's TransactionBufferStats: ``state`` ("Ready": loaded here),
        ``maxReadPosition`` ("L:E": readers stop there), ``ongoingTxnSize`` (transactions
        open on the topic), ``recoverStartTime`` / ``recoverEndTime`` (epoch ms when this
        broker rebuilt the buffer as it loaded the topic; 0: nothing to rebuild, a topic
        no transaction named), ``lastSnapshotTimestamps`` (always 0: no buffer snapshots
        are taken here). Magnetar adds ``abortedTxnSize`` (aborted transactions whose
        entries are still stored and skipped). Pulsar's ``lowWaterMarks`` and
        ``snapshotStats`` have no counterpart and are left out.
    GET /admin/v3/transactions/pendingAckStats/{tenant}/{namespace}/{topic}/{subName}
        Pulsar's TransactionPendingAckStats: ``state`` ("Ready"), ``ongoingTxnSize``
        (transactions holding acknowledgements on the subscription). Magnetar adds
        ``pendingAckSize`` (messages held; a cumulative acknowledgement counts once).
        404 when the subscription does not exist.
    GET /admin/v3/transactions/transactionInBufferStats/{tenant}/{namespace}/{topic}/{most}/{least}
        Pulsar's TransactionInBufferStats: ``startPosition`` ("L:E", the first entry the
        open transaction may own on the topic; null when it is not open there) and
        ``aborted`` (it was aborted and its entries are still stored).
    GET /admin/v3/transactions/transactionInPendingAckStats/{tenant}/{namespace}/{topic}/{subName}/{most}/{least}
        Pulsar's TransactionInPendingAckStats: ``cumulativeAckPosition`` ("L:E" of the
        transaction's cumulative acknowledgement on the subscription, else null).
        Magnetar adds ``individualAckSize`` (its individual acknowledgements held there).
        404 when the subscription does not exist.
    GET /admin/v3/transactions/positionStatsInPendingAck/{tenant}/{namespace}/{topic}/{subName}/
        {ledgerId}/{entryId}[?batchIndex=i] (one path)
        Pulsar's PositionInPendingAckStats: ``state`` "MarkDelete" (acknowledged for
        good), "PendingAck" (held by an open transaction: the entry, or message i of its
        batch), "NotInPendingAck". 404 when the subscription does not exist.
"""

from __future__ import annotations

from aiohttp import web

from broker.admin import topic_access
from broker.admin.common import path_integer, query_integer, topic_of
from broker.admin.policy_codec import subscription_name_of
from broker.admin.keys import SERVICE
from broker.topic import PersistentTopic
from common.errors import NotAllowed, SubscriptionNotFound
from common.position import Position
from transactions.pending_acks import PendingAcks
from transactions.records import TxnId

BASE = "/admin/v3/transactions"
_U64_MAX = 2**64 - 1


def position_text(position: Position | None) -> str | None:
    return None if position is None else f"{position.ledger_id}:{position.entry_id}"


def start_position(topic: PersistentTopic, txn_id: TxnId) -> Position | None:
    """The first entry ``txn_id`` may own on ``topic`` (None: not open there). The
    buffer keeps the entry before it, the last confirmed one at its first send."""
    bound = topic.transactions.buffer.open.get(txn_id)
    return None if bound is None else topic.ledger.next_position(bound)


def buffer_stats(topic: PersistentTopic) -> dict:
    transactions = topic.transactions
    buffer = transactions.buffer
    return {"state": "Ready", "maxReadPosition": position_text(buffer.max_read_position(topic.ledger.last_confirmed)),
            "lastSnapshotTimestamps": 0, "ongoingTxnSize": len(buffer.open),
            "recoverStartTime": transactions.recover_start_ms, "recoverEndTime": transactions.recover_end_ms,
            "abortedTxnSize": len(buffer.aborted)}


def _pending_of(topic: PersistentTopic, subscription: str) -> PendingAcks:
    """The subscription's pending acknowledgements (empty if none was ever held);
    SubscriptionNotFound when the subscription does not exist."""
    if subscription not in topic.subscriptions:
        raise SubscriptionNotFound(f"subscription {subscription} does not exist on {topic.full_name}")
    return topic.transactions.pending.get(subscription) or PendingAcks()


def in_buffer_stats(topic: PersistentTopic, txn_id: TxnId) -> dict:
    """Pulsar's TransactionInBufferStats of ``txn_id`` on ``topic``."""
    return {"startPosition": position_text(start_position(topic, txn_id)),
            "aborted": txn_id in topic.transactions.buffer.aborted}


def in_pending_ack_stats(topic: PersistentTopic, subscription: str, txn_id: TxnId) -> dict:
    """Pulsar's TransactionInPendingAckStats of ``txn_id`` on a subscription
    (SubscriptionNotFound if it does not exist)."""
    pending = _pending_of(topic, subscription)
    cumulative = pending.cumulative
    held = cumulative[1][0] if cumulative is not None and cumulative[0] == txn_id else None
    return {"cumulativeAckPosition": position_text(held), "individualAckSize": len(pending.by_txn.get(txn_id, {}))}


def position_in_pending_ack(topic: PersistentTopic, subscription: str, position: Position,
                            batch_index: int | None) -> str:
    """Pulsar's PositionInPendingAckStats state of a message on a subscription:
    "MarkDelete" (acknowledged for good), "PendingAck" (acknowledged in an open
    transaction: all of the entry, the message ``batch_index`` of it, or — without a
    batch index — any part of it), else "NotInPendingAck"."""
    pending = _pending_of(topic, subscription)
    cursor = topic.subscriptions[subscription].cursor
    if cursor.is_acked(position):
        return "MarkDelete"
    partly = cursor.unacked_batch_bits(position) if batch_index is not None else None
    if partly is not None and not (partly[1] >> batch_index) & 1:
        return "MarkDelete"   # that message of the batch acknowledged (plainly)
    if pending.holds(position):
        return "PendingAck"
    unheld = pending.unheld_bits(position)
    if unheld is not None and (batch_index is None or not (unheld >> batch_index) & 1):
        return "PendingAck"
    return "NotInPendingAck"

TOPIC_PATH = "{tenant}/{namespace}/{topic}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


async def loaded(request: web.Request) -> PersistentTopic:
    service = request.app[SERVICE]
    if service.transactions is None:
        raise NotAllowed("transactions are disabled on this broker (transactions_enabled)")
    return await topic_access.load(service, topic_of(request), request)


def txn_of(request: web.Request) -> TxnId:
    return TxnId(path_integer(request, "most", minimum=0, maximum=_U64_MAX),
                 path_integer(request, "least", minimum=0, maximum=_U64_MAX))


@routes.get(f"{BASE}/transactionBufferStats/{TOPIC_PATH}")
async def transaction_buffer_stats(request: web.Request) -> web.Response:
    return web.json_response(buffer_stats(await loaded(request)))


@routes.get(f"{BASE}/pendingAckStats/{TOPIC_PATH}/{{subscription}}")
async def pending_ack_stats(request: web.Request) -> web.Response:
    pending = _pending_of(await loaded(request), subscription_name_of(request.match_info["subscription"]))
    return web.json_response({"state": "Ready", "ongoingTxnSize": len(pending.txns),
                              "pendingAckSize": len(pending)})


@routes.get(f"{BASE}/transactionInBufferStats/{TOPIC_PATH}/{{most}}/{{least}}")
async def transaction_in_buffer_stats(request: web.Request) -> web.Response:
    return web.json_response(in_buffer_stats(await loaded(request), txn_of(request)))


@routes.get(f"{BASE}/transactionInPendingAckStats/{TOPIC_PATH}/{{subscription}}/{{most}}/{{least}}")
async def transaction_in_pending_ack_stats(request: web.Request) -> web.Response:
    topic = await loaded(request)
    return web.json_response(in_pending_ack_stats(
        topic, subscription_name_of(request.match_info["subscription"]), txn_of(request)))


@routes.get(f"{BASE}/positionStatsInPendingAck/{TOPIC_PATH}/{{subscription}}/{{ledger_id}}/{{entry_id}}")
async def position_stats_in_pending_ack(request: web.Request) -> web.Response:
    topic = await loaded(request)
    position = Position(path_integer(request, "ledger_id", minimum=0, maximum=2**63 - 1),
                        path_integer(request, "entry_id", minimum=0, maximum=2**63 - 1))
    batch_index = query_integer(request, "batchIndex", default=-1, minimum=0, maximum=2**31 - 1) \
        if "batchIndex" in request.query else None
    state = position_in_pending_ack(topic, subscription_name_of(request.match_info["subscription"]), position,
                                    batch_index)
    return web.json_response({"state": state})
