"""The metadata store on a real etcd, through its v3 gRPC API (the ``aetcd`` client).

Theory of operation:
- One ``aetcd.Client`` per store. Every call is bounded by ``call_timeout_s``; gRPC
  errors become ``MetadataUnavailable`` (retriable), so callers never see aetcd's types.
- With several endpoints the store talks to one; when a call finds it unavailable the
  next call goes to the next endpoint (etcd forwards writes to the leader itself).
- Transactions go straight to the KV stub so that the response header's revision
  (the new version of every key written) reaches the caller.
- Each lease has a keep-alive task refreshing it every ttl/3. When refreshes have
  failed for longer than the TTL, or etcd says the lease is unknown, the lease is
  lost: its ``lost`` event is set and the task ends. Owners watch that event.
- A watch re-establishes itself after a broken stream from the revision after the
  last event it delivered, so no event is missed across an etcd restart; if that
  history was compacted it yields a ``reset`` event instead. A watch gives up (and
  raises MetadataUnavailable from its iterator) after ``watch_reconnect_s_max`` of
  failing to reconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

import aetcd
import aetcd.exceptions
import aetcd.rpc as etcd_rpc
import aetcd.utils

from ledger.errors import ConfigError, MetadataUnavailable
from magnetar.tasks import cancel_and_wait
from metadata.store import Compare, Delete, Lease, MetadataStore, Put, Record, Watch, WatchEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EtcdStoreConfig:
    endpoints: tuple[tuple[str, int], ...]
    root: str = "/magnetar/standalone"
    # A metadata call that takes longer than this is treated as etcd being away. etcd
    # answers in milliseconds on loopback; 5 s leaves room for a leader election.
    call_timeout_s: float = 5.0
    # Reconnecting watches retry for this long before giving up on etcd.
    watch_reconnect_s_max: float = 120.0

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ConfigError("metadata endpoints must not be empty")
        if not self.root.startswith("/") or self.root.endswith("/"):
            raise ConfigError("metadata root must start with '/' and not end with '/'")
        if not 0 < self.call_timeout_s <= 60:
            raise ConfigError("call_timeout_s must be in (0, 60]")


def parse_metadata_url(url: str, *, root: str = "/magnetar/standalone") -> EtcdStoreConfig:
    """``etcd://host:port[,host:port...][/root]`` → EtcdStoreConfig."""
    scheme = "etcd://"
    if not url.startswith(scheme):
        raise ConfigError(f"metadata url must start with {scheme}: {url!r}")
    rest = url[len(scheme):]
    hosts_part, slash, path = rest.partition("/")
    if slash and path:
        root = "/" + path.rstrip("/")
    endpoints: list[tuple[str, int]] = []
    for item in hosts_part.split(","):
        host, colon, port_text = item.strip().rpartition(":")
        if not colon or not host or not port_text.isdigit():
            raise ConfigError(f"metadata endpoint must be host:port: {item!r}")
        endpoints.append((host, int(port_text)))
    return EtcdStoreConfig(endpoints=tuple(endpoints), root=root)


