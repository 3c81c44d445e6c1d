"""pulsar-lite (PyPI ``pulsar-lite``, a Pulsar-protocol broker compiled from Rust, in the
dev extra) as a process the tests start: its binary from the installed package
(``pulsar_lite.binary_finder``), on a free loopback port, with its own data directory
and config. Its metrics endpoint is switched off (it binds 0.0.0.0:8080, which other
suites may hold). ``default_partitions`` > 0 makes every topic it creates partitioned
(it has no admin API to create one partitioned topic: that is its only way)."""

from __future__ import annotations

import asyncio
import os
import socket
import time

from tests.cluster import ManagedProcess, free_port


def binary_path() -> str:
    from pulsar_lite.binary_finder import find_pulsar_lite_binary

    return str(find_pulsar_lite_binary())


class PulsarLiteProcess(ManagedProcess):
    def __init__(self, base_dir: str, *, default_partitions: int = 0, name: str = "pulsar-lite") -> None:
        self.port = free_port()
        self.base_dir = os.path.join(base_dir, name)
        os.makedirs(self.base_dir, exist_ok=True)
        config_path = os.path.join(self.base_dir, "pulsar-lite.toml")
        with open(config_path, "w") as handle:
            handle.write(f"default_partitions = {default_partitions}\n[metrics]\nenabled = false\n")
        argv = [binary_path(), "--config", config_path, "--addr", f"127.0.0.1:{self.port}",
                "--db-path", os.path.join(self.base_dir, "db"), "--log-level", "warn"]
        super().__init__(name, argv, os.path.join(self.base_dir, "pulsar-lite.log"))

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    async def start(self, timeout_s: float = 20.0) -> "PulsarLiteProcess":
        """Starts (or restarts, same port and data) and waits until it accepts connections."""
        self.spawn()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"pulsar-lite exited:\n{self.log_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.25):
                    return self
            except OSError:
                await asyncio.sleep(0.05)
        raise TimeoutError(f"pulsar-lite did not listen on {self.port} within {timeout_s} s")
