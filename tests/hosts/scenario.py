"""One run: traffic from the client hosts through a nemesis's faults, then the
checker's verdict and figures. Shared by the test (tests/hosts/test_hosts.py, a short
run) and ``make partitions`` (bench/partitions.py, a long one).

Order: consumers subscribe first (client-1), producers start (client-0) and run
through a warm-up, the nemesis's schedule and a cool-down; once the producers have
every receipt (or failure), the acknowledged payloads go to an "expect" file and the
consumers run until each subscription has them all (or a deadline); then the
histories, the fault log and the brokers' logs are checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from tests.hosts import checker
from tests.hosts.nemesis import Nemesis
from tests.hosts.topology import Topology

WORKLOAD_READY_TIMEOUT_S = 120.0


@dataclass
class RunConfig:
    seed: int
    kinds: list[str]
    nemesis_s: float
    topics: int = 3
    rate_per_producer: float = 40.0
    warmup_s: float = 4.0
    cooldown_s: float = 6.0
    cycle: bool = False
    hold_s_range: tuple[float, float] = (3.0, 6.0)
    gap_s_range: tuple[float, float] = (2.0, 4.0)
    long_share: float = 0.0
    long_hold_s_range: tuple[float, float] = (12.0, 16.0)
    drain_deadline_s: float = 180.0
    probe_majority: bool = True
    # Broker faults hit the owner of the first topic (else a broker the seed picks).
    target_owner: bool = False


@dataclass
class RunResult:
    verdict: checker.Verdict
    figures: list[dict]
    faults: list[dict]
    majority_probes: list[dict] = field(default_factory=list)
    consumers_complete: bool = False
    run_dir: str = ""
    probe_namespace: str = ""

    def summary(self) -> dict:
        return {"verdict": self.verdict.summary(), "faults": len(self.faults),
                "per_kind": checker.per_kind(self.figures), "majority_probes": self.majority_probes,
                "consumers_complete": self.consumers_complete, "run_dir": self.run_dir}


def _workload(topology: Topology, host: str, role: str, topics: list[str], history: str, *extra: str):
    argv = [sys.executable, "-m", "tests.hosts.workload", role, "--service-url", topology.service_url,
            "--history", history, *extra]
    for topic in topics:
        argv += ["--topic", topic]
    log = open(history + ".log", "ab")
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        return subprocess.Popen(topology.network.hosts[host].command(argv), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    finally:
        log.close()


def _wait_for_event(path: str, process: subprocess.Popen, kind: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as handle:
                if any(json.loads(line).get("type") == kind for line in handle if line.strip()):
                    return
        if process.poll() is not None:
            raise RuntimeError(f"workload exited ({process.returncode}) before {kind!r}:\n{_tail(path + '.log')}")
        time.sleep(0.2)
    raise TimeoutError(f"workload not {kind!r} after {timeout_s}s:\n{_tail(path + '.log')}")


def _tail(path: str, size: int = 3000) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")[-size:]
    except OSError:
        return ""


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, 9)
        process.wait(timeout=10)


def run(topology: Topology, config: RunConfig, run_dir: str) -> RunResult:
    os.makedirs(run_dir, exist_ok=True)
    token = uuid.uuid4().hex[:6]
    topics = [f"persistent://public/default/hosts-{token}-{index}" for index in range(config.topics)]
    produced_path = os.path.join(run_dir, "produce.jsonl")
    consumed_path = os.path.join(run_dir, "consume.jsonl")
    expect_path = os.path.join(run_dir, "expect.json")
    faults_path = os.path.join(run_dir, "faults.jsonl")
    client_producer, client_consumer = topology.client_names[0], topology.client_names[-1]
    total_s = config.warmup_s + config.nemesis_s + config.cooldown_s
    consumer = _workload(topology, client_consumer, "consume", topics, consumed_path,
                         "--expect-file", expect_path, "--deadline-s", str(total_s + config.drain_deadline_s + 120))
    producer = None
    nemesis = Nemesis(topology, config.seed, faults_path)
    if config.target_owner:
        nemesis.broker_target = lambda: owner_of(topology, topics[0])
    probes: list[dict] = []
    try:
        if config.probe_majority:
            status, body = topology.http("PUT", f"{topology.web_url(topology.broker_names[0])}/admin/v2/namespaces/"
                                                f"public/probe-{token}", body={}, timeout_s=20)
            assert status in (200, 204), (status, body)
        _wait_for_event(consumed_path, consumer, "ready", WORKLOAD_READY_TIMEOUT_S)
        producer = _workload(topology, client_producer, "produce", topics, produced_path,
                             "--rate", str(config.rate_per_producer), "--duration-s", str(total_s))
        _wait_for_event(produced_path, producer, "ready", WORKLOAD_READY_TIMEOUT_S)
        time.sleep(config.warmup_s)
        if config.probe_majority and "etcd-majority" in config.kinds:
            original_inject = nemesis.inject

            def inject(fault):
                original_inject(fault)
                if fault.kind == "etcd-majority":
                    probes.append(probe_new_ownership(topology, token))
            nemesis.inject = inject
        nemesis.run(config.kinds, config.nemesis_s, hold_s_range=config.hold_s_range, gap_s_range=config.gap_s_range,
                    long_share=config.long_share, long_hold_s_range=config.long_hold_s_range, cycle=config.cycle)
        try:
            producer.wait(timeout=total_s + 120)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"producers did not finish:\n{_tail(produced_path + '.log')}") from None
        produced = checker.read_history(produced_path)
        expected: dict[str, list[str]] = {}
        for event in produced:
            if event.get("type") == "ok":
                expected.setdefault(event["producer"].removeprefix("p"), []).append(f"{event['producer']}|{event['seq']}")
        with open(expect_path + ".tmp", "w") as handle:
            json.dump(expected, handle)
        os.rename(expect_path + ".tmp", expect_path)
        try:
            consumer.wait(timeout=config.drain_deadline_s + 30)
        except subprocess.TimeoutExpired:
            pass
    finally:
        nemesis.heal_all()
        for process in (producer, consumer):
            if process is not None:
                _stop(process)
    produced = checker.read_history(produced_path)
    consumed = checker.read_history(consumed_path)
    verdict = checker.check_histories(produced, consumed)
    broker_logs = {name: topology.processes[name].log_text() for name in topology.broker_names}
    verdict.two_writers = checker.check_single_writer(broker_logs, checker.broker_deaths(nemesis.log))
    server_logs = {name: process.log_text() for name, process in topology.processes.items()
                   if name in topology.broker_names or name == "autorecovery"}
    verdict.recovery_short = checker.check_recovered_ledgers(produced, server_logs)
    figures = checker.fault_figures(nemesis.log, produced, consumed)
    complete = any(e.get("type") == "done" and e.get("complete") for e in consumed)
    return RunResult(verdict, figures, nemesis.log, probes, complete, run_dir, f"public/probe-{token}")


def probe_new_ownership(topology: Topology, token: str) -> dict:
    """During an etcd majority loss: a lookup of a topic in a namespace none of whose
    bundles is owned yet (created before the run) must not be answered with an owner
    (no new ownership without etcd)."""
    topic = f"t-{uuid.uuid4().hex[:6]}"
    started = time.time()
    status, body = topology.http("GET", f"{topology.web_url(topology.broker_names[0])}/lookup/v2/topic/persistent/"
                                        f"public/probe-{token}/{topic}", timeout_s=4)
    return {"t": started, "status": status, "answered_owner": status == 200 and b"brokerUrl" in body,
            "body": body[:200].decode(errors="replace")}


def owner_of(topology: Topology, topic: str) -> str | None:
    """The broker (host name) a lookup names as the topic's owner; None if none answers."""
    path = topic.replace("persistent://", "persistent/")
    for broker in topology.broker_names:
        status, body = topology.http("GET", f"{topology.web_url(broker)}/lookup/v2/topic/{path}", timeout_s=3)
        if status != 200:
            continue
        url = json.loads(body).get("brokerUrl", "")
        for name in topology.broker_names:
            if f"//{topology.address(name)}:" in url:
                return name
    return None
