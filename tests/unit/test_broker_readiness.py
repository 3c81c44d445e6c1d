"""A broker's readiness (/ready) and its drain (POST /admin/v2/brokers/drain), as the
Kubernetes manifests use them (k8s/base/broker.yaml).

What it proves: /ready is 503 until the binary protocol serves, 200 once the broker's
ownership lease is held and its load report is in the store, 503 again as soon as a
hand-over starts; /live stays 200 throughout; the drain hands over once (a second call,
and SIGTERM's, wait for the same), answers with what the broker still owns (nothing), and
is refused from any host but the broker's own. How: a BrokerService with the bundles layer
on the in-memory store, served by aiohttp's test server on loopback.
"""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from broker.admin.app import build_admin_app
from broker.admin.brokers import _is_loopback
from broker.service import BrokerService
from bundles.config import BundlesConfig
from metadata.memory_store import MemoryStore
from tests.unit.fake_ledger_client import FakeLedgerClient
from tests.unit.test_broker_service import broker_config


async def test_ready_follows_serving_lease_and_hand_over():
    service = BrokerService(broker_config(), MemoryStore(), FakeLedgerClient(),
                            bundles_config=BundlesConfig(lease_ttl_s=10))
    await service.start()
    try:
        async with TestClient(TestServer(build_admin_app(service, CollectorRegistry()))) as client:
            response = await client.get("/ready")
            assert response.status == 503                      # not serving the protocol yet
            service.serving = True
            for _ in range(200):                               # the report's watch catches up
                response = await client.get("/ready")
                if response.status == 200:
                    break
                await asyncio.sleep(0.01)
            document = await response.json()
            assert response.status == 200, document
            assert document["load_reported"] is True and document["fenced"] is False

            drains = await asyncio.gather(client.post("/admin/v2/brokers/drain"),
                                          client.post("/admin/v2/brokers/drain"))
            for drained in drains:
                assert drained.status == 200
                assert (await drained.json())["bundlesOwned"] == 0
            await service.hand_over()                          # SIGTERM's: nothing left, returns
            assert (await client.get("/ready")).status == 503
            assert (await client.get("/live")).status == 200
            assert (await client.get("/health")).status == 200  # alive and serving until close
    finally:
        await service.close()


def test_drain_only_from_the_brokers_own_host():
    assert _is_loopback("127.0.0.1") and _is_loopback("::1")
    assert not _is_loopback("10.1.2.3")
    assert not _is_loopback(None)
    assert not _is_loopback("not-an-address")
