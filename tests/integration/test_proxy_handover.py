"""A bundle moved while the official client produces and consumes through the proxy.

Real etcd, 2 bookies, 3 brokers (no TLS listener) and one proxy (a plain and a TLS
port), shared by the module's tests; the client's service URL is the proxy's only.

Proves:
- while a producer sends continuously (each receipt recorded with its time) and a
  consumer on a Shared subscription receives and acknowledges, the topic's bundle
  transferred twice to a named broker (``unload?destinationBroker=``, the first time
  with ``magnetar admin`` through the proxy's HTTP port), once to the broker the owner
  picks, and the topic unloaded once: every acknowledged message was received (a
  Shared subscription may redeliver: duplicates are counted, not refused), no error
  reached the application, the producer's longest gap between receipts after each
  move is under a bound (and reported), the bundle went where it was sent;
- the client never went around the proxy although the old owner's CLOSE_PRODUCER /
  CLOSE_CONSUMER named the next owner (``assignedBrokerServiceUrl``): the test
  process's own TCP connections, sampled every 20 ms, never reached a broker's binary
  port; the client's log shows every connection made to the proxy's port, each named
  destination as a logical address; the new owner's producer and consumer sit on
  connections of the proxy's process (their addresses in the topic's stats);
- a ``destinationBroker`` that is no live broker, or the owner itself: 412;
- a client on the proxy's TLS port (a Failover subscription) follows a transfer at once
  too (the broker names the plain URL in the TLS field to connections that reached it
  in plain text); nothing lost.
- (``long``, make test-long) the owner stopped with SIGTERM under traffic (a rolling
  restart's step): it hands its bundles over, the client follows through the proxy to
  the broker its CLOSE_PRODUCER names, nothing lost, never to a broker's address.
- (``long``) behind an authenticating proxy (brokers with token authentication and
  authorization, the client's role granted one namespace, the proxy's role nothing):
  a transfer to a named broker, the new owner authorizes the client's role on the
  reconnect through the proxy; nothing lost, no error, reconnect "in 0 s".
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import threading
import time
import urllib.request
import uuid

import psutil
import pulsar
import pytest

from bundles.hashing import BundleRange, topic_hash
from magnetar.tools.admin_client import AdminClient, AdminError
from tests import token_files
from tests.cluster import Cluster, python_command
from tests.tls_certs import make_pki
from tests.traffic import Traffic

FAST = ["--lease-ttl-s", "4", "--load-report-interval-s", "0.5", "--leader-interval-s", "0.3", "--no-shedding"]
NAMESPACE = "public/default"
# A move's stall as the producer sees it: its longest gap between two receipts.
STALL_MAX_S = 5.0



def moving_traffic(url: str, topic: str, consumer_type=pulsar.ConsumerType.Shared, **client_args) -> Traffic:
    """Traffic (tests/traffic.py) on the subscription "moving", Shared unless said."""
    return Traffic(url, topic, consumer_type, subscription="moving", send_timeout_ms=60_000, **client_args)


class OwnConnections:
    """Samples this process's TCP connections (the official client lives in it) every
    20 ms: the remote ports it ever reached."""

    def __init__(self) -> None:
        self.remote_ports: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._process = psutil.Process(os.getpid())

    def _sample(self) -> None:
        while not self._stop.is_set():
            for connection in self._process.net_connections(kind="tcp"):
                if connection.raddr:
                    self.remote_ports.add(connection.raddr.port)
            time.sleep(0.02)

    def __enter__(self) -> "OwnConnections":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

def assert_followed_behind_proxy(traffic: Traffic, own: "OwnConnections", broker_ports: set[int], client_log: str,
                                 proxy_port: int, new_owner_url: str, topic: str | None, stall: float) -> None:
    """What every hand-over through the proxy must show: no client error, nothing
    acknowledged lost, no connection of this process to a broker, every connection of
    the client to the proxy, the close naming the new owner (and, given ``topic``, the
    client reconnecting at once), and a stall under STALL_MAX_S."""
    assert not traffic.errors, traffic.errors[:3]
    lost = set(traffic.acked) - set(traffic.received)
    assert not lost, f"{len(lost)} acknowledged messages never received"
    assert not own.remote_ports & broker_ports, own.remote_ports
    connected = re.findall(r"-> [^\]]*:(\d+)\] Connected to broker(.*)", client_log)
    assert {int(port) for port, _ in connected} == {proxy_port}, connected
    assert f"Closed producer: 0 assignedBrokerUrl: {new_owner_url}" in client_log, client_log[-3000:]
    if topic is not None:
        assert re.search(re.escape(topic) + r", [^\]]*\] Schedule reconnection in 0 s", client_log), \
            client_log[-3000:]
    assert stall < STALL_MAX_S, stall



def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].rstrip("/"))


def admin(broker, method: str, path: str):
    return AdminClient(broker.web_service_url).request(method, path).document()


def bundle_of(cluster: Cluster, topic: str) -> str:
    owners = admin(cluster.brokers[0], "GET", f"/admin/v2/namespaces/{NAMESPACE}/bundleOwners")
    return next(b for b in owners if BundleRange.parse(b).contains(topic_hash(f"persistent://{NAMESPACE}/{topic}")))


def owner_of(cluster: Cluster, topic: str):
    url = admin(cluster.brokers[0], "GET", f"/lookup/v2/topic/persistent/{NAMESPACE}/{topic}")["brokerUrl"]
    return next(b for b in cluster.brokers if b.service_url == url)


def proxy_connections_to(proxy, broker_port: int) -> set[int]:
    """The local ports of the proxy process's connections to ``broker_port``."""
    process = psutil.Process(proxy.process.pid)
    return {c.laddr.port for p in (process, *process.children(recursive=True))
            for c in p.net_connections(kind="tcp") if c.raddr and c.raddr.port == broker_port}


