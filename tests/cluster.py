"""Real processes for integration tests: etcd, bookies and brokers on free loopback
ports, and the few helpers the integration tests share (unique names, bounded waits,
disk usage, a tool's JSON summary).

A process counts as ready when its log shows its listen line (bookies, brokers) or its
health endpoint answers (etcd). Processes are killed with SIGKILL where a test means a
crash, and every process a test started is stopped when the test ends, whatever
happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from magnetar.etcd_server import etcd_command, wait_for_etcd

READY_TIMEOUT_S = 60.0
_BOOKIE_READY = re.compile(r"bookie listening: bookie_id=(\S+) address=(\S+) http_address=(\S+)")
_BROKER_READY = re.compile(r"broker listening: broker_id=(\S+) service_url=(\S+) web_service_url=(\S+)")
_GATEWAY_READY = re.compile(r"gateway listening: url=(\S+) instance=(\S+)")


def _port_slice() -> range:
    """The ports this test process hands out: below the kernel's ephemeral range, so a
    port picked, released and bound again later (a bookie restarted after ``kill -9``
    keeps its address; a standalone restarted on its data directory keeps its ports)
    cannot have been taken meanwhile as the local port of some outgoing connection;
    each xdist worker has a slice of its own, so two workers never pick the same one.
    Empty when the ephemeral range starts too low to leave room."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            ephemeral_low = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    low, high = 10_000, ephemeral_low
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (high - low) // workers
    if size < 1_000:
        return range(0)
    start = low + (worker % workers) * size
    return range(start, start + size)


_PORTS = _port_slice()
# Walked in order from a random start (another suite on the same machine starts elsewhere).
_port_cursor = [random.randrange(len(_PORTS))] if _PORTS else [0]


def _all_free(ports: range) -> bool:
    sockets: list[socket.socket] = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()


def contiguous_free_ports(count: int) -> int:
    """A base port with ``count`` free ports from it on (a standalone's bookies take
    ``base``, ``base + 1``, …), none of them handed out again by ``free_port`` soon."""
    if _PORTS:
        for _ in range(len(_PORTS)):
            base = _PORTS[_port_cursor[0] % len(_PORTS)]
            if base + count > _PORTS.stop:
                _port_cursor[0] = 0
                continue
            _port_cursor[0] += count
            if _all_free(range(base, base + count)):
                return base
    for _ in range(50):      # no slice: the kernel's choice as the base, best effort
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count < 65000 and _all_free(range(base, base + count)):
            return base
    raise RuntimeError("no run of free ports found")


def created_retrying(create, attempts: int = 3):
    """``create()`` (an official client's subscribe or create_producer), tried again when
    it times out. pulsar-client 3.13's C++ core never retries a SUBSCRIBE or PRODUCER a
    broker refused because the topic's bundle had just moved elsewhere: it keeps the
    refused connection and ignores its own reconnection ("Ignoring reconnection request
    since we're already connected"), so the call times out (apache/pulsar-client-cpp
    #577 fixed the same for reconnects). Applications retry; so do the tests that create
    clients while bundles move (brokers joining, draining, restarting)."""
    import pulsar

    for attempt in range(1, attempts + 1):
        try:
            return create()
        except pulsar.Timeout:
            if attempt == attempts:
                raise
            print(f"client creation timed out (attempt {attempt} of {attempts}), trying again", flush=True)


async def receive_in_order(consumer, expected: list[bytes], timeout_ms: int = 20_000) -> int:
    """Receives (and acknowledges) until every payload of ``expected`` has come, checking
    that they first came in that order and nothing else came; returns how many came
    again. Delivery is at least once: a consumer moved to another broker (a bundle shed
    or handed over) is sent again from the broker's last persisted acknowledgement, so a
    message received just before the move, whose acknowledgement the client had not yet
    sent, comes twice (Pulsar's clients behave so too). Bounded: at most
    ``len(expected)`` repeats."""
    first_arrivals: list[bytes] = []
    seen: set[bytes] = set()
    wanted = set(expected)
    repeats = 0
    while len(first_arrivals) < len(expected):
        message = await asyncio.to_thread(consumer.receive, timeout_ms)
        payload = message.data()
        consumer.acknowledge(message)
        if payload in seen:
            repeats += 1
            assert repeats <= len(expected), "redelivered without end"
            continue
        assert payload in wanted, f"unexpected message {payload!r}"
        seen.add(payload)
        first_arrivals.append(payload)
    assert first_arrivals == expected
    return repeats


