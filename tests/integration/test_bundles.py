"""Bundles with three brokers sharing the bookies and etcd, driven by the official
client through a multi-broker service URL while it produces and consumes.

Proves:
- kill -9 of the broker owning a topic: within 30 s the client produces and consumes
  through another broker, and every acknowledged message is consumed;
- a broker frozen (SIGSTOP) past its lease is replaced, and when it wakes it does not
  serve or write: it fenced itself, and its old ledger was fenced by the new owner;
- unload and split of a busy bundle during traffic: no acknowledged message lost, no
  error reaches the application, the longest gap between acknowledgements is reported,
  each new owner loaded the topic from the hand-over's list (its metric), and the old
  owner told the clients where to reconnect (CLOSE_* naming the new owner); with
  advertised listeners, a client that names its listener is sent to that listener's
  URL at once, one whose connection named none looks the topic up as before;
- scale-out from one broker to three with 30 topics under load: ownership spreads to
  all three within 60 s;
- etcd stopped for 5 s and restarted: brokers go on without a restart, no bundle was
  ever served by two brokers at once (the brokers' serving intervals, from their logs,
  never overlap on a hash range), no acknowledged message lost.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
import urllib.request
import uuid

import pulsar

from bundles.hashing import BundleRange
from magnetar.tools.admin_client import AdminClient
from tests.cluster import Cluster, EtcdProcess, free_port
from tests.traffic import Traffic

FAST = ["--lease-ttl-s", "4", "--load-report-interval-s", "0.5", "--leader-interval-s", "0.3",
        "--shedding-cooldown-s", "3", "--retention-check-interval-s", "1"]


def service_url(cluster: Cluster) -> str:
    return "pulsar://" + ",".join(b.service_url.removeprefix("pulsar://") for b in cluster.brokers if b.running)


def admin(cluster: Cluster, method: str, path: str, avoid=None):
    """The admin API through any running broker (but ``avoid``), following the redirect
    to the owner as Pulsar's admin client does; the decoded JSON body."""
    web_service_url = next(b.web_service_url for b in cluster.brokers if b.running and b is not avoid)
    return AdminClient(web_service_url).request(method, path).document()



async def start_cluster(etcd: EtcdProcess, base_dir: str, brokers: int, *extra: str) -> Cluster:
    """Three bookies, then ``brokers`` brokers started side by side (a start is mostly
    the process's own imports and set-up: one after the other, each waited for the
    previous one's)."""
    cluster = Cluster(etcd, base_dir)
    await cluster.start_bookies(3)
    await cluster.start_brokers(brokers, extra_args=[*FAST, *extra])
    return cluster


def owner_of_topic(cluster: Cluster, topic: str):
    lookup = admin(cluster, "GET", f"/lookup/v2/topic/persistent/public/default/{topic}")
    return next(b for b in cluster.brokers if b.service_url == lookup["brokerUrl"])


async def test_owner_killed_clients_move_within_30s(etcd_process, tmp_path):
    cluster = await start_cluster(etcd_process, str(tmp_path), 3)
    try:
        topic = f"failover-{uuid.uuid4().hex[:8]}"
        traffic = Traffic(service_url(cluster), topic).start()
        await asyncio.to_thread(traffic.wait_acked, 300, 30)
        owner = owner_of_topic(cluster, topic)
        before = len(traffic.acked)
        owner.kill9()
        killed_at = time.monotonic()
        await asyncio.to_thread(traffic.wait_acked, before + 300, 60)
        resumed_after = time.monotonic() - killed_at
        new_owner = owner_of_topic(cluster, topic)
        assert new_owner is not owner
        await asyncio.to_thread(traffic.finish)
        assert resumed_after < 30, f"producing resumed only after {resumed_after:.1f}s"
        assert not traffic.lost(), f"{len(traffic.lost())} acknowledged messages never consumed"
        assert not traffic.errors, traffic.errors[:3]
        print(f"clients moved to another broker in {resumed_after:.1f}s "
              f"(longest gap between acknowledgements {max(traffic.gaps):.1f}s)")
    finally:
        await cluster.stop()


