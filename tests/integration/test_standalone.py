"""``magnetar standalone`` as a user runs it (what ``make run`` starts).

Proves: it brings up etcd and three bookies and says so; the shell can list the bookies
and write and read a ledger through it; it stops cleanly on SIGTERM; started again on
the same data directory, the ledger is still there and reads back intact.
"""

from __future__ import annotations

import asyncio
import json
import signal

from tests.cluster import free_port, python_command, run_cli


async def start_standalone(data_dir: str, ports: dict[str, int]) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        *python_command("standalone", "--data-dir", data_dir, "--etcd-port", str(ports["etcd"]),
                        "--etcd-peer-port", str(ports["peer"]), "--bookie-port-base", str(ports["bookie"]),
                        "--bookie-http-port-base", str(ports["http"])),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    assert process.stdout is not None
    async with asyncio.timeout(90):
        while True:
            line = await process.stdout.readline()
            assert line, "standalone exited before it was ready"
            if b"standalone ready" in line:
                return process


async def stop_standalone(process: asyncio.subprocess.Process) -> int:
    process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(60):
        return await process.wait()


def contiguous_free_ports(count: int) -> int:
    """A base port with ``count`` free ports after it (best effort on a busy machine)."""
    import socket

    for _ in range(50):
        base = free_port()
        if base + count < 65000:
            sockets: list[socket.socket] = []
            try:
                for offset in range(count):
                    sock = socket.socket()
                    sock.bind(("127.0.0.1", base + offset))
                    sockets.append(sock)
                for sock in sockets:
                    sock.close()
                return base
            except OSError:
                for sock in sockets:
                    sock.close()
    raise RuntimeError("no run of free ports found")


async def test_standalone_survives_restart_with_its_data(tmp_path):
    ports = {"etcd": free_port(), "peer": free_port(), "bookie": contiguous_free_ports(3),
             "http": contiguous_free_ports(3)}
    data_dir = str(tmp_path / "standalone")
    metadata = f"etcd://127.0.0.1:{ports['etcd']}"
    process = await start_standalone(data_dir, ports)
    try:
        code, stdout, _ = await run_cli("shell", "--metadata", metadata, "listbookies")
        assert code == 0
        assert len(json.loads(stdout.splitlines()[-1])["bookies"]) == 3
        code, stdout, stderr = await run_cli("--log-level", "warning", "shell", "--metadata", metadata,
                                             "simpletest", "--entries", "5000")
        result = json.loads(stdout.splitlines()[-1])
        assert code == 0, stderr
        assert result["acked"] == 5000
        ledger_id = result["ledger_id"]
    finally:
        assert await stop_standalone(process) == 0

    process = await start_standalone(data_dir, ports)
    try:
        code, stdout, _ = await run_cli("--log-level", "warning", "shell", "--metadata", metadata,
                                        "readledger", "--ledger", str(ledger_id), "--check-pattern")
        report = json.loads(stdout.splitlines()[-1])
        assert code == 0, report
        assert report["entries"] == 5000 and report["digest_errors"] == 0 and report["pattern_errors"] == 0
    finally:
        assert await stop_standalone(process) == 0
