"""A virtual network of hosts on one Linux machine: one network namespace per host, all
plugged into one bridge that lives in a namespace of its own (the "switch").

Theory of operation:
- Nothing is created in the machine's own (root) namespace: the switch namespace holds
  the bridge ``br0`` and one veth end per host (``v<index>``); the other end is created
  straight inside the host's namespace as ``eth0`` (``ip link add … peer … netns``), so
  two test processes (xdist workers) can never collide on an interface name, and no
  route or address of the machine changes.
- Addresses come from ``172.31.<octet>.0/24`` (``SUBNET_PREFIX``); each network checks
  at creation that no interface of the machine has an address in that range, assigns
  them only inside its own hosts' namespaces, and the hosts have no route beyond the
  /24: no packet leaves the switch. Each network is its own layer-2 domain, so two
  workers' networks could even use the same octet; they use different ones anyway.
- Names: every namespace is ``mgh-<owner pid>-<token>-<role>``. The owner pid lets a
  later run sweep the leftovers of a run that died without cleaning up
  (``sweep_leftovers``: namespaces whose owner process is gone); the token keeps two
  networks of one process apart.
- Faults are applied with ``ip`` alone: a host isolated has its switch-side veth end set
  down (its own configuration untouched, so healing is bringing it up); a host cut
  from another gets a blackhole route to that one address (on one side: asymmetric;
  on both: a partial partition). Blackhole routes drop silently, like a cable cut:
  connections hang until their timeouts, which is what the checks need to see.
- ``destroy`` kills every process still inside the namespaces (by pid, as ``ip netns
  pids`` lists them: processes this network's owner started there), then deletes the
  namespaces; deleting a host's namespace deletes its veth pair, deleting the switch's
  deletes the bridge.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field

NAME_PREFIX = "mgh"
SUBNET_PREFIX = "172.31"
# The third octet of each network's /24: 200 + a number from the xdist worker and the
# token, so parallel workers' networks differ (they could share: separate switches).
OCTET_BASE = 200
OCTET_SPAN = 50
HOSTS_MAX = 200                 # addresses .10 to .209 of the /24
IP_TIMEOUT_S = 20.0             # one `ip` command; they take milliseconds
_NAME = re.compile(rf"^{NAME_PREFIX}-(\d+)-([0-9a-f]+)-(\S+)$")


class NetworkUnavailable(RuntimeError):
    """This machine cannot run the harness (not root, no `ip`, no network namespaces):
    the tests fail with this message; they never skip."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs ``ip ARGS``; raises with ip's own words when it fails and ``check``."""
    completed = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and completed.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({completed.returncode}): {completed.stderr.strip()}")
    return completed


def require_capabilities() -> None:
    """Fails (NetworkUnavailable) with what is missing and how to get it."""
    if shutil.which("ip") is None:
        raise NetworkUnavailable("the hosts harness needs the `ip` command (Debian: apt-get install iproute2; "
                                 "`make setup` installs it)")
    if os.geteuid() != 0:
        raise NetworkUnavailable("the hosts harness needs root (it creates network namespaces, veth pairs and a "
                                 f"bridge); this process runs as uid {os.geteuid()}")
    probe = f"{NAME_PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:6]}-probe"
    added = ip("netns", "add", probe, check=False)
    if added.returncode != 0:
        raise NetworkUnavailable(f"cannot create a network namespace (`ip netns add`): {added.stderr.strip()}")
    try:
        veth = ip("-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0", check=False)
        if veth.returncode != 0:
            raise NetworkUnavailable(f"cannot create a veth pair inside a namespace: {veth.stderr.strip()}")
        bridge = ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if bridge.returncode != 0:
            raise NetworkUnavailable(f"cannot create a bridge inside a namespace: {bridge.stderr.strip()}")
    finally:
        ip("netns", "delete", probe, check=False)


def machine_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of every address on the machine's own interfaces."""
    output = ip("-o", "-4", "addr", "show").stdout
    return [ipaddress.ip_interface(match).network for match in re.findall(r"inet (\S+)", output)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespace_names() -> list[str]:
    output = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in output.splitlines() if line.strip()]


