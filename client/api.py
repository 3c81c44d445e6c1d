"""The public asyncio client (``magnetar.client``): ``Client`` and what it makes.

    client = Client("pulsar://localhost:6650")
    producer = await client.create_producer("my-topic")
    message_id = await producer.send(b"hello")
    consumer = await client.subscribe("my-topic", "my-subscription")
    message = await consumer.receive()
    await consumer.acknowledge(message)
    await client.close()

Names and arguments follow the official client's ``pulsar.asyncio`` where it has them
(docs/client.md has the table). Everything is built on the partition producers and
consumers of client/producer.py and client/consumer.py, which the gateway and the
Spark source use directly; the broker pool (client/pool.py) and its connections are
shared by everything one Client makes. Errors are the catalogue's (common/errors.py),
named here as the official client names them too.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from typing import Any, Callable, Sequence

from common import errors
from common.errors import InvalidArgument
from common.topic_name import TopicName

from client.api_consumer import (Consumer, ConsumerType, DeadLetterPolicy, InitialPosition, Message,
                                 MultiplierRedeliveryBackoff, _Source)
from client.api_producer import CompressionType, PartitionsRoutingMode, Producer, ProducerAccessMode
from client.api_reader import Reader, StartFilter
from client.api_retry import within_operation_timeout
from client.config import ClientConfig
from client.consumer import Consumer as PartitionConsumer
from client.messages import MessageId
from client.pool import BrokerPool
from client.producer import Producer as PartitionProducer
from client.schema import AvroSchema, BytesSchema, JsonSchema, Schema, StringSchema

__all__ = [
    "Client", "Producer", "Consumer", "Reader", "Message", "MessageId", "ConsumerType", "InitialPosition",
    "CompressionType", "PartitionsRoutingMode", "ProducerAccessMode", "DeadLetterPolicy", "MultiplierRedeliveryBackoff",
    "AuthenticationToken", "AuthenticationBasic", "AuthenticationTLS", "TLS", "Schema", "BytesSchema", "StringSchema", "JsonSchema", "AvroSchema",
    "PulsarException", "Timeout", "TopicNotFound", "ProducerBusy", "ConsumerBusy", "ProducerQueueIsFull",
    "AuthenticationError", "AuthorizationError", "IncompatibleSchema", "AlreadyClosed", "NotConnected",
    "ProducerFenced", "TopicTerminated", "InvalidConfiguration", "SubscriptionNotFound",
]

# --- message ids at the ends of a topic (the official MessageId.earliest / .latest) ----------

MessageId.earliest = MessageId(-1, -1)                               # type: ignore[attr-defined]
MessageId.latest = MessageId(0x7FFF_FFFF_FFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF)   # type: ignore[attr-defined]

# --- exceptions: the catalogue's classes under the official client's names -----------------

PulsarException = errors.MagnetarError
Timeout = errors.OperationTimeout
TopicNotFound = errors.TopicNotFound
ProducerBusy = errors.ProducerBusy
ConsumerBusy = errors.ConsumerBusy
ProducerQueueIsFull = errors.TooManyRequests
AuthenticationError = errors.AuthenticationFailed
AuthorizationError = errors.AuthorizationDenied
IncompatibleSchema = errors.IncompatibleSchema
AlreadyClosed = errors.ShuttingDown
NotConnected = errors.ServiceNotReady
ProducerFenced = errors.ProducerFenced
TopicTerminated = errors.TopicTerminated
InvalidConfiguration = errors.InvalidArgument
SubscriptionNotFound = errors.SubscriptionNotFound


# --- authentication -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AuthenticationToken:
    """A JWT (or a callable returning the current one, asked at every connection and
    every AUTH_CHALLENGE)."""

    token: str | Callable[[], str] = dataclasses.field(repr=False)

    def apply(self, config: ClientConfig) -> ClientConfig:
        if callable(self.token):
            return dataclasses.replace(config, auth_token_source=self.token)
        return dataclasses.replace(config, auth_token=self.token)


@dataclasses.dataclass(frozen=True)
class AuthenticationBasic:
    username: str
    password: str = dataclasses.field(repr=False)

    def apply(self, config: ClientConfig) -> ClientConfig:
        return dataclasses.replace(config, auth_basic=f"{self.username}:{self.password}")


@dataclasses.dataclass(frozen=True)
class AuthenticationTLS:
    """Mutual TLS: this client's certificate and key; the broker takes the role from it."""

    certificate_path: str
    private_key_path: str

    def apply(self, config: ClientConfig) -> ClientConfig:
        return dataclasses.replace(config, tls_cert_file=self.certificate_path, tls_key_file=self.private_key_path)


