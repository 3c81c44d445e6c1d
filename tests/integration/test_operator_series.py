"""The series operators alert on, from real processes: a bookie's per-directory disk
usage, read-only state, journal queue and fsync latency after a broker stored the
official client's messages; a gateway's per-subscription pulled / acked / nacked /
extended / lease-ended counters and leases held after HTTP clients used them."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.cluster import unique, wait_until
from tests.integration.gateway_helpers import Gateway
from tests.metrics_scrape import scrape, value


async def test_bookie_series_name_each_directory_and_the_journal(cluster):
    """A bookie with two ledger directories: after 50 messages through a broker, its
    /metrics has a usage ratio and free bytes for the journal and each ledger
    directory, read-only 0, a journal queue gauge and fsync latency observations."""
    import pulsar

    bookies = [cluster.bookie(ledger_dir_count=2), cluster.bookie()]
    await asyncio.gather(*(b.start() for b in bookies))
    (broker,) = await cluster.start_brokers(1)
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(f"persistent://public/default/{unique('bookie-series')}",
                                          batching_enabled=False)
        for _ in range(50):
            producer.send(b"y" * 100)
        producer.close()
    finally:
        client.close()
    bookie = bookies[0]
    families = await asyncio.to_thread(scrape, f"http://{bookie.http_address}")
    for directory in (bookie.journal_dir, *bookie.ledger_dirs):
        ratio = value(families, "magnetar_bookie_directory_usage_ratio", directory=directory)
        assert ratio is not None and 0 < ratio <= 1, (directory, ratio)
        assert value(families, "magnetar_bookie_directory_free_bytes", directory=directory) > 0
    assert len(families["magnetar_bookie_directory_usage_ratio"]) == 3
    assert value(families, "magnetar_bookie_read_only") == 0
    assert value(families, "magnetar_bookie_journal_queue_records") >= 0
    assert value(families, "magnetar_bookie_journal_queue_bytes") >= 0
    assert value(families, "magnetar_bookie_journal_fsync_latency_seconds_count") >= 1


async def test_gateway_counts_settles_per_subscription(cluster):
    """Ten messages pulled over HTTP with a 1 s lease: 4 acked, 1 nacked, 2 extended,
    3 left alone. The gateway's per-subscription series then say pulled 10, acked 4,
    nacked 1, extended 2, and — once the lease ran out — 4 leases ended (the nacked one
    and the 3 left alone); the 2 extended are still leased. Another subscription's series are
    apart."""
    await cluster.start_bookies(2)
    await cluster.start_brokers(1)
    (process,) = await cluster.start_gateways(1)
    name = unique("gw-series")
    path, topic = f"persistent/public/default/{name}", f"persistent://public/default/{name}"
    async with aiohttp.ClientSession() as session:
        gateway = Gateway(process.url, session)
        await gateway.subscribe(path, "work")
        await gateway.subscribe(path, "audit")
        await gateway.produce(path, [{"payload": f"m{i}"} for i in range(10)])
        taken: list[dict] = []
        deadline = time.monotonic() + 15
        while len(taken) < 10 and time.monotonic() < deadline:
            taken += await gateway.pull(path, "work", max_messages=10 - len(taken), wait_ms=2000, lease_ms=1000)
        assert len(taken) == 10
        await gateway.ack(path, "work", taken[:4])
        results = await gateway.settle(path, "work", "nack", [taken[4]["receipt"]])
        assert results[0]["status"] == "nacked", results
        results = await gateway.settle(path, "work", "extend", [m["receipt"] for m in taken[5:7]], lease_ms=30_000)
        assert all(r["status"] == "extended" for r in results), results
        audit = await gateway.pull(path, "audit", max_messages=3, wait_ms=5000, lease_ms=30_000)
        assert audit
        labels = {"topic": topic, "subscription": "work"}

        def leases_ended():
            families = scrape(process.url)
            count = value(families, "magnetar_gateway_subscription_lease_ended_total", **labels)
            return families if count == 4 else None

        families = await asyncio.to_thread(wait_until, leases_ended, 15, "4 leases ended for 'work'")
        assert value(families, "magnetar_gateway_subscription_pulled_total", **labels) == 10
        assert value(families, "magnetar_gateway_subscription_acked_total", **labels) == 4
        assert value(families, "magnetar_gateway_subscription_nacked_total", **labels) == 1
        assert value(families, "magnetar_gateway_subscription_extended_total", **labels) == 2
        assert value(families, "magnetar_gateway_subscription_leases_active", **labels) == 2
        audit_labels = {"topic": topic, "subscription": "audit"}
        assert value(families, "magnetar_gateway_subscription_pulled_total", **audit_labels) == len(audit)
        assert value(families, "magnetar_gateway_subscription_leases_active", **audit_labels) == len(audit)
        assert value(families, "magnetar_gateway_subscription_acked_total", **audit_labels) == 0
