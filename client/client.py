"""The client facade: a broker pool (connections and lookups, client/pool.py) and the
producers and consumers made through it. ``close`` closes those first (each owns its
own reconnection task), then the connections. Its users are the project's services
(the Spark source and sink, the diagnosis tool): without a config of their own, a
producer or consumer gives up after SERVICE_RECONNECT_ATTEMPTS_MAX attempts and its
owner decides what next (the public client, client/api.py, never gives up)."""

from __future__ import annotations

from client.config import SERVICE_RECONNECT_ATTEMPTS_MAX, ClientConfig
from client.consumer import Consumer
from client.pool import BrokerPool
from client.producer import Producer


class PulsarClient:
    def __init__(self, service_url: str, config: ClientConfig | None = None) -> None:
        self.config = config or ClientConfig(reconnect_attempts_max=SERVICE_RECONNECT_ATTEMPTS_MAX)
        self.pool = BrokerPool(service_url, self.config)
        self.producers: set[Producer] = set()
        self.consumers: set[Consumer] = set()

    @property
    def service_url(self) -> str:
        return self.pool.service_url

    async def partitions(self, topic: str) -> int:
        return await self.pool.partitions(topic)

    async def create_producer(self, topic: str, *, producer_name: str = "") -> Producer:
        """A producer on one (non-partitioned) topic or partition, connected."""
        producer = Producer(self.pool, topic, producer_name=producer_name, on_closed=self.producers.discard)
        await producer.start()
        self.producers.add(producer)
        return producer

    async def subscribe(self, topic: str, subscription: str, **options) -> Consumer:
        """A consumer on one (non-partitioned) topic or partition, subscribed; see
        client.consumer.Consumer for the options."""
        consumer = Consumer(self.pool, topic, subscription, on_closed=self.consumers.discard, **options)
        await consumer.start()
        self.consumers.add(consumer)
        return consumer

    async def close(self) -> None:
        """Closes producers and consumers, then every connection."""
        for producer in list(self.producers):
            await producer.close()
        for consumer in list(self.consumers):
            await consumer.close()
        self.pool.close()
