"""What one gateway process holds: its identity (cluster, instance id, advertised URL),
the broker pool, its producers and consumers, the HTTP client it uses to reach other
gateway instances and the broker's admin API, and the background tasks of all of
those, which ``run`` owns (one TaskGroup) and ``close`` stops.

The gateway keeps no state that outlives it: producers and consumers are remade on
demand, leases die with the process (the broker redelivers what a dead gateway held),
and receipts carry everything another instance needs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from typing import Callable

import aiohttp

from client.config import SERVICE_RECONNECT_ATTEMPTS_MAX, ClientConfig
from client.messages import OutgoingMessage, ReceivedEntry
from client.pool import BrokerPool
from common.errors import InvalidArgument, NotFound
from common.topic_name import NAME_BYTES_MAX, TopicName
from runtime.tls import TlsConfig, client_context
from runtime.tokens import TokenFile
from gateway.subscription_counts import SubscriptionCounts
from gateway.admin_client import admin_call
from gateway.config import GatewayConfig
from gateway.consumers import ConsumerKey, ConsumerPool, DeadLetterPolicy, GatewayConsumer
from gateway.json_codec import PullSpec
from gateway.idempotent import IdempotentProducers
from gateway.producers import ProducerPool, partition_topic
from gateway.receipts import IssuedReceipts, Receipt, ReceiptContext

log = logging.getLogger(__name__)

# Receipts remembered by handle (gateway/receipts.IssuedReceipts): a steady drain needs a
# few times the messages in flight. A typical handle is about 250 characters, so about
# 10 MB in all; the character bound holds it near that when names are long.
ISSUED_RECEIPTS_MAX = 20_000
ISSUED_RECEIPT_CHARS_MAX = 8_000_000


class GatewayService:
    def __init__(self, config: GatewayConfig, issuer_url: str) -> None:
        self.config = config
        self.issuer_url = issuer_url
        self.instance_id = os.urandom(8)
        self.instance_name = f"gateway-{self.instance_id.hex()}"
        # Handles issued lately, so an ack coming back here skips decoding them (bounded).
        self.issued = IssuedReceipts(ISSUED_RECEIPTS_MAX, ISSUED_RECEIPT_CHARS_MAX)
        # The gateway's own token, as it is now (a renewed file's, read again).
        self.service_token: Callable[[], str] = TokenFile(config.service_token_file).current \
            if config.service_token_file else (lambda: config.service_token)
        # A producer or consumer that cannot reconnect within the bound fails; the next
        # request makes another one (ProducerPool / ConsumerPool drop failed ones).
        self.broker_pool = BrokerPool(config.service_url, ClientConfig(
            reconnect_attempts_max=SERVICE_RECONNECT_ATTEMPTS_MAX, auth_token_source=self.service_token, tls_trust_certs_file=config.broker_tls_trust_certs_file,
            tls_hostname_verification=config.broker_tls_hostname_verification))
        self.producers = ProducerPool(self.broker_pool, config)
        self.idempotent = IdempotentProducers(self.broker_pool, self.producers.partitions, self.deduplication_enabled,
                                              producers_max=config.producers_max,
                                              timeout_s=config.produce_timeout_ms / 1000)
        self.consumers = ConsumerPool(self.broker_pool, config, self.instance_name, self._dead_letter)
        self.http: aiohttp.ClientSession | None = None
        self.requests_in_flight = [0]
        self.forward_tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        # Counters for /metrics (gateway/metrics.py reads them).
        self.messages_produced = 0
        self.messages_pulled = 0
        self.messages_acked = 0
        self.messages_nacked = 0
        self.messages_rejected = 0
        self.leases_extended = 0
        # The same per subscription, with a bounded label set (gateway/subscription_counts.py).
        self.subscription_counts = SubscriptionCounts(config.metrics_subscriptions_max)
        self.consumers.on_leases_ended = lambda key, count: self.subscription_counts.add(
            key.topic, key.subscription, "lease_ended", count)

    async def start(self) -> None:
        # The service token on every admin request (stats, backlog), as it is at the
        # request; a permission check sends the caller's token instead.
        service_token = self.service_token

        async def with_service_token(request: aiohttp.ClientRequest, handler) -> aiohttp.ClientResponse:
            token = service_token()
            if token and "Authorization" not in request.headers:
                request.headers["Authorization"] = f"Bearer {token}"
            return await handler(request)
        # An https:// admin URL is verified against the brokers' CA when one is given.
        context = client_context(TlsConfig(trust_certs_file=self.config.broker_tls_trust_certs_file),
                                 verify_hostname=self.config.broker_tls_hostname_verification) \
            if self.config.admin_url.startswith("https://") else None
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.forward_timeout_ms / 1000),
                                          middlewares=(with_service_token,), connector=aiohttp.TCPConnector(ssl=context)
                                          if context is not None else None)

    async def run(self) -> None:
        """The background tasks: lease ticks and idle sweeps. Runs until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.consumers.run(), name="gateway consumers")
            group.create_task(self.producers.run(), name="gateway producers")

    async def close(self) -> None:
        self.stopping = True
        for task in list(self.forward_tasks):
            task.cancel()
        await self.consumers.close()
        await self.producers.close()
        self.broker_pool.close()
        if self.http is not None:
            await self.http.close()

    # --- topics --------------------------------------------------------------------------------

    @staticmethod
    def topic_name(tenant: str, namespace: str, topic: str) -> str:
        name = TopicName.from_parts(tenant, namespace, topic)
        return str(name)

    async def deduplication_enabled(self, namespace: str) -> bool:
        """The namespace's ``deduplication`` policy, from a broker's admin API (unset is
        off, as the brokers take it)."""
        assert self.http is not None
        status, document = await admin_call(self.http, self.config.admin_url, "GET",
                                            f"/admin/v2/namespaces/{namespace}/deduplication")
        if status == 404:
            raise NotFound(f"namespace {namespace} does not exist")
        return document is True

    async def partition_topics(self, topic: str) -> list[str]:
        partitions = await self.producers.partitions(topic)
        if partitions == 0:
            return [topic]
        return [partition_topic(topic, index, partitions) for index in range(partitions)]

    # --- consumers -----------------------------------------------------------------------------

    @staticmethod
    def consumer_name(mode: str, member: str | None, consumer: str | None) -> str:
        if mode == "broadcast":
            assert member is not None
            return member
        if mode == "shared":
            return ""
        assert consumer is not None
        return consumer

    async def pull_consumers(self, topic: str, subscription: str, spec: PullSpec) -> list[GatewayConsumer]:
        name = self.consumer_name(spec.mode, spec.member, spec.consumer)
        policy = None
        if spec.max_deliveries is not None:
            policy = DeadLetterPolicy(spec.max_deliveries, dead_letter_topic(topic, subscription,
                                                                             spec.dead_letter_topic))
        consumers = []
        for partition in await self.partition_topics(topic):
            consumer = await self.consumers.get(ConsumerKey(partition, subscription, spec.mode, name),
                                                spec.initial_position)
            consumer.dead_letter_policy = policy
            consumers.append(consumer)
        return consumers

    async def _dead_letter(self, topic: str, origin_topic: str, entry: ReceivedEntry) -> None:
        await self.dead_letter(topic, origin_topic, entry.messages)

    async def dead_letter(self, topic: str, origin_topic: str, received: list) -> None:
        """Publishes messages to the dead-letter topic, with the properties Pulsar's
        clients add (REAL_TOPIC, ORIGIN_MESSAGE_ID); returns once they are stored."""
        messages = [OutgoingMessage(m.payload, key=m.key, ordering_key=m.ordering_key,
                                    properties={**m.properties, "REAL_TOPIC": origin_topic,
                                                "ORIGIN_MESSAGE_ID": str(m.message_id)},
                                    event_time_ms=m.event_time_ms)
                    for m in received]
        entries = await self.producers.send(topic, messages, batch=True)
        async with asyncio.timeout(self.config.produce_timeout_ms / 1000):
            await asyncio.gather(*(entry.future for entry in entries))

    # --- receipts ------------------------------------------------------------------------------

    def receipt(self, consumer: GatewayConsumer, slot_message_id, attempt: int, deadline_ms: int) -> str:
        context = consumer.receipt_context
        if context is None:
            key = consumer.key
            context = consumer.receipt_context = ReceiptContext(
                self.config.receipt_keys, self.instance_id, self.issuer_url, key.topic, key.subscription, key.name,
                key.mode)
        numbers = (slot_message_id.ledger_id, slot_message_id.entry_id, slot_message_id.partition,
                   slot_message_id.batch_index, slot_message_id.batch_size, attempt, deadline_ms)
        handle = context.handle(*numbers)
        self.issued.add(handle, context.receipt(*numbers))
        return handle

    def is_ours(self, receipt: Receipt) -> bool:
        return receipt.instance_id == self.instance_id

    @staticmethod
    def key_of(receipt: Receipt) -> ConsumerKey:
        return ConsumerKey(receipt.topic, receipt.subscription, receipt.mode, receipt.consumer)

    def spawn_forward(self, coroutine) -> bool:
        """Runs a best-effort forward in the background (bounded; False if full)."""
        if self.stopping or len(self.forward_tasks) >= self.config.forwards_in_flight_max:
            coroutine.close()
            return False
        task = asyncio.get_running_loop().create_task(coroutine)
        self.forward_tasks.add(task)
        task.add_done_callback(self._forward_done)
        return True

    def _forward_done(self, task: asyncio.Task[None]) -> None:
        self.forward_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("background forward failed: error=%r", task.exception())


