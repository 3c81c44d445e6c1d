"""Credentials toward bookies rotate without a restart (ledger/bookie_client.py
BookieClientPool): when the service token file (or a TLS file) changes, the pool hands
out new clients that read it again, and the replaced ones close once their adds were
answered — an add in flight on the old channel is not failed by the rotation."""

import asyncio
import os

from ledger import bookie_client as bookie_client_module
from ledger.bookie_client import BookieClientPool
from ledger.config import LedgerClientConfig


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write(path: str, text: str, mtime_ns: int) -> None:
    with open(path, "w") as handle:
        handle.write(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


async def test_a_new_token_file_gives_new_clients_and_the_old_ones_close_when_idle(tmp_path):
    token_file = str(tmp_path / "service.token")
    _write(token_file, "token-one", 1_000_000_000)
    clock = _Clock()
    pool = BookieClientPool(LedgerClientConfig(bookie_auth_token_file=token_file), lambda bookie_id: bookie_id,
                            clock=clock)
    try:
        first = pool.get("127.0.0.1:1")
        assert first._metadata == (("authorization", "Bearer token-one"),)
        _write(token_file, "token-two", 2_000_000_000)
        assert pool.get("127.0.0.1:1") is first            # looked at only every CREDENTIALS_CHECK_S
        clock.now += bookie_client_module.CREDENTIALS_CHECK_S
        second = pool.get("127.0.0.1:1")
        assert second is not first and pool.credential_changes == 1
        assert second._metadata == (("authorization", "Bearer token-two"),)
        async with asyncio.timeout(5):
            while not first._closed:
                await asyncio.sleep(0.01)                    # idle: retired at once
        clock.now += bookie_client_module.CREDENTIALS_CHECK_S
        assert pool.get("127.0.0.1:1") is second             # unchanged files: kept
    finally:
        await pool.close()


async def test_a_retiring_client_waits_for_its_adds(tmp_path, monkeypatch):
    """The replaced client stays open while it has an add awaiting its reply."""
    token_file = str(tmp_path / "service.token")
    _write(token_file, "token-one", 1_000_000_000)
    clock = _Clock()
    pool = BookieClientPool(LedgerClientConfig(bookie_auth_token_file=token_file, add_timeout_s=5.0),
                            lambda bookie_id: bookie_id, clock=clock)
    try:
        first = pool.get("127.0.0.1:1")
        busy = True
        monkeypatch.setattr(type(first), "busy", property(lambda client: busy if client is first else False))
        _write(token_file, "token-two", 2_000_000_000)
        clock.now += bookie_client_module.CREDENTIALS_CHECK_S
        assert pool.get("127.0.0.1:1") is not first
        await asyncio.sleep(0.2)
        assert not first._closed                             # its add is still out
        busy = False
        async with asyncio.timeout(5):
            while not first._closed:
                await asyncio.sleep(0.01)
    finally:
        await pool.close()
