"""A real bookie process, driven over gRPC by the ledger client's BookieClient.

Proves: adds are acknowledged and read back with their digests; fencing stops normal
adds but not recovery adds; the bookie registers itself in etcd with a lease; and every
kind of bad input (unknown ledger, entry out of range, oversized entry, wrong digest,
mismatched ids, garbage bytes on the port, an HTTP/1 request) gets a clear error while
the bookie keeps serving a well-behaved client at the same time.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import urllib.request

import grpc
import pytest

from protocol.proto import bookie_pb2, bookie_pb2_grpc
from ledger.bookie_client import BookieClient
from ledger.config import LedgerClientConfig
from common.entry import encode_entry, verify_entry
from common.errors import (
    BookieUnavailable,
    DigestMismatch,
    EntryTooLarge,
    InvalidArgument,
    LedgerFenced,
    MalformedFrame,
    NoSuchEntry,
    NoSuchLedger,
)
from metadata import keys, open_store
from metadata.bookie_record import BookieRecord

CONFIG = LedgerClientConfig()


def entry(ledger_id: int, entry_id: int, payload: bytes = b"payload", lac: int | None = None) -> bytes:
    lac = entry_id - 1 if lac is None else lac
    return encode_entry(ledger_id, entry_id, lac, len(payload) * (entry_id + 1), payload)


@pytest.fixture
async def bookie(cluster):
    (process,) = await cluster.start_bookies(1)
    client = BookieClient(process.bookie_id, process.address, CONFIG)
    yield process, client
    await client.close()


async def write_entries(client: BookieClient, ledger_id: int, count: int, payload: bytes = b"x" * 100) -> None:
    await asyncio.gather(*(client.add(ledger_id, i, entry(ledger_id, i, payload)) for i in range(count)))


async def test_add_then_read_back(bookie):
    """Acknowledged entries are read back byte for byte, in the order asked."""
    _process, client = bookie
    await write_entries(client, 7, 50)
    results = await client.read(7, list(range(50)), 1 << 20)
    assert [r.entry_id for r in results] == list(range(50))
    for result in results:
        header = verify_entry(result.entry)
        assert (header.ledger_id, header.entry_id) == (7, result.entry_id)
    state = await client.read_last_add_confirmed(7)
    assert state.last_entry_id == 49 and state.last_add_confirmed == 48 and not state.fenced


async def test_registration_and_health(cluster, bookie):
    """The bookie is registered (leased) in etcd and answers /health and /metrics."""
    process, client = bookie
    store = open_store(cluster.metadata_url)
    try:
        record = await store.get(keys.bookie(process.bookie_id))
        assert record is not None and record.lease_id != 0
        registered = BookieRecord.decode(record.value)
        assert registered.address == process.address and not registered.read_only
    finally:
        await store.close()
    health = json.loads(urllib.request.urlopen(f"http://{process.http_address}/health", timeout=5).read())
    assert health["status"] == "ok" and health["bookie_id"] == process.bookie_id
    await write_entries(client, 1, 10)
    metrics = urllib.request.urlopen(f"http://{process.http_address}/metrics", timeout=5).read().decode()
    assert "magnetar_bookie_adds_total 10.0" in metrics
    assert "magnetar_bookie_journal_fsyncs" in metrics
    info = await client.info()
    assert info.bookie_id == process.bookie_id and info.total_bytes > 0


async def test_fence_blocks_normal_adds_but_not_recovery_adds(bookie):
    """After a fence, a normal add fails with LedgerFenced; a recovery add lands."""
    _process, client = bookie
    await write_entries(client, 3, 5)
    state = await client.fence(3)
    assert state.fenced and state.last_entry_id == 4
    with pytest.raises(LedgerFenced):
        await client.add(3, 5, entry(3, 5))
    await client.add(3, 5, entry(3, 5), recovery=True)
    assert (await client.read_last_add_confirmed(3)).last_entry_id == 5
    # Fencing a ledger the bookie never saw also blocks its adds.
    await client.fence(99)
    with pytest.raises(LedgerFenced):
        await client.add(99, 0, entry(99, 0))


async def test_unknown_ledger_and_out_of_range_reads(bookie):
    """Reads of an unknown ledger, a missing entry and negative ids fail clearly."""
    _process, client = bookie
    with pytest.raises(NoSuchLedger):
        await client.read(12345, [0], 1 << 20)
    with pytest.raises(NoSuchLedger):
        await client.read_last_add_confirmed(12345)
    await write_entries(client, 4, 3)
    results = await client.read(4, [2, 3, 10**12], 1 << 20)
    assert results[0].entry is not None
    assert isinstance(results[1].error, NoSuchEntry) and isinstance(results[2].error, NoSuchEntry)
    with pytest.raises(InvalidArgument):
        await client.read(4, [-1], 1 << 20)
    with pytest.raises(InvalidArgument):
        await client.read(4, [], 1 << 20)


async def test_bad_entries_fail_alone_in_their_batch(bookie):
    """In one batch, a wrong digest, mismatched envelope ids and an oversized entry
    each get their own error, and the good entries around them are stored."""
    _process, client = bookie
    good0 = client.add(5, 0, entry(5, 0))
    corrupted = bytearray(entry(5, 1))
    corrupted[-1] ^= 0xFF
    bad_digest = client.add(5, 1, bytes(corrupted))
    mismatched = client.add(5, 2, entry(5, 3))
    oversized = client.add(5, 4, entry(5, 4, b"z" * (6 * 1024 * 1024)))
    truncated = client.add(5, 5, entry(5, 5)[:20])
    good6 = client.add(5, 6, entry(5, 6))
    outcomes = await asyncio.gather(good0, bad_digest, mismatched, oversized, truncated, good6,
                                    return_exceptions=True)
    assert outcomes[0] is None and outcomes[5] is None
    assert isinstance(outcomes[1], DigestMismatch)
    assert isinstance(outcomes[2], MalformedFrame)
    assert isinstance(outcomes[3], EntryTooLarge)
    assert isinstance(outcomes[4], MalformedFrame)
    results = await client.read(5, [0, 1, 6], 1 << 20)
    assert results[0].entry is not None and results[2].entry is not None
    assert isinstance(results[1].error, NoSuchEntry)


async def test_message_past_grpc_limit_breaks_only_that_stream(bookie):
    """An add message larger than the bookie's gRPC limit (64 MiB) fails that stream;
    the bookie keeps serving, and the client's next add opens a new stream."""
    process, client = bookie
    huge = client.add(6, 0, b"\0" * (70 * 1024 * 1024))
    with pytest.raises(BookieUnavailable):
        await huge
    other = BookieClient(process.bookie_id, process.address, CONFIG)
    try:
        await other.add(6, 0, entry(6, 0))
    finally:
        await other.close()
    await client.add(6, 1, entry(6, 1))