class _EtcdWatch(Watch):
    def __init__(self, store: "EtcdStore", prefix: str, start_version: int) -> None:
        self._store = store
        self._prefix = prefix
        self._next_revision = start_version + 1 if start_version > 0 else 0
        self._closed = False
        self._current: object | None = None

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _open(self):
        client = await self._store._client_now()
        key = self._store._full(self._prefix).encode()
        return await client.watch(
            key,
            range_end=aetcd.utils.prefix_range_end(key),
            start_revision=self._next_revision or None,
        )

    async def _events(self) -> AsyncIterator[WatchEvent]:
        deadline: float | None = None
        backoff_s = 0.1
        while not self._closed:
            try:
                watch = await self._open()
            except aetcd.exceptions.RevisionCompactedError as error:
                self._next_revision = error.compacted_revision
                yield WatchEvent(kind="reset", key=self._prefix)
                continue
            except (aetcd.exceptions.ClientError, asyncio.TimeoutError) as error:
                deadline = deadline or time.monotonic() + self._store.config.watch_reconnect_s_max
                if time.monotonic() > deadline:
                    raise MetadataUnavailable(f"watch on {self._prefix} lost etcd: {error}")
                self._store._rotate_endpoint()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)
                continue
            self._current = watch
            deadline = None
            backoff_s = 0.1
            try:
                async for event in watch:
                    kv = event.kv
                    revision = kv.mod_revision
                    self._next_revision = revision + 1
                    kind = "put" if event.kind == aetcd.rtypes.EventKind.PUT else "delete"
                    yield WatchEvent(
                        kind=kind,
                        key=self._store._relative(kv.key.decode()),
                        value=bytes(kv.value),
                        version=revision,
                    )
            except aetcd.exceptions.RevisionCompactedError as error:
                self._next_revision = error.compacted_revision
                yield WatchEvent(kind="reset", key=self._prefix)
            except (aetcd.exceptions.ClientError, etcd_rpc.AioRpcError) as error:
                if self._closed:
                    return
                log.warning("metadata watch broken, reconnecting: prefix=%s error=%s",
                            self._prefix, error)
                await asyncio.sleep(backoff_s)
            finally:
                self._current = None
        return

    async def close(self) -> None:
        self._closed = True
        current = self._current
        if current is not None:
            try:
                await current.cancel()
            except Exception:  # cancelling a watch on a dead stream may fail; ignore it
                pass


