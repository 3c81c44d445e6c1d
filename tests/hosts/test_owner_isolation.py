"""The owner broker cut off the network for 25 s mid-traffic, then healed (issue 32):
nothing acknowledged is lost, and the stall is bounded by what was measured
(bench/results/owner_isolation.md), with margin.

Topology, fault and figures: tests/hosts/owner_isolation.py. The brokers run with
their defaults: the fence resets every client connection, and the keep-alive is 30 s
(so the isolated broker does not close its clients' connections by itself before the
heal: the reset is what ends them). After the heal the clients' first packet to the old
owner is answered with a reset, they look the topics up again and find the broker that
took the bundles over while the owner was away. With the former graceful fence
(``--fence-keeps-connections``) the same run stalled 27.3 s against 26.0 s (3 runs
each), and once 31.9 s with 200 sends timed out (bench/results/owner_isolation*.md).

Time: about 90 s of wall time on the 2-core machine (start ~15 s, traffic 57 s, drain
and teardown), so it is marked ``long`` (make test-long).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from broker.config import BrokerConfig
from tests.hosts import owner_isolation, scenario
from tests.hosts.network import Network

pytestmark = pytest.mark.long

SEED = int(os.environ.get("HOSTS_SEED", "32"))
DEFAULT_KEEPALIVE_S = BrokerConfig.keepalive_interval_s      # 30 s
# The stall cannot be shorter than the hold (nothing reaches the isolated broker's
# clients, and they notice nothing before the heal). After the heal, the measured runs
# with the reset came back within 1.0-1.1 s at the default keep-alive (3 runs,
# bench/results/owner_isolation.md) and within 2.0 s in every run with the reset (a
# client's first lookup may land on the still fenced old owner: ~0.7 s more). The
# bound doubles that; the graceful fence took 2.3-2.4 s, and 6.9 s in one earlier run
# (200 sends timed out).
AFTER_HEAL_S_MEASURED = 2.0
STALL_S_MAX = owner_isolation.HOLD_S + 2 * AFTER_HEAL_S_MEASURED + 2.0


@pytest.fixture
def topology(request):
    base_dir = tempfile.mkdtemp(prefix="magnetar-owner-isolation-")
    failed_before = request.session.testsfailed
    network = Network()
    topology = None
    try:
        network.create()
        topology = owner_isolation.topology(network, base_dir, keepalive_s=DEFAULT_KEEPALIVE_S)
        topology.start()
        yield topology
    finally:
        try:
            if topology is not None:
                topology.stop()
        finally:
            network.destroy()
            if request.session.testsfailed > failed_before:
                print(f"owner isolation test failed: server logs kept in {base_dir}")
            else:
                shutil.rmtree(base_dir, ignore_errors=True)


def test_the_owner_isolated_for_25_s_loses_nothing_and_clients_return_soon_after_the_heal(topology, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setenv("HOSTS_CLIENT_LOG_LEVEL", "INFO")     # the client's connection lines, for the report
    result = scenario.run(topology, owner_isolation.config(SEED), str(tmp_path / "run"))
    recovery = owner_isolation.recovery(topology, result)
    summary = {**result.summary(), "recovery": recovery.as_dict()}
    print(f"seed={SEED}", summary)
    verdict = result.verdict
    assert verdict.acknowledged > 1000, summary
    assert verdict.lost_count == 0, f"acknowledged messages lost (seed {SEED}): {summary}"
    assert verdict.ok, summary
    assert result.consumers_complete, summary
    # Every send was acknowledged: none waited past the client's 30 s send timeout.
    assert verdict.failed_sends == 0, summary
    # The isolated broker fenced itself and reset its clients' connections...
    assert recovery.fenced_after_s is not None, f"{recovery.target} never fenced itself: {summary}"
    assert recovery.aborted_connections, f"{recovery.target} reset no connection when it fenced: {summary}"
    # ...the other broker took its bundles over while it was away...
    assert recovery.taken_over_after_s is not None and recovery.taken_over_after_s < owner_isolation.HOLD_S, summary
    # ...and the clients were back on it soon after the heal.
    assert recovery.stall_s >= owner_isolation.HOLD_S - 1.0, f"the fault stalled nothing: {summary}"
    assert recovery.stall_s <= STALL_S_MAX, summary
    assert recovery.after_heal_s <= 2 * AFTER_HEAL_S_MEASURED, summary
