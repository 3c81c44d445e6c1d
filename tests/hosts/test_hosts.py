"""Magnetar as the distributed system it is: each part on a host of its own (a Linux
network namespace), real network faults between them, and nothing acknowledged lost.

What it proves:
- every server (3 etcd members, 4 bookies, 3 brokers, 2 gateways, auto-recovery)
  listens on its own host's address only, never on loopback or the wildcard, what
  the brokers answer to lookups is an address a client host can reach, and each
  gateway publishes through the brokers from its own host;
- through a seeded schedule of faults, one of each kind in turn — a broker's host
  isolated, a broker's packets to a bookie dropped one way, a bookie killed -9, a
  broker paused (SIGSTOP), a bookie cut from every broker but not from etcd, an etcd
  member lost, an etcd majority lost — official-client producers on a client host
  and consumers on shared, failover and key-shared subscriptions on another lose no
  acknowledged message, see no acknowledged message out of the order their mode
  promises, and no bundle is ever served by two brokers at once (the brokers' own
  "bundle serving started/stopped" lines);
- an etcd minority loss changes nothing visible (publishes go on), an etcd majority
  loss stops new ownership (a lookup in a namespace nobody owns yet is not answered
  with an owner) but not the publishes of owned topics, and ownership resumes on heal.

How: tests/hosts/ — network.py builds the hosts, topology.py starts the servers on
them, workload.py is the clients' traffic (run inside the client hosts), nemesis.py the
faults, checker.py reads the recorded histories. A missing capability (not root, no
`ip`, no network namespaces) fails the module with a clear message; it never skips.
The long run with figures is `make partitions` (bench/partitions.py).

Broker faults hit the owner of the first topic. Time: about 85 s of wall time on the
2-core machine (start 10-20 s, traffic 47 s, drain and teardown 10 s).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from tests.hosts import scenario
from tests.hosts.network import Network
from tests.hosts.topology import BROKER_HTTP_PORT, GATEWAY_PORT, Topology

SEED = int(os.environ.get("HOSTS_SEED", "32"))
SHORT_KINDS = ["isolate-broker", "etcd-majority", "kill-bookie", "broker-to-bookie-one-way", "etcd-minority",
               "pause-broker", "bookie-from-broker-only"]
# One fault alone never stalls publishes longer than this in the short run: the
# longest holds are 3.5 s, a bookie's add timeout is 5 s, and a client whose broker was
# isolated reconnects within its operation timeout (30 s) at worst.
PUBLISH_STALL_S_MAX = 30.0
# An etcd minority or majority loss (held under the brokers' 9 s fence) must not be
# visible to publishers beyond ordinary jitter on a loaded machine.
ETCD_LOSS_STALL_S_MAX = 4.0


@pytest.fixture(scope="module")
def topology(request):
    base_dir = tempfile.mkdtemp(prefix="magnetar-hosts-")
    failed_before = request.session.testsfailed
    network = Network()
    topology = None
    try:
        network.create()
        topology = Topology(network, base_dir)
        topology.start()
        yield topology
    finally:
        try:
            if topology is not None:
                topology.stop()
        finally:
            network.destroy()
            if request.session.testsfailed > failed_before:
                # Evidence: every server's log under its host's directory.
                print(f"hosts test failed: server logs kept in {base_dir}")
            else:
                shutil.rmtree(base_dir, ignore_errors=True)


def test_every_server_listens_on_its_own_host_address(topology):
    servers = (topology.etcd_names + topology.bookie_names + topology.broker_names + topology.gateway_names
               + ["autorecovery"])
    for name in servers:
        address = topology.address(name)
        listening = topology.listening_sockets(name)
        assert listening, f"{name} listens on nothing"
        # gRPC (bookies) listens on the IPv4-mapped IPv6 form of the same address.
        elsewhere = [local for local in listening
                     if local.rsplit(":", 1)[0].removeprefix("[::ffff:").removesuffix("]") != address]
        assert not elsewhere, f"{name} ({address}) also listens on {elsewhere}"
    status, body = topology.http("GET", f"{topology.web_url(topology.broker_names[1])}/lookup/v2/topic/persistent/"
                                        "public/default/where-am-i")
    assert status == 200, (status, body)
    broker_addresses = {topology.address(name) for name in topology.broker_names}
    assert any(f"pulsar://{address}:" in body.decode() for address in broker_addresses), body
    # Each gateway, on its own host, publishes through the brokers on theirs.
    for name in topology.gateway_names:
        status, body = topology.http("POST", f"http://{topology.address(name)}:{GATEWAY_PORT}/v1/topics/persistent/"
                                             f"public/default/through-{name}/message", body={"payload": "hello"},
                                     timeout_s=30)
        assert status == 200, (name, status, body[:300])


@pytest.mark.long
def test_faults_of_every_kind_lose_nothing_acknowledged(topology, tmp_path):
    config = scenario.RunConfig(seed=SEED, kinds=SHORT_KINDS, nemesis_s=42.0, cycle=True, warmup_s=3.0,
                                target_owner=True,
                                cooldown_s=4.0, hold_s_range=(2.5, 3.5), gap_s_range=(1.5, 2.0),
                                rate_per_producer=30.0, drain_deadline_s=90.0)
    result = scenario.run(topology, config, str(tmp_path / "run"))
    summary = result.summary()
    print(f"seed={SEED}", summary)
    verdict = result.verdict
    assert verdict.acknowledged > 1000, summary
    assert verdict.lost_count == 0, f"acknowledged messages lost (seed {SEED}): {summary}"
    assert not verdict.order_violations, f"order (seed {SEED}): {verdict.order_violations[:5]}"
    assert not verdict.receipt_order_violations, verdict.receipt_order_violations[:5]
    assert not verdict.unexpected, verdict.unexpected[:5]
    assert not verdict.two_writers, f"two writers (seed {SEED}): {verdict.two_writers}"
    assert not verdict.recovery_short, verdict.recovery_short
    assert result.consumers_complete, summary
    kinds_seen = {fault["kind"] for fault in result.faults}
    assert {"isolate-broker", "kill-bookie", "etcd-minority", "etcd-majority"} <= kinds_seen, kinds_seen
    for figure in result.figures:
        assert figure["publish_stall_s"] <= PUBLISH_STALL_S_MAX, figure
        if figure["kind"] in ("etcd-minority", "etcd-majority"):
            assert figure["publish_stall_s"] <= ETCD_LOSS_STALL_S_MAX, figure
    # An etcd majority loss: no new owner was answered meanwhile...
    assert result.majority_probes, "the majority loss was not probed"
    assert not any(probe["answered_owner"] for probe in result.majority_probes), result.majority_probes
    # ...and after healing, new ownership resumes.
    namespace = result.probe_namespace
    deadline = time.monotonic() + 60
    while True:
        status, body = topology.http("GET", f"{topology.web_url(topology.broker_names[0])}/lookup/v2/topic/"
                                            f"persistent/{namespace}/after-heal", timeout_s=10)
        if status == 200 and b"brokerUrl" in body:
            break
        assert time.monotonic() < deadline, f"no owner after healing: {status} {body[:200]!r}"
        time.sleep(1)
    assert str(BROKER_HTTP_PORT) in body.decode()
