"""A transactional Pulsar client at the wire level, for the transaction tests.

Why not the official Python client: pulsar-client 3.x for Python (and the C++ library
under it, which its wheels embed) has no transaction API at all — no
``new_transaction``, no ``txn`` argument on send or acknowledge; only the Java and Go
clients have one. So this speaks the commands in the order the Java client sends them
(``TransactionCoordinatorClientImpl``, ``TransactionImpl``): the assign topic's
partition metadata, a lookup of each coordinator's partition and
TC_CLIENT_CONNECT_REQUEST, NEW_TXN (its ``txn_ttl_seconds`` field carries
milliseconds, as the Java client sends it), ADD_PARTITION_TO_TXN before the first send
to a topic, SEND with the transaction id in the command and in the message metadata,
ADD_SUBSCRIPTION_TO_TXN before the first acknowledgement on a subscription, ACK with
the id and a request id (answered by ACK_RESPONSE), END_TXN. The tests check what
other consumers see with the official client.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

from protocol.codec import NEED_DATA, CommandDecoder, encode_command, encode_payload_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import error_for_server_error

T = pb.BaseCommand
ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
REQUEST_TIMEOUT_S = 30.0
_ANSWER_FIELDS = {
    T.PARTITIONED_METADATA_RESPONSE: "partitionMetadataResponse", T.LOOKUP_RESPONSE: "lookupTopicResponse",
    T.SUCCESS: "success", T.ERROR: "error", T.PRODUCER_SUCCESS: "producer_success",
    T.TC_CLIENT_CONNECT_RESPONSE: "tcClientConnectResponse", T.NEW_TXN_RESPONSE: "newTxnResponse",
    T.ADD_PARTITION_TO_TXN_RESPONSE: "addPartitionToTxnResponse",
    T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE: "addSubscriptionToTxnResponse", T.END_TXN_RESPONSE: "endTxnResponse",
    T.ACK_RESPONSE: "ackResponse",
}


class TxnError(Exception):
    """An answer carrying a ServerError: ``error`` is its catalogue error."""

    def __init__(self, server_error: int, message: str) -> None:
        self.server_error = server_error
        self.error = error_for_server_error(server_error, message)
        super().__init__(f"{pb.ServerError.Name(server_error)}: {message}")


@dataclass
class Received:
    ledger_id: int
    entry_id: int
    payload: bytes
    metadata: pb.MessageMetadata
    redelivery_count: int = 0


@dataclass
class Transaction:
    most: int
    least: int
    partitions: set[str] = field(default_factory=set)
    subscriptions: set[tuple[str, str]] = field(default_factory=set)
    # The connection to the coordinator's broker (ADD_*_TO_TXN go there, as the Java
    # client sends them: sends and acks go to the topic's owner, which may be another).
    via: "WireConnection | None" = None


class WireConnection:
    def __init__(self, service_url: str, token: str | None = None) -> None:
        """``token``: presented in CONNECT (method ``token``) when given."""
        self.token = token
        url = urlparse(service_url)
        self.url = service_url
        self.host, self.port = url.hostname, url.port
        self.request_ids = itertools.count(1)
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[pb.BaseCommand]] = {}
        self.receipts: dict[tuple[int, int], asyncio.Future[pb.BaseCommand]] = {}
        self.messages: dict[int, asyncio.Queue[Received]] = {}
        self.reader_task: asyncio.Task[None] | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.transactions: dict[int, str] = {}   # coordinator id -> its owner's URL

    async def open(self) -> "WireConnection":
        reader, self.writer = await asyncio.open_connection(self.host, self.port)
        connect = pb.CommandConnect(client_version="txn-wire-test", protocol_version=pb.v20)
        if self.token is not None:
            connect.auth_method_name = "token"
            connect.auth_data = self.token.encode()
        self.writer.write(encode_command(wrap(connect)))
        decoder = CommandDecoder(frame_bytes_max=5 * 1024 * 1024)
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                raise ConnectionError("the broker closed the connection before CONNECTED")
            decoder.feed(chunk)
            frame = decoder.next_command()
            if frame is not NEED_DATA:
                if frame.command.type != T.CONNECTED:
                    raise TxnError(frame.command.error.error, frame.command.error.message) \
                        if frame.command.type == T.ERROR else ConnectionError(str(frame.command))
                break
        self.reader_task = asyncio.get_running_loop().create_task(self._read(reader, decoder))
        return self

    async def _read(self, reader: asyncio.StreamReader, decoder: CommandDecoder) -> None:
        while True:
            while (frame := decoder.next_command()) is not NEED_DATA:
                command = frame.command
                if command.type == T.PING:
                    self.writer.write(encode_command(wrap(pb.CommandPong())))
                elif command.type in (T.SEND_RECEIPT, T.SEND_ERROR):
                    body = command.send_receipt if command.type == T.SEND_RECEIPT else command.send_error
                    future = self.receipts.pop((body.producer_id, body.sequence_id), None)
                    if future is not None and not future.done():
                        future.set_result(command)
                elif command.type == T.MESSAGE:
                    message = command.message
                    queue = self.messages.get(message.consumer_id)
                    if queue is not None:
                        queue.put_nowait(Received(message.message_id.ledgerId, message.message_id.entryId,
                                                  bytes(frame.payload.payload), frame.payload.metadata,
                                                  message.redelivery_count))
                elif command.type in _ANSWER_FIELDS:
                    future = self.waiting.pop(getattr(command, _ANSWER_FIELDS[command.type]).request_id, None)
                    if future is not None and not future.done():
                        future.set_result(command)
            chunk = await reader.read(65536)
            if not chunk:
                for future in [*self.waiting.values(), *self.receipts.values()]:
                    if not future.done():
                        future.set_exception(ConnectionError("broker closed the connection"))
                return
            decoder.feed(chunk)

    async def request(self, body) -> pb.BaseCommand:
        future = asyncio.get_running_loop().create_future()
        self.waiting[body.request_id] = future
        self.writer.write(encode_command(wrap(body)))
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            answer = await future
        if answer.type == T.ERROR:
            raise TxnError(answer.error.error, answer.error.message)
        inner = getattr(answer, _ANSWER_FIELDS[answer.type])
        if answer.type not in (T.LOOKUP_RESPONSE, T.PARTITIONED_METADATA_RESPONSE) \
                and "error" in inner.DESCRIPTOR.fields_by_name and inner.HasField("error"):
            raise TxnError(inner.error, inner.message)
        return answer

    async def close(self) -> None:
        if self.reader_task is not None:
            self.reader_task.cancel()
        if self.writer is not None:
            self.writer.close()

    # --- the coordinator ---------------------------------------------------------------------------

    async def connect_coordinators(self) -> int:
        answer = await self.request(pb.CommandPartitionedTopicMetadata(topic=ASSIGN_TOPIC,
                                                                       request_id=next(self.request_ids)))
        metadata = answer.partitionMetadataResponse
        if metadata.response == pb.CommandPartitionedTopicMetadataResponse.Failed:
            raise TxnError(metadata.error, metadata.message)
        count = metadata.partitions
        assert count > 0, f"{ASSIGN_TOPIC} has no partitions: no transaction coordinators"
        for coordinator_id in range(count):
            self.transactions[coordinator_id] = await self.lookup(f"{ASSIGN_TOPIC}-partition-{coordinator_id}")
            if self.transactions[coordinator_id] == self.url:
                await self.request(pb.CommandTcClientConnectRequest(request_id=next(self.request_ids),
                                                                    tc_id=coordinator_id))
        return count

    async def lookup(self, topic: str) -> str:
        """The owner's service URL (a Connect answer; the broker answers lookups of
        topics others own with their URL)."""
        answer = await self.request(pb.CommandLookupTopic(topic=topic, request_id=next(self.request_ids),
                                                          authoritative=True))
        body = answer.lookupTopicResponse
        if body.response == pb.CommandLookupTopicResponse.Failed:
            raise TxnError(body.error, body.message)
        return body.brokerServiceUrl

    async def new_txn(self, timeout_ms: int, coordinator_id: int = 0) -> Transaction:
        answer = await self.request(pb.CommandNewTxn(request_id=next(self.request_ids), txn_ttl_seconds=timeout_ms,
                                                     tc_id=coordinator_id))
        body = answer.newTxnResponse
        return Transaction(body.txnid_most_bits, body.txnid_least_bits, via=self)

    async def add_partition(self, txn: Transaction, topic: str) -> None:
        await self.request(pb.CommandAddPartitionToTxn(request_id=next(self.request_ids), txnid_most_bits=txn.most,
                                                       txnid_least_bits=txn.least, partitions=[topic]))
        txn.partitions.add(topic)

    async def add_subscription(self, txn: Transaction, topic: str, subscription: str) -> None:
        await self.request(pb.CommandAddSubscriptionToTxn(
            request_id=next(self.request_ids), txnid_most_bits=txn.most, txnid_least_bits=txn.least,
            subscription=[pb.Subscription(topic=topic, subscription=subscription)]))
        txn.subscriptions.add((topic, subscription))

    async def end(self, txn: Transaction, *, commit: bool) -> None:
        await self.request(pb.CommandEndTxn(request_id=next(self.request_ids), txnid_most_bits=txn.most,
                                            txnid_least_bits=txn.least,
                                            txn_action=pb.COMMIT if commit else pb.ABORT))

    # --- producing and consuming -------------------------------------------------------------------

    async def producer(self, topic: str) -> "WireProducer":
        producer_id = next(self.ids)
        await self.request(pb.CommandProducer(topic=topic, producer_id=producer_id,
                                              request_id=next(self.request_ids)))
        return WireProducer(self, topic, producer_id)

    async def subscribe(self, topic: str, subscription: str, *, permits: int = 1000,
                        sub_type: int = pb.CommandSubscribe.Shared) -> "WireConsumer":
        consumer_id = next(self.ids)
        self.messages[consumer_id] = asyncio.Queue()
        await self.request(pb.CommandSubscribe(topic=topic, subscription=subscription, subType=sub_type,
                                               consumer_id=consumer_id, request_id=next(self.request_ids),
                                               initialPosition=pb.CommandSubscribe.Earliest))
        self.writer.write(encode_command(wrap(pb.CommandFlow(consumer_id=consumer_id, messagePermits=permits))))
        return WireConsumer(self, topic, subscription, consumer_id)


class WireProducer:
    def __init__(self, connection: WireConnection, topic: str, producer_id: int) -> None:
        self.connection = connection
        self.topic = topic
        self.producer_id = producer_id
        self.sequence_ids = itertools.count(0)

    async def send(self, payload: bytes, txn: Transaction | None = None, *,
                   stamp_metadata: bool = True) -> tuple[int, int]:
        """Sends one message (in ``txn``: adds the partition first, as the Java client
        does) and returns its message id; TxnError when refused."""
        connection = self.connection
        if txn is not None and self.topic not in txn.partitions:
            await (txn.via or connection).add_partition(txn, self.topic)
        sequence_id = next(self.sequence_ids)
        send = pb.CommandSend(producer_id=self.producer_id, sequence_id=sequence_id, num_messages=1)
        metadata = pb.MessageMetadata(producer_name=f"wire-{self.producer_id}", sequence_id=sequence_id,
                                      publish_time=int(time.time() * 1000))
        if txn is not None:
            send.txnid_most_bits, send.txnid_least_bits = txn.most, txn.least
            if stamp_metadata:
                metadata.txnid_most_bits, metadata.txnid_least_bits = txn.most, txn.least
        future = asyncio.get_running_loop().create_future()
        connection.receipts[(self.producer_id, sequence_id)] = future
        connection.writer.write(encode_payload_command(wrap(send), metadata, payload))
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            answer = await future
        if answer.type == T.SEND_ERROR:
            raise TxnError(answer.send_error.error, answer.send_error.message)
        message_id = answer.send_receipt.message_id
        return message_id.ledgerId, message_id.entryId


class WireConsumer:
    def __init__(self, connection: WireConnection, topic: str, subscription: str, consumer_id: int) -> None:
        self.connection = connection
        self.topic = topic
        self.subscription = subscription
        self.consumer_id = consumer_id

    async def receive(self, timeout_s: float = 10.0) -> Received:
        async with asyncio.timeout(timeout_s):
            received = await self.connection.messages[self.consumer_id].get()
        self.connection.writer.write(encode_command(wrap(pb.CommandFlow(consumer_id=self.consumer_id,
                                                                        messagePermits=1))))
        return received

    async def ack(self, message: Received, txn: Transaction | None = None, *, cumulative: bool = False,
                  ack_set: tuple[int, ...] | None = None, batch_size: int | None = None) -> None:
        """Acknowledges ``message`` (``cumulative``: it and everything before it), in
        ``txn`` when given (adding the subscription first, as the Java client does);
        ``ack_set``: only some messages of a batch entry (the words of those left
        unacknowledged, with ``batch_size``), as a batch-index acknowledgement."""
        connection = self.connection
        if txn is not None and (self.topic, self.subscription) not in txn.subscriptions:
            await (txn.via or connection).add_subscription(txn, self.topic, self.subscription)
        ack = pb.CommandAck(consumer_id=self.consumer_id,
                            ack_type=pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual,
                            message_id=[pb.MessageIdData(ledgerId=message.ledger_id, entryId=message.entry_id,
                                                         ack_set=list(ack_set or ()), batch_size=batch_size)],
                            request_id=next(connection.request_ids))
        if txn is not None:
            ack.txnid_most_bits, ack.txnid_least_bits = txn.most, txn.least
        await connection.request(ack)

    def redeliver_unacknowledged(self) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES for everything this consumer holds (no
        answer comes: the broker sends them again)."""
        self.connection.writer.write(encode_command(wrap(pb.CommandRedeliverUnacknowledgedMessages(
            consumer_id=self.consumer_id))))

    async def received_within(self, quiet_s: float) -> list[Received]:
        """What arrives until ``quiet_s`` passes with nothing new (permits granted back
        as ``receive`` does)."""
        got = []
        while True:
            try:
                got.append(await self.receive(timeout_s=quiet_s))
            except TimeoutError:
                return got

    async def close(self) -> None:
        connection = self.connection
        await connection.request(pb.CommandCloseConsumer(consumer_id=self.consumer_id,
                                                         request_id=next(connection.request_ids)))
        connection.messages.pop(self.consumer_id, None)
