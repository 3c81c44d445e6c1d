"""``magnetar proxy`` with real processes (etcd, bookies, three brokers, proxies on
loopback), driven by the official client whose service URL names only proxies.

Proves:
- exclusive and shared subscriptions produce and consume through the proxy; the
  client's connections were piped (the proxy's metrics), and its lookups answered with
  ``proxy_through_service_url``;
- a partitioned topic whose partitions are served by several brokers, through one proxy;
- kill -9 of the broker owning a topic during traffic: the client's reconnect through
  the proxy reaches the new owner, every acknowledged message is consumed, no error;
- kill -9 of a proxy during traffic: the client goes on through the other proxy of its
  service URL, every acknowledged message consumed;
- the proxy is no open relay: CONNECT naming an address that is not a registered broker
  is refused and nothing connects there;
- mutated frames (tests/fuzz_inputs.py) never crash it: afterwards it is healthy and
  a client still produces and consumes through it;
- the public asyncio client (magnetar.client) works through it too: lookups, piped
  connections, a partitioned topic served by several brokers.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import time
import urllib.error
import urllib.request
import uuid

import pulsar
import pytest

from magnetar.tools.admin_client import AdminClient
from protocol.codec import encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from tests import fuzz_inputs
from tests.cluster import Cluster
from tests.traffic import Traffic

FAST = ["--lease-ttl-s", "4", "--load-report-interval-s", "0.5", "--leader-interval-s", "0.3",
        "--shedding-cooldown-s", "3"]


async def start_cluster(cluster: Cluster, brokers: int = 3, proxies: int = 2) -> Cluster:
    await cluster.start_bookies(3)
    await asyncio.gather(*(cluster.broker(extra_args=FAST).start() for _ in range(brokers)))
    await asyncio.gather(*(cluster.proxy().start() for _ in range(proxies)))
    return cluster


@pytest.fixture(scope="module")
def proxied(etcd_process, tmp_path_factory):
    """3 bookies, 3 brokers and 2 proxies shared by this module's tests, in file order:
    the later tests kill a proxy, then a broker."""
    cluster = Cluster(etcd_process, str(tmp_path_factory.mktemp("proxied")))
    try:
        asyncio.run(start_cluster(cluster))
        yield cluster
    finally:
        asyncio.run(cluster.stop())


def proxy_url(cluster: Cluster) -> str:
    return "pulsar://" + ",".join(p.service_url.removeprefix("pulsar://") for p in cluster.proxies if p.running)


def running_proxy(cluster: Cluster):
    return next(p for p in cluster.proxies if p.running)


def metric(proxy, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(f"{proxy.http_url}/metrics", timeout=10).read().decode()
    pattern = re.compile(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$" if labels
                         else rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def admin(cluster: Cluster, method: str, path: str, body=None):
    broker = next(b for b in cluster.brokers if b.running)
    return AdminClient(broker.web_service_url).request(method, path, body=body).document()


def owner_of(cluster: Cluster, topic: str):
    lookup = admin(cluster, "GET", f"/lookup/v2/topic/persistent/public/default/{topic}")
    return next(b for b in cluster.brokers if b.service_url == lookup["brokerUrl"])



def produce_consume(url: str, topic: str, count: int, subscription_type) -> tuple[set[bytes], int]:
    """Sends ``count`` messages and receives until each came back (at-least-once: a
    bundle moving meanwhile may redeliver some) or 30 s pass; (missing, duplicates)."""
    client = pulsar.Client(url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=subscription_type,
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(
            topic, batching_enabled=False, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
        sent = {f"m-{i}".encode() for i in range(count)}
        for payload in sorted(sent):
            producer.send(payload)
        received: set[bytes] = set()
        duplicates = 0
        deadline = time.monotonic() + 30
        while received != sent and time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            duplicates += message.data() in received
            received.add(message.data())
            consumer.acknowledge(message)
        return sent - received, duplicates
    finally:
        client.close()


async def test_exclusive_shared_and_partitioned_through_one_proxy(proxied):
    cluster = proxied
    proxy = running_proxy(cluster)
    url = proxy.service_url
    for kind in (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Shared):
        topic = f"persistent://public/default/proxy-{kind.name}-{uuid.uuid4().hex[:6]}"
        missing, _ = await asyncio.to_thread(produce_consume, url, topic, 200, kind)
        assert not missing, f"{kind.name}: {len(missing)} messages never came back"
    assert metric(proxy, "magnetar_proxy_lookups_total", '{command="lookup",outcome="ok"}') >= 2
    assert metric(proxy, "magnetar_proxy_bytes_total", '{direction="client_to_broker"}') > 200 * 5
    assert metric(proxy, "magnetar_proxy_bytes_total", '{direction="broker_to_client"}') > 200 * 5

    # A partitioned topic with more partitions than brokers, in a namespace of
    # several bundles: its partitions are served by more than one broker.
    namespace = f"public/proxy-{uuid.uuid4().hex[:6]}"
    admin(cluster, "PUT", f"/admin/v2/namespaces/{namespace}", {"bundles": {"numBundles": 16}})
    name = f"parts-{uuid.uuid4().hex[:6]}"
    admin(cluster, "PUT", f"/admin/v2/persistent/{namespace}/{name}/partitions", 9)
    topic = f"persistent://{namespace}/{name}"
    missing, duplicates = await asyncio.to_thread(produce_consume, url, topic, 270, pulsar.ConsumerType.Shared)
    assert not missing, f"{len(missing)} messages of the partitioned topic never came back"
    owners = set()
    for index in range(9):
        lookup = admin(cluster, "GET", f"/lookup/v2/topic/persistent/{namespace}/{name}-partition-{index}")
        owners.add(lookup["brokerUrl"])
    assert len(owners) >= 2, f"every partition on one broker: {owners}"
    print(f"partitions served by {len(owners)} brokers through one proxy ({duplicates} redelivered)")


def _exchange(port: int, data: bytes, timeout_s: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (socket.timeout, ConnectionResetError):
            pass
        return b"".join(chunks)


async def test_no_open_relay_and_bad_input_never_crashes_it(proxied):
    cluster = proxied
    proxy = running_proxy(cluster)
    port = int(proxy.service_url.rsplit(":", 1)[1])
    # An address that is not a registered broker: a listener of ours that must
    # never see a connection.
    bait = socket.create_server(("127.0.0.1", 0))
    bait.settimeout(0.5)
    bait_url = f"pulsar://127.0.0.1:{bait.getsockname()[1]}"
    for named in (bait_url, bait_url.removeprefix("pulsar://"), "pulsar://example.invalid:6650", "garbage"):
        connect = pb.CommandConnect(client_version="relay-test", protocol_version=20,
                                    proxy_to_broker_url=named)
        answer = await asyncio.to_thread(_exchange, port, encode_command(wrap(connect)))
        assert b"is not a broker of this cluster" in answer, (named, answer[:200])
    try:
        bait.accept()
        raise AssertionError("the proxy connected to an address that is no broker")
    except socket.timeout:
        pass
    finally:
        bait.close()

    rng = random.Random(34)
    seeds = fuzz_inputs.seed_frames()
    connect = seeds[0]
    for round_index in range(200):
        seed = rng.choice(seeds)
        mutated = fuzz_inputs.mutate(rng, seed, seeds) if round_index % 2 else \
            fuzz_inputs.mutate_fields(rng, seed)
        # Half the streams start with a valid CONNECT, so the lookup phase sees them too.
        data = (connect + mutated) if round_index % 3 else mutated
        await asyncio.to_thread(_exchange, port, data, 0.1)
    assert proxy.running, proxy.log_text()[-3000:]
    health = urllib.request.urlopen(f"{proxy.http_url}/health", timeout=10)
    assert health.status == 200
    topic = f"persistent://public/default/after-fuzz-{uuid.uuid4().hex[:6]}"
    missing, _ = await asyncio.to_thread(produce_consume, proxy.service_url, topic, 20, pulsar.ConsumerType.Shared)
    assert not missing
    assert "Traceback" not in proxy.log_text(), proxy.log_text()[-3000:]


def _http(method: str, url: str, body=None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def test_admin_and_lookup_http_through_the_proxy(proxied):
    """/admin/v2 and /lookup on the proxy's HTTP port reach the brokers; a broker's
    redirect to a topic's owner is followed by the proxy (the caller only ever talks
    to the proxy)."""
    cluster = proxied
    proxy = running_proxy(cluster)
    base = proxy.http_url
    namespace = f"public/http-{uuid.uuid4().hex[:6]}"
    assert (await asyncio.to_thread(_http, "PUT", f"{base}/admin/v2/namespaces/{namespace}", {}))[0] in (200, 204)
    assert (await asyncio.to_thread(_http, "PUT", f"{base}/admin/v2/persistent/{namespace}/orders/partitions",
                                    3))[0] in (200, 204)
    status, body = await asyncio.to_thread(_http, "GET", f"{base}/admin/v2/persistent/{namespace}/orders/partitions")
    assert (status, body) == (200, {"partitions": 3})
    topic = f"persistent://{namespace}/stats-{uuid.uuid4().hex[:6]}"
    missing, _ = await asyncio.to_thread(produce_consume, proxy.service_url, topic, 10, pulsar.ConsumerType.Shared)
    assert not missing
    # Served by the owner only: the other brokers answer 307, which the proxy follows.
    path = topic.replace("persistent://", "persistent/")
    for _ in range(6):
        status, body = await asyncio.to_thread(_http, "GET", f"{base}/admin/v2/{path}/stats")
        assert status == 200 and body["msgInCounter"] == 10, (status, body)
        status, body = await asyncio.to_thread(_http, "GET", f"{base}/lookup/v2/topic/{path}")
        assert status == 200 and body["brokerUrl"].startswith("pulsar://"), (status, body)
    assert metric(proxy, "magnetar_proxy_http_requests_total", '{outcome="ok"}') >= 15


async def test_magnetar_client_through_the_proxy(proxied):
    """The public asyncio client (magnetar.client) with only proxies in its service URL:
    lookups answered with proxy_through_service_url, each connection piped to the
    topic's owner (CONNECT with proxy_to_broker_url), a partitioned topic whose
    partitions several brokers serve."""
    from magnetar.client import Client, ConsumerType, InitialPosition

    cluster = proxied
    namespace = f"public/ours-{uuid.uuid4().hex[:6]}"
    admin(cluster, "PUT", f"/admin/v2/namespaces/{namespace}", {"bundles": {"numBundles": 16}})
    name = f"parts-{uuid.uuid4().hex[:6]}"
    admin(cluster, "PUT", f"/admin/v2/persistent/{namespace}/{name}/partitions", 6)
    topic = f"persistent://{namespace}/{name}"
    async with Client(proxy_url(cluster), operation_timeout_seconds=30) as client:
        consumer = await client.subscribe(topic, "ours", consumer_type=ConsumerType.Shared,
                                          initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic, batching_enabled=False)
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(60)))
        got = set()
        async with asyncio.timeout(30):
            while len(got) < 60:
                message = await consumer.receive()
                got.add(int(message.data()))
                await consumer.acknowledge(message)
    assert got == set(range(60))
    owners = {admin(cluster, "GET", f"/lookup/v2/topic/persistent/{namespace}/{name}-partition-{index}")["brokerUrl"]
              for index in range(6)}
    assert len(owners) >= 2, f"every partition on one broker: {owners}"


async def test_a_proxy_killed_during_traffic_the_other_takes_over(proxied):
    cluster = proxied
    first, second = cluster.proxies
    topic = f"proxy-death-{uuid.uuid4().hex[:8]}"
    traffic = Traffic(proxy_url(cluster), topic, pulsar.ConsumerType.Shared).start()
    await asyncio.to_thread(traffic.wait_acked, 200, 30)
    # Kill a proxy piping the client's connections.
    piped = [p for p in cluster.proxies if metric(p, "magnetar_proxy_connections_open", '{phase="piped"}') > 0]
    assert piped, "no proxy pipes the client's connections"
    victim = piped[0]
    survivor = second if victim is first else first
    before = len(traffic.acked)
    victim.kill9()
    await asyncio.to_thread(traffic.wait_acked, before + 200, 60)
    # Everything the client does now goes through the survivor.
    assert metric(survivor, "magnetar_proxy_connections_open", '{phase="piped"}') > 0
    await asyncio.to_thread(traffic.finish)
    assert not traffic.lost(), f"{len(traffic.lost())} acknowledged messages never consumed"
    assert not traffic.errors, traffic.errors[:3]


async def test_owner_killed_during_traffic_through_the_proxy(proxied):
    cluster = proxied
    topic = f"proxy-failover-{uuid.uuid4().hex[:8]}"
    traffic = Traffic(proxy_url(cluster), topic).start()
    await asyncio.to_thread(traffic.wait_acked, 200, 30)
    owner = owner_of(cluster, topic)
    before = len(traffic.acked)
    owner.kill9()
    killed_at = time.monotonic()
    await asyncio.to_thread(traffic.wait_acked, before + 200, 60)
    resumed_after = time.monotonic() - killed_at
    assert owner_of(cluster, topic) is not owner
    await asyncio.to_thread(traffic.finish)
    assert not traffic.lost(), f"{len(traffic.lost())} acknowledged messages never consumed"
    assert not traffic.errors, traffic.errors[:3]
    print(f"through the proxy, clients reached the new owner in {resumed_after:.1f}s")