async def test_garbage_on_the_port_does_not_disturb_other_clients(bookie):
    """Random bytes, a half-open connection and an HTTP/1 request on the gRPC port are
    refused by that connection only; a concurrent writer keeps getting acks."""
    process, client = bookie
    host, port = process.address.rsplit(":", 1)
    stop = asyncio.Event()
    acked = 0

    async def steady_writer():
        nonlocal acked
        entry_id = 0
        while not stop.is_set():
            await client.add(8, entry_id, entry(8, entry_id))
            entry_id += 1
            acked += 1

    writer = asyncio.create_task(steady_writer())

    def abuse():
        for payload in (os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(512)):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(payload)
                sock.settimeout(2)
                try:
                    while sock.recv(4096):
                        pass
                except (socket.timeout, ConnectionResetError):
                    pass
        half_open = socket.create_connection((host, int(port)), timeout=5)
        half_open.sendall(b"\x00\x00")
        return half_open

    half_open = await asyncio.to_thread(abuse)
    before = acked
    await asyncio.sleep(0.5)
    stop.set()
    await writer
    half_open.close()
    assert acked > before, "the writer made no progress while garbage arrived"
    channel = grpc.aio.insecure_channel(process.address)
    try:
        info = await bookie_pb2_grpc.BookieStub(channel).Info(bookie_pb2.InfoRequest(), timeout=5)
        assert info.bookie_id == process.bookie_id
    finally:
        await channel.close()


async def test_restart_replays_journal(cluster):
    """Entries acknowledged just before kill -9 are readable after a restart, with the
    fence state, whether or not they reached the entry logs."""
    (process,) = await cluster.start_bookies(1, extra_args=["--flush-interval-s", "600"])
    client = BookieClient(process.bookie_id, process.address, CONFIG)
    try:
        await write_entries(client, 11, 200)
        await client.fence(11)
    finally:
        await client.close()
    process.kill9()
    await process.start()
    client = BookieClient(process.bookie_id, process.address, CONFIG)
    try:
        results = await client.read(11, list(range(200)), 1 << 24)
        assert [r.entry_id for r in results if r.entry is not None] == list(range(200))
        state = await client.read_last_add_confirmed(11)
        assert state.fenced and state.last_entry_id == 199
        assert "records=201" in process.log_text()
    finally:
        await client.close()


async def test_several_ledger_dirs_share_the_ledgers(cluster):
    """A bookie with three ledger directories spreads ledgers over all of them (each
    gets entry logs and index rows) and reads every ledger back after a restart."""
    (process,) = await cluster.start_bookies(1, ledger_dir_count=3, extra_args=["--flush-interval-s", "0.1"])
    client = BookieClient(process.bookie_id, process.address, CONFIG)
    try:
        for ledger_id in range(1, 10):
            await write_entries(client, ledger_id, 20)
    finally:
        await client.close()
    await process.terminate()
    for ledger_dir in process.ledger_dirs:
        logs = os.listdir(os.path.join(ledger_dir, "entrylogs"))
        assert any(os.path.getsize(os.path.join(ledger_dir, "entrylogs", name)) > 1000 for name in logs), ledger_dir
    await process.start()
    client = BookieClient(process.bookie_id, process.address, CONFIG)
    try:
        for ledger_id in range(1, 10):
            results = await client.read(ledger_id, list(range(20)), 1 << 20)
            assert all(r.entry is not None for r in results) and len(results) == 20
    finally:
        await client.close()