def free_port() -> int:
    """A loopback port nothing listens on now, from this process's slice (see
    ``_port_slice``); the kernel's choice when there is no slice."""
    if _PORTS:
        return contiguous_free_ports(1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_json(method: str, url: str, body: object | None = None) -> object:
    """One JSON request to an admin endpoint; the decoded answer (None when empty)."""
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


def archiving_broker_args(ledger_entries_max: int) -> list[str]:
    """A broker that rolls ledgers every ``ledger_entries_max`` entries and checks
    archiving and retention often (the archive and Spark tests)."""
    return ["--ledger-max-entries", str(ledger_entries_max), "--archive-check-interval-s", "0.3",
            "--retention-check-interval-s", "0.5"]


def archive_at_once_policy(batch_rows: int) -> dict:
    """A namespace offload policy: every closed ledger archived at once, its bookie copy
    deleted at once, in record batches of ``batch_rows``."""
    return {"managedLedgerOffloadThresholdInBytes": 0, "managedLedgerOffloadDeletionLagInMillis": 0,
            "archiveBatchRows": batch_rows}


def python_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "magnetar", *args]


class ManagedProcess:
    def __init__(self, name: str, argv: list[str], log_path: str) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._log_offset = 0
        self.env: dict[str, str] | None = None      # None: this process's environment

    def spawn(self) -> None:
        assert self.process is None or self.process.poll() is not None, f"{self.name} already running"
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self._log_offset = log_file.tell()
            self.process = subprocess.Popen(self.argv, stdout=log_file, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=self.env)

    def log_text(self, since_spawn: bool = True) -> str:
        with open(self.log_path, "rb") as handle:
            if since_spawn:
                handle.seek(self._log_offset)
            return handle.read().decode(errors="replace")

    async def wait_for_log(self, pattern: re.Pattern, timeout_s: float = READY_TIMEOUT_S) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = pattern.search(self.log_text())
            if match:
                return match
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.process.returncode}):\n{self.log_text()[-4000:]}")
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{self.name}: {pattern.pattern!r} not seen in {timeout_s}s:\n{self.log_text()[-4000:]}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill9(self) -> None:
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    async def terminate(self, timeout_s: float = 30.0) -> int:
        if not self.running:
            return self.process.returncode if self.process is not None else 0
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return self.process.returncode
            await asyncio.sleep(0.05)
        self.kill9()
        raise TimeoutError(f"{self.name} did not stop within {timeout_s}s after SIGTERM")


class EtcdProcess(ManagedProcess):
    def __init__(self, base_dir: str) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()
        self.data_dir = os.path.join(base_dir, "etcd")
        super().__init__("etcd", etcd_command(self.data_dir, self.client_port, self.peer_port),
                         os.path.join(base_dir, "etcd.log"))

    def start(self) -> None:
        self.spawn()
        wait_for_etcd(self.client_port, READY_TIMEOUT_S, self.process)

    def url(self, root: str) -> str:
        return f"etcd://127.0.0.1:{self.client_port}{root}"


@dataclass
class BookieProcess(ManagedProcess):
    metadata_url: str = ""
    journal_dir: str = ""
    ledger_dirs: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    bookie_id: str = ""
    address: str = ""
    http_address: str = ""

    def __init__(self, name: str, base_dir: str, metadata_url: str, *, ledger_dir_count: int = 1,
                 extra_args: list[str] | None = None, journal_dir: str | None = None,
                 ledger_dirs: list[str] | None = None) -> None:
        self.metadata_url = metadata_url
        directory = os.path.join(base_dir, name)
        self.journal_dir = journal_dir or os.path.join(directory, "journal")
        self.ledger_dirs = ledger_dirs or [os.path.join(directory, f"ledgers-{i}") for i in range(ledger_dir_count)]
        self.extra_args = list(extra_args or [])
        # From this process's port slice, not the kernel's ephemeral range: a bookie
        # restarted after kill -9 binds this port again, and an ephemeral port may have
        # become some outgoing connection's local port meanwhile.
        self.port = free_port()
        self.bookie_id = ""
        self.address = ""
        self.http_address = ""
        super().__init__(name, [], os.path.join(directory, "bookie.log"))

    def _argv(self) -> list[str]:
        argv = python_command("bookie", "--metadata", self.metadata_url, "--journal-dir", self.journal_dir,
                              "--port", str(self.port), "--http-port", "0", "--registration-ttl-s", "4")
        for ledger_dir in self.ledger_dirs:
            argv += ["--ledger-dir", ledger_dir]
        return argv + self.extra_args

    async def start(self) -> "BookieProcess":
        """Starts (or restarts, on the same port) and waits until it serves."""
        self.argv = self._argv()
        self.spawn()
        match = await self.wait_for_log(_BOOKIE_READY)
        self.bookie_id, self.address, self.http_address = match.group(1), match.group(2), match.group(3)
        self.port = int(self.address.rsplit(":", 1)[1])
        return self