class EtcdStore(MetadataStore):
    def __init__(self, config: EtcdStoreConfig) -> None:
        self.config = config
        self._endpoint_index = 0
        self._client: aetcd.Client | None = None
        self._keepalive_tasks: dict[int, asyncio.Task[None]] = {}
        self._closed = False

    # --- connection -------------------------------------------------------------------

    async def _client_now(self) -> aetcd.Client:
        if self._closed:
            raise MetadataUnavailable("metadata store is closed")
        if self._client is None:
            host, port = self.config.endpoints[self._endpoint_index]
            self._client = aetcd.Client(
                host=host,
                port=port,
                timeout=self.config.call_timeout_s,
                connect_wait_timeout=int(self.config.call_timeout_s),
                options={
                    # etcd caps values at 1.5 MiB; leave headroom for range replies.
                    "grpc.max_receive_message_length": 64 * 1024 * 1024,
                    "grpc.keepalive_time_ms": 10_000,
                    "grpc.keepalive_timeout_ms": 5_000,
                },
            )
        return self._client

    def _rotate_endpoint(self) -> None:
        if len(self.config.endpoints) <= 1:
            return
        self._endpoint_index = (self._endpoint_index + 1) % len(self.config.endpoints)
        client, self._client = self._client, None
        if client is not None:
            asyncio.get_running_loop().create_task(client.close())

    def _full(self, key: str) -> str:
        assert key.startswith("/"), key
        return self.config.root + key

    def _relative(self, full_key: str) -> str:
        assert full_key.startswith(self.config.root), (full_key, self.config.root)
        return full_key[len(self.config.root):]

    async def _call(self, coroutine_factory):
        client = await self._client_now()
        try:
            async with asyncio.timeout(self.config.call_timeout_s):
                return await coroutine_factory(client)
        except (aetcd.exceptions.ClientError, etcd_rpc.AioRpcError, TimeoutError) as error:
            self._rotate_endpoint()
            raise MetadataUnavailable(f"etcd call failed: {type(error).__name__}: {error}") from None

    # --- key/value ----------------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        full = self._full(key).encode()
        result = await self._call(lambda c: c.get(full))
        if result is None:
            return None
        return Record(key, bytes(result.value), result.mod_revision, result.create_revision,
                      result.lease)

    async def _range(self, prefix: str, limit: int, keys_only: bool):
        full = self._full(prefix).encode()
        request = etcd_rpc.RangeRequest(
            key=full,
            range_end=aetcd.utils.prefix_range_end(full),
            limit=limit,
            keys_only=keys_only,
            sort_order=etcd_rpc.RangeRequest.ASCEND,
            sort_target=etcd_rpc.RangeRequest.KEY,
        )

        async def query(client: aetcd.Client):
            await client.connect()
            return await client.kvstub.Range(request, timeout=self.config.call_timeout_s,
                                             metadata=client.metadata)

        response = await self._call(query)
        records = [
            Record(self._relative(kv.key.decode()), bytes(kv.value), kv.mod_revision,
                   kv.create_revision, kv.lease)
            for kv in response.kvs
        ]
        return records, int(response.header.revision)

    async def get_prefix(self, prefix: str, *, limit: int = 0, keys_only: bool = False) -> list[Record]:
        records, _revision = await self._range(prefix, limit, keys_only)
        return records

    async def get_prefix_at(self, prefix: str) -> tuple[list[Record], int]:
        return await self._range(prefix, 0, False)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        revision = await self.transaction([], [Put(key, value, lease.lease_id if lease else 0)])
        assert revision is not None
        return revision

    async def delete(self, key: str) -> bool:
        full = self._full(key).encode()
        return bool(await self._call(lambda c: c.delete(full)))

    async def delete_prefix(self, prefix: str) -> int:
        full = self._full(prefix).encode()
        response = await self._call(lambda c: c.delete_prefix(full))
        return int(getattr(response, "deleted", 0))

    async def transaction(
        self, compares: Sequence[Compare], operations: Sequence[Put | Delete]
    ) -> int | None:
        compare_messages = [
            etcd_rpc.Compare(
                key=self._full(c.key).encode(),
                result=etcd_rpc.Compare.EQUAL,
                target=etcd_rpc.Compare.MOD,
                mod_revision=c.version,
            )
            for c in compares
        ]
        success = []
        for operation in operations:
            if isinstance(operation, Put):
                success.append(etcd_rpc.RequestOp(request_put=etcd_rpc.PutRequest(
                    key=self._full(operation.key).encode(),
                    value=operation.value,
                    lease=operation.lease_id,
                )))
            else:
                success.append(etcd_rpc.RequestOp(request_delete_range=etcd_rpc.DeleteRangeRequest(
                    key=self._full(operation.key).encode(),
                )))
        request = etcd_rpc.TxnRequest(compare=compare_messages, success=success, failure=[])

        async def run(client: aetcd.Client):
            await client.connect()
            return await client.kvstub.Txn(request, timeout=self.config.call_timeout_s,
                                           metadata=client.metadata)

        response = await self._call(run)
        if not response.succeeded:
            return None
        return int(response.header.revision)

    # --- leases --------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> Lease:
        granted = await self._call(lambda c: c.lease(ttl_s))
        lease = Lease(lease_id=granted.id, ttl_s=ttl_s)
        task = asyncio.get_running_loop().create_task(self._keep_alive(lease))
        self._keepalive_tasks[lease.lease_id] = task
        task.add_done_callback(lambda _t, lease_id=lease.lease_id: self._keepalive_tasks.pop(lease_id, None))
        return lease

    async def _keep_alive(self, lease: Lease) -> None:
        # Refresh at a third of the TTL so that two refreshes may fail before expiry.
        interval_s = max(lease.ttl_s / 3.0, 0.2)
        last_success = time.monotonic()
        try:
            while not self._closed:
                await asyncio.sleep(interval_s)
                try:
                    reply = await self._call(lambda c: c.refresh_lease(lease.lease_id))
                except MetadataUnavailable as error:
                    if time.monotonic() - last_success > lease.ttl_s:
                        log.warning("lease lost (etcd unreachable past its ttl): lease_id=%x error=%s",
                                    lease.lease_id, error)
                        return
                    continue
                if reply is None or reply.TTL <= 0:
                    log.warning("lease lost (expired in etcd): lease_id=%x", lease.lease_id)
                    return
                last_success = time.monotonic()
                lease.refreshed_at = last_success
        finally:
            lease.lost.set()

    async def revoke_lease(self, lease: Lease) -> None:
        task = self._keepalive_tasks.pop(lease.lease_id, None)
        if task is not None:
            task.cancel()
        lease.lost.set()
        try:
            await self._call(lambda c: c.revoke_lease(lease.lease_id))
        except MetadataUnavailable:
            # The lease will expire by itself within its TTL.
            pass

    # --- watches ---------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, *, start_version: int = 0) -> Watch:
        return _EtcdWatch(self, prefix, start_version)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._keepalive_tasks.values())
        await cancel_and_wait(*tasks)
        client, self._client = self._client, None
        if client is not None:
            await client.close()
