"""``magnetar standalone`` survives its parts (issue 14).

Proves: with ``--brokers 3``, a ``kill -9`` of the broker that owns a topic under
official-client traffic (a producer sending and a consumer receiving through the
standalone's multi-broker service URL) leaves the standalone running; it starts that
broker again (a new process on the same port answers /health); the client's
acknowledgements resume within 30 s (through whichever broker owns the topic then);
every acknowledged message is consumed; and a SIGTERM then still stops everything with
exit code 0.

How: the standalone as a user starts it (bench/fanout_check.py's helper, free ports),
its children found in /proc by parent pid and told apart by their ``--port``;
tests/integration/test_bundles.py's Traffic for the client side.

Also, on the supervisor alone (``Standalone._supervise`` with small stand-in children,
back-offs shortened): a child that dies once is started again and the standalone goes
on (a SIGTERM then ends it with 0); a child that fails every start ends the standalone
with 1 after ``START_ATTEMPTS_MAX`` attempts, naming the child.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
import uuid

import argparse
import sys

from bench.fanout_check import running_standalone
from magnetar import standalone as standalone_module
from magnetar.standalone import Child, Standalone
from tests.cluster import free_port
from tests.traffic import Traffic


def children_of(pid: int) -> dict[int, list[str]]:
    """pid -> argv of every child of ``pid``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != pid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                found[int(entry)] = handle.read().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue
    return found


def broker_pid(standalone_pid: int, port: int) -> int | None:
    for pid, argv in children_of(standalone_pid).items():
        if "broker" in argv and "--port" in argv and argv[argv.index("--port") + 1] == str(port):
            return pid
    return None


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


async def test_kill_9_of_a_broker_is_a_failover_and_the_broker_comes_back(tmp_path):
    async with running_standalone(str(tmp_path / "standalone"), bookies=2, copies=2, brokers=3) as (process, ready):
        topic = f"supervised-{uuid.uuid4().hex[:8]}"
        traffic = Traffic(ready["service_url"], topic).start()
        try:
            await asyncio.to_thread(traffic.wait_acked, 200, 60)
            lookup = await asyncio.to_thread(get_json, f"{ready['admin_url']}/lookup/v2/topic/persistent/public/"
                                                       f"default/{topic}")
            port = int(lookup["brokerUrl"].rsplit(":", 1)[1])
            victim = broker_pid(process.pid, port)
            assert victim is not None, (lookup, children_of(process.pid))
            before = len(traffic.acked)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            await asyncio.to_thread(traffic.wait_acked, before + 200, 60)
            resumed_after_s = time.monotonic() - killed_at
            # The standalone is still up and started the broker again, on its port.
            assert process.returncode is None
            deadline = time.monotonic() + 60
            while (broker_pid(process.pid, port) in (None, victim)) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            restarted = broker_pid(process.pid, port)
            assert restarted not in (None, victim), children_of(process.pid)
        finally:
            await asyncio.to_thread(traffic.finish)
        assert resumed_after_s < 30, f"acknowledgements resumed only after {resumed_after_s:.1f} s"
        assert not traffic.lost(), f"{len(traffic.lost())} acknowledged messages never consumed"
        print(f"broker {lookup['brokerUrl']} killed: acknowledgements resumed after {resumed_after_s:.1f} s, "
              f"longest gap {max(traffic.gaps):.1f} s, {len(traffic.acked)} acknowledged, none lost")
        output = b"".join(process.output_lines).decode(errors="replace")
        assert "child exited on its own, restarting it: process=broker" in output, output[-3000:]
        assert "child restarted: process=broker" in output, output[-3000:]
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(90):
            assert await process.wait() == 0


# A stand-in child: serves HTTP on its port; the first time (no marker file yet) only
# for a moment, then exits 7, as a crash would.
_FLAKY = """
import http.server, os, sys, threading, time
marker, port = sys.argv[1], int(sys.argv[2])
first = not os.path.exists(marker)
open(marker, "a").close()
server = http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
time.sleep(1.0 if first else 600)
sys.exit(7)
"""


