"""One client connection (broker/connection.py): closing a producer or consumer that
is still being created, frames after a close, and the bound on requests in progress.

What it proves: CLOSE_PRODUCER / CLOSE_CONSUMER for one whose creation is still in
progress are answered with success, and the creation then attaches nothing (before the
fix it went on and registered a producer or consumer that nobody would close); a
PRODUCER sent again with the same id after such a close is created normally; frames
that arrive in the same chunk after one that closed the connection are not handled;
past ``pending_requests_per_connection_max`` requests in progress, LOOKUP and
PARTITIONED_METADATA get their own failure responses and other requests an ERROR,
each with ServerError TooManyRequests, and requests are served again once some finish;
a SUBSCRIBE to a subscription that another client is unsubscribing (its dispatcher
closed, its cursor being deleted) is refused with ServiceNotReady and succeeds once the
deletion is done (before the fix the consumer was added to the closed dispatcher of a
subscription about to leave the topic, and never received a message).

How: a real ServerConnection and BrokerService over the in-memory metadata store and
FakeLedgerClient, with a fake transport that records what the broker writes (and, like
asyncio's, reports connection_lost on a later loop iteration after close()); a gated
ownership manager holds topic loads and lookups where the test wants them.
"""

from __future__ import annotations

import asyncio

from protocol import commands
from protocol.codec import NEED_DATA, CommandDecoder, encode_command, encode_payload_command
from broker.config import BrokerConfig
from runtime import write_batch
from broker.connection import ServerConnection
from managed_ledger.managed_ledger import ManagedLedgerConfig
from protocol.proto import pulsar_api_pb2 as pb
from broker.service import BrokerService
from common.topic_name import TopicName
from metadata import keys
from metadata.memory_store import MemoryStore
from metadata.store import Delete
from tests.unit.fake_ledger_client import FakeLedgerClient

T = pb.BaseCommand
TOPIC = "persistent://public/default/connected"
TIMEOUT_S = 5.0


class GatedOwnership:
    """This broker owns everything; ``ensure_serving`` and ``owner_of`` wait for
    ``gate``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()

    async def ensure_serving(self, topic: TopicName) -> None:
        await self.gate.wait()

    async def is_serving(self, topic: TopicName) -> bool:
        return True

    async def owner_of(self, topic: TopicName, broker_urls):
        await self.gate.wait()
        raise AssertionError("not reached in these tests")


class FakeTransport(asyncio.Transport):
    def __init__(self, protocol: ServerConnection) -> None:
        super().__init__()
        self._protocol = protocol
        self._closing = False
        self.written = bytearray()
        self.writes = 0              # write / writelines calls: sends on a real socket

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 4000) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def write(self, data) -> None:
        self.writes += 1
        self.written += data

    def writelines(self, buffers) -> None:
        self.writes += 1
        for buffer in buffers:
            self.written += buffer

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Client:
    """Feeds frames to a connection and reads back what it answered."""

    def __init__(self, connection: ServerConnection, transport: FakeTransport) -> None:
        self.connection = connection
        self.transport = transport
        self._decoder = CommandDecoder(frame_bytes_max=connection.config.frame_bytes_max)
        self._read = 0

    def send(self, *bodies) -> None:
        """Delivers the commands in one chunk, as one socket read would."""
        self.connection.data_received(b"".join(encode_command(commands.wrap(body)) for body in bodies))

    def answers(self) -> list[pb.BaseCommand]:
        self._decoder.feed(bytes(self.transport.written[self._read:]))
        self._read = len(self.transport.written)
        out = []
        while (frame := self._decoder.next_command()) is not NEED_DATA:
            out.append(frame.command)
        return out


class GatedStore(MemoryStore):
    """The in-memory etcd, except that deleting a cursor record waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def transaction(self, compares, operations):
        if any(isinstance(op, Delete) and op.key.startswith(keys.CURSORS) for op in operations):
            self.waiting += 1
            try:
                await self.gate.wait()
            finally:
                self.waiting -= 1
        return await super().transaction(compares, operations)


async def connected(*, requests_max: int = 1000, store: MemoryStore | None = None) -> tuple[BrokerService, Client]:
    config = BrokerConfig(metadata_url="memory://", managed_ledger=ManagedLedgerConfig(1, 1, 1),
                          retention_check_interval_s=3600, pending_requests_per_connection_max=requests_max)
    service = BrokerService(config, store or MemoryStore(), FakeLedgerClient(), topic_ownership=GatedOwnership())
    await service.start()
    return service, connect(service)


def connect(service: BrokerService) -> Client:
    connection = ServerConnection(service)
    transport = FakeTransport(connection)
    connection.connection_made(transport)
    client = Client(connection, transport)
    client.send(pb.CommandConnect(client_version="test", protocol_version=pb.v21))
    (answer,) = client.answers()
    assert answer.type == T.CONNECTED
    return client


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.001)


