"""Which process runs on which host: a Magnetar cluster laid out over the hosts of a
``Network`` — a 3-member etcd cluster, bookies, brokers, gateways, auto-recovery and
client hosts, each server on a host of its own, binding and advertising that host's
address (never 127.0.0.1), every host on the same well-known ports (they are
different machines, as far as the network can tell).

A process counts as ready when its log shows its listen line (bookies, brokers,
gateways) or its health endpoint answers from the control host (etcd,
auto-recovery). The control host ("ctl") is where the test process's own questions
come from (``Topology.http``): a thread of the test process inside that host's
namespace. Processes are killed by pid (their process group) at ``stop``, and the
network's ``destroy`` kills anything left inside the namespaces.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

from magnetar.etcd_server import etcd_is_healthy, etcd_member_command
from tests.hosts.network import Host, HostThread, Network

READY_TIMEOUT_S = 90.0          # a loaded 2-core machine starts 15 Python servers at once
ETCD_CLIENT_PORT = 2379
BOOKIE_PORT = 3181
BOOKIE_HTTP_PORT = 8000
BROKER_PORT = 6650
BROKER_HTTP_PORT = 8080
GATEWAY_PORT = 8081
AUTORECOVERY_HTTP_PORT = 8010

_BOOKIE_READY = re.compile(r"bookie listening: bookie_id=(\S+) address=(\S+)")
_BROKER_READY = re.compile(r"broker listening: broker_id=(\S+) service_url=(\S+) web_service_url=(\S+)")
_GATEWAY_READY = re.compile(r"gateway listening: url=(\S+)")


@dataclass
class HostProcess:
    """One server process on one host, started with ``ip netns exec`` (which execs in
    place: the pid is the server's) in a session of its own, signalled by pid."""
    name: str
    host: Host
    argv: list[str]
    log_path: str
    env: dict[str, str] | None = None
    process: subprocess.Popen | None = None
    stopped: bool = False          # SIGSTOPped and not yet continued
    _log_offset: int = 0

    def spawn(self) -> None:
        assert not self.running, f"{self.name} already running"
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self._log_offset = log_file.tell()
            self.process = subprocess.Popen(self.host.command(self.argv), stdout=log_file, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=self.env)
        self.stopped = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log_text(self, since_spawn: bool = False) -> str:
        with open(self.log_path, "rb") as handle:
            if since_spawn:
                handle.seek(self._log_offset)
            return handle.read().decode(errors="replace")

    def wait_for_log(self, pattern: re.Pattern, timeout_s: float = READY_TIMEOUT_S) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = pattern.search(self.log_text(since_spawn=True))
            if match:
                return match
            if not self.running:
                raise RuntimeError(f"{self.name} on {self.host.address} exited "
                                   f"({self.process.returncode if self.process else None}):\n"
                                   f"{self.log_text(since_spawn=True)[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: {pattern.pattern!r} not in its log after {timeout_s}s:\n"
                           f"{self.log_text(since_spawn=True)[-3000:]}")

    def signal(self, signum: int) -> None:
        if self.running:
            os.killpg(self.pid, signum)

    def kill9(self) -> None:
        if self.running:
            self.signal(signal.SIGKILL)
            assert self.process is not None
            self.process.wait(timeout=15)
        self.stopped = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self, timeout_s: float = 15.0) -> None:
        if not self.running:
            return
        assert self.process is not None
        if self.stopped:
            self.resume()
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()


def magnetar(*args: str) -> list[str]:
    return [sys.executable, "-m", "magnetar", *args]


