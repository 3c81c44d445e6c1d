"""What happens on the bookies' disks: corruption, a filling disk, and garbage collection.

Proves: a byte flipped in an entry log is reported as a digest error and never
returned as data (with one copy the entry is unreadable; with two the reader takes the
good replica); a bookie whose disk passes its usage threshold turns read-only (in its
registration), new ledgers avoid it, a writer using it moves to another bookie, its
entries stay readable, and it turns writable again below the low-water mark; deleting
ledgers makes the bookies drop them and compaction gives the disk space back while the
surviving ledgers stay intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import subprocess
import urllib.error
import urllib.request
import uuid

import pytest

from ledger.client import LedgerClient
from ledger.config import LedgerClientConfig
from common.errors import NoSuchLedger
from ledger.quorum import write_set
from metadata import keys, open_store
from metadata.bookie_record import BookieRecord
from tests.cluster import directory_bytes, last_json, run_cli, wait_until_async

MIB = 1024 * 1024


@contextlib.asynccontextmanager
async def ledger_client(cluster):
    store = open_store(cluster.metadata_url)
    client = LedgerClient(store, LedgerClientConfig(), rng=random.Random(7))
    await client.start()
    try:
        yield client
    finally:
        await client.close()
        await store.close()


def flip_byte_on_disk(bookie, ledger_id: int, entry_id: int) -> None:
    """Flips one payload byte of an entry in its entry log (bookie must be stopped)."""
    for ledger_dir in bookie.ledger_dirs:
        with sqlite3.connect(os.path.join(ledger_dir, "index.sqlite")) as db:
            row = db.execute("SELECT log_id, offset, size FROM entries WHERE ledger_id = ? AND entry_id = ?",
                             (ledger_id, entry_id)).fetchone()
        if row is None:
            continue
        log_id, offset, size = row
        path = os.path.join(ledger_dir, "entrylogs", f"entrylog-{log_id:016x}.log")
        with open(path, "r+b") as handle:
            handle.seek(offset + size - 10)
            byte = handle.read(1)
            handle.seek(offset + size - 10)
            handle.write(bytes([byte[0] ^ 0x40]))
            handle.flush()
            os.fsync(handle.fileno())
        return
    raise AssertionError(f"entry {ledger_id}/{entry_id} not in any index of {bookie.name}")


async def write_ledger(client: LedgerClient, quorums: tuple[int, int, int], count: int, size: int = 200) -> int:
    handle = await client.create_ledger(*quorums)
    futures = [await handle.submit(bytes([i % 256]) * size) for i in range(count)]
    await asyncio.gather(*futures)
    await handle.close()
    return handle.ledger_id


async def test_flipped_byte_is_a_digest_error_never_data(cluster):
    """One copy: the corrupted entry is reported unreadable with a digest error, all
    others read fine. Two copies: the reader counts the digest error and returns the
    good replica's bytes."""
    bookies = await cluster.start_bookies(2, extra_args=["--flush-interval-s", "0.1"])
    async with ledger_client(cluster) as client:
        single = await write_ledger(client, (1, 1, 1), 300)
        double = await write_ledger(client, (2, 2, 2), 300)
        single_bookie_id = (await client.ledger_metadata(single)).current_ensemble[0]
        # Corrupt the copy of entry 45 the reader asks for first (its write set's head).
        double_ensemble = (await client.ledger_metadata(double)).current_ensemble
        first_asked_id = double_ensemble[write_set(45, 2, 2)[0]]
    for bookie in bookies:
        await bookie.terminate()  # a clean stop flushes everything to the entry logs
    single_bookie = next(b for b in bookies if b.bookie_id == single_bookie_id)
    flip_byte_on_disk(single_bookie, single, 123)
    first_asked = next(b for b in bookies if b.bookie_id == first_asked_id)
    flip_byte_on_disk(first_asked, double, 45)
    for bookie in bookies:
        await bookie.start()

    code, stdout, _ = await run_cli("--log-level", "error", "shell", "--metadata", cluster.metadata_url,
                                    "readledger", "--ledger", str(single))
    report = last_json(stdout)
    assert code == 1
    assert report["entries"] == 299 and report["unreadable_entries"] == [123]
    assert report["digest_errors"] >= 1 and 123 in report["digest_error_entries"]
    assert "digest mismatch" in report["error"]

    code, stdout, _ = await run_cli("--log-level", "error", "shell", "--metadata", cluster.metadata_url,
                                    "readledger", "--ledger", str(double))
    report = last_json(stdout)
    assert report["entries"] == 300 and report["unreadable"] == 0
    assert report["digest_errors"] == 1 and report["digest_error_entries"] == [45]
    async with ledger_client(cluster) as client:
        reader = await client.open_ledger(double, recovery=False)
        entries = await reader.read(40, 50)
        assert [bytes(e.payload) for e in entries] == [bytes([i % 256]) * 200 for i in range(40, 51)]
    assert "corrupt entry on disk" in first_asked.log_text()