async def test_close_producer_while_it_is_being_created_attaches_nothing():
    """CLOSE_PRODUCER while the PRODUCER's topic is still loading is answered with
    success; when the load completes, no producer is attached to the topic or the
    connection and PRODUCER is not answered with success."""
    service, client = await connected()
    service.topic_ownership.gate.clear()
    client.send(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1, producer_name="p"))
    await settle()
    client.send(pb.CommandCloseProducer(producer_id=1, request_id=2))
    answers = client.answers()
    assert [(a.type, a.success.request_id) for a in answers] == [(T.SUCCESS, 2)]
    service.topic_ownership.gate.set()
    topic = await service.get_topic(TopicName.parse(TOPIC), create=True)
    await settle()
    assert [a.type for a in client.answers()] == []
    assert topic.producers == {}
    assert client.connection.producers == {}
    assert client.connection._pending_producers == {}

    client.send(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=3, producer_name="p"))
    await settle()
    (answer,) = client.answers()
    assert answer.type == T.PRODUCER_SUCCESS and answer.producer_success.request_id == 3
    assert [p.name for p in topic.producers.values()] == ["p"]
    client.transport.close()
    await service.close()


async def test_close_consumer_while_it_is_subscribing_attaches_nothing():
    """CLOSE_CONSUMER while the SUBSCRIBE's topic is still loading is answered with
    success; when the load completes, the subscription (if any) has no consumer and
    the connection none either."""
    service, client = await connected()
    service.topic_ownership.gate.clear()
    client.send(pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=pb.CommandSubscribe.Shared,
                                    consumer_id=7, request_id=1))
    await settle()
    client.send(pb.CommandCloseConsumer(consumer_id=7, request_id=2))
    answers = client.answers()
    assert [(a.type, a.success.request_id) for a in answers] == [(T.SUCCESS, 2)]
    service.topic_ownership.gate.set()
    topic = await service.get_topic(TopicName.parse(TOPIC), create=True)
    await settle()
    assert [a.type for a in client.answers()] == []
    assert all(not s.consumers for s in topic.subscriptions.values())
    assert client.connection.consumers == {}
    assert client.connection._pending_consumers == {}
    client.transport.close()
    await service.close()


async def test_a_read_s_entries_are_flushed_to_the_bookies_once_at_its_end():
    """The SENDs of one socket read are all appended before the ledger client is told
    to send its queued adds (LedgerClient.flush_adds), once per read: the entries of a
    read leave in that turn and together."""
    service, client = await connected()
    client.send(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1, producer_name="p"))
    await settle()
    assert [a.type for a in client.answers()] == [T.PRODUCER_SUCCESS]
    ledgers = service.ledger_client
    flushes = ledgers.flushes
    client.connection.data_received(b"".join(
        encode_payload_command(commands.wrap(pb.CommandSend(producer_id=1, sequence_id=n, num_messages=1)),
                               pb.MessageMetadata(producer_name="p", sequence_id=n, publish_time=1), b"m")
        for n in range(3)))
    assert ledgers.flushes == flushes + 1
    assert ledgers.submitted_at_flush == ledgers.submitted >= 3
    await settle()
    assert sorted(a.send_receipt.sequence_id for a in client.answers() if a.type == T.SEND_RECEIPT) == [0, 1, 2]
    client.transport.close()
    await service.close()


async def test_what_one_read_causes_leaves_in_one_write():
    """Three PINGs in one socket read: three PONGs in one write (runtime/write_batch.py)."""
    service, client = await connected()
    writes = client.transport.writes
    client.send(pb.CommandPing(), pb.CommandPing(), pb.CommandPing())
    assert client.transport.writes == writes + 1
    assert [a.type for a in client.answers()] == [T.PONG] * 3
    client.transport.close()
    await service.close()