def proxy_metric(proxy, name: str, labels: str) -> float:
    text = urllib.request.urlopen(f"{proxy.http_url}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M))


async def start_cluster(cluster: Cluster, pki) -> Cluster:
    await cluster.start_bookies(2)   # the brokers' default ensemble
    await asyncio.gather(*(cluster.broker(extra_args=FAST).start() for _ in range(3)))
    # Plain brokers; the proxy takes clients on a plain and a TLS port.
    await cluster.proxy(extra_args=["--tls-port", "0", "--tls-cert-file", pki.cert_file,
                                    "--tls-key-file", pki.key_file]).start()
    return cluster


@pytest.fixture(scope="module")
def moving(etcd_process, tmp_path_factory):
    """2 bookies, 3 brokers and a proxy shared by this module's tests; its PKI."""
    base = tmp_path_factory.mktemp("handover")
    pki = make_pki(str(base / "pki"))
    cluster = Cluster(etcd_process, str(base))
    try:
        asyncio.run(start_cluster(cluster, pki))
        yield cluster, pki
    finally:
        asyncio.run(cluster.stop())


async def test_bundle_moves_under_traffic_through_the_proxy(moving, capfd):
    cluster, _ = moving
    proxy = cluster.proxies[0]
    capfd.readouterr()
    broker_ports = {port_of(b.service_url) for b in cluster.brokers}
    topic = f"moving-{uuid.uuid4().hex[:8]}"
    with OwnConnections() as own:
        traffic = await asyncio.to_thread(moving_traffic, proxy.service_url, f"persistent://{NAMESPACE}/{topic}")
        traffic.start()
        await asyncio.to_thread(traffic.wait_acked, 100, 30)
        stalls = []
        targets = []
        # Twice to a named broker, then where the owner picks (the CLOSE_* name the
        # new owner each time), then the topic alone unloaded: it stays where it is
        # and the client finds it again by a lookup through the proxy.
        for round_index in range(4):
            owner = owner_of(cluster, topic)
            bundle = bundle_of(cluster, topic)
            path = f"/admin/v2/namespaces/{NAMESPACE}/{bundle}/unload"
            target = None
            if round_index < 2:
                target = next(b for b in cluster.brokers if b is not owner)
                path += f"?destinationBroker={target.broker_id}"
                targets.append(target)
            elif round_index == 3:
                path = f"/admin/v2/persistent/{NAMESPACE}/{topic}/unload"
            before = len(traffic.acked)
            moved_at = time.monotonic()
            if round_index == 0:
                # From outside too: `magnetar admin` through the proxy's HTTP port.
                await asyncio.to_thread(subprocess.run, python_command(
                    "admin", "--admin-url", proxy.http_url, "namespaces", "unload", NAMESPACE,
                    "--bundle", bundle, "--destinationBroker", target.broker_id),
                    check=True, capture_output=True, timeout=60)
            else:
                admin(owner, "PUT", path)
            await asyncio.to_thread(traffic.wait_acked, before + 100, 30)
            new_owner = owner_of(cluster, topic)
            if round_index < 3:
                assert new_owner is not owner, f"round {round_index}: the bundle stayed on {owner.broker_id}"
            if target is not None:
                assert new_owner is target, (round_index, new_owner.broker_id, target.broker_id)
            stalls.append(traffic.stall_after(moved_at))
        # A destination that is no live broker, or the owner itself, is refused (412).
        owner = owner_of(cluster, topic)
        bundle = bundle_of(cluster, topic)
        for named in ("no-such-broker:1", owner.broker_id):
            with pytest.raises(AdminError) as refused:
                admin(owner, "PUT", f"/admin/v2/namespaces/{NAMESPACE}/{bundle}/unload?destinationBroker={named}")
            assert refused.value.status == 412, refused.value
        assert owner_of(cluster, topic) is owner
        # The new owner's producer and consumer are on connections the proxy opened.
        owner = owner_of(cluster, topic)
        deadline = time.monotonic() + 10
        while True:   # the consumer may still be reconnecting after the last unload
            stats = admin(owner, "GET", f"/admin/v2/persistent/{NAMESPACE}/{topic}/stats")
            addresses = [p["address"] for p in stats["publishers"]]
            addresses += [c["address"] for c in stats["subscriptions"]["moving"]["consumers"]]
            if len(addresses) == 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        proxy_sockets = proxy_connections_to(proxy, port_of(owner.service_url))
        assert len(addresses) == 2 and all(port_of(a) in proxy_sockets for a in addresses), \
            (addresses, proxy_sockets)
        await asyncio.to_thread(traffic.finish)
    client_log = capfd.readouterr().out

    assert not traffic.errors, traffic.errors[:3]
    lost = set(traffic.acked) - set(traffic.received)
    assert not lost, f"{len(lost)} acknowledged messages never received"
    duplicates = len(traffic.received) - len(set(traffic.received))
    assert max(stalls) < STALL_MAX_S, f"sends stalled {max(stalls):.2f}s after a move ({stalls})"

    # The client stayed behind the proxy: it never reached a broker's binary port...
    direct = own.remote_ports & broker_ports
    assert not direct, f"the client connected to brokers directly (ports {direct})\n{client_log[-3000:]}"
    assert port_of(proxy.service_url) in own.remote_ports
    # ... its log shows each broker connection made to the proxy's port (the lookup
    # connection, then piped ones naming a broker as the logical address), each
    # destination named in a CLOSE_PRODUCER reached that way ...
    connected = re.findall(r"-> [^\]]*:(\d+)\] Connected to broker(.*)", client_log)
    assert connected, client_log[-3000:]
    assert {int(port) for port, _ in connected} == {port_of(proxy.service_url)}, connected
    logical = {url for _, rest in connected for url in re.findall(r"Logical broker: (\S+),", rest)}
    assert {t.service_url for t in targets} <= logical, (logical, connected)
    assert len(re.findall(r"Closed producer: \d+ assignedBrokerUrl: pulsar://", client_log)) >= 3, \
        client_log[-3000:]
    assert re.search(r"Closed producer: \d+\s*\n", client_log), "the topic unload's CLOSE_PRODUCER named nobody"
    # ... and the proxy accepted them all (the lookup connection and one per broker).
    assert proxy_metric(proxy, "magnetar_proxy_connections_accepted_total", "") >= 1 + len(logical)
    print(f"through the proxy: 3 moves and an unload, stalls {[round(s, 2) for s in stalls]} s, "
          f"{len(traffic.acked)} acknowledged, {duplicates} redelivered")


async def test_a_tls_client_of_the_proxy_follows_a_transfer_to_a_plain_broker(moving, capfd):
    """A client on the proxy's TLS port (the brokers have no TLS listener), its consumer
    on a Failover subscription: the bundle transferred to a named broker. The CLOSE_* name the destination's plain URL in the
    TLS field too (the client reads the field of its own scheme, and only names it back
    to the proxy), so the client reconnects at once, through the proxy's TLS port."""
    cluster, pki = moving
    proxy = cluster.proxies[0]
    broker_ports = {port_of(b.service_url) for b in cluster.brokers}
    capfd.readouterr()
    topic = f"moving-tls-{uuid.uuid4().hex[:8]}"
    with OwnConnections() as own:
        traffic = await asyncio.to_thread(moving_traffic, proxy.service_url_tls, f"persistent://{NAMESPACE}/{topic}",
                                          pulsar.ConsumerType.Failover, tls_trust_certs_file_path=pki.ca_file, tls_validate_hostname=True)
        traffic.start()
        await asyncio.to_thread(traffic.wait_acked, 100, 30)
        owner = owner_of(cluster, topic)
        target = next(b for b in cluster.brokers if b is not owner)
        before = len(traffic.acked)
        moved_at = time.monotonic()
        admin(owner, "PUT", f"/admin/v2/namespaces/{NAMESPACE}/{bundle_of(cluster, topic)}/unload"
                            f"?destinationBroker={target.broker_id}")
        await asyncio.to_thread(traffic.wait_acked, before + 100, 30)
        stall = traffic.stall_after(moved_at)
        assert owner_of(cluster, topic) is target
        await asyncio.to_thread(traffic.finish)
    assert_followed_behind_proxy(traffic, own, broker_ports, capfd.readouterr().out,
                                 port_of(proxy.service_url_tls), target.service_url, topic, stall)
    duplicates = len(traffic.received) - len(set(traffic.received))
    print(f"TLS client through the proxy: transfer stall {stall:.2f} s, {duplicates} redelivered")


@pytest.mark.long
async def test_owner_stopped_gracefully_under_traffic_through_the_proxy(moving, capfd):
    """A rolling restart's step behind the proxy: the topic's owner gets SIGTERM and hands
    its bundles to the other brokers, its CLOSE_* naming each bundle's next owner. The
    client follows through the proxy (never to a broker's address), nothing is lost.
    Last in the module: it stops a broker of the shared cluster."""
    cluster, _ = moving
    proxy = cluster.proxies[0]
    broker_ports = {port_of(b.service_url) for b in cluster.brokers}
    capfd.readouterr()
    topic = f"moving-stop-{uuid.uuid4().hex[:8]}"
    with OwnConnections() as own:
        traffic = await asyncio.to_thread(moving_traffic, proxy.service_url, f"persistent://{NAMESPACE}/{topic}")
        traffic.start()
        await asyncio.to_thread(traffic.wait_acked, 100, 30)
        owner = owner_of(cluster, topic)
        before = len(traffic.acked)
        stopped_at = time.monotonic()
        assert await owner.terminate() == 0, owner.log_text()[-3000:]
        await asyncio.to_thread(traffic.wait_acked, before + 100, 30)
        stall = traffic.stall_after(stopped_at)
        new_owner = next(b for b in cluster.brokers if b.running and b.service_url == admin(
            b, "GET", f"/lookup/v2/topic/persistent/{NAMESPACE}/{topic}")["brokerUrl"])
        await asyncio.to_thread(traffic.finish)
    assert_followed_behind_proxy(traffic, own, broker_ports, capfd.readouterr().out,
                                 port_of(proxy.service_url), new_owner.service_url, None, stall)
    print(f"owner stopped behind the proxy: stall {stall:.2f} s")


@pytest.mark.long
async def test_a_transfer_behind_an_authenticating_proxy(etcd_process, tmp_path, capfd):
    """Brokers with token authentication and authorization; a proxy that authenticates
    clients and names them to brokers (``original_principal``, its own token of a proxy
    role). A client whose role is granted one namespace produces and consumes through it
    while the bundle is transferred to a named broker: the new owner authorizes the
    client's role on the reconnect that the CLOSE_* sent through the proxy; nothing lost,
    no error, never to a broker's address."""
    key_path, signer = token_files.secret_key_file(str(tmp_path))
    proxy_token = token_files.token_file(str(tmp_path), "proxy.token", signer, "proxy-role")
    superuser = signer.create("admin-role")
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(2)
        await asyncio.gather(*(cluster.broker(extra_args=[
            *FAST, "--authentication-enabled", "--authorization-enabled", "--superuser-roles", "admin-role",
            "--proxy-roles", "proxy-role", "--token-secret-key", f"file://{key_path}"]).start() for _ in range(2)))
        proxy = await cluster.proxy(extra_args=["--authentication-enabled", "--token-secret-key",
                                                f"file://{key_path}", "--broker-token-file", proxy_token]).start()
        broker_ports = {port_of(b.service_url) for b in cluster.brokers}

        def as_admin(broker, method: str, path: str, body=None):
            return AdminClient(broker.web_service_url, token=superuser).request(method, path, body=body).document()

        namespace = f"public/moving-{uuid.uuid4().hex[:6]}"
        as_admin(cluster.brokers[0], "PUT", f"/admin/v2/namespaces/{namespace}", {})
        as_admin(cluster.brokers[0], "POST", f"/admin/v2/namespaces/{namespace}/permissions/app",
                 ["produce", "consume"])
        topic = f"persistent://{namespace}/orders"
        capfd.readouterr()
        with OwnConnections() as own:
            traffic = await asyncio.to_thread(moving_traffic, proxy.service_url, topic,
                                              authentication=pulsar.AuthenticationToken(signer.create("app")))
            traffic.start()
            await asyncio.to_thread(traffic.wait_acked, 100, 30)
            lookup = f"/lookup/v2/topic/{topic.replace('persistent://', 'persistent/')}"
            owner_url = as_admin(cluster.brokers[0], "GET", lookup)["brokerUrl"]
            owner = next(b for b in cluster.brokers if b.service_url == owner_url)
            target = next(b for b in cluster.brokers if b is not owner)
            owners = as_admin(owner, "GET", f"/admin/v2/namespaces/{namespace}/bundleOwners")
            bundle = next(b for b in owners if BundleRange.parse(b).contains(topic_hash(topic)))
            before = len(traffic.acked)
            moved_at = time.monotonic()
            as_admin(owner, "PUT", f"/admin/v2/namespaces/{namespace}/{bundle}/unload"
                                   f"?destinationBroker={target.broker_id}")
            await asyncio.to_thread(traffic.wait_acked, before + 100, 30)
            stall = traffic.stall_after(moved_at)
            assert as_admin(cluster.brokers[0], "GET", lookup)["brokerUrl"] == target.service_url
            await asyncio.to_thread(traffic.finish)
        assert_followed_behind_proxy(traffic, own, broker_ports, capfd.readouterr().out,
                                     port_of(proxy.service_url), target.service_url, topic, stall)
        print(f"authenticating proxy: transfer stall {stall:.2f} s")
    finally:
        await cluster.stop()