@dataclass
class Topology:
    """The cluster's layout over a network; ``start`` brings every server up, ``stop``
    takes them down (the network is the caller's)."""
    network: Network
    base_dir: str
    etcd_count: int = 3
    bookie_count: int = 4
    broker_count: int = 3
    gateway_count: int = 2
    client_count: int = 2
    autorecovery: bool = True
    broker_args: list[str] = field(default_factory=list)
    root: str = field(default_factory=lambda: f"/hosts-{uuid.uuid4().hex[:8]}")
    processes: dict[str, HostProcess] = field(default_factory=dict)
    control: HostThread | None = None

    # --- names and addresses ------------------------------------------------------------------------

    @property
    def etcd_names(self) -> list[str]:
        return [f"etcd-{i}" for i in range(self.etcd_count)]

    @property
    def bookie_names(self) -> list[str]:
        return [f"bookie-{i}" for i in range(self.bookie_count)]

    @property
    def broker_names(self) -> list[str]:
        return [f"broker-{i}" for i in range(self.broker_count)]

    @property
    def gateway_names(self) -> list[str]:
        return [f"gateway-{i}" for i in range(self.gateway_count)]

    @property
    def client_names(self) -> list[str]:
        return [f"client-{i}" for i in range(self.client_count)]

    def address(self, host_name: str) -> str:
        return self.network.hosts[host_name].address

    @property
    def metadata_url(self) -> str:
        endpoints = ",".join(f"{self.address(name)}:{ETCD_CLIENT_PORT}" for name in self.etcd_names)
        return f"etcd://{endpoints}{self.root}"

    @property
    def service_url(self) -> str:
        """The brokers, as a client outside them is told (the official client's
        multi-host form: it tries the next on a failed connection)."""
        return "pulsar://" + ",".join(f"{self.address(name)}:{BROKER_PORT}" for name in self.broker_names)

    def web_url(self, broker_name: str) -> str:
        return f"http://{self.address(broker_name)}:{BROKER_HTTP_PORT}"

    def host_dir(self, host_name: str) -> str:
        return os.path.join(self.base_dir, host_name)

    # --- the control host ---------------------------------------------------------------------------

    def http(self, method: str, url: str, body: object | None = None, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """One HTTP request from the control host: (status, body); status 0 when
        nothing answered."""
        assert self.control is not None

        def request() -> tuple[int, bytes]:
            data = None if body is None else json.dumps(body).encode()
            req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout_s) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()
            except (urllib.error.URLError, OSError):
                return 0, b""

        return self.control.call(request, timeout_s=timeout_s + 5)

    def wait_http(self, name: str, url: str, healthy=lambda status, body: status == 200,
                  timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        process = self.processes[name]
        while time.monotonic() < deadline:
            status, body = self.http("GET", url, timeout_s=2)
            if healthy(status, body):
                return
            if not process.running:
                raise RuntimeError(f"{name} exited:\n{process.log_text()[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"{name}: {url} not healthy after {timeout_s}s:\n{process.log_text()[-3000:]}")

    # --- bringing it up -----------------------------------------------------------------------------

    def add_hosts(self) -> None:
        names = (["ctl"] + self.etcd_names + self.bookie_names + self.broker_names + self.gateway_names
                 + (["autorecovery"] if self.autorecovery else []) + self.client_names)
        for name in names:
            self.network.add_host(name)
        self.control = HostThread(self.network.hosts["ctl"].namespace)

    def _process(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> HostProcess:
        host = self.network.hosts[name]
        process = HostProcess(name, host, argv, os.path.join(self.host_dir(name), f"{name}.log"), env=env)
        self.processes[name] = process
        return process

    def start(self) -> "Topology":
        self.add_hosts()
        members = {name: self.address(name) for name in self.etcd_names}
        for name in self.etcd_names:
            self._process(name, etcd_member_command(os.path.join(self.host_dir(name), "data"), name,
                                                    self.address(name), members)).spawn()
        for name in self.etcd_names:
            self.wait_http(name, f"http://{self.address(name)}:{ETCD_CLIENT_PORT}/health",
                           healthy=lambda status, body: status == 200 and etcd_is_healthy(body))
        for name in self.bookie_names:
            directory = self.host_dir(name)
            self._process(name, magnetar(
                "bookie", "--metadata", self.metadata_url, "--host", self.address(name),
                "--port", str(BOOKIE_PORT), "--http-port", str(BOOKIE_HTTP_PORT),
                "--journal-dir", os.path.join(directory, "journal"), "--ledger-dir", os.path.join(directory, "ledgers"),
                "--registration-ttl-s", "4", "--write-cache-mib", "16", "--read-cache-mib", "8")).spawn()
        for name in self.bookie_names:
            match = self.processes[name].wait_for_log(_BOOKIE_READY)
            assert match.group(2).startswith(self.address(name)), f"{name} registered {match.group(2)}"
        for index, name in enumerate(self.broker_names):
            self._process(name, magnetar(
                "broker", "--metadata", self.metadata_url, "--host", self.address(name),
                "--port", str(BROKER_PORT), "--http-port", str(BROKER_HTTP_PORT), "--broker-id", name,
                "--keepalive-interval-s", "10", "--ensemble-size", "3", "--write-quorum", "2", "--ack-quorum", "2",
                "--entry-cache-mib", "8", *self.broker_args)).spawn()
        for name in self.broker_names:
            match = self.processes[name].wait_for_log(_BROKER_READY)
            assert self.address(name) in match.group(2), f"{name} advertises {match.group(2)}"
            assert self.address(name) in match.group(3), f"{name} advertises {match.group(3)}"
        if self.autorecovery:
            self._process("autorecovery", magnetar(
                "autorecovery", "--metadata", self.metadata_url, "--host", self.address("autorecovery"),
                "--http-port", str(AUTORECOVERY_HTTP_PORT))).spawn()
        secret = f"hosts:{uuid.uuid4().hex}{uuid.uuid4().hex}"
        for name in self.gateway_names:
            self._process(name, magnetar(
                "gateway", "--service-url", self.service_url, "--admin-url", self.web_url(self.broker_names[0]),
                "--host", self.address(name), "--port", str(GATEWAY_PORT)),
                env={**os.environ, "MAGNETAR_GATEWAY_SECRET": secret}).spawn()
        for name in self.gateway_names:
            match = self.processes[name].wait_for_log(_GATEWAY_READY)
            assert self.address(name) in match.group(1), f"{name} listens on {match.group(1)}"
        if self.autorecovery:
            self.wait_http("autorecovery", f"http://{self.address('autorecovery')}:{AUTORECOVERY_HTTP_PORT}/health")
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to every server at once (continued first if paused), then kill -9
        whatever has not exited within ``timeout_s``."""
        for process in self.processes.values():
            if process.running:
                if process.stopped:
                    process.resume()
                process.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            while process.running and time.monotonic() < deadline:
                time.sleep(0.05)
            process.kill9()
        if self.control is not None:
            self.control.close()

    def listening_sockets(self, host_name: str) -> list[str]:
        """The local addresses of the TCP sockets listening on a host (``ss``, from
        iproute2, inside its namespace)."""
        completed = subprocess.run(self.network.hosts[host_name].command(["ss", "-Htln"]), capture_output=True,
                                   text=True, timeout=20, check=True)
        return [line.split()[3] for line in completed.stdout.splitlines() if line.strip()]

    def host_of_process(self, name: str) -> Host:
        return self.processes[name].host