async def test_entries_confirmed_together_leave_with_their_receipts_in_one_write():
    """A bookie reply that confirms three entries is handled inside one write batch
    (ledger/add_socket_connection.py): the dispatch of the entries to a consumer and
    the producer's receipts, on the same connection (one client process), leave in one
    write, each entry before its receipt (the handle confirms entries one by one; for
    each, the dispatcher is woken before the receipt is written)."""
    service, client = await connected()
    ledgers = service.ledger_client
    ledgers.eager_adds = True
    client.send(pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=pb.CommandSubscribe.Exclusive,
                                    consumer_id=1, request_id=1))
    client.send(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=2, producer_name="p"))
    await settle()
    assert sorted(a.type for a in client.answers()) == sorted([T.SUCCESS, T.PRODUCER_SUCCESS])
    client.send(pb.CommandFlow(consumer_id=1, messagePermits=100))
    await settle()
    ledgers.hold_adds = True
    client.connection.data_received(b"".join(
        encode_payload_command(commands.wrap(pb.CommandSend(producer_id=1, sequence_id=n, num_messages=1)),
                               pb.MessageMetadata(producer_name="p", sequence_id=n, publish_time=1), b"m")
        for n in range(3)))
    await settle()
    assert client.answers() == []
    writes = client.transport.writes
    with write_batch.batched_writes():
        ledgers.release_adds()
    assert client.transport.writes == writes + 1
    answers = client.answers()
    assert [a.type for a in answers] == [T.MESSAGE, T.SEND_RECEIPT] * 3
    assert [a.send_receipt.sequence_id for a in answers[1::2]] == [0, 1, 2]
    client.transport.close()
    await service.close()


async def test_frames_after_a_closing_frame_are_not_handled():
    """A command before CONNECT closes the connection; a CONNECT that came in the same
    chunk is not handled (before the fix the loop went on until connection_lost)."""
    config = BrokerConfig(metadata_url="memory://", managed_ledger=ManagedLedgerConfig(1, 1, 1))
    service = BrokerService(config, MemoryStore(), FakeLedgerClient())
    connection = ServerConnection(service)
    transport = FakeTransport(connection)
    connection.connection_made(transport)
    client = Client(connection, transport)
    client.send(pb.CommandLookupTopic(topic=TOPIC, request_id=1),
                pb.CommandConnect(client_version="test", protocol_version=pb.v21))
    assert transport.is_closing()
    assert not connection.connected
    assert [a.type for a in client.answers()] == [T.ERROR]
    await settle()
    assert connection.closed


async def test_requests_past_the_bound_are_refused_with_too_many_requests():
    """With a bound of 2 and two lookups held, a third LOOKUP, a PARTITIONED_METADATA
    and a PRODUCER are each refused at once with TooManyRequests in their own response
    form; once the held lookups finish, a request is served again."""
    service, client = await connected(requests_max=2)
    service.topic_ownership.gate.clear()
    client.send(pb.CommandLookupTopic(topic=TOPIC, request_id=1), pb.CommandLookupTopic(topic=TOPIC, request_id=2))
    await settle()
    assert client.answers() == []
    client.send(pb.CommandLookupTopic(topic=TOPIC, request_id=3),
                pb.CommandPartitionedTopicMetadata(topic=TOPIC, request_id=4),
                pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=5))
    lookup, metadata, producer = client.answers()
    assert lookup.type == T.LOOKUP_RESPONSE
    assert lookup.lookupTopicResponse.request_id == 3
    assert lookup.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed
    assert lookup.lookupTopicResponse.error == pb.TooManyRequests
    assert metadata.type == T.PARTITIONED_METADATA_RESPONSE
    assert metadata.partitionMetadataResponse.request_id == 4
    assert metadata.partitionMetadataResponse.error == pb.TooManyRequests
    assert producer.type == T.ERROR
    assert (producer.error.request_id, producer.error.error) == (5, pb.TooManyRequests)

    for task in list(client.connection._tasks):   # the held lookups end (e.g. the client left)
        task.cancel()
    await settle()
    service.topic_ownership.gate.set()
    client.send(pb.CommandPartitionedTopicMetadata(topic=TOPIC, request_id=6))
    await settle()
    (served,) = client.answers()
    assert served.partitionMetadataResponse.request_id == 6
    assert served.partitionMetadataResponse.response == pb.CommandPartitionedTopicMetadataResponse.Success
    client.transport.close()
    await service.close()


async def test_subscribe_while_the_subscription_is_being_deleted_is_refused_then_served():
    """Client A unsubscribes the only consumer of shared subscription "s"; the deletion
    is held while it deletes the cursor record. Client B's SUBSCRIBE to "s" meanwhile is
    refused with ServiceNotReady (a client retries that); once the deletion is done, B's
    next SUBSCRIBE creates "s" anew and B's consumer is attached to the subscription the
    topic lists."""
    store = GatedStore()
    service, first = await connected(store=store)
    second = connect(service)
    shared = pb.CommandSubscribe.Shared
    first.send(pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=shared, consumer_id=1, request_id=1))
    await settle()
    assert [a.type for a in first.answers()] == [T.SUCCESS]
    topic = service.loaded_topic(TopicName.parse(TOPIC))

    store.gate.clear()
    first.send(pb.CommandUnsubscribe(consumer_id=1, request_id=2))
    async with asyncio.timeout(TIMEOUT_S):
        while store.waiting == 0:
            await asyncio.sleep(0.001)
    second.send(pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=shared, consumer_id=7, request_id=3))
    await settle()
    (refused,) = second.answers()
    assert refused.type == T.ERROR, "a consumer was attached to a subscription being deleted"
    assert (refused.error.request_id, refused.error.error) == (3, pb.ServiceNotReady)

    store.gate.set()
    await settle()
    assert [(a.type, a.success.request_id) for a in first.answers()] == [(T.SUCCESS, 2)]
    second.send(pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=shared, consumer_id=7, request_id=4))
    await settle()
    assert [(a.type, a.success.request_id) for a in second.answers()] == [(T.SUCCESS, 4)]
    attached = second.connection.consumers[7]
    assert topic.subscriptions["s"] is attached.subscription
    assert attached.consumer in attached.subscription.consumers
    first.transport.close()
    second.transport.close()
    await service.close()


