"""Auto-recovery against real bookies, a real etcd and ``magnetar autorecovery`` processes.

Proves:
- 4 bookies, ledgers E=3 Qw=2 Qa=2 written and closed one after another; one bookie is
  killed for good (kill -9) under that traffic. Within the bound (registration TTL 4 s
  + grace period 2 s + audit and copy time; the test allows 90 s and prints what it
  took) the auditor's under-replicated fragments drop to 0 and every entry of every
  closed ledger is on its Qw bookies again: each entry is read from each replica the
  metadata names, digest checked. Two autorecovery processes run: exactly one is the
  auditor, both replicate; /metrics reports the bytes re-replicated, /health answers.
- ``magnetar shell decommissionbookie`` under the same traffic returns once no ledger
  names the bookie; stopping the bookie then loses nothing (every entry reads), and
  the decommissioned bookie's GC removes the ledgers that no longer name it.
- ``magnetar shell recover --bookie-id`` re-replicates a dead bookie's closed ledgers
  at once (no auditor running), and ``listunderreplicated`` is empty afterwards.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import urllib.request

import pytest

from common.entry import verify_entry
from common.errors import MagnetarError
from ledger.client import LedgerClient
from ledger.config import LedgerClientConfig
from ledger.metadata import LedgerMetadata
from ledger.quorum import write_set
from metadata import keys, open_store
from tests.cluster import ManagedProcess, last_json, python_command, run_cli, wait_until_async

_AUTORECOVERY_READY = re.compile(r"autorecovery listening: id=(\S+) http_address=(\S+)")
GC_ARGS = ["--gc-interval-s", "1"]
RECOVERY_BOUND_S = 90.0


@pytest.fixture
async def ledger_client(cluster):
    store = open_store(cluster.metadata_url)
    client = LedgerClient(store, LedgerClientConfig(add_timeout_s=2.0), rng=random.Random(7))
    await client.start()
    yield client
    await client.close()
    await store.close()


async def _start_autorecovery(cluster, name: str = "autorecovery") -> tuple[ManagedProcess, str]:
    process = ManagedProcess(name, python_command(
        "autorecovery", "--metadata", cluster.metadata_url, "--http-port", "0", "--grace-period-s", "2",
        "--audit-interval-s", "0.5", "--worker-interval-s", "0.3", "--lease-ttl-s", "3"),
        f"{cluster.base_dir}/{name}.log")
    process.spawn()
    try:
        match = await process.wait_for_log(_AUTORECOVERY_READY)
    except BaseException:
        process.kill9()
        raise
    return process, match.group(2)


class _Traffic:
    """Writes ledgers of ``entries`` entries one after another, closing each."""

    def __init__(self, client: LedgerClient, entries: int = 100) -> None:
        self.client = client
        self.entries = entries
        self.ledgers: list[int] = []
        self.acked: dict[int, int] = {}   # ledger id -> entries acknowledged
        self.stopping = asyncio.Event()
        self.errors: list[str] = []
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                handle = await self.client.create_ledger(3, 2, 2)
            except MagnetarError as error:
                self.errors.append(str(error))
                await asyncio.sleep(0.2)
                continue
            self.ledgers.append(handle.ledger_id)
            acked = 0
            for index in range(self.entries):
                try:
                    await handle.add(f"{handle.ledger_id}:{index}".encode() * 8)
                    acked += 1
                except MagnetarError as error:
                    self.errors.append(str(error))
                    break
                if index % 25 == 0:
                    await asyncio.sleep(0.01)
            self.acked[handle.ledger_id] = acked
            try:
                await handle.close()
            except MagnetarError as error:
                self.errors.append(str(error))
                await self.client.open_ledger(handle.ledger_id, recovery=True)

    async def stop(self) -> None:
        self.stopping.set()
        assert self.task is not None
        await self.task


async def _all_metadata(client: LedgerClient) -> list[LedgerMetadata]:
    return [LedgerMetadata.decode(r.value) for r in await client.store.get_prefix(keys.LEDGERS)]


async def _check_every_replica(client: LedgerClient, traffic: _Traffic) -> int:
    """Reads every entry of every ledger from every bookie of its write set; returns how
    many replica reads were checked."""
    checked = 0
    for metadata in await _all_metadata(client):
        assert metadata.is_closed, metadata
        assert metadata.last_entry_id + 1 >= traffic.acked.get(metadata.ledger_id, 0), metadata
        e, qw = metadata.ensemble_size, metadata.write_quorum_size
        for entry_id in range(metadata.last_entry_id + 1):
            ensemble = metadata.ensemble_for(entry_id)
            for index in write_set(entry_id, e, qw):
                (result,) = await client.pool.get(ensemble[index]).read(metadata.ledger_id, [entry_id], 1 << 20)
                assert result.entry is not None, (metadata.ledger_id, entry_id, ensemble[index], result.error)
                header = verify_entry(result.entry)
                assert (header.ledger_id, header.entry_id) == (metadata.ledger_id, entry_id)
                checked += 1
    return checked


def _metric(http_address: str, name: str) -> float | None:
    body = urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5).read().decode()
    match = re.search(rf"^{name} (\S+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else None


async def test_killed_bookie_is_rereplicated(cluster, ledger_client):
    """Two autorecovery processes: one is elected auditor, both replicate (their
    per-ledger locks keep them off each other's ledgers)."""
    bookies = await cluster.start_bookies(4, extra_args=GC_ARGS)
    (first, first_http), (second, second_http) = await asyncio.gather(
        _start_autorecovery(cluster, "autorecovery-0"), _start_autorecovery(cluster, "autorecovery-1"))
    try:
        async def auditors() -> list[float]:
            return [await asyncio.to_thread(_metric, address, "magnetar_autorecovery_auditor")
                    for address in (first_http, second_http)]

        await wait_until_async(lambda: _one_auditor(auditors), 30, "an auditor elected")
        http_address = first_http if (await auditors())[0] else second_http
        traffic = _Traffic(ledger_client)
        traffic.start()
        await wait_until_async(lambda: _at_least(traffic, 3), 60, "three ledgers written")
        victim = bookies[1]
        victim.kill9()
        killed_at = time.monotonic()
        written_before = len(traffic.ledgers)
        await wait_until_async(lambda: _at_least(traffic, written_before + 2), 60, "traffic after the kill")
        await traffic.stop()

        async def healed() -> bool:
            named = [m for m in await _all_metadata(ledger_client) if victim.bookie_id in m.all_bookies()]
            fragments = await asyncio.to_thread(_metric, http_address,
                                                "magnetar_autorecovery_under_replicated_fragments")
            return not named and fragments == 0

        await wait_until_async(healed, RECOVERY_BOUND_S, "no ledger naming the killed bookie", interval_s=0.5)
        took = time.monotonic() - killed_at
        checked = await _check_every_replica(ledger_client, traffic)
        assert sorted(await auditors()) == [0.0, 1.0]   # still exactly one auditor
        copied = sum([await asyncio.to_thread(_metric, address, "magnetar_autorecovery_bytes_rereplicated_total")
                      for address in (first_http, second_http)])
        print(f"re-replicated {copied:.0f} bytes; healed {took:.1f} s after the kill "
              f"(bound: 4 s TTL + 2 s grace + copy); {checked} replica reads checked")
        assert copied > 0
        assert checked > 0
        health = json.loads(await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://{http_address}/health", timeout=5).read()))
        assert health["status"] == "ok" and health["auditor"] is True
        code, stdout, _ = await run_cli("shell", "listunderreplicated", "--metadata", cluster.metadata_url)
        assert code == 0 and last_json(stdout)["count"] == 0
    finally:
        await first.terminate()
        await second.terminate()


async def _one_auditor(auditors) -> bool:
    return sorted(await auditors()) == [0.0, 1.0]


async def _at_least(traffic: _Traffic, count: int) -> bool:
    return len(traffic.acked) >= count


async def test_decommission_under_traffic_then_stop_loses_nothing(cluster, ledger_client):
    bookies = await cluster.start_bookies(4, extra_args=GC_ARGS)
    autorecovery, _http_address = await _start_autorecovery(cluster)
    try:
        traffic = _Traffic(ledger_client)
        traffic.start()
        await wait_until_async(lambda: _at_least(traffic, 3), 60, "three ledgers written")
        leaving = bookies[2]
        held_before = [m.ledger_id for m in await _all_metadata(ledger_client) if leaving.bookie_id in m.all_bookies()]
        assert held_before
        code, stdout, stderr = await run_cli("shell", "decommissionbookie", "--bookie-id", leaving.bookie_id,
                                             "--metadata", cluster.metadata_url, "--progress-interval-s", "0.5",
                                             timeout_s=120)
        assert code == 0, stdout + stderr
        assert last_json(stdout)["decommissioned"] is True
        await traffic.stop()
        assert not [m for m in await _all_metadata(ledger_client) if leaving.bookie_id in m.all_bookies()]

        # Its GC drops what it no longer holds for anyone (bookie GC every second).
        async def dropped() -> bool:
            try:
                await ledger_client.pool.get(leaving.bookie_id).read(held_before[0], [0], 1 << 20)
            except MagnetarError:
                return True
            return False

        await wait_until_async(dropped, 30, "the decommissioned bookie's GC to drop a moved ledger")
        await leaving.terminate()
        checked = await _check_every_replica(ledger_client, traffic)
        assert checked > 0
        for ledger_id, acked in traffic.acked.items():
            reader = await ledger_client.open_ledger(ledger_id, recovery=False)
            if acked:
                assert len(await reader.read(0, acked - 1)) == acked
    finally:
        await autorecovery.terminate()


async def test_shell_recover_rereplicates_a_dead_bookie(cluster, ledger_client):
    bookies = await cluster.start_bookies(4)
    traffic = _Traffic(ledger_client, entries=60)
    traffic.start()
    await wait_until_async(lambda: _at_least(traffic, 2), 60, "two ledgers written")
    await traffic.stop()
    victim = bookies[0]
    victim.kill9()
    code, stdout, stderr = await run_cli("shell", "recover", "--bookie-id", victim.bookie_id,
                                         "--metadata", cluster.metadata_url)
    assert code == 0, stdout + stderr
    summary = last_json(stdout)
    assert summary["closed_ledgers_left"] == 0 and summary["open_ledgers_left"] == 0, summary
    await _check_every_replica(ledger_client, traffic)
    code, stdout, _ = await run_cli("shell", "listunderreplicated", "--metadata", cluster.metadata_url)
    assert code == 0 and last_json(stdout)["count"] == 0
