"""Builders for the transaction commands (PIP-31) a broker sends: the coordinator's
answers, a topic owner's answers to END_TXN_ON_*, the acknowledgement receipt of a
transactional ACK, and the requests a coordinator sends to topic owners."""

from __future__ import annotations

from protocol.codec import wrap
from protocol.proto import pulsar_api_pb2 as pb


def _txn_answer(message_class, request_id: int, txn: tuple[int, int] | None, error: int | None,
                text: str) -> pb.BaseCommand:
    body = message_class(request_id=request_id)
    if txn is not None:
        body.txnid_most_bits, body.txnid_least_bits = txn
    if error is not None:
        body.error = error
        body.message = text
    return wrap(body)


def tc_client_connect_response(request_id: int, error: int | None = None, text: str = "") -> pb.BaseCommand:
    body = pb.CommandTcClientConnectResponse(request_id=request_id)
    if error is not None:
        body.error = error
        body.message = text
    return wrap(body)


def new_txn_response(request_id: int, txn: tuple[int, int] | None, error: int | None = None,
                     text: str = "") -> pb.BaseCommand:
    return _txn_answer(pb.CommandNewTxnResponse, request_id, txn, error, text)


def add_partition_response(request_id: int, txn: tuple[int, int], error: int | None = None,
                           text: str = "") -> pb.BaseCommand:
    return _txn_answer(pb.CommandAddPartitionToTxnResponse, request_id, txn, error, text)


def add_subscription_response(request_id: int, txn: tuple[int, int], error: int | None = None,
                              text: str = "") -> pb.BaseCommand:
    return _txn_answer(pb.CommandAddSubscriptionToTxnResponse, request_id, txn, error, text)


def end_txn_response(request_id: int, txn: tuple[int, int], error: int | None = None,
                     text: str = "") -> pb.BaseCommand:
    return _txn_answer(pb.CommandEndTxnResponse, request_id, txn, error, text)


def end_txn_on_partition_response(request_id: int, txn: tuple[int, int], error: int | None = None,
                                  text: str = "") -> pb.BaseCommand:
    return _txn_answer(pb.CommandEndTxnOnPartitionResponse, request_id, txn, error, text)


def end_txn_on_subscription_response(request_id: int, txn: tuple[int, int], error: int | None = None,
                                     text: str = "") -> pb.BaseCommand:
    return _txn_answer(pb.CommandEndTxnOnSubscriptionResponse, request_id, txn, error, text)


def txn_ack_response(consumer_id: int, request_id: int, txn: tuple[int, int], error: int | None = None,
                     text: str = "") -> pb.BaseCommand:
    body = pb.CommandAckResponse(consumer_id=consumer_id, request_id=request_id,
                                 txnid_most_bits=txn[0], txnid_least_bits=txn[1])
    if error is not None:
        body.error = error
        body.message = text
    return wrap(body)


def end_txn_on_partition(request_id: int, txn: tuple[int, int], topic: str, commit: bool) -> pb.BaseCommand:
    return wrap(pb.CommandEndTxnOnPartition(request_id=request_id, txnid_most_bits=txn[0], txnid_least_bits=txn[1],
                                            topic=topic, txn_action=pb.COMMIT if commit else pb.ABORT))


def end_txn_on_subscription(request_id: int, txn: tuple[int, int], topic: str, subscription: str,
                            commit: bool) -> pb.BaseCommand:
    return wrap(pb.CommandEndTxnOnSubscription(
        request_id=request_id, txnid_most_bits=txn[0], txnid_least_bits=txn[1],
        subscription=pb.Subscription(topic=topic, subscription=subscription),
        txn_action=pb.COMMIT if commit else pb.ABORT))