def _kill_namespace_processes(namespace: str) -> None:
    pids = ip("netns", "pids", namespace, check=False).stdout.split()
    for pid_text in pids:
        if pid_text == str(os.getpid()):
            continue
        try:
            os.kill(int(pid_text), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def sweep_leftovers() -> list[str]:
    """Deletes the namespaces (and so links and bridges) that runs of this harness left
    behind when they died: those named by our prefix whose owner process is gone. The
    processes still inside them were started by that run; they are killed first."""
    swept = []
    for name in namespace_names():
        match = _NAME.match(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        _kill_namespace_processes(name)
        ip("netns", "delete", name, check=False)
        swept.append(name)
    return swept


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _enter_namespace(namespace: str) -> None:
    """Moves the calling thread (only it: a network namespace is per thread) into
    ``namespace``; sockets it creates from then on live there."""
    descriptor = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc.setns(descriptor, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into {namespace}: {os.strerror(error)}")
    finally:
        os.close(descriptor)


class HostThread:
    """A thread of the test process that lives in one host's namespace: what the tests
    themselves ask the servers (health, admin REST, metrics) goes from a host of the
    network, since the machine's own namespace has no route to it."""

    def __init__(self, namespace: str) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"host-{namespace}", initializer=_enter_namespace,
            initargs=(namespace,))

    def call(self, function, *args, timeout_s: float = 60.0, **kwargs):
        return self._executor.submit(function, *args, **kwargs).result(timeout=timeout_s)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class Host:
    """One host: its namespace, its address and the switch port it is plugged into."""
    name: str
    namespace: str
    address: str
    switch_port: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec`` execs in place,
        so the pid of the process started is the pid of ``argv``)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass
class Network:
    """A switch and the hosts plugged into it. ``create`` first, ``destroy`` always."""
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    octet: int = 0
    hosts: dict[str, Host] = field(default_factory=dict)
    switch_namespace: str = ""
    # (from host, to host) pairs currently cut by a blackhole route on the "from" side.
    cuts: set[tuple[str, str]] = field(default_factory=set)
    isolated: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.octet:
            worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
            self.octet = OCTET_BASE + (worker * 7 + int(self.token, 16)) % OCTET_SPAN
        self.switch_namespace = self._namespace("switch")

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(f"{SUBNET_PREFIX}.{self.octet}.0/24")

    def _namespace(self, role: str) -> str:
        return f"{NAME_PREFIX}-{os.getpid()}-{self.token}-{role}"

    def create(self) -> "Network":
        require_capabilities()
        sweep_leftovers()
        clashes = [str(net) for net in machine_networks() if net.overlaps(self.subnet)]
        if clashes:
            raise NetworkUnavailable(f"the harness's range {self.subnet} overlaps the machine's {clashes}: "
                                     "change SUBNET_PREFIX in tests/hosts/network.py")
        ip("netns", "add", self.switch_namespace)
        ip("-n", self.switch_namespace, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch_namespace, "link", "set", "br0", "up")
        ip("-n", self.switch_namespace, "link", "set", "lo", "up")
        return self

    def add_host(self, name: str) -> Host:
        """A new host plugged into the switch, with the next address of the subnet."""
        assert name not in self.hosts, name
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name), name
        index = len(self.hosts)
        assert index < HOSTS_MAX
        address = str(self.subnet.network_address + 10 + index)
        namespace = self._namespace(name)
        port = f"v{index}"
        ip("netns", "add", namespace)
        try:
            ip("-n", self.switch_namespace, "link", "add", port, "type", "veth", "peer", "name", "eth0",
               "netns", namespace)
            ip("-n", self.switch_namespace, "link", "set", port, "master", "br0")
            ip("-n", self.switch_namespace, "link", "set", port, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", namespace, "link", "set", "eth0", "up")
        except Exception:
            ip("netns", "delete", namespace, check=False)
            raise
        host = Host(name, namespace, address, port)
        self.hosts[name] = host
        return host

    # --- faults -------------------------------------------------------------------------------------

    def isolate(self, name: str) -> None:
        """Unplugs a host: its switch port goes down; nothing reaches it or leaves it."""
        ip("-n", self.switch_namespace, "link", "set", self.hosts[name].switch_port, "down")
        self.isolated.add(name)

    def reconnect(self, name: str) -> None:
        ip("-n", self.switch_namespace, "link", "set", self.hosts[name].switch_port, "up")
        self.isolated.discard(name)

    def cut(self, source: str, target: str) -> None:
        """``source`` can no longer send to ``target`` (a blackhole route on the source
        side). Replies to what ``target`` sends are dropped too, so a TCP connection
        either side opens fails; ``target`` can still send datagrams one way."""
        if (source, target) in self.cuts:
            return
        ip("-n", self.hosts[source].namespace, "route", "add", "blackhole", f"{self.hosts[target].address}/32")
        self.cuts.add((source, target))

    def uncut(self, source: str, target: str) -> None:
        if (source, target) not in self.cuts:
            return
        ip("-n", self.hosts[source].namespace, "route", "del", "blackhole", f"{self.hosts[target].address}/32")
        self.cuts.discard((source, target))

    def partition(self, side: list[str], other: list[str]) -> None:
        """No host of ``side`` reaches any of ``other`` nor the other way round."""
        for source in side:
            for target in other:
                self.cut(source, target)
                self.cut(target, source)

    def heal(self) -> None:
        """Every cut and every isolation undone."""
        for source, target in sorted(self.cuts):
            self.uncut(source, target)
        for name in sorted(self.isolated):
            self.reconnect(name)

    def reachable(self, source: str, target: str, timeout_s: float = 2.0) -> bool:
        """Whether one ping from ``source`` to ``target`` comes back (both our hosts)."""
        completed = subprocess.run(self.hosts[source].command(
            ["ping", "-c", "1", "-W", str(max(int(timeout_s), 1)), self.hosts[target].address]),
            capture_output=True, timeout=timeout_s + 5)
        return completed.returncode == 0

    # --- teardown -----------------------------------------------------------------------------------

    def destroy(self) -> None:
        """Kills what still runs inside the hosts, deletes their namespaces (their links
        go with them) and the switch's (the bridge goes with it). Idempotent."""
        namespaces = [host.namespace for host in self.hosts.values()] + [self.switch_namespace]
        existing = set(namespace_names())
        for namespace in namespaces:
            if namespace in existing:
                _kill_namespace_processes(namespace)
        deadline = time.monotonic() + 10
        for namespace in namespaces:
            if namespace not in existing:
                continue
            while ip("netns", "pids", namespace, check=False).stdout.split() and time.monotonic() < deadline:
                time.sleep(0.05)
            ip("netns", "delete", namespace, check=False)
        self.hosts.clear()
        self.cuts.clear()
        self.isolated.clear()