@dataclasses.dataclass(frozen=True)
class TLS:
    """TLS toward brokers (with a ``pulsar+ssl://`` service URL): the CA file that signs
    their certificates (None: the system's trust store), whether their host names are
    checked, and for mutual TLS this client's certificate and key (PEM files)."""

    trust_certs_file: str | None = None
    validate_hostname: bool = False
    certificate_file: str | None = None
    private_key_file: str | None = None


def _schema(schema: Schema | None) -> Schema:
    return schema if schema is not None else BytesSchema()


class Client:
    def __init__(self, service_url: str, authentication: Any = None, *, auth: Any = None, tls: TLS | None = None,
                 operation_timeout_seconds: float = 30,
                 connection_timeout_ms: int = 10_000, tls_trust_certs_file_path: str | None = None,
                 tls_validate_hostname: bool = False, tls_certificate_file_path: str | None = None,
                 tls_private_key_file_path: str | None = None, keep_alive_interval_seconds: float = 30,
                 config: ClientConfig | None = None) -> None:
        """``service_url``: pulsar://host:port[,host:port] (brokers or a proxy), or
        pulsar+ssl:// for TLS. ``auth`` (or ``authentication``, the official client's
        name): AuthenticationToken, AuthenticationBasic or AuthenticationTLS. ``tls``:
        a TLS (or the official client's tls_* arguments). ``config`` sets every other
        limit (client/config.py)."""
        if auth is not None and authentication is not None:
            raise InvalidArgument("give auth or authentication, not both")
        authentication = auth if auth is not None else authentication
        if tls is not None:
            tls_trust_certs_file_path = tls.trust_certs_file or tls_trust_certs_file_path
            tls_validate_hostname = tls.validate_hostname
            tls_certificate_file_path = tls.certificate_file or tls_certificate_file_path
            tls_private_key_file_path = tls.private_key_file or tls_private_key_file_path
        config = config or ClientConfig()
        config = dataclasses.replace(
            config, operation_timeout_ms=int(operation_timeout_seconds * 1000), connect_timeout_ms=connection_timeout_ms,
            keepalive_interval_s=keep_alive_interval_seconds, tls_hostname_verification=tls_validate_hostname,
            tls_trust_certs_file=tls_trust_certs_file_path or config.tls_trust_certs_file)
        if tls_certificate_file_path or tls_private_key_file_path:
            config = dataclasses.replace(config, tls_cert_file=tls_certificate_file_path or "",
                                         tls_key_file=tls_private_key_file_path or "")
        if authentication is not None:
            config = authentication.apply(config)
        self.config = config
        self._pool = BrokerPool(service_url, config)
        self._producers: set[Producer] = set()
        self._consumers: set[Any] = set()
        self._loose: set[PartitionProducer] = set()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def get_topic_partitions(self, topic: str) -> list[str]:
        """The partition names of ``topic``, or [topic] when it is not partitioned."""
        name = str(TopicName.parse(topic))
        count = await within_operation_timeout(self.config, lambda: self._pool.partitions(name),
                                               f"partitions of {name}")
        return [f"{name}-partition-{index}" for index in range(count)] if count else [name]

    # --- producers ----------------------------------------------------------------------------

    async def create_producer(self, topic: str, producer_name: str | None = None, schema: Schema | None = None,
                              initial_sequence_id: int | None = None, send_timeout_millis: int = 30_000,
                              compression_type: CompressionType = CompressionType.NONE,
                              max_pending_messages: int = 1_000, block_if_queue_full: bool = False,
                              batching_enabled: bool = True, batching_max_messages: int = 1_000,
                              batching_max_allowed_size_in_bytes: int = 128 * 1024,
                              batching_max_publish_delay_ms: int = 10,
                              message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
                              message_router: Callable | None = None,
                              access_mode: ProducerAccessMode = ProducerAccessMode.Shared) -> Producer:
        schema = _schema(schema)
        partitions = await self.get_topic_partitions(topic)
        made: list[PartitionProducer] = []
        try:
            for index, name in enumerate(partitions):
                # A partitioned topic's producers share one name, as the official client's do.
                given = producer_name if producer_name or index == 0 else made[0].producer_name
                partition = PartitionProducer(self._pool, name, producer_name=given or "", access_mode=int(access_mode),
                                              schema=schema.schema_info(), compression=int(compression_type),
                                              resume_sequence_ids=True)
                if initial_sequence_id is not None:
                    partition.set_next_sequence_id(initial_sequence_id + 1)
                await within_operation_timeout(self.config, partition.start, f"producer of {name}")
                made.append(partition)
        except BaseException:
            for partition in made:
                await partition.close()
            raise
        producer = Producer(str(TopicName.parse(topic)), made, len(partitions) > 1 or partitions[0] != str(
            TopicName.parse(topic)), schema, batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms, max_pending_messages=max_pending_messages,
            block_if_queue_full=block_if_queue_full, send_timeout_millis=send_timeout_millis,
            message_routing_mode=message_routing_mode, message_router=message_router,
            on_closed=self._producers.discard)
        self._producers.add(producer)
        return producer

    async def _partition_producer(self, topic: str) -> PartitionProducer:
        """A plain producer of one topic (the dead-letter topic's), closed by its user."""
        producer = PartitionProducer(self._pool, str(TopicName.parse(topic)))
        await producer.start()
        return producer

    # --- consumers ----------------------------------------------------------------------------

    async def subscribe(self, topic: str | Sequence[str] | re.Pattern, subscription_name: str,
                        consumer_type: ConsumerType = ConsumerType.Exclusive, schema: Schema | None = None,
                        receiver_queue_size: int = 1_000, consumer_name: str | None = None,
                        unacked_messages_timeout_ms: int | None = None,
                        negative_ack_redelivery_delay_ms: int = 60_000, ack_group_time_ms: int = 100,
                        is_read_compacted: bool = False, properties: dict | None = None,
                        initial_position: InitialPosition = InitialPosition.Latest,
                        dead_letter_policy: DeadLetterPolicy | None = None, is_pattern_topic: bool = False,
                        pattern_auto_discovery_period: float = 60.0,
                        message_listener: Callable | None = None,
                        negative_ack_redelivery_backoff: MultiplierRedeliveryBackoff | None = None) -> Consumer:
        """Subscribes to a topic (all partitions of a partitioned one), a list of
        topics, or every topic of one namespace whose name matches a pattern (a
        ``re.Pattern``, or a string with ``is_pattern_topic``). ``message_listener``:
        ``listener(consumer, message)``, a function or an ``async def``, called for
        each message in order instead of ``receive`` (client/api_consumer.py)."""
        if not subscription_name:
            raise InvalidArgument("subscription_name must not be empty")
        pattern = None
        namespace = ""
        if isinstance(topic, re.Pattern) or is_pattern_topic:
            text = topic.pattern if isinstance(topic, re.Pattern) else str(topic)
            namespace, pattern = _pattern_of(text)
            topics = await self._pattern_topics(namespace, pattern)
        else:
            names = [topic] if isinstance(topic, str) else list(topic)
            topics = [partition for name in names for partition in await self.get_topic_partitions(name)]
        schema = _schema(schema)
        sub_type = ConsumerType(consumer_type).value

        async def make_source(owner: Consumer, name: str) -> _Source:
            source = _Source(owner, name)
            source.low = PartitionConsumer(
                self._pool, name, subscription_name, sub_type=sub_type, consumer_name=consumer_name or "",
                initial_position=InitialPosition(initial_position).value, properties=properties,
                schema=schema.schema_info(), read_compacted=is_read_compacted, listener=source)
            await within_operation_timeout(self.config, source.low.start, f"consumer of {name}")
            return source

        consumer = Consumer(self, subscription_name, ConsumerType(consumer_type), schema,
                            receiver_queue_size=receiver_queue_size, ack_group_time_ms=ack_group_time_ms,
                            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                            unacked_messages_timeout_ms=unacked_messages_timeout_ms,
                            dead_letter_policy=dead_letter_policy, make_source=make_source, pattern=pattern,
                            pattern_namespace=namespace, pattern_auto_discovery_period=pattern_auto_discovery_period,
                            message_listener=message_listener,
                            negative_ack_redelivery_backoff=negative_ack_redelivery_backoff)
        await consumer._start(topics)
        self._consumers.add(consumer)
        return consumer

    async def _pattern_topics(self, namespace: str, pattern: re.Pattern) -> list[str]:
        return sorted(name for name in await self._pool.topics_of_namespace(namespace) if pattern.fullmatch(name))

    # --- readers ------------------------------------------------------------------------------

    async def create_reader(self, topic: str, start_message_id: MessageId, schema: Schema | None = None,
                            receiver_queue_size: int = 1_000, reader_name: str | None = None,
                            is_read_compacted: bool = False, start_message_id_inclusive: bool = False,
                            reader_listener: Callable | None = None) -> Reader:
        """A reader of one topic or partition from ``start_message_id`` (an id,
        ``MessageId.earliest`` or ``MessageId.latest``). ``reader_listener``:
        ``listener(reader, message)``, a function or an ``async def``, called for each
        message in order instead of ``read_next``."""
        name = str(TopicName.parse(topic))
        if await within_operation_timeout(self.config, lambda: self._pool.partitions(name), f"partitions of {name}"):
            raise InvalidArgument(f"{name} is partitioned: read one of its partitions")
        schema = _schema(schema)
        start_filter = StartFilter()
        earliest = start_message_id.ledger_id < 0
        latest = start_message_id.ledger_id >= 0x7FFF_FFFF_FFFF_FFFF
        if not earliest and not latest:
            start_filter.set(start_message_id, start_message_id_inclusive)
        subscription = f"reader-{secrets.token_hex(5)}"

        async def make_source(owner: Consumer, source_topic: str) -> _Source:
            source = _Source(owner, source_topic)
            source.low = PartitionConsumer(
                self._pool, source_topic, subscription, sub_type="exclusive", consumer_name=reader_name or "",
                initial_position="earliest" if earliest else "latest", durable=False,
                start_message_id=None if earliest or latest else start_message_id,
                schema=schema.schema_info(), read_compacted=is_read_compacted, listener=source)
            await within_operation_timeout(self.config, source.low.start, f"reader of {source_topic}")
            return source

        consumer = Consumer(self, subscription, ConsumerType.Exclusive, schema,
                            receiver_queue_size=receiver_queue_size, ack_group_time_ms=100,
                            negative_ack_redelivery_delay_ms=60_000, unacked_messages_timeout_ms=None,
                            dead_letter_policy=None, make_source=make_source, pattern=None, pattern_namespace="",
                            pattern_auto_discovery_period=60.0, message_filter=start_filter,
                            message_listener=None if reader_listener is None else
                            lambda _, message: reader_listener(reader, message))
        await consumer._start([name])
        self._consumers.add(consumer)
        # The listener's task starts with the consumer and first runs after this
        # returns (it awaits a message), so ``reader`` is bound by then.
        reader = Reader(consumer, start_filter)
        return reader

    def _forget(self, consumer: Consumer) -> None:
        self._consumers.discard(consumer)

    async def close(self) -> None:
        """Flushes and closes every producer, closes every consumer, then the connections."""
        for producer in list(self._producers):
            await producer.close()
        for consumer in list(self._consumers):
            await consumer.close()
        self._pool.close()


def _pattern_of(text: str) -> tuple[str, re.Pattern]:
    """A topic pattern → (tenant/namespace, compiled pattern on full topic names)."""
    full = text if "://" in text else f"persistent://public/default/{text}"
    domain, _, rest = full.partition("://")
    parts = rest.split("/", 2)
    if domain != "persistent" or len(parts) != 3:
        raise InvalidArgument(f"a topic pattern names its namespace: persistent://tenant/namespace/regex, "
                              f"not {text!r}")
    return f"{parts[0]}/{parts[1]}", re.compile(full)
