"""The proxy as the only door: a client host whose one route is to the proxy's host
produces and consumes through it (issue 34).

Hosts: ``ctl``, ``etcd-0``, ``bookie-0..2``, ``broker-0..2`` (E=3, Qw=2, Qa=2),
``proxy-0``, ``proxy-1`` and ``client-0``. After start, ``client-0`` is partitioned
from every etcd member, bookie and broker: it reaches only the proxies (checked with
TCP connects from inside it: brokers' and etcd's ports unreachable, the proxies'
reachable). The official client on ``client-0``, whose service URL names only the two
proxies, runs the harness's workload (3 topics, one keyed producer each; shared,
failover and key-shared subscriptions, 2 consumers each) while the owner of the first
topic is killed -9, then a proxy is killed -9 (each restarted on heal): 0 failed
sends, 0 lost, nothing out of order, no two writers.

Time: 30-70 s of wall time on the 2-core machine depending on its load (start, traffic
20 s, the killed owner's bundles taken over, drain and teardown): over make test's 40 s
allowance at worst, so it runs with ``make hosts-proxy``, not ``make test``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest

from tests.hosts import scenario
from tests.hosts.network import Network
from tests.hosts.topology import Topology, magnetar

# Not in make test (30-70 s, over its 40 s allowance under load): make hosts-proxy.
pytestmark = pytest.mark.hosts_proxy

PROXIES = ["proxy-0", "proxy-1"]
PROXY_PORT = 6650
PROXY_HTTP_PORT = 8082
SEED = int(os.environ.get("HOSTS_SEED", "34"))


@dataclass
class ProxiedTopology(Topology):
    """A topology whose clients are told the proxy's URL, not the brokers'."""
    client_url: str = ""

    @property
    def service_url(self) -> str:
        if self.client_url:
            return self.client_url
        return super().service_url


_CONNECT = ("import socket, sys\n"
            "try:\n"
            "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()\n"
            "except OSError:\n"
            "    sys.exit(1)\n")


def tcp_reachable(topology: Topology, source: str, target: str, port: int) -> bool:
    """Whether a TCP connection from host ``source`` to ``target``'s ``port`` opens."""
    argv = topology.network.hosts[source].command([sys.executable, "-c", _CONNECT, topology.address(target),
                                                   str(port)])
    return subprocess.run(argv, capture_output=True, timeout=20).returncode == 0


@pytest.fixture(scope="module")
def topology(request):
    base_dir = tempfile.mkdtemp(prefix="magnetar-proxy-hosts-")
    failed_before = request.session.testsfailed
    network = Network()
    topology = None
    try:
        network.create()
        topology = ProxiedTopology(network, base_dir, etcd_count=1, bookie_count=3, broker_count=3,
                                   gateway_count=0, client_count=1, autorecovery=False)
        topology.start()
        for name in PROXIES:
            network.add_host(name)
            topology._process(name, magnetar(
                "proxy", "--metadata", topology.metadata_url, "--host", topology.address(name),
                "--port", str(PROXY_PORT), "--http-port", str(PROXY_HTTP_PORT))).spawn()
        for name in PROXIES:
            topology.wait_http(name, f"http://{topology.address(name)}:{PROXY_HTTP_PORT}/health")
        network.partition(["client-0"], topology.broker_names + topology.bookie_names + topology.etcd_names)
        topology.client_url = "pulsar://" + ",".join(f"{topology.address(name)}:{PROXY_PORT}" for name in PROXIES)
        yield topology
    finally:
        try:
            if topology is not None:
                topology.stop()
        finally:
            network.destroy()
            if request.session.testsfailed > failed_before:
                print(f"proxy hosts test failed: server logs kept in {base_dir}")
            else:
                shutil.rmtree(base_dir, ignore_errors=True)


def test_a_client_that_reaches_only_the_proxy_loses_nothing(topology, tmp_path):
    for broker in topology.broker_names:
        assert not tcp_reachable(topology, "client-0", broker, 6650), f"client-0 must not reach {broker}"
    assert not tcp_reachable(topology, "client-0", "etcd-0", 2379), "client-0 must not reach etcd"
    for name in PROXIES:
        assert tcp_reachable(topology, "client-0", name, PROXY_PORT), f"client-0 must reach {name}"
        assert topology.listening_sockets(name), f"{name} listens on nothing"
    # The owner of the first topic killed -9, then a proxy killed -9 (each restarted on heal).
    config = scenario.RunConfig(seed=SEED, kinds=["kill-broker", "kill-proxy"], cycle=True, nemesis_s=12.0,
                                warmup_s=3.0, cooldown_s=5.0, rate_per_producer=30.0, hold_s_range=(2.0, 3.0),
                                gap_s_range=(1.0, 1.5), drain_deadline_s=60.0, probe_majority=False,
                                target_owner=True)
    result = scenario.run(topology, config, str(tmp_path / "run"))
    summary = result.summary()
    print(f"through the proxy only: {summary['verdict']} faults={summary['faults']}")
    verdict = result.verdict
    assert {f["kind"] for f in result.faults} == {"kill-broker", "kill-proxy"}, result.faults
    assert verdict.acknowledged > 0, summary
    assert verdict.failed_sends == 0, summary
    assert verdict.lost_count == 0, summary
    assert verdict.ok, summary
    assert result.consumers_complete, summary
    for name in PROXIES:
        assert "Traceback" not in topology.processes[name].log_text(), name