def fast_restarts(monkeypatch) -> None:
    monkeypatch.setattr(standalone_module, "RESTART_DELAY_S", 0.05)
    monkeypatch.setattr(standalone_module, "RESTART_DELAY_S_MAX", 0.1)
    monkeypatch.setattr(standalone_module, "READY_TIMEOUT_S", 10.0)


async def test_a_child_that_dies_is_started_again(tmp_path, monkeypatch):
    fast_restarts(monkeypatch)
    standalone = Standalone(argparse.Namespace(data_dir=str(tmp_path)))
    port = free_port()
    child = Child("flaky", [sys.executable, "-c", _FLAKY, str(tmp_path / "marker"), str(port)],
                  f"http://127.0.0.1:{port}/")
    await standalone._start_child(child)
    first_pid = child.process.pid
    watching = asyncio.ensure_future(standalone.watch_children())
    try:
        async with asyncio.timeout(30):
            while child.restarts == 0 or child.process.pid == first_pid or not healthy(child.ready_url):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert not watching.done()                # the standalone goes on
        assert child.restarts == 1 and child.failed_starts == 0
        standalone.stopping.set()
        assert await watching == 0
    finally:
        await standalone.stop()


async def test_a_child_that_fails_every_start_stops_the_standalone_loudly(tmp_path, monkeypatch, capsys):
    fast_restarts(monkeypatch)
    standalone = Standalone(argparse.Namespace(data_dir=str(tmp_path)))
    port = free_port()
    (tmp_path / "marker").touch()                 # not the first run: it serves until killed
    child = Child("doomed", [sys.executable, "-c", _FLAKY, str(tmp_path / "marker"), str(port)],
                  f"http://127.0.0.1:{port}/")
    await standalone._start_child(child)
    # From now on every start exits at once (a broken command), as a bad disk would make it.
    child.command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    child.process.kill()
    try:
        async with asyncio.timeout(60):
            assert await standalone.watch_children() == 1
        assert child.failed_starts == standalone_module.START_ATTEMPTS_MAX
        assert standalone.gave_up is not None and "doomed" in standalone.gave_up
        assert "doomed failed 5 starts in a row" in capsys.readouterr().err
    finally:
        await standalone.stop()


def _bookies(tmp_path, count: int) -> list[Child]:
    """Stand-in bookies (each serves until killed, as a started bookie does)."""
    children = []
    for n in range(count):
        port = free_port()
        (tmp_path / f"marker-{n}").touch()
        child = Child(f"bookie-{n}", [sys.executable, "-c", _FLAKY, str(tmp_path / f"marker-{n}"), str(port)],
                      f"http://127.0.0.1:{port}/")
        child.may_stay_down = True
        children.append(child)
    return children


async def test_a_bookie_that_cannot_start_is_left_down_while_the_others_hold_the_copies(tmp_path, monkeypatch):
    """3 bookies, 2 copies: a bookie failing every start (as a bookie whose disks were
    lost does, on its cookie) is left down and the standalone goes on (auto-recovery
    makes its copies again); a second one then would leave fewer bookies than copies,
    so that one ends the standalone as any other child would."""
    fast_restarts(monkeypatch)
    standalone = Standalone(argparse.Namespace(data_dir=str(tmp_path), copies=2))
    bookies = _bookies(tmp_path, 3)
    for child in bookies:
        await standalone._start_child(child)
    watching = asyncio.ensure_future(standalone.watch_children())
    try:
        lost = bookies[1]
        lost.command = [sys.executable, "-c", "import sys; sys.exit(3)"]
        lost.process.kill()
        async with asyncio.timeout(60):
            while not lost.left_down:
                assert not watching.done(), standalone.gave_up
                await asyncio.sleep(0.05)
        assert lost.failed_starts == standalone_module.START_ATTEMPTS_MAX
        await asyncio.sleep(0.3)
        assert not watching.done() and standalone.gave_up is None
        assert all(healthy(child.ready_url) for child in (bookies[0], bookies[2]))

        second = bookies[2]
        second.command = [sys.executable, "-c", "import sys; sys.exit(3)"]
        second.process.kill()
        async with asyncio.timeout(60):
            assert await watching == 1
        assert not second.left_down and "bookie-2 failed 5 starts in a row" in standalone.gave_up
    finally:
        watching.cancel()
        await standalone.stop()
