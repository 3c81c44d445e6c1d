"""Several gateway processes on one port (``--processes N``): a 2-core machine uses both
cores. Each process binds the port with SO_REUSEPORT (the kernel spreads connections
over them) and also binds a settle port of its own: receipts name the process that
holds the lease by that address, so a nack, extension or reject arriving at another
process (or another gateway) is forwarded to the right one, as between gateways.

The first process starts the others (``python -m magnetar gateway`` with the same
arguments, the port it bound, ``--processes 1 --reuse-port``), stops them when it
stops, and stops when one of them dies, so whatever restarts the gateway restarts all.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

_POLL_S = 0.5
READY_FD_ENV = "MAGNETAR_GATEWAY_READY_FD"
READY_TIMEOUT_S = 120.0


def bind_shared(host: str, port: int) -> socket.socket:
    """The public port, shared with the other processes (SO_REUSEPORT)."""
    return socket.create_server((host, port), reuse_port=True)


def settle_url(public_url: str, settle_port: int) -> str:
    """This process's own address: the public URL's scheme and host, its settle port."""
    parts = urlsplit(public_url)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, f"{host}:{settle_port}", parts.path, "", ""))


def announce_ready() -> None:
    """In a worker: tells the first process this one serves (see Workers.start)."""
    fd = os.environ.pop(READY_FD_ENV, "")
    if fd:
        os.write(int(fd), b"1")
        os.close(int(fd))


def _die_with_parent() -> None:
    """In a worker, before exec: SIGTERM when the first process dies, even by kill -9
    (Linux's PR_SET_PDEATHSIG), so no worker outlives it holding the port."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Workers:
    """The other processes, started by the first."""

    def __init__(self, count: int, port: int) -> None:
        self.count = count
        self.port = port
        self.processes: list[subprocess.Popen] = []

    async def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Starts them and returns once each is serving (it writes a byte to a pipe
        then), so the first announces the port only when all serve it."""
        argv = [sys.executable, "-m", "magnetar", *sys.argv[1:], "--port", str(self.port), "--processes", "1",
                "--reuse-port"]
        pipes = []
        for _ in range(self.count):
            read_fd, write_fd = os.pipe()
            self.processes.append(subprocess.Popen(argv, preexec_fn=_die_with_parent, pass_fds=(write_fd,),
                                                   env={**os.environ, READY_FD_ENV: str(write_fd)}))
            os.close(write_fd)
            pipes.append(read_fd)
        try:
            for read_fd in pipes:
                ready = await asyncio.wait_for(asyncio.to_thread(os.read, read_fd, 1), timeout_s)
                if not ready:
                    raise RuntimeError("a gateway worker process exited before serving")
        finally:
            for read_fd in pipes:
                os.close(read_fd)
        log.info("gateway worker processes serving: pids=%s port=%d", [p.pid for p in self.processes], self.port)

    async def watch(self, stopping: asyncio.Event) -> int:
        """Returns when one exits (its code, or 1) or ``stopping`` is set (0)."""
        while not stopping.is_set():
            for process in self.processes:
                code = process.poll()
                if code is not None:
                    log.error("gateway worker process exited: pid=%d code=%d; stopping all", process.pid, code)
                    return code or 1
            try:
                await asyncio.wait_for(stopping.wait(), _POLL_S)
            except TimeoutError:
                pass
        return 0

    async def stop(self, timeout_s: float) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + timeout_s
        for process in self.processes:
            while process.poll() is None and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            if process.poll() is None:
                process.kill()
                process.wait()
