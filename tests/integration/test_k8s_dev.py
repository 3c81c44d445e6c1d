"""The dev overlay, run: every pod of ``kubectl kustomize k8s/overlays/dev`` as a local process.

What it proves: the exact commands, arguments and environment of the rendered pods (1 etcd,
3 bookies, 2 brokers, 1 gateway, 2 proxies, 1 auto-recovery) make a working cluster; every probe of every pod (startup,
liveness, readiness) and every scrape target answers 200 on the path it names; messages
produced through the rendered broker Service with the official client, and through the
rendered gateway over HTTP, and through the proxies' LoadBalancer Service as a client
outside the cluster would (lookups answered and connections piped by the proxy pods; the
admin REST on its HTTP port), are consumed back whole; the brokers advertise the addresses
and ids the manifests give them, and the bookies register under their pod DNS names, with
their add sockets (3182) at the same names; every add of the run (brokers', shell's,
auto-recovery's copies) reaches the bookies on the add socket, none over gRPC (the
bookies' magnetar_bookie_add_socket_adds equals magnetar_bookie_adds).

Then the scaling procedures of k8s/README.md, run as written on the same pods:
- add then remove brokers (2 -> 4 -> 2) under producer and consumer traffic: the new
  brokers are given bundles, the removed ones hand theirs back in their preStop drain
  (hook exit 0, owning nothing after it, within the grace period; the process then exits
  0), no send fails at the client (the client's own retries aside), and every
  acknowledged message is received;
- restart the brokers (a rolling update, one new broker ready before an old one drains)
  under traffic: every bundle ends on the new brokers, no client error, nothing lost;
- restart the proxies the same way under traffic that goes through their Service only:
  each old one exits 0, no client error, nothing lost;
- add a bookie: it registers under its pod name and takes part in new ledgers (the check's
  ledger deleted after);
- recover a bookie whose volumes were lost: it refuses to start on its cookie; the
  procedure restarts the brokers (closing the ledgers open on it) and re-replicates every
  ledger it held (none names it after), and it is
  ready again under the same identity, with every message that was acknowledged before
  the loss still consumed;
- decommission the added bookie under traffic: marked, brokers restarted (their open
  ledgers on it closed), waited for until no ledger names it (auto-recovery copied its
  closed ledgers), then the StatefulSet shrinks and its claims, cookie and mark go; no
  client error, and every acknowledged message is received, and read again from the start
  by a second subscription after the bookie is gone.
How: tests/k8s_local.py runs each pod's rendered command as a process (ports remapped to
loopback, volumes to a temporary directory) and carries out the procedures' kubectl lines
(scale, rollout status, wait, exec, delete pod/pvc, logs) on them; the official client
drives traffic through the rendered broker Service. One cluster for the module: the tests
run in file order, the procedures last.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import threading
import time
import urllib.request

import aiohttp
import pulsar
import pytest

from tests import k8s_render as k8s
from tests.cluster import created_retrying, receive_in_order, unique_topic
from tests.integration.gateway_helpers import Gateway, drain, new_topic_path, payload_bytes
from tests.k8s_local import LocalCluster, procedure

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def cluster():
    with tempfile.TemporaryDirectory(prefix="k8s-dev-") as base_dir:
        local = LocalCluster(k8s.render("dev"), base_dir)
        try:
            asyncio.run(local.start_all())
            yield local
        finally:
            asyncio.run(local.stop_all())


@pytest.fixture(autouse=True)
def _pod_logs_when_failed(request, cluster):
    """A failed test prints each pod's warnings, errors and bundle moves (the module
    shares one cluster: the pods' state after a failure is the evidence a CI run keeps)."""
    yield
    report = getattr(request.node, "report_call", None)
    if report is None or not report.failed:
        return
    for name, pod in sorted(cluster.pods.items()):
        lines = [line for line in pod.log_text().splitlines()
                 if re.search(r"\b(WARNING|ERROR|CRITICAL)\b|\"level\": \"(warning|error|critical)\"|Traceback"
                              r"|bundle (shed|assigned|released|split):", line)]
        print(f"--- {name}: {len(lines)} warning/error lines, the last 40 ---")
        print("\n".join(lines[-40:]))