def dead_letter_topic(topic: str, subscription: str, named: str | None) -> str:
    """The dead-letter topic: the one named, or Pulsar's default {topic}-{subscription}-DLQ.
    When that default is no topic name (a subscription name with whitespace, or a name
    past 1,024 bytes - names the document allows), it is {topic}-{digest}-DLQ instead:
    the first 16 hex digits of the subscription name's SHA-256, the topic's local name
    cut to fit."""
    if named:
        return str(_parse_topic(named))
    try:
        return str(TopicName.parse(f"{topic}-{subscription}-DLQ"))
    except InvalidArgument:
        pass
    name = TopicName.parse(topic)
    digest = hashlib.sha256(subscription.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    suffix = f"-{digest}-DLQ"
    room = NAME_BYTES_MAX - len(f"{name.domain}://{name.tenant}/{name.namespace}/".encode()) - len(suffix)
    local = name.local_name.encode()[:room].decode("utf-8", "ignore")
    return str(TopicName.parse(f"{name.domain}://{name.tenant}/{name.namespace}/{local}{suffix}"))


def _parse_topic(text: str) -> TopicName:
    try:
        return TopicName.parse(text)
    except InvalidArgument as error:
        raise InvalidArgument(f"dead_letter_topic: {error.message}") from None


def now_unix_ms() -> int:
    return int(time.time() * 1000)