async def test_ack_and_seek_ids_past_a_java_long_are_refused():
    """Found by the live fuzz: a cumulative ACK or a SEEK naming a ledger id above
    2**63 - 1 reached the cursor, whose records store signed 64-bit ids, and every
    later flush failed. Such ids are refused at the connection (InvalidArgument);
    MessageId.earliest ((-1, -1) as uint64s) still seeks."""
    service, client = await connected()
    client.send(pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=pb.CommandSubscribe.Exclusive,
                                    consumer_id=7, request_id=1))
    await settle()
    assert [a.type for a in client.answers()] == [T.SUCCESS]
    huge = pb.MessageIdData(ledgerId=2**64 - 2, entryId=0)
    client.send(pb.CommandAck(consumer_id=7, ack_type=pb.CommandAck.Cumulative, message_id=[huge], request_id=2),
                pb.CommandSeek(consumer_id=7, request_id=3, message_id=huge))
    await settle()
    answers = client.answers()
    assert [(a.type, a.error.request_id if a.type == T.ERROR else a.ackResponse.request_id) for a in answers] == \
        [(T.ERROR, 2), (T.ERROR, 3)], answers
    client.send(pb.CommandSeek(consumer_id=7, request_id=4, message_id=pb.MessageIdData(ledgerId=2**64 - 1,
                                                                                       entryId=2**64 - 1)))
    await settle()
    assert T.ERROR not in [a.type for a in client.answers()]
    client.transport.close()
    await service.close()


async def test_aborting_the_connections_drops_them_without_a_word_and_the_peer_is_reset():
    """A fence's abort_connections (issue 32) on real loopback sockets: the broker
    writes nothing more (no CLOSE_PRODUCER), forgets the connection and its producer,
    and the client's next packet is answered with a reset, as after a partition heals."""
    service = BrokerService(BrokerConfig(metadata_url="memory://", managed_ledger=ManagedLedgerConfig(1, 1, 1),
                                         retention_check_interval_s=3600), MemoryStore(), FakeLedgerClient(),
                            topic_ownership=GatedOwnership())
    await service.start()
    server = await asyncio.get_running_loop().create_server(lambda: ServerConnection(service), "127.0.0.1", 0)
    writer = None
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        decoder = CommandDecoder(frame_bytes_max=service.config.frame_bytes_max)

        async def answer() -> pb.BaseCommand:
            while (frame := decoder.next_command()) is NEED_DATA:
                data = await asyncio.wait_for(reader.read(65536), TIMEOUT_S)
                assert data, "the broker closed the connection"
                decoder.feed(data)
            return frame.command

        writer.write(encode_command(commands.wrap(pb.CommandConnect(client_version="test", protocol_version=pb.v21))))
        assert (await answer()).type == T.CONNECTED
        writer.write(encode_command(commands.wrap(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1,
                                                                     producer_name="p"))))
        assert (await answer()).type == T.PRODUCER_SUCCESS
        topic = await service.get_topic(TopicName.parse(TOPIC), create=True)
        assert len(service.connections) == 1 and len(topic.producers) == 1

        service.abort_connections()
        await settle()
        assert service.connections == set()
        assert topic.producers == {}
        # Nothing more was written: the stream ends (or is reset) with no frame.
        try:
            rest = await asyncio.wait_for(reader.read(65536), TIMEOUT_S)
        except ConnectionResetError:
            rest = b""
        assert rest == b"", rest
        # The client's next packet finds no socket to take it: a reset.
        reset = False
        for _ in range(50):
            try:
                writer.write(encode_command(commands.wrap(pb.CommandPing())))
                await writer.drain()
                await asyncio.wait_for(reader.read(65536), 0.1)
            except (ConnectionResetError, BrokenPipeError):
                reset = True
                break
            except asyncio.TimeoutError:
                pass
        assert reset, "the peer was never reset"
    finally:
        if writer is not None:
            writer.close()
        server.close()
        await service.close()