def service_address(cluster: LocalCluster, service: str, port: int) -> str:
    """The rendered Service's address on loopback (a proxy to its ready pods)."""
    target = cluster.pod(sorted(cluster.pods)[0])
    return cluster.rewrite(target, f"{service}:{port}")


def test_every_probe_and_scrape_target_answers(cluster):
    assert sorted(cluster.pods) == ["magnetar-autorecovery-00000", "magnetar-bookie-0", "magnetar-bookie-1",
                                    "magnetar-bookie-2", "magnetar-broker-00000", "magnetar-broker-00001",
                                    "magnetar-etcd-0", "magnetar-gateway-00000", "magnetar-objectstore-0",
                                    "magnetar-proxy-00000", "magnetar-proxy-00001"]
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
            # At least once: the leader may still be placing or shedding bundles.
            await receive_in_order(consumer, sent[topic], 10_000)
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


def proxy_metric(pod, name: str) -> float:
    """The sum of a proxy pod's samples named ``name`` (any labels), from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{pod.local_port('http')}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def test_clients_outside_go_through_the_proxies_load_balancer(cluster):
    """The rendered magnetar-proxy Service (type LoadBalancer; on loopback a proxy to its
    ready pods, round robin) is the one address a client outside knows: the official
    client's lookups are answered through it, its producers' and consumers' connections
    are piped by the proxy pods to the owner brokers, and the admin REST answers on the
    Service's HTTP port."""
    service = cluster.workloads["magnetar-proxy"]
    lb = next(s for s in k8s.by_kind(cluster.objects, "Service") if s["metadata"]["name"] == "magnetar-proxy")
    assert lb["spec"]["type"] == "LoadBalancer" and service["kind"] == "Deployment"
    proxies = [cluster.pods["magnetar-proxy-00000"], cluster.pods["magnetar-proxy-00001"]]
    before = [proxy_metric(p, "magnetar_proxy_bytes_total") for p in proxies]
    client = pulsar.Client(f"pulsar://{service_address(cluster, 'magnetar-proxy', 6650)}", operation_timeout_seconds=30)
    topics = [unique_topic("k8s-proxy") for _ in range(6)]
    try:
        consumers = [client.subscribe(t, "k8s", initial_position=pulsar.InitialPosition.Earliest) for t in topics]
        sent = {}
        for topic in topics:
            producer = client.create_producer(topic)
            sent[topic] = [f"{topic}-{i}".encode() for i in range(50)]
            for payload in sent[topic]:
                producer.send(payload)
            producer.close()
        for topic, consumer in zip(topics, consumers):
            await receive_in_order(consumer, sent[topic], 10_000)
    finally:
        client.close()
    # Every byte went through the proxy pods: lookups answered there, connections piped.
    payload_bytes_sent = sum(len(p) for payloads in sent.values() for p in payloads)
    piped = sum(proxy_metric(p, "magnetar_proxy_bytes_total") for p in proxies) - sum(before)
    assert piped >= 2 * payload_bytes_sent, (piped, payload_bytes_sent)      # in, and out again
    assert sum(proxy_metric(p, "magnetar_proxy_lookups_total") for p in proxies) >= len(topics)
    # The admin REST through the Service's HTTP port (forwarded to a broker, a redirect to
    # the owner followed by the proxy).
    base = f"http://{service_address(cluster, 'magnetar-proxy', 8080)}"
    with urllib.request.urlopen(f"{base}/admin/v2/persistent/public/default", timeout=15) as response:
        listed = set(json.loads(response.read()))
    assert set(topics) <= listed, sorted(set(topics) - listed)
    path = topics[0].replace("persistent://", "persistent/")
    with urllib.request.urlopen(f"{base}/admin/v2/{path}/stats", timeout=15) as response:
        assert json.loads(response.read())["msgInCounter"] == 50


