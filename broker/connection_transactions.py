"""Transactions over a connection (Pulsar's PIP-31 commands): the coordinator's
requests (TC_CLIENT_CONNECT_REQUEST, NEW_TXN, ADD_PARTITION_TO_TXN,
ADD_SUBSCRIPTION_TO_TXN, END_TXN) served by broker/transaction_coordinator.py, the
topic owner's requests from coordinators (END_TXN_ON_PARTITION,
END_TXN_ON_SUBSCRIPTION), and the transactional forms of SEND and ACK
(broker/topic_transactions.py). Each answer carries the transaction id and, on failure,
the ServerError of the catalogue error (protocol/server_errors.py).
Mixed into ``ServerConnection`` (broker/connection.py, the router).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from broker.authorization import CONSUME as _CONSUME, PRODUCE as _PRODUCE
from common.errors import MagnetarError, NotAllowed
from common.position import Position
from common.topic_name import TopicName
from protocol import txn_commands
from protocol.codec import Frame
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import server_error_for
from subscriptions.ports import AckedMessage
from transactions.records import TxnId

if TYPE_CHECKING:
    from broker.producer import Producer
    from broker.topic import PersistentTopic

log = logging.getLogger(__name__)


def _txn(body) -> TxnId:
    return TxnId(body.txnid_most_bits, body.txnid_least_bits)


def has_txn(body) -> bool:
    """Whether a SEND or ACK carries a transaction id."""
    return body.HasField("txnid_most_bits") or body.HasField("txnid_least_bits")


def _failure(error: MagnetarError) -> tuple[int, str]:
    return server_error_for(error), error.message


class TransactionHandlers:
    """The transaction commands (see the module)."""

    def _coordinators(self):
        coordinators = self.service.transactions
        if coordinators is None:
            raise NotAllowed("transactions are disabled on this broker (transactions_enabled)")
        return coordinators

    async def _on_tc_client_connect(self, frame: Frame) -> None:
        request = frame.command.tcClientConnectRequest
        try:
            await self._coordinators().coordinator(request.tc_id)
        except MagnetarError as error:
            self.write_command(txn_commands.tc_client_connect_response(request.request_id, *_failure(error)))
            return
        self.write_command(txn_commands.tc_client_connect_response(request.request_id))

    async def _on_new_txn(self, frame: Frame) -> None:
        request = frame.command.newTxn
        try:
            txn_id = await self._coordinators().new_txn(request.tc_id, request.txn_ttl_seconds,
                                                         owner=self.role if self.identity is not None else None)
        except MagnetarError as error:
            self.write_command(txn_commands.new_txn_response(request.request_id, None, *_failure(error)))
            return
        self.write_command(txn_commands.new_txn_response(request.request_id, (txn_id.most, txn_id.least)))

    async def _on_add_partition_to_txn(self, frame: Frame) -> None:
        request = frame.command.addPartitionToTxn
        txn_id = _txn(request)
        try:
            for topic in request.partitions:
                await self.service.authorizer.check(self.role, TopicName.parse(topic), _PRODUCE)
            await self._coordinators().add_partitions(txn_id, list(request.partitions), role=self.role)
        except MagnetarError as error:
            self.write_command(txn_commands.add_partition_response(request.request_id, (txn_id.most, txn_id.least),
                                                                   *_failure(error)))
            return
        self.write_command(txn_commands.add_partition_response(request.request_id, (txn_id.most, txn_id.least)))

    async def _on_add_subscription_to_txn(self, frame: Frame) -> None:
        request = frame.command.addSubscriptionToTxn
        txn_id = _txn(request)
        try:
            for subscription in request.subscription:
                await self.service.authorizer.check(self.role, TopicName.parse(subscription.topic), _CONSUME)
            await self._coordinators().add_subscriptions(
                txn_id, [(s.topic, s.subscription) for s in request.subscription], role=self.role)
        except MagnetarError as error:
            self.write_command(txn_commands.add_subscription_response(
                request.request_id, (txn_id.most, txn_id.least), *_failure(error)))
            return
        self.write_command(txn_commands.add_subscription_response(request.request_id, (txn_id.most, txn_id.least)))

    async def _on_end_txn(self, frame: Frame) -> None:
        request = frame.command.endTxn
        txn_id = _txn(request)
        try:
            await self._coordinators().end(txn_id, commit=request.txn_action == pb.COMMIT, role=self.role)
        except MagnetarError as error:
            self.write_command(txn_commands.end_txn_response(request.request_id, (txn_id.most, txn_id.least),
                                                             *_failure(error)))
            return
        self.write_command(txn_commands.end_txn_response(request.request_id, (txn_id.most, txn_id.least)))

    async def _on_end_txn_on_partition(self, frame: Frame) -> None:
        request = frame.command.endTxnOnPartition
        txn_id = _txn(request)
        try:
            self._check_broker_peer()
            await self._coordinators().end_locally_on_partition(TopicName.parse(request.topic), txn_id,
                                                                request.txn_action == pb.COMMIT)
        except MagnetarError as error:
            self.write_command(txn_commands.end_txn_on_partition_response(
                request.request_id, (txn_id.most, txn_id.least), *_failure(error)))
            return
        self.write_command(txn_commands.end_txn_on_partition_response(request.request_id,
                                                                      (txn_id.most, txn_id.least)))

    async def _on_end_txn_on_subscription(self, frame: Frame) -> None:
        request = frame.command.endTxnOnSubscription
        txn_id = _txn(request)
        try:
            self._check_broker_peer()
            await self._coordinators().end_locally_on_subscription(
                TopicName.parse(request.subscription.topic), request.subscription.subscription, txn_id,
                request.txn_action == pb.COMMIT)
        except MagnetarError as error:
            self.write_command(txn_commands.end_txn_on_subscription_response(
                request.request_id, (txn_id.most, txn_id.least), *_failure(error)))
            return
        self.write_command(txn_commands.end_txn_on_subscription_response(request.request_id,
                                                                         (txn_id.most, txn_id.least)))

    def _check_broker_peer(self) -> None:
        """Ending a transaction on a topic is a coordinator's request. With
        authentication on, only a superuser (brokers' own role) may send it."""
        if self.identity is not None and not self.service.authorizer.is_superuser(self.role):
            raise NotAllowed("END_TXN_ON_* is for transaction coordinators")

    # --- transactional SEND and ACK ------------------------------------------------------------------

    def _publish_in_txn(self, producer: "Producer", topic: "PersistentTopic", payload: bytes,
                        send: pb.CommandSend) -> "asyncio.Future[Position]":
        """Raises what refuses the send (the caller answers SEND_ERROR)."""
        if self.service.transactions is None:
            raise NotAllowed("transactions are disabled on this broker (transactions_enabled)")
        return topic.transactions.publish(producer, payload, send.num_messages, _txn(send))

    def _on_txn_ack(self, frame: Frame) -> None:
        ack = frame.command.ack
        attached = self._attached(ack.consumer_id)
        txn_id = _txn(ack)
        request_id = ack.request_id if ack.HasField("request_id") else None

        async def acknowledge() -> None:
            try:
                if attached is None:
                    raise NotAllowed("no such consumer")
                if self.service.transactions is None:
                    raise NotAllowed("transactions are disabled on this broker (transactions_enabled)")
                acks = [AckedMessage(Position(m.ledgerId, m.entryId), tuple(m.ack_set) or None,
                                     m.batch_size if m.HasField("batch_size") else 0) for m in ack.message_id]
                await attached.topic.transactions.acknowledge(attached.subscription, txn_id, acks,
                                                              cumulative=ack.ack_type == pb.CommandAck.Cumulative)
            except MagnetarError as error:
                log.info("transactional ack refused: peer=%s txn=%s error=%s", self.peer, txn_id, error)
                if request_id is not None:
                    self.write_command(txn_commands.txn_ack_response(ack.consumer_id, request_id,
                                                                     (txn_id.most, txn_id.least), *_failure(error)))
                return
            if request_id is not None:
                self.write_command(txn_commands.txn_ack_response(ack.consumer_id, request_id,
                                                                 (txn_id.most, txn_id.least)))

        self._start_task(acknowledge())

