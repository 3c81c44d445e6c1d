"""The add socket (bookie/add_socket.py): adds without gRPC, against real bookie
processes and a real etcd.

Proves: bookies started with ``--add-socket-port 0`` register an add address, and a
ledger client with ``add_transport="socket"`` writes through it (the bookies log the
writer's connection); every acknowledged entry survives a kill -9 of every bookie right
after its acknowledgement (the reply still comes only after the journal's fdatasync) and
is read back whole; a token of a role the bookie does not allow, or none, fails the add
as an authorization / authentication error (not a failed bookie); a writer sending a
length past the bound, or bytes that are not a hello, is cut off while the bookie goes
on serving the next writer.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import struct

import pytest

from common.errors import AuthenticationFailed, AuthorizationDenied
from runtime.tokens import TokenSigner, create_secret_key
from protocol.add_socket import encode_message
from protocol.proto import bookie_pb2
from tests.integration.test_ledger_client import make_client  # noqa: F401 - the fixture

SOCKET = ["--add-socket-port", "0"]
_ADD_ADDRESS = re.compile(r"add_address=(\S+)")


def _add_address(bookie) -> str:
    match = _ADD_ADDRESS.search(bookie.log_text())
    assert match is not None and match.group(1) != "-", bookie.log_text()[-2000:]
    return match.group(1)


async def test_acknowledged_adds_survive_kill_9_of_every_bookie(cluster, make_client):
    bookies = await cluster.start_bookies(3, extra_args=SOCKET)
    client = await make_client(add_transport="socket")
    handle = await client.create_ledger(3, 2, 2)
    futures = [await handle.submit(f"entry-{i}".encode()) for i in range(2000)]
    assert await asyncio.gather(*futures) == list(range(2000))
    for bookie in bookies:      # acknowledged: on two journals each, fsynced
        bookie.kill9()
    for bookie in bookies:
        assert "add socket writer connected" in bookie.log_text(since_spawn=True)
    await asyncio.gather(*(bookie.start() for bookie in bookies))
    reader_client = await make_client(add_transport="socket")
    reader = await reader_client.open_ledger(handle.ledger_id, recovery=True)
    assert reader.metadata.last_entry_id == 1999
    entries = await reader.read(0, 1999)
    assert [bytes(entry.payload) for entry in entries] == [f"entry-{i}".encode() for i in range(2000)]


async def test_refusals_and_bad_bytes_end_that_writer_only(cluster, make_client, tmp_path):
    key = create_secret_key()
    key_path = tmp_path / "secret.key"
    key_path.write_bytes(key)
    signer = TokenSigner.with_secret_key(key)
    (bookie,) = await cluster.start_bookies(1, extra_args=[
        *SOCKET, "--authentication-enabled", "--token-secret-key", f"file://{key_path}",
        "--allowed-roles", "broker"])
    address = _add_address(bookie)

    async def first_add_error(token: str | None) -> Exception | None:
        config = {}
        if token is not None:
            path = tmp_path / f"token-{len(token)}-{random.random()}"
            path.write_text(token)
            config["bookie_auth_token_file"] = str(path)
        client = await make_client(add_transport="socket", add_timeout_s=5.0, **config)
        handle = await client.create_ledger(1, 1, 1)
        try:
            await handle.add(b"x")
        except Exception as error:   # noqa: BLE001 - the test looks at which
            return error
        return None

    assert isinstance(await first_add_error(signer.create("someone-else")), AuthorizationDenied)
    assert isinstance(await first_add_error(None), AuthenticationFailed)
    assert bookie.log_text().count("add socket refused") == 2   # refused on the socket, not on gRPC

    host, port = address.rsplit(":", 1)
    # A length past the bound, then bytes that are not a hello: each connection is closed.
    for garbage in (struct.pack(">I", 0xFFFFFFF0), struct.pack(">I", 5) + b"\xff" * 5):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(garbage)
        await writer.drain()
        async with asyncio.timeout(10):
            assert await reader.read() == b""
        writer.close()
    # A hello and then a request that does not parse: a welcome, then the close.
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(encode_message(bookie_pb2.AddSocketHello(token=signer.create("broker"))))
    writer.write(struct.pack(">I", 3) + b"\xff\xff\xff")
    await writer.drain()
    async with asyncio.timeout(10):
        rest = await reader.read()
    assert rest == encode_message(bookie_pb2.AddSocketWelcome()), rest
    writer.close()

    # The bookie goes on serving a writer with a good token.
    assert await first_add_error(signer.create("broker")) is None
    assert bookie.running and os.path.exists(bookie.journal_dir)
