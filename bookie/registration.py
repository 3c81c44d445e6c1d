"""A bookie's presence in etcd: its cookie (checked once at start) and its leased
registration, kept up to date and re-created if the lease is lost.

Theory of operation: the registration key lives under a lease the store keeps alive.
If etcd is unreachable for longer than the TTL the lease is lost and the key is gone
from every writer's view; the bookie keeps serving reads and the adds of writers that
still use it, and re-registers under a fresh lease as soon as etcd answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid

from bookie.fileio import replace_file
from common.errors import ConfigError, MagnetarError
from runtime.tasks import cancel_and_wait
from metadata import keys
from metadata.bookie_record import BookieRecord, Cookie
from metadata.store import Lease, MetadataStore

log = logging.getLogger(__name__)

COOKIE_FILE = "cookie"
# Re-registration after a lost lease retries this often at most, with this pause.
_REGISTER_PAUSE_S = 1.0


def _read_local_cookie(directory: str) -> Cookie | None:
    path = os.path.join(directory, COOKIE_FILE)
    try:
        with open(path, "rb") as handle:
            return Cookie.decode(handle.read())
    except FileNotFoundError:
        return None


def _write_local_cookie(directory: str, cookie: Cookie) -> None:
    os.makedirs(directory, exist_ok=True)
    # Directory fsynced too: a cookie whose name a crash could lose would make the
    # next start find a cookie in etcd and none on disk, and refuse to start.
    replace_file(os.path.join(directory, COOKIE_FILE), cookie.encode())


async def check_cookie(store: MetadataStore, bookie_id: str, journal_dir: str, ledger_dirs: list[str]) -> Cookie:
    """Refuses to start a bookie whose disks do not belong to its id (see Cookie)."""
    directories = [journal_dir, *ledger_dirs]
    local = await asyncio.to_thread(lambda: [_read_local_cookie(d) for d in directories])
    remote_record = await store.get(keys.cookie(bookie_id))
    remote = Cookie.decode(remote_record.value) if remote_record else None
    found = [c for c in local if c is not None]
    instance_ids = {c.instance_id for c in found}
    if len(instance_ids) > 1:
        raise ConfigError(f"bookie directories carry cookies of different instances: {sorted(instance_ids)}")
    if found and found[0].bookie_id != bookie_id:
        raise ConfigError(f"bookie directories belong to bookie {found[0].bookie_id}, not {bookie_id}")
    if remote is not None and not found:
        raise ConfigError(
            f"bookie {bookie_id} registered a cookie before but its directories have none: "
            f"its data is gone (wiped or wrong disks); refusing to start. Remove "
            f"{keys.cookie(bookie_id)} from the metadata only after its ledgers were re-replicated")
    if remote is not None and remote.instance_id not in instance_ids:
        raise ConfigError(f"bookie {bookie_id} directories are of instance {sorted(instance_ids)}, "
                          f"metadata says {remote.instance_id}")
    cookie = found[0] if found else Cookie(bookie_id, uuid.uuid4().hex, journal_dir, list(ledger_dirs))
    missing = [d for d, c in zip(directories, local) if c is None]
    if missing:
        if found:
            # Some directories are new (a ledger dir was added): accept and stamp them.
            log.warning("stamping new bookie directories with the cookie: directories=%s", missing)
        await asyncio.to_thread(lambda: [_write_local_cookie(d, cookie) for d in missing])
    if remote is None:
        await store.put(keys.cookie(bookie_id), cookie.encode())
    return cookie


class Registration:
    def __init__(self, store: MetadataStore, ttl_s: int) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._lease: Lease | None = None
        self._record: BookieRecord | None = None
        self._changed = asyncio.Event()

    @property
    def record(self) -> BookieRecord | None:
        return self._record

    @property
    def registered(self) -> bool:
        return self._lease is not None and not self._lease.is_lost

    async def register(self, record: BookieRecord) -> None:
        self._record = record
        self._lease = await self._store.grant_lease(self._ttl_s)
        await self._store.put(keys.bookie(record.bookie_id), record.encode(), lease=self._lease)
        log.info("bookie registered: bookie_id=%s read_only=%s", record.bookie_id, record.read_only)

    def update(self, record: BookieRecord) -> None:
        """Queues a new record (read-only state, free space); ``run`` writes it."""
        self._record = record
        self._changed.set()

    async def run(self) -> None:
        """Keeps the registration present and current until cancelled."""
        assert self._record is not None
        while True:
            lease = self._lease
            lost = asyncio.ensure_future(lease.lost.wait()) if lease is not None else None
            changed = asyncio.ensure_future(self._changed.wait())
            waiters = [w for w in (lost, changed) if w is not None]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel_and_wait(*waiters)
            self._changed.clear()
            try:
                if self._lease is None or self._lease.is_lost:
                    log.warning("bookie registration lost, registering again: bookie_id=%s",
                                self._record.bookie_id)
                    await self.register(self._record)
                else:
                    await self._store.put(keys.bookie(self._record.bookie_id), self._record.encode(),
                                          lease=self._lease)
            except MagnetarError as error:
                log.warning("bookie registration failed, retrying: error=%s", error)
                self._changed.set()
                await asyncio.sleep(_REGISTER_PAUSE_S)

    async def unregister(self) -> None:
        if self._lease is not None:
            await self._store.revoke_lease(self._lease)
            self._lease = None
