"""``magnetar standalone`` killed with ``kill -9`` takes its children with it.

Proves: after SIGKILL of the standalone process, its children (etcd, the bookie, the
broker, the gateway) are gone within a few seconds and every port they held can be bound again, so
the next ``make run`` starts (the bug: the broker kept 6650 and 8080). Also: the
standalone refuses a port already taken with one line naming the port and its flag,
exit code non-zero, no traceback.

How: a small standalone (one bookie, one copy) on free ports, as a user starts it; its
children are found in /proc by parent pid; "gone" means no such process or a zombie
(reaping is up to whoever adopted it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

from tests.cluster import contiguous_free_ports, free_port, python_command


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry))
    return children


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports() -> dict[str, int]:
    return {"etcd": free_port(), "peer": free_port(), "bookie": contiguous_free_ports(1),
            "http": contiguous_free_ports(1), "broker": free_port(), "broker_http": free_port(),
            "gateway": free_port(), "autorecovery": free_port()}


def _command(data_dir: str, ports: dict[str, int]) -> list[str]:
    return python_command("standalone", "--data-dir", data_dir, "--bookies", "1", "--copies", "1",
                          "--etcd-port", str(ports["etcd"]), "--etcd-peer-port", str(ports["peer"]),
                          "--bookie-port-base", str(ports["bookie"]), "--bookie-http-port-base", str(ports["http"]),
                          "--broker-port", str(ports["broker"]), "--broker-http-port", str(ports["broker_http"]),
                          "--gateway-port", str(ports["gateway"]),
                          "--autorecovery-http-port", str(ports["autorecovery"]))


async def test_kill_9_of_the_standalone_takes_its_children_and_frees_the_ports(tmp_path):
    """SIGKILL the standalone once ready: within 5 s no child lives and all eight ports
    bind again."""
    ports = _ports()
    process = await asyncio.create_subprocess_exec(*_command(str(tmp_path / "standalone"), ports),
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                   start_new_session=True)
    children: list[int] = []
    try:
        assert process.stdout is not None
        async with asyncio.timeout(90):
            while True:
                line = await process.stdout.readline()
                assert line, "standalone exited before it was ready"
                if b"standalone ready" in line:
                    break
        children = _children_of(process.pid)
        assert len(children) == 5, children   # etcd, one bookie, one broker, auto-recovery, the gateway
        assert [name for name, port in ports.items() if _port_free(port)] == []
        process.send_signal(signal.SIGKILL)
        await process.wait()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and (any(_alive(pid) for pid in children)
                                               or not all(_port_free(port) for port in ports.values())):
            await asyncio.sleep(0.05)
        assert [pid for pid in children if _alive(pid)] == []
        assert [name for name, port in ports.items() if not _port_free(port)] == []
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        for pid in children:            # only if the test failed: leave nothing behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


async def test_one_port_given_to_two_parts_is_refused_in_one_line(tmp_path):
    """The auto-recovery process's port set to the gateway's: exit 2, one line naming
    the port and the flag, nothing started (each would have probed the other)."""
    ports = _ports()
    ports["autorecovery"] = ports["gateway"]
    process = await asyncio.create_subprocess_exec(*_command(str(tmp_path / "standalone"), ports),
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        _stdout, stderr = await process.communicate()
    text = stderr.decode()
    assert process.returncode == 2, text
    errors = [line for line in text.splitlines() if line.startswith("magnetar: configuration error:")]
    assert len(errors) == 1 and "Traceback" not in text, text
    assert f"--autorecovery-http-port {ports['gateway']}" in errors[0] and "gateway's" in errors[0], errors
    assert not (tmp_path / "standalone" / "etcd.log").exists()


async def test_a_taken_port_is_refused_in_one_line(tmp_path):
    """A listener on the broker's HTTP port: the standalone exits 2 with one line naming
    the port and --broker-http-port, and no traceback; nothing was started."""
    ports = _ports()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports["broker_http"]))
        taken.listen()
        process = await asyncio.create_subprocess_exec(*_command(str(tmp_path / "standalone"), ports),
                                                       stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(30):
            stdout, stderr = await process.communicate()
    text = stderr.decode()
    assert process.returncode == 2, text
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if line.startswith("magnetar standalone:")]
    assert len(errors) == 1, text
    assert f"--broker-http-port {ports['broker_http']}" in errors[0]
    assert not (tmp_path / "standalone" / "etcd.log").exists()