class BrokerProcess(ManagedProcess):
    def __init__(self, name: str, base_dir: str, metadata_url: str, *, extra_args: list[str] | None = None,
                 port: int = 0, http_port: int = 0) -> None:
        self.metadata_url = metadata_url
        self.extra_args = list(extra_args or [])
        # Restarts bind the same ports again: from the port slice (see BookieProcess).
        self.port = port or free_port()
        self.http_port = http_port or free_port()
        self.broker_id = ""
        self.service_url = ""
        self.web_service_url = ""
        super().__init__(name, [], os.path.join(base_dir, name, "broker.log"))

    async def start(self) -> "BrokerProcess":
        """Starts (or restarts, on the same ports) and waits until it serves."""
        self.argv = python_command("broker", "--metadata", self.metadata_url, "--port", str(self.port),
                                   "--http-port", str(self.http_port), "--keepalive-interval-s", "10",
                                   *self.extra_args)
        self.spawn()
        match = await self.wait_for_log(_BROKER_READY)
        self.broker_id, self.service_url, self.web_service_url = match.group(1), match.group(2), match.group(3)
        self.port = int(self.service_url.rsplit(":", 1)[1])
        self.http_port = int(self.web_service_url.rsplit(":", 1)[1])
        return self


class GatewayProcess(ManagedProcess):
    """``magnetar gateway`` on a free port; every gateway of one test cluster shares the
    receipt secret (passed in the environment, as in production)."""

    def __init__(self, name: str, base_dir: str, service_url: str, admin_url: str, secret: str, *,
                 extra_args: list[str] | None = None, cluster_name: str = "standalone") -> None:
        self.service_url = service_url
        self.admin_url = admin_url
        self.secret = secret
        self.cluster_name = cluster_name
        self.extra_args = list(extra_args or [])
        self.url = ""
        self.instance = ""
        super().__init__(name, [], os.path.join(base_dir, name, "gateway.log"))

    async def start(self) -> "GatewayProcess":
        self.argv = python_command("gateway", "--service-url", self.service_url, "--admin-url", self.admin_url,
                                   "--port", "0", "--cluster", self.cluster_name, *self.extra_args)
        self.env = {**os.environ, "MAGNETAR_GATEWAY_SECRET": self.secret}
        self.spawn()
        match = await self.wait_for_log(_GATEWAY_READY)
        self.url, self.instance = match.group(1), match.group(2)
        return self


_PROXY_READY = re.compile(r"proxy listening: service_url=(\S+) service_url_tls=(\S+) http_url=(\S+) https_url=(\S+)")


class ProxyProcess(ManagedProcess):
    """``magnetar proxy`` on free ports, finding the brokers through ``metadata_url``."""

    def __init__(self, name: str, base_dir: str, metadata_url: str, *, extra_args: list[str] | None = None,
                 port: int = 0) -> None:
        self.metadata_url = metadata_url
        self.extra_args = list(extra_args or [])
        # Restarts bind the same port again (a client's service URL names it).
        self.port = port or free_port()
        self.service_url = ""
        self.service_url_tls = ""
        self.http_url = ""
        self.https_url = ""      # "-" when not listening (--http-tls-port)
        super().__init__(name, [], os.path.join(base_dir, name, "proxy.log"))

    async def start(self) -> "ProxyProcess":
        self.argv = python_command("proxy", "--metadata", self.metadata_url, "--port", str(self.port),
                                   "--http-port", "0", *self.extra_args)
        self.spawn()
        match = await self.wait_for_log(_PROXY_READY)
        self.service_url, self.service_url_tls, self.http_url, self.https_url = match.groups()
        return self