async def test_sigterm_hands_bundles_over_without_client_errors(etcd_process, tmp_path):
    """SIGTERM: the owner releases its bundles before it exits; the leader gives them
    to the others, and the clients move without an error and without a lease-length
    stall."""
    cluster = await start_cluster(etcd_process, str(tmp_path), 3)
    try:
        topic = f"handover-{uuid.uuid4().hex[:8]}"
        traffic = Traffic(service_url(cluster), topic).start()
        await asyncio.to_thread(traffic.wait_acked, 300, 30)
        owner = owner_of_topic(cluster, topic)
        before = len(traffic.acked)
        assert await owner.terminate() == 0
        await asyncio.to_thread(traffic.wait_acked, before + 300, 30)
        assert owner_of_topic(cluster, topic) is not owner
        assert re.search(r"bundle released: .* reason=shutdown", owner.log_text())
        await asyncio.to_thread(traffic.finish)
        assert not traffic.errors, traffic.errors[:3]
        assert not traffic.lost(), f"{len(traffic.lost())} acknowledged messages never consumed"
        gap = max(traffic.gaps)
        assert gap < 4, f"a gap of {gap:.2f}s between acknowledgements: as long as a lease"
        print(f"SIGTERM handover: longest gap between acknowledgements {gap * 1000:.0f} ms")
    finally:
        await cluster.stop()


