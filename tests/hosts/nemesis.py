"""The faults: each kind is one object that knows how to inject it and how to heal it
(etcd's robustness tests call them failpoints; Jepsen, a nemesis), and a seeded
schedule that injects them one at a time, every step logged with a wall-clock time.

Kinds (``FAULT_KINDS``):
- ``isolate-broker`` / ``isolate-bookie``: the host's link down (nothing in or out);
- ``broker-from-etcd``: a broker cut from every etcd member, both ways (it still
  reaches bookies and clients: its lease must lapse and it must fence itself);
- ``broker-from-bookie``: a broker and one bookie cut from each other (partial);
- ``broker-to-bookie-one-way``: only the broker's packets to one bookie dropped
  (asymmetric: the bookie's to the broker still arrive, its answers do not);
- ``bookie-from-broker-only``: a bookie cut from every broker, still reaching etcd (it
  stays registered; writers must replace it in their ensembles);
- ``kill-broker`` / ``kill-bookie``: kill -9, restarted on heal;
- ``kill-proxy``: a proxy (a host named ``proxy*``, test_proxy_hosts.py) killed -9,
  restarted on heal;
- ``pause-broker`` / ``pause-bookie``: SIGSTOP, SIGCONT on heal;
- ``etcd-minority``: one etcd member killed (restarted on heal);
- ``etcd-majority``: two members isolated (healed together), held shorter than a
  broker's fence so that owned topics are seen to keep publishing.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass, field

from tests.hosts.topology import Topology

FAULT_KINDS = (
    "isolate-broker", "isolate-bookie", "broker-from-etcd", "broker-from-bookie", "broker-to-bookie-one-way",
    "bookie-from-broker-only", "kill-broker", "kill-bookie", "pause-broker", "pause-bookie", "etcd-minority",
    "etcd-majority",
)
# Kinds that need hosts only some topologies have (not in FAULT_KINDS, which make
# partitions draws from): proxies (tests/hosts/test_proxy_hosts.py).
PROXY_FAULT_KINDS = ("kill-proxy",)
# A broker fences itself 9 s after its lease was last confirmed (bundles/config.py,
# TTL 10 s); an etcd majority loss held under that shows owned topics publishing on.
ETCD_MAJORITY_HOLD_S_MAX = 6.0
RESTART_READY_TIMEOUT_S = 60.0


@dataclass
class Fault:
    kind: str
    target: str
    details: dict = field(default_factory=dict)


_PROXY_READY = re.compile(r"proxy listening: ")


class Nemesis:
    """Injects and heals faults on a topology; ``log`` holds one record per fault
    (kind, target, start, end wall-clock times, seed) and goes to ``log_path``."""

    def __init__(self, topology: Topology, seed: int, log_path: str) -> None:
        self.topology = topology
        self.network = topology.network
        self.seed = seed
        self.random = random.Random(seed)
        self.log_path = log_path
        self.log: list[dict] = []
        self.active: Fault | None = None
        self._active_start = 0.0
        # When set: the broker a broker fault targets (say, the owner of a topic the
        # traffic uses) instead of one chosen by the seed.
        self.broker_target = None

    def _write(self, record: dict) -> None:
        with open(self.log_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    # --- one fault ----------------------------------------------------------------------------------

    def choose(self, kind: str) -> Fault:
        t = self.topology
        pick = self.random.choice
        if kind in ("isolate-broker", "broker-from-etcd", "kill-broker", "pause-broker"):
            chosen = pick(t.broker_names)
            return Fault(kind, (self.broker_target() or chosen) if self.broker_target is not None else chosen)
        if kind in ("isolate-bookie", "kill-bookie", "pause-bookie", "bookie-from-broker-only"):
            return Fault(kind, pick(t.bookie_names))
        if kind in ("broker-from-bookie", "broker-to-bookie-one-way"):
            broker, bookie = pick(t.broker_names), pick(t.bookie_names)
            return Fault(kind, f"{broker}~{bookie}", {"broker": broker, "bookie": bookie})
        if kind == "etcd-minority":
            return Fault(kind, pick(t.etcd_names))
        if kind == "kill-proxy":
            return Fault(kind, pick(sorted(name for name in t.processes if name.startswith("proxy"))))
        if kind == "etcd-majority":
            members = sorted(self.random.sample(t.etcd_names, 2))
            return Fault(kind, "+".join(members), {"members": members})
        raise ValueError(kind)

    def inject(self, fault: Fault) -> None:
        assert self.active is None, "one fault at a time"
        t, net, kind = self.topology, self.network, fault.kind
        self._active_start = time.time()
        if kind in ("isolate-broker", "isolate-bookie"):
            net.isolate(fault.target)
        elif kind == "broker-from-etcd":
            net.partition([fault.target], t.etcd_names)
        elif kind == "broker-from-bookie":
            net.partition([fault.details["broker"]], [fault.details["bookie"]])
        elif kind == "broker-to-bookie-one-way":
            net.cut(fault.details["broker"], fault.details["bookie"])
        elif kind == "bookie-from-broker-only":
            net.partition([fault.target], t.broker_names)
        elif kind in ("kill-broker", "kill-bookie", "etcd-minority", "kill-proxy"):
            t.processes[fault.target].kill9()
        elif kind in ("pause-broker", "pause-bookie"):
            t.processes[fault.target].pause()
        elif kind == "etcd-majority":
            for member in fault.details["members"]:
                net.isolate(member)
        else:
            raise ValueError(kind)
        self.active = fault
        self._write({"event": "inject", "kind": kind, "target": fault.target, "t": self._active_start})

    def heal(self) -> dict:
        fault = self.active
        assert fault is not None
        t, kind = self.topology, fault.kind
        healed_at = time.time()
        if kind in ("kill-broker", "kill-bookie", "etcd-minority", "kill-proxy"):
            process = t.processes[fault.target]
            process.spawn()
        elif kind in ("pause-broker", "pause-bookie"):
            t.processes[fault.target].resume()
        else:
            self.network.heal()
        record = {"kind": kind, "target": fault.target, "start": self._active_start, "end": healed_at,
                  "seed": self.seed}
        self._write({"event": "heal", **record, "t": healed_at})
        if kind in ("kill-broker", "kill-bookie"):
            from tests.hosts.topology import _BOOKIE_READY, _BROKER_READY

            t.processes[fault.target].wait_for_log(_BROKER_READY if kind == "kill-broker" else _BOOKIE_READY,
                                                   timeout_s=RESTART_READY_TIMEOUT_S)
        if kind == "kill-proxy":
            t.processes[fault.target].wait_for_log(_PROXY_READY, timeout_s=RESTART_READY_TIMEOUT_S)
        self.active = None
        self.log.append(record)
        return record

    def heal_all(self) -> None:
        """Whatever is still broken, mended (the run's end, or a failure midway)."""
        if self.active is not None:
            try:
                self.heal()
            except Exception:
                pass
        self.network.heal()
        for process in self.topology.processes.values():
            if process.stopped:
                process.resume()

    # --- a schedule ---------------------------------------------------------------------------------

    def hold_s(self, kind: str, hold_s_range: tuple[float, float], long_share: float,
               long_hold_s_range: tuple[float, float]) -> float:
        if kind == "etcd-majority":
            return min(self.random.uniform(*hold_s_range), ETCD_MAJORITY_HOLD_S_MAX)
        if self.random.random() < long_share:
            return self.random.uniform(*long_hold_s_range)
        return self.random.uniform(*hold_s_range)

    def run(self, kinds: list[str], duration_s: float, *, hold_s_range: tuple[float, float] = (3.0, 6.0),
            gap_s_range: tuple[float, float] = (2.0, 4.0), long_share: float = 0.0,
            long_hold_s_range: tuple[float, float] = (12.0, 16.0), faults_max: int = 10_000,
            cycle: bool = False) -> list[dict]:
        """Faults one after another for ``duration_s``: a kind (in turn when ``cycle``,
        else at random), a target, a hold, heal, a gap. Stops by itself."""
        deadline = time.monotonic() + duration_s
        index = 0
        try:
            while time.monotonic() < deadline and index < faults_max:
                kind = kinds[index % len(kinds)] if cycle else self.random.choice(kinds)
                fault = self.choose(kind)
                hold = self.hold_s(kind, hold_s_range, long_share, long_hold_s_range)
                remaining = deadline - time.monotonic()
                if remaining < min(hold_s_range):
                    break
                self.inject(fault)
                # The hold counts from the injection (what inject did, a probe, counts).
                held = time.time() - self._active_start
                time.sleep(max(0.0, min(hold, max(remaining, 0.5)) - held))
                self.heal()
                time.sleep(self.random.uniform(*gap_s_range))
                index += 1
        finally:
            self.heal_all()
        return self.log