class Cluster:
    """etcd (shared per session) plus bookies of one test, under a unique root."""

    def __init__(self, etcd: EtcdProcess, base_dir: str) -> None:
        self.etcd = etcd
        self.base_dir = base_dir
        self.root = f"/test-{uuid.uuid4().hex[:12]}"
        self.metadata_url = etcd.url(self.root)
        self.bookies: list[BookieProcess] = []
        self.brokers: list[BrokerProcess] = []
        self.gateways: list[GatewayProcess] = []
        self.proxies: list[ProxyProcess] = []
        self.gateway_secret = f"test:{uuid.uuid4().hex}{uuid.uuid4().hex}"

    def bookie(self, name: str | None = None, **kwargs) -> BookieProcess:
        name = name or f"bookie-{len(self.bookies)}"
        process = BookieProcess(name, self.base_dir, self.metadata_url, **kwargs)
        self.bookies.append(process)
        return process

    async def start_bookies(self, count: int, **kwargs) -> list[BookieProcess]:
        started = [self.bookie(**kwargs) for _ in range(count)]
        await asyncio.gather(*(b.start() for b in started))
        return started

    def broker(self, name: str | None = None, **kwargs) -> BrokerProcess:
        name = name or f"broker-{len(self.brokers)}"
        process = BrokerProcess(name, self.base_dir, self.metadata_url, **kwargs)
        self.brokers.append(process)
        return process

    async def start_brokers(self, count: int, **kwargs) -> list[BrokerProcess]:
        started = [self.broker(**kwargs) for _ in range(count)]
        await asyncio.gather(*(b.start() for b in started))
        return started

    def gateway(self, name: str | None = None, **kwargs) -> GatewayProcess:
        assert self.brokers, "start a broker before a gateway"
        name = name or f"gateway-{len(self.gateways)}"
        broker = self.brokers[0]
        process = GatewayProcess(name, self.base_dir, broker.service_url, broker.web_service_url,
                                 self.gateway_secret, **kwargs)
        self.gateways.append(process)
        return process

    async def start_gateways(self, count: int, **kwargs) -> list[GatewayProcess]:
        started = [self.gateway(**kwargs) for _ in range(count)]
        await asyncio.gather(*(g.start() for g in started))
        return started

    def proxy(self, name: str | None = None, **kwargs) -> ProxyProcess:
        name = name or f"proxy-{len(self.proxies)}"
        process = ProxyProcess(name, self.base_dir, self.metadata_url, **kwargs)
        self.proxies.append(process)
        return process

    async def stop(self) -> None:
        for proxy in self.proxies:
            if proxy.running:
                try:
                    await proxy.terminate(timeout_s=20)
                except TimeoutError:
                    proxy.kill9()
        for gateway in self.gateways:
            if gateway.running:
                try:
                    await gateway.terminate(timeout_s=20)
                except TimeoutError:
                    pass
        for broker in self.brokers:
            if broker.running:
                try:
                    await broker.terminate(timeout_s=20)
                except TimeoutError:
                    pass
        for bookie in self.bookies:
            if bookie.running:
                try:
                    await bookie.terminate(timeout_s=15)
                except TimeoutError:
                    pass


async def run_cli(*args: str, timeout_s: float = 120.0, env: dict | None = None) -> tuple[int, str, str]:
    """Runs ``magnetar …`` to completion (``env``: its environment, None: this
    process's); returns (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(*python_command(*args), stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE, env=env)
    try:
        async with asyncio.timeout(timeout_s):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode, stdout.decode(), stderr.decode()


# --- helpers the integration tests share ------------------------------------------------------

def unique(prefix: str) -> str:
    """A name no other test (or earlier run on the same etcd) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def unique_topic(prefix: str) -> str:
    return f"persistent://public/default/{unique(prefix)}"


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    """Polls ``predicate()`` until it returns something truthy, and returns that; fails
    the test, naming ``what`` was awaited, once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(interval_s)


async def wait_until_async(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    """``wait_until`` for a coroutine predicate, sleeping without blocking the loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(interval_s)


def directory_bytes(path: str) -> int:
    """Bytes in the files under ``path`` (files deleted while walking count 0)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def last_json(stdout: str) -> dict:
    """A tool's summary: the last line of its stdout that starts a JSON object."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, stdout
    return json.loads(lines[-1])
