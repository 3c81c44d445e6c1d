"""The add stream over the bookie's WebSocket (bookie/add_socket.py, the ledger
client's default carrier for adds) against real bookie processes and a real etcd.

Proves: a ledger client configured for the socket sends its adds there (not to gRPC)
and the entries read back whole; every entry acknowledged over the socket survives a
kill -9 of its bookie and a restart (the reply waited for the journal fdatasync); the
gRPC carrier still works when chosen; a bookie with authentication on refuses an
upgrade without a valid service token (401) and takes one with it.
"""

from __future__ import annotations

import asyncio
import os
import random

import aiohttp
import pytest

from common.tokens import TokenSigner, create_secret_key
from ledger.bookie_client import ADD_SOCKET_PATH
from ledger.client import LedgerClient
from ledger.config import LedgerClientConfig
from metadata import open_store

ROLE = "broker-role"


@pytest.fixture
async def make_client(cluster):
    made = []

    async def make(**config) -> LedgerClient:
        store = open_store(cluster.metadata_url)
        client = LedgerClient(store, LedgerClientConfig(**config), rng=random.Random(len(made)))
        await client.start()
        made.append((client, store))
        return client

    yield make
    for client, store in made:
        await client.close()
        await store.close()


async def socket_streams(http_address: str) -> float:
    """Add streams the bookie opened on its add socket (its /metrics)."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{http_address}/metrics") as response:
            text = await response.text()
    for line in text.splitlines():
        if line.startswith("magnetar_bookie_add_socket_streams_total "):
            return float(line.split()[1])
    raise AssertionError("no magnetar_bookie_add_socket_streams_total in /metrics")


async def test_adds_over_the_socket_survive_kill9(cluster, make_client):
    """200 entries over the socket (gRPC's add stream never opened), acknowledged,
    then the bookie is killed with SIGKILL and restarted: all 200 read back."""
    bookie, = await cluster.start_bookies(1)
    client = await make_client(add_transport="socket")
    handle = await client.create_ledger(1, 1, 1)
    futures = [await handle.submit(f"entry-{i}".encode()) for i in range(200)]
    assert await asyncio.gather(*futures) == list(range(200))
    bookie_client = client.pool.get(bookie.bookie_id)
    assert bookie_client.add_socket_url == f"http://{bookie.http_address}{ADD_SOCKET_PATH}"
    assert await socket_streams(bookie.http_address) >= 1
    bookie.kill9()
    await bookie.start()
    reader = await client.open_ledger(handle.ledger_id, recovery=True)
    entries = await reader.read(0, reader.metadata.last_entry_id)
    assert [bytes(e.payload) for e in entries] == [f"entry-{i}".encode() for i in range(200)]


async def test_grpc_carrier_when_chosen(cluster, make_client):
    """add_transport="grpc": the same adds go over gRPC's AddEntries."""
    bookie, = await cluster.start_bookies(1)
    client = await make_client(add_transport="grpc")
    handle = await client.create_ledger(1, 1, 1)
    assert await handle.add(b"over grpc") == 0
    assert client.pool.get(bookie.bookie_id).add_socket_url is None
    assert await socket_streams(bookie.http_address) == 0
    entries = await handle.read(0, 0)
    assert bytes(entries[0].payload) == b"over grpc"


async def test_socket_needs_a_service_token_when_authentication_is_on(cluster, make_client, tmp_path):
    """A bookie with authentication: an upgrade with no token or a foreign one is
    refused with 401, a writer with the right token adds over the socket."""
    key = create_secret_key()
    key_path = tmp_path / "secret.key"
    key_path.write_bytes(key)
    token_path = tmp_path / "broker.token"
    token_path.write_text(TokenSigner.with_secret_key(key).create(ROLE))
    os.chmod(token_path, 0o600)
    bookie, = await cluster.start_bookies(1, extra_args=[
        "--authentication-enabled", "--token-secret-key", f"file://{key_path}", "--allowed-roles", ROLE])
    url = f"http://{bookie.http_address}{ADD_SOCKET_PATH}"
    foreign = TokenSigner.with_secret_key(create_secret_key()).create(ROLE)
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"Authorization": f"Bearer {foreign}"}):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(url, headers=headers)
            assert refused.value.status == 401
    client = await make_client(add_transport="socket", bookie_auth_token_file=str(token_path))
    handle = await client.create_ledger(1, 1, 1)
    assert await handle.add(b"with a token") == 0