def bookie_adds(pod) -> tuple[float, float]:
    """(entries acknowledged, of which on the add socket) of a bookie pod, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{pod.local_port('http')}/metrics", timeout=5) as response:
        text = response.read().decode()
    return tuple(float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))
                 for name in ("magnetar_bookie_adds_total", "magnetar_bookie_add_socket_adds_total"))


async def test_adds_go_over_the_bookies_add_sockets(cluster):
    """Each bookie registered its add socket at its pod's DNS name and port 3182 (mapped to
    loopback: the advertised host, not the bound 0.0.0.0); every entry any bookie has
    acknowledged (the brokers' of the test above, the shell's written here on all three)
    came on the add socket, none over gRPC."""
    listed = last_json(await cluster.run_kubectl("kubectl -n magnetar exec deploy/magnetar-broker -- "
                                                 "magnetar shell listbookies"))["bookies"]
    bookies = [cluster.pods[f"magnetar-bookie-{i}"] for i in range(3)]
    assert {b["bookie_id"]: b["add_address"] for b in listed} == {
        f"127.0.0.1:{pod.local_port(3181)}": f"127.0.0.1:{pod.local_port(3182)}" for pod in bookies}
    written = last_json(await cluster.run_kubectl(
        "kubectl -n magnetar exec deploy/magnetar-broker -- magnetar shell simpletest "
        "--ensemble 3 --write-quorum 3 --ack-quorum 3 --entries 50 --delete"))
    assert written["acked"] == 50 and written["ensemble_changes"] == 0, written
    for pod in bookies:
        adds, on_socket = bookie_adds(pod)
        assert adds >= 50 and on_socket == adds, (pod.name, adds, on_socket)


# --- the procedures of k8s/README.md -------------------------------------------------------


async def until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
        await asyncio.sleep(0.1)


def broker_service_url(cluster: LocalCluster) -> str:
    return "pulsar://" + cluster.rewrite(cluster.pods["magnetar-etcd-0"], "magnetar-broker:6650")


class Traffic:
    """A producer thread sending to several topics (each send waited for) and a consumer
    acknowledging all it gets; what was acknowledged, received and failed, per payload."""

    def __init__(self, service_url: str, topic_count: int = 8) -> None:
        self.client = pulsar.Client(service_url, operation_timeout_seconds=60)
        self.topics = [unique_topic("k8s-scale") for _ in range(topic_count)]
        # Bundles may be moving (brokers drained or restarted by the previous test).
        self.consumer = created_retrying(lambda: self.client.subscribe(
            self.topics, "scale", consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest))
        self.producers = [created_retrying(lambda t=t: self.client.create_producer(t, send_timeout_millis=60_000))
                          for t in self.topics]
        self.acknowledged: set[bytes] = set()
        self.received: set[bytes] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._produced = threading.Event()     # the producer thread's last send is done
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]

    def _produce(self) -> None:
        index = 0
        try:
            while not self._stop.is_set():
                payload = f"m-{index}".encode()
                try:
                    self.producers[index % len(self.producers)].send(payload)
                    self.acknowledged.add(payload)
                except Exception as error:     # the client's own retries failed: a client error
                    self.errors.append(repr(error))
                index += 1
                time.sleep(0.005)
        finally:
            self._produced.set()

    def _consume(self) -> None:
        # Until the producer's last send is done (one may be in flight when stop is
        # asked: its payload joins ``acknowledged`` after) and all it acknowledged is here.
        while not (self._produced.is_set() and self.acknowledged <= self.received):

            try:
                message = self.consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            self.received.add(message.data())
            self.consumer.acknowledge(message)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 60) -> None:
        """Stops sending; returns once everything acknowledged was received (or timeout_s)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)

    def finish(self, timeout_s: float = 60) -> None:
        self.stop(timeout_s)
        self.client.close()


def bundle_owners(output: str) -> dict[str, str | None]:
    """Bundle -> owning broker; None for a bundle between owners (handed over, not yet taken)."""
    return {bundle: owner["broker"] if owner else None for bundle, owner in json.loads(output).items()}


async def settled_owners(cluster: LocalCluster, output: str, timeout_s: float = 60) -> dict[str, str]:
    """The procedure's bundle owners once every bundle has one: a bundle the last drain
    released may be taken a moment after the drain returned."""
    owners = bundle_owners(output)
    deadline = time.monotonic() + timeout_s
    while None in owners.values():
        assert time.monotonic() < deadline, f"bundles without an owner: {owners}"
        await asyncio.sleep(0.2)
        owners = await current_owners(cluster)
    return owners


async def current_owners(cluster: LocalCluster) -> dict[str, str]:
    """The procedure's last command's answer, asked directly (a poll, without a process per ask)."""
    broker = cluster.running_pods("magnetar-broker")[0]
    url = f"http://127.0.0.1:{broker.local_port('http')}/admin/v2/namespaces/public/default/bundleOwners"

    def get() -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()
    return bundle_owners(await asyncio.to_thread(get))


