"""The owner broker cut off the network for ~25 s mid-traffic, then healed (issue 32's
"acks stalled 27 s while the owner was fully isolated"): a small topology, one fault,
and what the records say about how the clients came back.

Shared by tests/hosts/test_owner_isolation.py (asserts) and bench/owner_isolation.py
(``make partitions-owner``: figures, with and without the broker's abort on fence).

Hosts: ``ctl``, ``etcd-0``, ``bookie-0..1``, ``broker-0..1`` (E=Qw=Qa=2) and
``client-0``, on which the official client's producers (3 topics) and consumers
(shared, failover and key-shared on each) run. The owner of the first topic is
isolated (its switch port down) for ``hold_s`` and healed.

Why the stall cannot be shorter than the hold: nothing the isolated broker does reaches
its clients, and they notice nothing wrong (a TCP connection with unacknowledged data
just retransmits, and the Python client has no keep-alive setting: the C++ client PINGs
every 30 s). The bundle moves to the other broker once the lease expires (~10 s), but the
clients only look the topic up again once their connection to the old owner ends, after
the heal. What can be shortened is the time after the heal (``after_heal_s``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from tests.hosts import scenario
from tests.hosts.network import Network
from tests.hosts.topology import Topology

HOLD_S = 25.0
# Producers run through the warm-up, the fault and the cool-down (scenario.RunConfig);
# the cool-down leaves room to see the clients come back after the heal.
WARMUP_S = 5.0
COOLDOWN_S = 25.0
RATE_PER_PRODUCER = 30.0
# The brokers' keep-alive: the harness's 10 s (tests/hosts/topology.py). A broker
# closes a connection silent for two intervals, so with 10 s it closes its isolated
# clients' connections itself 20-25 s into a 25 s isolation; with Pulsar's default
# (30 s) it does not before the heal.
BROKER_KEEPALIVE_S = 10.0

# Receipts already on their way when the owner is cut off may still arrive this long after.
STALLED_GRACE_S = 2.0

# A server log line starts with its local time (magnetar/logs.py); the client's
# (tests/hosts/workload.py) the same way.
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3}) ", re.M)
_FENCED = re.compile(r"lease not confirmed for [0-9.]+s, stopping to serve every bundle")
_ABORTED = re.compile(r"fenced: aborting client connections: count=(\d+)")
_SERVING_STARTED = re.compile(r"bundle serving started: bundle=(\S+) broker_id=(\S+) wall_time=([0-9.]+)")
# What the C++ client says when a connection ends (pulsar-client's ClientConnection.cc).
_CLIENT_CONNECTION = re.compile(r"(Connection reset|Broken pipe|Connection closed|Disconnected|ConnectError|"
                                r"Server closed the connection|close[ds]? (?:the )?connection|Connected to broker|"
                                r"Reconnect|reconnect|Connection (?:refused|timed out)|End of file|keep-?alive|"
                                r"Ping|PING|timed out)", re.I)

_CLIENT_NOTICED = re.compile(r"Connection disconnected|notification of Closed producer|Schedule reconnection")


def topology(network: Network, base_dir: str, *, fence_aborts: bool = True,
             keepalive_s: float = BROKER_KEEPALIVE_S) -> Topology:
    """Not started. ``fence_aborts=False`` starts the brokers with the graceful fence
    (the baseline: topics closed, connections left open). ``keepalive_s``: the brokers'
    keep-alive interval (they close a connection silent for twice that)."""
    broker_args = ["--ensemble-size", "2", "--write-quorum", "2", "--ack-quorum", "2",
                   "--keepalive-interval-s", f"{keepalive_s:g}"]
    if not fence_aborts:
        broker_args.append("--fence-keeps-connections")
    return Topology(network, base_dir, etcd_count=1, bookie_count=2, broker_count=2, gateway_count=0,
                    client_count=1, autorecovery=False, broker_args=broker_args)


def config(seed: int, hold_s: float = HOLD_S) -> scenario.RunConfig:
    """One fault: the owner of the first topic isolated for ``hold_s``."""
    return scenario.RunConfig(seed=seed, kinds=["isolate-broker"], cycle=True, target_owner=True,
                              nemesis_s=hold_s + 2.0, hold_s_range=(hold_s, hold_s), gap_s_range=(1.0, 1.0),
                              warmup_s=WARMUP_S, cooldown_s=COOLDOWN_S, rate_per_producer=RATE_PER_PRODUCER,
                              drain_deadline_s=90.0, probe_majority=False)


def _log_time(text: str, position: int) -> float | None:
    """The wall time of the log line holding ``position`` (its local-time stamp)."""
    start = text.rfind("\n", 0, position) + 1
    match = _STAMP.match(text, start)
    if match is None:
        return None
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")) + int(match.group(2)) / 1000


@dataclass
class Recovery:
    """What happened around the fault, from the records and the logs."""
    target: str
    injected: float
    healed: float
    stall_s: float                    # the longest publish stall overlapping the fault
    consume_stall_s: float
    after_heal_s: float               # the last stalled producer's first receipt after the heal
    fenced_after_s: float | None      # from the injection to the target's fence
    aborted_connections: int | None   # what the target's fence aborted (None: graceful fence)
    taken_over_after_s: float | None  # from the injection to the other broker serving a bundle of it
    client_noticed_after_s: float | None   # from the heal to the producers' client dropping a connection or producer
    client_lines: list[str]           # the client's connection lines from the injection on

    def as_dict(self) -> dict:
        return {key: (round(value, 3) if isinstance(value, float) else value)
                for key, value in self.__dict__.items()}


def recovery(topology: Topology, result: scenario.RunResult) -> Recovery:
    faults = [fault for fault in result.faults if fault["kind"] == "isolate-broker"]
    assert len(faults) == 1, result.faults
    fault = faults[0]
    target, injected, healed = fault["target"], fault["start"], fault["end"]
    figure = next(f for f in result.figures if f["start"] == injected)
    produced = scenario.checker.read_history(f"{result.run_dir}/produce.jsonl")
    acks: dict[str, list[float]] = {}
    for event in produced:
        if event.get("type") == "ok":
            acks.setdefault(event["producer"], []).append(event["t"])
    after_heal = 0.0
    for times in acks.values():
        # A producer of a topic on the isolated broker: no ack from shortly after the
        # injection (receipts already on the wire still arrive) to the heal.
        stalled = not any(injected + STALLED_GRACE_S <= t <= healed for t in times)
        later = [t for t in times if t > healed]
        if stalled and later:
            after_heal = max(after_heal, min(later) - healed)
    target_log = topology.processes[target].log_text()
    fenced_after = aborted = None
    for match in _FENCED.finditer(target_log):
        stamp = _log_time(target_log, match.start())
        if stamp is not None and stamp >= injected:
            fenced_after = stamp - injected
            break
    for match in _ABORTED.finditer(target_log):
        stamp = _log_time(target_log, match.start())
        if stamp is not None and stamp >= injected:
            aborted = int(match.group(1))
            break
    taken_over = None
    for name in topology.broker_names:
        if name == target:
            continue
        for match in _SERVING_STARTED.finditer(topology.processes[name].log_text()):
            started = float(match.group(3))
            if injected <= started <= healed + 60 and (taken_over is None or started - injected < taken_over):
                taken_over = started - injected
    client_lines = []
    noticed = None
    try:
        with open(f"{result.run_dir}/produce.jsonl.log", errors="replace") as handle:
            client_text = handle.read()
    except OSError:
        client_text = ""
    for line in client_text.splitlines():
        stamp = _STAMP.match(line)
        if stamp is None or not _CLIENT_CONNECTION.search(line):
            continue
        at = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S")) + int(stamp.group(2)) / 1000
        if at >= injected - 1:
            client_lines.append(f"{at - healed:+.3f}s after heal: {line[24:240]}")
        if noticed is None and at >= healed and _CLIENT_NOTICED.search(line):
            noticed = at - healed
    return Recovery(target, injected, healed, figure["publish_stall_s"], figure["consume_stall_s"], after_heal,
                    fenced_after, aborted, taken_over, noticed, client_lines[:40])
