"""Servers started by hand, as a new user starts them (README, "Running the parts by hand").

Proves:
- a port already in use (bookie gRPC and HTTP, broker binary and HTTP) stops the
  server with one line naming the port and the flag that sets it, exit code 2, and no
  traceback (the bug: a traceback from deep inside aiohttp);
- two bookies started on one host with only distinct --port values (no --http-port)
  both serve: their HTTP ports derive from their gRPC ports (the bug: both took 8000
  and the second died);
- ``magnetar shell`` takes --metadata after the command as well as before it.

How: real processes; a plain listening socket takes the port; etcd is the session's.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import urllib.request

import pytest

from tests.cluster import ManagedProcess, free_port, python_command, run_cli

HTTP_PORT_OFFSET = 8001 - 3181


def _listening(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.mark.parametrize("command, flag", [("bookie", "--port"), ("bookie", "--http-port"),
                                           ("broker", "--port"), ("broker", "--http-port")])
async def test_a_port_in_use_is_one_line_naming_the_flag(tmp_path, command, flag):
    taken = free_port()
    other = free_port()
    ports = {"--port": taken, "--http-port": other} if flag == "--port" else {"--port": other, "--http-port": taken}
    args = ["--metadata", "etcd://127.0.0.1:1", "--port", str(ports["--port"]), "--http-port", str(ports["--http-port"])]
    if command == "bookie":
        args += ["--journal-dir", str(tmp_path / "journal"), "--ledger-dir", str(tmp_path / "ledgers")]
    with _listening(taken):
        code, stdout, stderr = await run_cli("--log-level", "warning", command, *args, timeout_s=60)
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"magnetar {command}: cannot listen on 127.0.0.1:{taken} ({flag} {taken})")
    assert "already in use" in lines[0]
    assert not (tmp_path / "journal").exists()       # stopped before opening storage


def _grpc_ports_with_free_http_ports() -> int:
    """A gRPC port p with p + 1 free and their derived HTTP ports free too."""
    for _ in range(100):
        base = free_port()
        ports = [base, base + 1, base + HTTP_PORT_OFFSET, base + 1 + HTTP_PORT_OFFSET]
        if ports[-1] >= 65536:
            continue
        sockets = []
        try:
            for port in ports:
                sock = socket.socket()
                sock.bind(("127.0.0.1", port))
                sockets.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free ports found")


async def test_two_bookies_by_hand_without_http_ports_both_serve(cluster, tmp_path):
    """Bookies on p and p + 1 with no --http-port: both start and answer /health on
    p + 4820 and p + 4821."""
    base = _grpc_ports_with_free_http_ports()
    processes = []
    try:
        for n in range(2):
            argv = python_command("bookie", "--metadata", cluster.metadata_url,
                                  "--journal-dir", str(tmp_path / f"b{n}" / "journal"),
                                  "--ledger-dir", str(tmp_path / f"b{n}" / "ledgers"), "--port", str(base + n))
            process = ManagedProcess(f"bookie-{n}", argv, os.path.join(str(tmp_path), f"b{n}.log"))
            process.spawn()
            processes.append(process)
        for n, process in enumerate(processes):
            match = await process.wait_for_log(re.compile(r"bookie listening: .* http_address=(\S+)"), timeout_s=60)
            assert match.group(1) == f"127.0.0.1:{base + n + HTTP_PORT_OFFSET}"

            def health(port: int = base + n + HTTP_PORT_OFFSET) -> dict:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    return json.loads(response.read())

            assert (await asyncio.to_thread(health))["status"] == "ok"
    finally:
        for process in processes:
            if process.running:
                await process.terminate(timeout_s=20)


async def test_shell_takes_metadata_after_the_command(cluster):
    """``shell listbookies --metadata URL`` works like ``shell --metadata URL listbookies``."""
    await cluster.start_bookies(1)
    for args in (["shell", "--metadata", cluster.metadata_url, "listbookies"],
                 ["shell", "listbookies", "--metadata", cluster.metadata_url]):
        code, stdout, stderr = await run_cli("--log-level", "warning", *args)
        assert code == 0, stderr
        assert len(json.loads(stdout.splitlines()[-1])["bookies"]) == 1
    code, _stdout, stderr = await run_cli("shell", "listbookies")
    assert code == 2 and "--metadata" in stderr and "Traceback" not in stderr
