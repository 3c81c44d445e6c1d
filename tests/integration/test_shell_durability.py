"""Durability through bookie crashes, driven by the shell as an operator would.

``magnetar shell simpletest`` writes with E=3, Qw=2, Qa=2 to 4 bookies; once it has
acknowledged a few thousand entries, one bookie of its ensemble is killed with SIGKILL.
Proves: writing continues through an ensemble change and every entry is acknowledged;
``readledger`` reads every acknowledged entry from the survivors with no digest or
pattern errors; and after the killed bookie restarts (journal replay), every entry it
acknowledged before dying is read back from it alone. Run twice: with checkpoints
suppressed (everything comes back from the journal) and with frequent checkpoints (the
entry logs plus the journal tail since the last checkpoint).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ledger.bookie_client import BookieClient
from ledger.config import LedgerClientConfig
from common.entry import verify_entry
from ledger.quorum import write_set
from ledger.shell import pattern_payload
from tests.cluster import last_json, python_command, run_cli

ENTRIES = 30_000
SIZE = 512


@pytest.mark.parametrize("flush_interval_s", ["600", "0.2"], ids=["journal-only", "checkpointing"])
async def test_kill9_during_simpletest(cluster, flush_interval_s):
    bookies = await cluster.start_bookies(4, extra_args=["--flush-interval-s", flush_interval_s])
    by_id = {b.bookie_id: b for b in bookies}
    process = await asyncio.create_subprocess_exec(
        *python_command("--log-level", "warning", "shell", "--metadata", cluster.metadata_url, "simpletest",
                        "--ensemble", "3", "--write-quorum", "2", "--ack-quorum", "2",
                        "--entries", str(ENTRIES), "--size", str(SIZE), "--window", "500",
                        "--progress-interval-s", "0.05"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    lines: list[dict] = []
    victim = None
    async with asyncio.timeout(180):
        assert process.stdout is not None
        while True:
            raw = await process.stdout.readline()
            if not raw:
                break
            document = json.loads(raw)
            lines.append(document)
            if victim is None and document.get("event") == "progress" and document["acked"] >= 5000:
                victim = by_id[document["ensemble"][1]]
                victim.kill9()
        await process.wait()
    stderr = (await process.stderr.read()).decode() if process.stderr else ""
    assert victim is not None, f"simpletest finished before the kill: {lines[-1]} {stderr}"
    result = lines[-1]
    assert process.returncode == 0, (result, stderr[-3000:])
    assert result["acked"] == ENTRIES and result["last_entry_id"] == ENTRIES - 1
    assert result["ensemble_changes"] >= 1 and result["closed"] is True
    fragments = result["fragments"]
    assert len(fragments) >= 2
    assert victim.bookie_id in fragments[0]["bookies"]
    assert all(victim.bookie_id not in f["bookies"] for f in fragments[1:])
    ledger_id = result["ledger_id"]

    # Every acknowledged entry, from the three survivors.
    code, stdout, stderr = await run_cli("--log-level", "warning", "shell", "--metadata", cluster.metadata_url,
                                         "readledger", "--ledger", str(ledger_id), "--check-pattern")
    report = last_json(stdout)
    assert code == 0, (report, stderr[-2000:])
    assert report["entries"] == ENTRIES and report["last_entry_id"] == ENTRIES - 1
    assert report["digest_errors"] == 0 and report["pattern_errors"] == 0 and report["unreadable"] == 0

    # The killed bookie, restarted on its port, replays its journal and serves alone
    # every entry of the first fragment whose write set held it: with Qa = Qw = 2 each
    # of those was acknowledged by it before the ensemble changed.
    await victim.start()
    first = fragments[0]
    victim_index = first["bookies"].index(victim.bookie_id)
    fragment_end = fragments[1]["first_entry_id"] - 1
    expected = [e for e in range(0, fragment_end + 1) if victim_index in write_set(e, 3, 2)]
    assert len(expected) > 1000
    client = BookieClient(victim.bookie_id, victim.address, LedgerClientConfig())
    try:
        got: dict[int, bytes] = {}
        position = 0
        while position < len(expected):
            results = await client.read(ledger_id, expected[position:position + 2000], 8 << 20)
            for item in results:
                assert item.entry is not None, f"entry {item.entry_id} missing on the restarted bookie: {item.error}"
                got[item.entry_id] = item.entry
            position += len(results)
        for entry_id in expected:
            header = verify_entry(got[entry_id])
            assert header.entry_id == entry_id
            assert bytes(got[entry_id][-SIZE:]) == pattern_payload(ledger_id, entry_id, SIZE)
    finally:
        await client.close()
    if flush_interval_s == "600":
        assert "journal replayed: records=" in victim.log_text()
