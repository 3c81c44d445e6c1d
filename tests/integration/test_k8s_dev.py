"""The dev overlay, run: every pod of ``kubectl kustomize k8s/overlays/dev`` as a local process.

What it proves: the exact commands, arguments and environment of the rendered pods (1 etcd,
3 bookies, 2 brokers, 1 gateway) make a working cluster; every probe of every pod (startup,
liveness, readiness) and every scrape target answers 200 on the path it names; messages
produced through the rendered broker Service with the official client, and through the
rendered gateway over HTTP, are consumed back whole; the brokers advertise the addresses
and ids the manifests give them, and the bookies register under their pod DNS names.
How: tests/k8s_local.py (ports remapped to loopback, volumes to a temporary directory).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.request

import aiohttp
import pulsar
import pytest

from tests import k8s_render as k8s
from tests.cluster import unique_topic
from tests.integration.gateway_helpers import Gateway, drain, new_topic_path, payload_bytes
from tests.k8s_local import LocalCluster

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster():
    with tempfile.TemporaryDirectory(prefix="k8s-dev-") as base_dir:
        local = LocalCluster(k8s.render("dev"), base_dir)
        try:
            asyncio.run(local.start_all())
            yield local
        finally:
            asyncio.run(local.stop_all())


def service_address(cluster: LocalCluster, service: str, port: int) -> str:
    """Where the rendered Service's port leads (its first running pod), on loopback."""
    target = cluster.pod(sorted(cluster.pods)[0])
    return cluster.rewrite(target, f"{service}:{port}")


def test_every_probe_and_scrape_target_answers(cluster):
    assert sorted(cluster.pods) == ["magnetar-bookie-0", "magnetar-bookie-1", "magnetar-bookie-2",
                                    "magnetar-broker-00000", "magnetar-broker-00001", "magnetar-etcd-0",
                                    "magnetar-gateway-00000"]
    for pod in cluster.pods.values():
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert pod.probe(kind) == 200, (pod.name, kind, pod.probe_url(kind))
        annotations = pod.pod.workload["spec"]["template"]["metadata"]["annotations"]
        url = f"http://127.0.0.1:{pod.local_port(int(annotations['prometheus.io/port']))}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200 and response.read()


def test_pods_register_under_their_manifest_identities(cluster):
    broker = cluster.pods["magnetar-broker-00000"]
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.local_port('http')}/ready", timeout=5) as response:
        ready = json.loads(response.read())
    assert ready["broker_id"] == "magnetar-broker-00000" and ready["load_reported"] is True
    bookies = [cluster.pods[f"magnetar-bookie-{i}"] for i in range(3)]
    for bookie in bookies:
        with urllib.request.urlopen(f"http://127.0.0.1:{bookie.local_port('http')}/ready", timeout=5) as response:
            document = json.loads(response.read())
        # The pod's DNS name, as the kubelet resolved it, mapped to its loopback port.
        assert document["bookie_id"] == f"127.0.0.1:{bookie.local_port(3181)}"
        assert document["registered"] is True and document["read_only"] is False


async def test_produce_and_consume_through_the_rendered_brokers_and_gateway(cluster):
    client = pulsar.Client(f"pulsar://{service_address(cluster, 'magnetar-broker', 6650)}", operation_timeout_seconds=30)
    try:
        topics = [unique_topic("k8s-dev") for _ in range(6)]
        consumers = [client.subscribe(t, "k8s", initial_position=pulsar.InitialPosition.Earliest) for t in topics]
        sent = {}
        for index, topic in enumerate(topics):
            producer = client.create_producer(topic)
            sent[topic] = [f"{topic}-{i}".encode() for i in range(50)]
            for payload in sent[topic]:
                producer.send(payload)
            producer.close()
        for topic, consumer in zip(topics, consumers):
            got = []
            for _ in range(len(sent[topic])):
                message = await asyncio.to_thread(consumer.receive, 10_000)
                got.append(message.data())
                consumer.acknowledge(message)
            assert got == sent[topic]
    finally:
        client.close()

    gateway_url = f"http://{service_address(cluster, 'magnetar-gateway', 8081)}"
    async with aiohttp.ClientSession() as session:
        gateway = Gateway(gateway_url, session)
        _, path = new_topic_path("k8s-gw")
        await gateway.subscribe(path, "work", mode="shared")
        payloads = [f"job-{i}" for i in range(40)]
        await gateway.produce(path, [{"payload": p} for p in payloads])
        got = await drain(gateway, path, "work", mode="shared")
        assert sorted(payload_bytes(m).decode() for m in got) == sorted(payloads)
