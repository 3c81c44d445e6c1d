"""The etcd store, a broker's leader and its load reporter while etcd is blackholed, and
after: every call ends within its bound during the cut, nothing fails with a foreign
error, and everything works again after the heal (issue 32's "bundles without an owner
for 8 minutes": the leader's rounds and the load reports went silent after an etcd
fault, waiting on calls that never ended).

etcd runs on one host, the client (tests/hosts/etcd_cut_client.py, its own process) on
another; the cut is a blackhole route both ways, so packets vanish and TCP hangs, unlike
a refused connection. The client's store is given etcd's endpoint twice, so a failed
call also moves the store to a fresh connection (the rotation between endpoints). About
35 s of wall time (etcd start ~2 s, the client's start ~3 s, the cut 20 s, the heal a
few seconds).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from magnetar.etcd_server import etcd_is_healthy, etcd_member_command
from tests.hosts.network import Network

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read_event(process: subprocess.Popen, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            break
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the etcd cut client exited (code {process.poll()})")
        return json.loads(line)
    raise AssertionError(f"the etcd cut client said nothing for {timeout_s}s")


def _send(process: subprocess.Popen, line: str) -> None:
    process.stdin.write(line + "\n")
    process.stdin.flush()


@pytest.fixture
def network():
    network = Network()
    try:
        network.create()
        yield network
    finally:
        network.destroy()


def test_store_leader_and_reporter_survive_a_blackholed_etcd(network):
    base_dir = tempfile.mkdtemp(prefix="magnetar-etcd-cut-")
    etcd_host = network.add_host("etcd")
    client_host = network.add_host("client")
    processes: list[subprocess.Popen] = []
    stderr_path = os.path.join(base_dir, "client.log")
    passed = False
    try:
        with open(os.path.join(base_dir, "etcd.log"), "wb") as etcd_log:
            processes.append(subprocess.Popen(etcd_host.command(etcd_member_command(
                os.path.join(base_dir, "etcd"), "etcd", etcd_host.address, {"etcd": etcd_host.address})),
                stdout=etcd_log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while True:
            probe = subprocess.run(client_host.command(
                [sys.executable, "-c", "import sys, urllib.request; sys.stdout.buffer.write("
                 f"urllib.request.urlopen('http://{etcd_host.address}:2379/health', timeout=1).read())"]),
                capture_output=True, timeout=10)
            if probe.returncode == 0 and etcd_is_healthy(probe.stdout):
                break
            assert time.monotonic() < deadline, f"etcd not healthy: {probe.stderr[-300:]!r}"
            time.sleep(0.2)

        endpoint = f"{etcd_host.address}:2379"
        with open(stderr_path, "wb") as client_log:
            client = subprocess.Popen(
                client_host.command([sys.executable, "-m", "tests.hosts.etcd_cut_client",
                                     f"etcd://{endpoint},{endpoint}/cut"]),
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=client_log, text=True)
        processes.append(client)
        ready = _read_event(client, 30)
        assert ready["event"] == "ready", ready

        network.partition(["client"], ["etcd"])
        _send(client, "cut")
        cut = _read_event(client, 60)
        assert cut["event"] == "cut", cut
        print("during the cut:", cut)
        assert cut["calls"] > 20, cut
        assert not cut["hangs"], f"etcd calls that outlived their bound during the cut: {cut}"
        assert not cut["foreign"], f"etcd calls that failed with a foreign error: {cut}"

        network.heal()
        _send(client, "heal")
        healed = _read_event(client, 60)
        print("after the heal:", healed)
        assert healed["event"] == "healed", healed
        assert not healed["pending"], f"operations still failing after the heal: {healed}"
        assert healed["reporter_task_alive"] and healed["leader_task_alive"], healed
        assert healed["reporter_ok"], f"no load report published after the heal: {healed}"
        assert healed["leader_ok"], f"no good leader round after the heal: {healed}"
        closed = _read_event(client, 60)
        assert closed["event"] == "closed", closed
        passed = True
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.kill()
            process.wait(10)
        if passed:
            shutil.rmtree(base_dir, ignore_errors=True)
        else:
            print(f"etcd cut test failed: logs kept in {base_dir}")
            try:
                with open(stderr_path) as log:
                    print(log.read()[-6000:])
            except OSError:
                pass