@contextlib.contextmanager
def small_filesystem(path: str, size_mib: int):
    """A tmpfs of the given size mounted at ``path``. Mounting needs privileges: the
    test runs as root (or with CAP_SYS_ADMIN), as CI does; otherwise it fails saying so."""
    os.makedirs(path, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", path]
    try:
        mounted = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise AssertionError("this test mounts a small tmpfs to fill a disk, and needs the `mount` command "
                             "and mount privileges (root or CAP_SYS_ADMIN)") from None
    if mounted.returncode != 0:
        raise AssertionError(
            f"this test mounts a small tmpfs to fill a disk and needs mount privileges (run as root or with "
            f"CAP_SYS_ADMIN): `{' '.join(command)}` exited {mounted.returncode}: "
            f"{(mounted.stderr or mounted.stdout).strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)


async def registration(cluster, bookie_id: str) -> BookieRecord:
    store = open_store(cluster.metadata_url)
    try:
        record = await store.get(keys.bookie(bookie_id))
        assert record is not None
        return BookieRecord.decode(record.value)
    finally:
        await store.close()


async def http_status(address: str, path: str) -> int:
    def get() -> int:
        try:
            with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
    return await asyncio.to_thread(get)


async def test_full_disk_turns_bookie_read_only(cluster, tmp_path):
    """The disk of one bookie fills past its threshold: it turns read-only, writers
    move off it, new ledgers avoid it, its entries stay readable; freeing the disk
    brings it back."""
    mount_point = str(tmp_path / f"small-{uuid.uuid4().hex[:6]}")
    with small_filesystem(mount_point, 64):
        small = cluster.bookie("small", journal_dir=os.path.join(mount_point, "journal"),
                               ledger_dirs=[os.path.join(mount_point, "ledgers")],
                               extra_args=["--disk-usage-threshold", "0.5", "--disk-usage-lwm-threshold", "0.3",
                                           "--disk-check-interval-s", "0.1", "--flush-interval-s", "0.1"])
        await small.start()
        others = await cluster.start_bookies(3)
        async with ledger_client(cluster) as client:
            # A ledger on all four bookies, written before the disk fills.
            handle = await client.create_ledger(4, 4, 4)
            assert small.bookie_id in handle.metadata.current_ensemble
            for i in range(100):
                await handle.add(b"before-%d" % i)

            filler = os.path.join(mount_point, "filler")
            with open(filler, "wb") as out:
                out.write(b"\0" * (40 * MIB))
                out.flush()
                os.fsync(out.fileno())

            async def small_is_read_only():
                return (await registration(cluster, small.bookie_id)).read_only
            await wait_until_async(small_is_read_only, 20, "the full bookie to turn read-only")
            assert "turned read-only" in small.log_text()
            # Readiness (the Kubernetes probe) says so; health and liveness do not.
            assert await http_status(small.http_address, "/ready") == 503
            assert await http_status(small.http_address, "/health") == 200
            assert await http_status(small.http_address, "/live") == 200

            # The writer's next adds are refused by the full bookie; it cannot move (all
            # four bookies are in a 4-bookie ensemble), so add a fifth and go on.
            spare = cluster.bookie("spare")
            await spare.start()
            await client.registry.refresh()
            for i in range(100, 200):
                await handle.add(b"after-%d" % i)
            assert small.bookie_id not in handle.metadata.current_ensemble
            await handle.close()

            # New ledgers never choose the read-only bookie.
            for _ in range(15):
                new = await client.create_ledger(3, 3, 3)
                assert small.bookie_id not in new.metadata.current_ensemble
                await new.close()

            # Its entries stay readable, from it alone.
            stored = await client.pool.get(small.bookie_id).read(handle.ledger_id, list(range(100)), 8 << 20)
            assert [bytes(r.entry[-len(b"before-%d" % r.entry_id):]) for r in stored] == \
                [b"before-%d" % i for i in range(100)]
            reader = await client.open_ledger(handle.ledger_id, recovery=False)
            assert len(await reader.read(0, 199)) == 200

            code, stdout, _ = await run_cli("--log-level", "error", "shell", "--metadata", cluster.metadata_url,
                                            "listbookies", "--readonly")
            assert [b["bookie_id"] for b in last_json(stdout)["bookies"]] == [small.bookie_id]

            os.unlink(filler)

            async def small_is_writable():
                return not (await registration(cluster, small.bookie_id)).read_only
            await wait_until_async(small_is_writable, 20, "the freed bookie to turn writable")
            assert "writable again" in small.log_text()
            assert await http_status(small.http_address, "/ready") == 200
        assert others  # the three regular bookies served throughout


async def test_deleted_ledgers_are_collected_and_space_returns(cluster):
    """Two ledgers interleaved in the same entry logs; one is deleted. Each bookie
    drops it at its next GC, compaction moves the survivor's entries out of the sparse
    logs and deletes them, so the ledger directories shrink, and the survivor still
    reads back intact."""
    bookies = await cluster.start_bookies(
        2, extra_args=["--flush-interval-s", "0.1", "--gc-interval-s", "0.5", "--entry-log-mib", "24"])
    payload_size = 8 * 1024
    async with ledger_client(cluster) as client:
        doomed = await client.create_ledger(2, 2, 2)
        kept = await client.create_ledger(2, 2, 2)
        futures = []
        for i in range(3000):
            futures.append(await doomed.submit(b"d" * payload_size))
            if i % 10 == 0:
                futures.append(await kept.submit(i.to_bytes(4, "big") * (payload_size // 4)))
        await asyncio.gather(*futures)
        await doomed.close()
        await kept.close()
        await asyncio.sleep(0.5)  # let the last flush land
        before = [directory_bytes(d) for b in bookies for d in b.ledger_dirs]
        assert min(before) > 20 * MIB

        await client.delete_ledger(doomed.ledger_id)

        async def shrunk():
            after = [directory_bytes(d) for b in bookies for d in b.ledger_dirs]
            # The compaction logs its line after it has deleted the old log: a directory
            # can be seen shrunk a moment before the line is written.
            return (all(a < b / 4 for a, b in zip(after, before))
                    and all("entry log compacted" in b.log_text() for b in bookies))
        await wait_until_async(shrunk, 60, "the ledger directories to shrink", interval_s=0.5)
        after = [directory_bytes(d) for b in bookies for d in b.ledger_dirs]

        for bookie in bookies:
            with pytest.raises(NoSuchLedger):
                await client.pool.get(bookie.bookie_id).read(doomed.ledger_id, [0], 1 << 20)
            assert "entry log compacted" in bookie.log_text()
        reader = await client.open_ledger(kept.ledger_id, recovery=False)
        entries = await reader.read(0, 299)
        assert [bytes(e.payload) for e in entries] == [(i * 10).to_bytes(4, "big") * (payload_size // 4)
                                                       for i in range(300)]
    print(f"ledger dir bytes before GC {before}, after {after}")