async def test_frozen_owner_is_fenced_when_it_wakes(etcd_process, tmp_path):
    """The owner freezes (SIGSTOP) while a client is producing through it. Its lease
    expires, the bundle moves, and a second client's producer on the new owner opens
    the topic (fencing the frozen owner's ledger) and stores a marker. When the frozen
    broker wakes with the first client's send still pending, its log shows that it was
    fenced or fenced itself; the first client moves on without an error.

    Checked on what the consumer received, against what was acknowledged: every value
    acknowledged to the first client, and the marker, is consumed (none lost); nothing
    is consumed that was not acknowledged to one of the two clients (a send the zombie
    stored but never acknowledged would show up here; a send the client retried counts
    as acknowledged, at-least-once); and the first client's values, first deliveries
    only, come in the order they were acknowledged (a stale write landing after the
    new owner's would break it). Redeliveries of the same value are allowed."""
    cluster = await start_cluster(etcd_process, str(tmp_path), 3)
    try:
        topic = f"zombie-{uuid.uuid4().hex[:8]}"
        traffic = Traffic(service_url(cluster), topic).start()
        await asyncio.to_thread(traffic.wait_acked, 300, 30)
        zombie = owner_of_topic(cluster, topic)
        os.kill(zombie.process.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            while True:
                owners = admin(cluster, "GET", "/admin/v2/namespaces/public/default/bundleOwners", avoid=zombie)
                owner = next(v for b, v in owners.items() if BundleRange.parse(b).contains(_hash(topic)))
                if owner and owner["broker"] != zombie.broker_id:
                    break
                assert time.monotonic() < deadline, "the frozen broker's bundle did not move"
                await asyncio.sleep(0.3)
            others = [b for b in cluster.brokers if b is not zombie]
            second = pulsar.Client("pulsar://" + ",".join(b.service_url.removeprefix("pulsar://") for b in others),
                                   operation_timeout_seconds=30)
            marker = second.create_producer(topic, batching_enabled=False)
            marker.send(b"-1")   # raises unless acknowledged
        finally:
            os.kill(zombie.process.pid, signal.SIGCONT)
        before = len(traffic.acked)
        await asyncio.to_thread(traffic.wait_acked, before + 300, 90)
        deadline = time.monotonic() + 20
        while not re.search(r"managed ledger fenced|stopping to serve every bundle|lost its managed ledger",
                            zombie.log_text()):
            assert time.monotonic() < deadline, "the woken broker neither fenced itself nor was fenced"
            await asyncio.sleep(0.2)
        # (Once fenced and back with a fresh lease it may legitimately be given bundles
        # again by the leader's shedding: what matters is that it stored nothing stale.)
        await asyncio.to_thread(traffic.finish)
        second.close()
        assert not traffic.lost(), f"{len(traffic.lost())} acknowledged messages never consumed"
        assert not traffic.errors, traffic.errors[:3]
        assert -1 in traffic.received, "the second client's message was lost"
        stale = set(traffic.received) - set(traffic.acked) - {-1}
        assert not stale, f"consumed but acknowledged to nobody: {sorted(stale)[:10]}"
        first_deliveries = list(dict.fromkeys(value for value in traffic.received if value != -1))
        assert first_deliveries == sorted(first_deliveries), "the first client's messages were stored out of order"
    finally:
        await cluster.stop()


async def test_unload_and_split_of_a_busy_bundle(etcd_process, tmp_path):
    cluster = await start_cluster(etcd_process, str(tmp_path), 3)
    try:
        topic = f"busy-{uuid.uuid4().hex[:8]}"
        traffic = Traffic(service_url(cluster), topic).start()
        await asyncio.to_thread(traffic.wait_acked, 200, 30)
        for _round in range(2):
            owners = admin(cluster, "GET", "/admin/v2/namespaces/public/default/bundleOwners")
            bundle = next(b for b in owners if BundleRange.parse(b).contains(_hash(topic)))
            admin(cluster, "PUT", f"/admin/v2/namespaces/public/default/{bundle}/unload")
            await asyncio.to_thread(traffic.wait_acked, len(traffic.acked) + 200, 30)
        owners = admin(cluster, "GET", "/admin/v2/namespaces/public/default/bundleOwners")
        bundle = next(b for b in owners if BundleRange.parse(b).contains(_hash(topic)))
        halves = admin(cluster, "PUT", f"/admin/v2/namespaces/public/default/{bundle}/split?unload=true")["bundles"]
        assert len(halves) == 2
        await asyncio.to_thread(traffic.wait_acked, len(traffic.acked) + 300, 30)
        owners = admin(cluster, "GET", "/admin/v2/namespaces/public/default/bundleOwners")
        assert set(halves) <= set(owners) and bundle not in owners
        await asyncio.to_thread(traffic.finish)
        assert not traffic.errors, traffic.errors[:3]
        assert not traffic.lost(), f"{len(traffic.lost())} acknowledged messages never consumed"
        gap = max(traffic.gaps)
        assert gap < 5, f"a gap of {gap:.2f}s between acknowledgements"
        # Each unload handed the busy topic over by name: its new owner loaded it; and
        # the old owner's CLOSE_* named the new owner, so the client went straight there.
        assert sum(_metric(broker, "magnetar_broker_topics_preloaded") for broker in cluster.brokers) >= 2
        assert any("redirect_to=pulsar://" in broker.log_text(since_spawn=False) for broker in cluster.brokers)
        print(f"unload/split: longest gap between acknowledgements {gap * 1000:.0f} ms")
    finally:
        await cluster.stop()


async def test_a_hand_over_sends_listener_clients_to_their_listener(etcd_process, tmp_path, capfd):
    """Two brokers advertising a listener named "internal". A client that names it in
    its lookups and one that names none produce to topics owned by the first broker,
    through it alone; the bundles are unloaded to the second. The first client is
    told the second's "internal" URL and reconnects at once without a lookup; the
    second, whose connection never named a listener, gets no URL and looks the topic up
    after its back-off, as before. Both go on producing."""
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(3)
        for _ in range(2):
            port = free_port()
            await cluster.broker(port=port, extra_args=[*FAST, "--no-shedding", "--advertised-listeners",
                                                        f"internal:pulsar://127.0.0.1:{port}"]).start()
            if len(cluster.brokers) == 1:
                first_url = cluster.brokers[0].service_url
                listener = pulsar.Client(first_url, listener_name="internal", operation_timeout_seconds=30)
                plain = pulsar.Client(first_url, operation_timeout_seconds=30)
                topics = {"listener": f"persistent://public/default/via-listener-{uuid.uuid4().hex[:8]}",
                          "plain": f"persistent://public/default/via-lookup-{uuid.uuid4().hex[:8]}"}
                producers = {"listener": listener.create_producer(topics["listener"]),
                             "plain": plain.create_producer(topics["plain"])}
                for producer in producers.values():
                    producer.send(b"before")
        capfd.readouterr()
        owners = admin(cluster, "GET", "/admin/v2/namespaces/public/default/bundleOwners")
        for bundle in {next(b for b in owners if BundleRange.parse(b).contains(_hash(t.rsplit("/", 1)[1])))
                       for t in topics.values()}:
            admin(cluster, "PUT", f"/admin/v2/namespaces/public/default/{bundle}/unload")
        for producer in producers.values():
            await asyncio.to_thread(producer.send, b"after")
        client_log = capfd.readouterr().out
        listener.close()
        plain.close()
        second = cluster.brokers[1].service_url
        assert f"assignedBrokerUrl: {second}" in client_log, client_log[-3000:]
        assert f"[{topics['listener']}, " in client_log
        assert re.search(re.escape(topics["listener"]) + r", [^\]]*\] Schedule reconnection in 0 s", client_log)
        assert re.search(re.escape(topics["plain"]) + r", [^\]]*\] Schedule reconnection in 0\.\d+ s", client_log)
    finally:
        await cluster.stop()


def _metric(broker, name: str) -> float:
    with urllib.request.urlopen(f"{broker.web_service_url}/metrics", timeout=15) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def _hash(topic: str) -> int:
    from bundles.hashing import topic_hash

    return topic_hash(f"persistent://public/default/{topic}")


async def test_scale_out_spreads_ownership(etcd_process, tmp_path):
    cluster = await start_cluster(etcd_process, str(tmp_path), 1, "--default-bundles", "8")
    try:
        # A namespace with 8 bundles, so three brokers have something to share.
        admin(cluster, "PUT", "/admin/v2/namespaces/public/scale")
        assert admin(cluster, "GET", "/admin/v2/namespaces/public/scale/bundles")["numBundles"] == 8
        url = service_url(cluster)
        client = pulsar.Client(url, operation_timeout_seconds=30)
        producers = [client.create_producer(f"persistent://public/scale/t-{i}", batching_enabled=True)
                     for i in range(30)]
        stop = threading.Event()
        outcomes = {"ok": 0, "failed": []}

        def sent(result, _message_id) -> None:
            if result == pulsar.Result.Ok:
                outcomes["ok"] += 1
            else:
                outcomes["failed"].append(str(result))

        def load() -> None:
            while not stop.is_set():
                for producer in producers:
                    producer.send_async(b"x" * 512, sent)
                time.sleep(0.01)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        started = time.monotonic()
        await cluster.start_brokers(2, extra_args=[*FAST, "--default-bundles", "8"])
        spread = False
        while time.monotonic() - started < 60:
            owners = admin(cluster, "GET", "/admin/v2/namespaces/public/scale/bundleOwners")
            brokers = {v["broker"] for v in owners.values() if v}
            if len(brokers) == 3:
                spread = True
                break
            await asyncio.sleep(0.5)
        took = time.monotonic() - started
        ok_at_spread = outcomes["ok"]
        await asyncio.sleep(2)
        stop.set()
        loader.join(10)
        for producer in producers:
            await asyncio.to_thread(producer.flush)
        client.close()
        assert spread, f"ownership did not spread to three brokers: {owners}"
        assert len(owners) == 8
        assert outcomes["ok"] > ok_at_spread, "publishing stalled once ownership spread"
        assert not outcomes["failed"], outcomes["failed"][:3]
        moves = sum(broker.log_text(since_spawn=False).count("bundle shed:") for broker in cluster.brokers)
        print(f"ownership spread to all three brokers in {took:.1f}s with {moves} moves: {owners}")
    finally:
        await cluster.stop()


_SERVING = re.compile(r"bundle serving (started|stopped): bundle=(\S+) broker_id=(\S+) .*wall_time=([0-9.]+)")


def serving_intervals(cluster: Cluster) -> list[tuple[str, str, BundleRange, float, float]]:
    """(broker, namespace, hash range, start, end) of every span a broker served a bundle.
    Bundles of different namespaces share hash ranges (every namespace starts with the
    same four), so only a namespace's own bundles can overlap."""
    intervals = []
    for broker in cluster.brokers:
        open_spans: dict[str, float] = {}
        for kind, bundle, broker_id, wall in _SERVING.findall(broker.log_text(since_spawn=False)):
            if kind == "started":
                open_spans[bundle] = float(wall)
            elif bundle in open_spans:
                namespace, _, bundle_range = bundle.rpartition("/")
                intervals.append((broker_id, namespace, BundleRange.parse(bundle_range),
                                  open_spans.pop(bundle), float(wall)))
        for bundle, start in open_spans.items():
            namespace, _, bundle_range = bundle.rpartition("/")
            intervals.append((broker.broker_id, namespace, BundleRange.parse(bundle_range), start, time.time()))
    return intervals


async def test_etcd_outage_keeps_single_ownership(tmp_path):
    etcd = EtcdProcess(str(tmp_path / "etcd"))
    etcd.start()
    cluster = await start_cluster(etcd, str(tmp_path), 3)
    try:
        topic = f"outage-{uuid.uuid4().hex[:8]}"
        traffic = Traffic(service_url(cluster), topic).start()
        await asyncio.to_thread(traffic.wait_acked, 300, 30)
        etcd.kill9()
        await asyncio.sleep(5)
        etcd.start()
        await asyncio.to_thread(traffic.wait_acked, len(traffic.acked) + 500, 60)
        await asyncio.to_thread(traffic.finish)
        assert all(b.running for b in cluster.brokers), "a broker died"
        assert not traffic.lost(), f"{len(traffic.lost())} acknowledged messages never consumed"
        intervals = serving_intervals(cluster)
        assert intervals
        for i, (broker_a, namespace_a, range_a, start_a, end_a) in enumerate(intervals):
            for broker_b, namespace_b, range_b, start_b, end_b in intervals[i + 1:]:
                if broker_a == broker_b or namespace_a != namespace_b:
                    continue
                ranges_meet = range_a.lower < range_b.upper and range_b.lower < range_a.upper
                times_meet = start_a < end_b and start_b < end_a
                assert not (ranges_meet and times_meet), (
                    f"{broker_a} and {broker_b} served overlapping bundles at the same time: "
                    f"{namespace_a}/{range_a.name} [{start_a}, {end_a}] and {range_b.name} [{start_b}, {end_b}]")
    finally:
        await cluster.stop()
        etcd.kill9()