@pytest.mark.long
async def test_add_then_remove_brokers_under_traffic(cluster):
    traffic = Traffic(broker_service_url(cluster))
    traffic.start()
    try:
        await until(lambda: len(traffic.acknowledged) >= 100, 60, "traffic flowing")
        outputs = [await cluster.run_kubectl(line) for line in procedure("Add brokers")]
        assert len(cluster.running_pods("magnetar-broker")) == 4
        new = {"magnetar-broker-00002", "magnetar-broker-00003"}
        owners = bundle_owners(outputs[-1])
        spread_started = time.monotonic()
        deadline = spread_started + 120      # the leader sheds one bundle at a time to them
        while not new <= set(owners.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            owners = await current_owners(cluster)
        assert new <= set(owners.values()), owners
        spread, spread_s = owners, time.monotonic() - spread_started
        sent_before_removal = len(traffic.acknowledged)

        stops_before = len(cluster.stops)
        outputs = [await cluster.run_kubectl(line) for line in procedure("Remove brokers")]
        removed = cluster.stops[stops_before:]
        assert sorted(s["pod"] for s in removed) == sorted(new)
        for stop in removed:
            assert stop["pre_stop_exit"] == 0, stop
            assert json.loads(stop["pre_stop_output"])["bundlesOwned"] == 0, stop
            assert stop["exit_code"] == 0, stop
            assert stop["seconds"] < stop["grace_s"], stop
        owners = await settled_owners(cluster, outputs[-1])
        assert set(owners.values()) <= {"magnetar-broker-00000", "magnetar-broker-00001"}, owners
        await until(lambda: len(traffic.acknowledged) >= sent_before_removal + 100, 60,
                               "traffic flowing after the scale-down")
    finally:
        traffic.finish()
    assert traffic.errors == []
    missing = traffic.acknowledged - traffic.received
    assert not missing, f"{len(missing)} acknowledged messages not received (of {len(traffic.acknowledged)})"
    print(f"brokers 2->4->2: {len(traffic.acknowledged)} messages acknowledged and received; bundles at 4 "
          f"brokers {spread} ({spread_s:.1f} s after they were ready); drains {[(s['pod'], round(s['seconds'], 1)) for s in removed]}")


@pytest.mark.long
async def test_rolling_restart_of_the_brokers_under_traffic(cluster):
    traffic = Traffic(broker_service_url(cluster))
    traffic.start()
    try:
        await until(lambda: len(traffic.acknowledged) >= 100, 60, "traffic flowing")
        old = {p.name for p in cluster.running_pods("magnetar-broker")}
        stops_before = len(cluster.stops)
        outputs = [await cluster.run_kubectl(line) for line in procedure("Restart brokers")]
        new = {p.name for p in cluster.running_pods("magnetar-broker")}
        assert len(new) == 2 and not new & old
        stops = cluster.stops[stops_before:]
        assert sorted(s["pod"] for s in stops) == sorted(old)
        for stop in stops:
            assert stop["pre_stop_exit"] == 0 and stop["exit_code"] == 0, stop
        # Every bundle on the new brokers; each old one handed over once (its drain).
        assert set((await settled_owners(cluster, outputs[-1])).values()) <= new
        acknowledged = len(traffic.acknowledged)
        await until(lambda: len(traffic.acknowledged) >= acknowledged + 100, 60, "traffic after the restart")
    finally:
        traffic.finish()
    assert traffic.errors == []
    assert not traffic.acknowledged - traffic.received


@pytest.mark.long
async def test_rolling_restart_of_the_proxies_under_traffic(cluster):
    """Clients outside, through the proxies' load balancer only, while the README's
    procedure replaces both proxy pods: each old one exits 0 at SIGTERM, the new ones
    pipe the traffic, no client error, every acknowledged message received."""
    traffic = Traffic("pulsar://" + service_address(cluster, "magnetar-proxy", 6650))
    traffic.start()
    try:
        await until(lambda: len(traffic.acknowledged) >= 100, 60, "traffic flowing")
        old = {p.name for p in cluster.running_pods("magnetar-proxy")}
        stops_before = len(cluster.stops)
        for line in procedure("Restart proxies"):
            await cluster.run_kubectl(line)
        new = cluster.running_pods("magnetar-proxy")
        assert len(new) == 2 and not {p.name for p in new} & old
        stops = cluster.stops[stops_before:]
        assert sorted(s["pod"] for s in stops) == sorted(old)
        assert all(s["exit_code"] == 0 for s in stops), stops
        acknowledged = len(traffic.acknowledged)
        await until(lambda: len(traffic.acknowledged) >= acknowledged + 100, 60, "traffic after the restart")
    finally:
        traffic.finish()
    assert traffic.errors == []
    assert not traffic.acknowledged - traffic.received
    # The traffic after the restart went through the new pods.
    assert sum(proxy_metric(p, "magnetar_proxy_bytes_total") for p in new) > 0


@pytest.mark.long
async def test_add_a_bookie(cluster):
    outputs = [await cluster.run_kubectl(line) for line in procedure("Add bookies")]
    listed = json.loads(outputs[2].strip().splitlines()[-1])["bookies"]
    new_bookie = cluster.pods["magnetar-bookie-3"]
    assert f"127.0.0.1:{new_bookie.local_port(3181)}" in {b["bookie_id"] for b in listed}
    assert len(listed) == 4
    assert new_bookie.probe("readinessProbe") == 200
    check = json.loads(outputs[3].strip().splitlines()[-1])
    assert check["acked"] == 100 and len(check["fragments"][0]["bookies"]) == 4
    assert check["deleted"] is True      # it would be on every bookie: none could take its copy


def autorecovery_metric(cluster: LocalCluster, name: str) -> float:
    """A counter of the auto-recovery pod, scraped where its annotations say."""
    pod = cluster.running_pods("magnetar-autorecovery")[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{pod.local_port('http')}/metrics", timeout=5) as response:
        text = response.read().decode()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def last_json(output: str) -> dict:
    """A magnetar shell command's result: the last line it prints."""
    return json.loads(output.strip().splitlines()[-1])


@pytest.mark.long
async def test_recover_a_bookie_whose_volumes_were_lost(cluster):
    client = pulsar.Client(broker_service_url(cluster), operation_timeout_seconds=60)
    try:
        topic = unique_topic("k8s-lost-volume")
        consumer = client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        sent = [f"before-{i}".encode() for i in range(200)]
        for payload in sent:
            producer.send(payload)

        # The volumes are lost: the pod dies and its claims come back empty.
        copied_before = autorecovery_metric(cluster, "magnetar_autorecovery_fragments_rereplicated_total")
        lost = cluster.pods["magnetar-bookie-1"]
        cluster.kill9(lost.name)
        for mount_path, directory in lost.mounts.items():
            if "/var/lib/magnetar/" in mount_path:
                shutil.rmtree(directory)
        await cluster.start(lost.name, wait_ready=False)        # the kubelet restarts it...
        await until(lambda: not lost.running, 60, "the bookie refusing to start")
        assert lost.process.process.returncode == 2              # ...and it refuses, on its cookie
        # The operator comes once its registration has lapsed (10 s after it died; a pod in
        # CrashLoopBackOff is past that): no new ledger is placed on it from then on.
        registered = "kubectl -n magnetar exec magnetar-etcd-0 -- etcdctl --endpoints=http://127.0.0.1:2379 " \
                     "get --prefix --keys-only /magnetar/magnetar/bookies/"
        lost_id = f"127.0.0.1:{lost.local_port(3181)}"
        deadline = time.monotonic() + 60
        while lost_id in await cluster.run_kubectl(registered):
            assert time.monotonic() < deadline, "the lost bookie's registration did not lapse"
            await asyncio.sleep(0.5)

        outputs = [await cluster.run_kubectl(line) for line in procedure("Recover a bookie whose volume was lost")]
        assert "its data is gone" in outputs[0]
        recovered = last_json(outputs[3])
        # The earlier tests' brokers closed ledgers on every bookie: some named it, and
        # their copies were restored, by recover or by the auto-recovery pod's worker
        # (which takes them once the bookie is gone its grace period; on a slow machine
        # it can finish before the operator runs recover, and recover waits for a
        # ledger the worker has locked). The brokers' restart closed the open ones, so
        # no ledger names it when its cookie goes.
        copied_by_worker = autorecovery_metric(
            cluster, "magnetar_autorecovery_fragments_rereplicated_total") - copied_before
        assert recovered["ledgers_replicated"] + copied_by_worker >= 1, (recovered, copied_by_worker)
        assert recovered["closed_ledgers_left"] == 0 and recovered["open_ledgers_left"] == 0, recovered
        assert lost.running and lost.probe("readinessProbe") == 200
        assert lost.probe("livenessProbe") == 200

        after = [f"after-{i}".encode() for i in range(50)]
        for payload in after:
            producer.send(payload)
        # At least once: a bundle shed after the brokers' restart may move the consumer
        # mid-read (a message whose acknowledgement was not yet sent comes again).
        await receive_in_order(consumer, sent + after)
    finally:
        client.close()


@pytest.mark.long
async def test_decommission_a_bookie_under_traffic(cluster):
    bookie = cluster.pods["magnetar-bookie-3"]
    claims = [cluster.base_dir / "pvc" / f"{t}-magnetar-bookie-3" for t in ("journal", "ledgers")]
    assert all(c.is_dir() for c in claims)
    traffic = Traffic(broker_service_url(cluster))
    # A second subscription, read only once the bookie is gone: what it held, copied elsewhere.
    replay = traffic.client.subscribe(traffic.topics, "after-decommission", consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest)
    traffic.start()
    try:
        await until(lambda: len(traffic.acknowledged) >= 200, 60, "traffic flowing")
        stops_before = len(cluster.stops)
        copied_before = autorecovery_metric(cluster, "magnetar_autorecovery_fragments_rereplicated_total")
        started = time.monotonic()
        outputs = [await cluster.run_kubectl(line) for line in procedure("Decommission a bookie")]
        seconds = time.monotonic() - started
        marked = last_json(outputs[0])
        assert marked["marked"] is True
        # It held copies (the traffic's ledgers, the re-replicated ones): the wait had work.
        assert marked["closed_ledgers_left"] + marked["open_ledgers_left"] >= 1, marked
        done = last_json(outputs[3])
        assert done["decommissioned"] is True, done
        # The closed ledgers were copied off it by the auto-recovery pod (the shell only waits).
        copied = autorecovery_metric(cluster, "magnetar_autorecovery_fragments_rereplicated_total") - copied_before
        assert copied >= 1
        assert not bookie.running
        stops = cluster.stops[stops_before:]
        assert stops[-1]["pod"] == "magnetar-bookie-3" and stops[-1]["exit_code"] == 0, stops[-1]
        assert not any(c.exists() for c in claims)
        assert outputs[6].strip() == "1" and outputs[7].strip() == "1"     # cookie and mark deleted
        listed = last_json(await cluster.run_kubectl(
            "kubectl -n magnetar exec deploy/magnetar-broker -- magnetar shell listbookies"))["bookies"]
        assert len(listed) == 3
        acknowledged = len(traffic.acknowledged)
        await until(lambda: len(traffic.acknowledged) >= acknowledged + 100, 60, "traffic after the decommission")
    finally:
        traffic.stop()
    try:
        assert traffic.errors == []
        missing = traffic.acknowledged - traffic.received
        assert not missing, f"{len(missing)} acknowledged messages not received (of {len(traffic.acknowledged)})"
        replayed: set[bytes] = set()
        while not traffic.acknowledged <= replayed:
            message = await asyncio.to_thread(replay.receive, 20_000)
            replayed.add(message.data())
            replay.acknowledge(message)
    finally:
        traffic.client.close()
    print(f"decommission of magnetar-bookie-3 under traffic: {seconds:.1f} s for the procedure "
          f"(wait {done['seconds']} s; {marked['closed_ledgers_left']} closed and {marked['open_ledgers_left']} open "
          f"ledgers named it when marked; {copied:.0f} fragments copied by auto-recovery); {len(traffic.acknowledged)} messages acknowledged, received, and read "
          "again after it was gone")


def test_the_procedures_adds_came_on_the_add_sockets_too(cluster):
    """Last: the copies auto-recovery made, the recovery's and the brokers' adds during
    the procedures all came on the bookies' add sockets (none over gRPC)."""
    bookies = cluster.running_pods("magnetar-bookie")
    assert len(bookies) == 3
    counts = {pod.name: bookie_adds(pod) for pod in bookies}
    assert sum(adds for adds, _ in counts.values()) > 0, counts
    assert all(on_socket == adds for adds, on_socket in counts.values()), counts
