"""EtcdStore reads: bounded when their callers are cancelled (issue 13's live-fuzz memory
growth), and sent together when asked for in the same turn of the loop (issue 40).

What it proves:
- grpc goes on with a call whose caller was cancelled, so reads in flight are bounded
  by ``reads_in_flight_max`` even when their callers are cancelled again and again
  (before the fix every cancelled lookup left a call running, without limit), and a
  cancelled caller that was still waiting for a slot never starts its read;
- reads asked for in one turn of the loop go to etcd as one read-only transaction
  (at most BATCH_MAX reads each), and every caller gets exactly its own answer: a get
  its record or None, a prefix read its records in key order; a read alone is still
  a plain get;
- a batch etcd refuses for its size is sent again read by read; a batch that fails
  because etcd is away fails every read of it with MetadataUnavailable.

How: an EtcdStore whose ``_call`` is replaced by a fake that runs the store's own
request factory against a fake client: gets and transactions answered from a dict
(no etcd is needed).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aetcd.rpc as etcd_rpc

from common.errors import MetadataUnavailable
from metadata.etcd_batches import BATCH_MAX
from metadata.etcd_store import EtcdStore, EtcdStoreConfig

ROOT = "/magnetar/standalone"


class FakeEtcd:
    """Answers the store's gets, ranges and read-only transactions from ``data``
    (full key -> value), counting calls and the reads they carried."""

    def __init__(self, data: dict[bytes, bytes]) -> None:
        self.data = data
        self.calls: list[str] = []
        self.reads_per_call: list[int] = []
        self.metadata = None
        self.kvstub = self
        self.refuse_transactions = False
        self.unavailable = False

    async def connect(self) -> None:
        return None

    def _check(self) -> None:
        if self.unavailable:
            raise MetadataUnavailable("etcd call failed: UNAVAILABLE: connection refused")

    async def get(self, key: bytes):
        self._check()
        self.calls.append("get")
        self.reads_per_call.append(1)
        value = self.data.get(key)
        return None if value is None else SimpleNamespace(value=value, mod_revision=5, create_revision=4, lease=0)

    def _range(self, request: etcd_rpc.RangeRequest) -> etcd_rpc.RangeResponse:
        end = request.range_end
        keys = sorted(k for k in self.data if (request.key <= k < end if end else k == request.key))
        response = etcd_rpc.RangeResponse(count=len(keys))
        response.header.revision = 9
        for key in keys:
            response.kvs.add(key=key, value=self.data[key], mod_revision=5, create_revision=4)
        return response

    async def Range(self, request, timeout=None, metadata=None):   # noqa: N802 (gRPC's name)
        self._check()
        self.calls.append("range")
        self.reads_per_call.append(1)
        return self._range(request)

    async def Txn(self, request, timeout=None, metadata=None):   # noqa: N802 (gRPC's name)
        self._check()
        if self.refuse_transactions:
            raise MetadataUnavailable("etcd call failed: RESOURCE_EXHAUSTED: received message larger than max")
        assert not request.compare and not request.failure
        self.calls.append("txn")
        self.reads_per_call.append(len(request.success))
        reply = etcd_rpc.TxnResponse(succeeded=True)
        for operation in request.success:
            reply.responses.add(response_range=self._range(operation.request_range))
        return reply


def _store_on(fake: FakeEtcd, reads_in_flight_max: int = 256) -> EtcdStore:
    store = EtcdStore(EtcdStoreConfig(endpoints=(("127.0.0.1", 1),), reads_in_flight_max=reads_in_flight_max))

    async def fake_call(coroutine_factory, *, timeout_s=None):
        return await coroutine_factory(fake)

    store._call = fake_call
    return store


async def test_cancelled_reads_stay_bounded():
    store = EtcdStore(EtcdStoreConfig(endpoints=(("127.0.0.1", 1),), reads_in_flight_max=8))
    gate = asyncio.Event()
    running = started = peak = 0

    class GatedClient:
        """Counts the reads in flight (a transaction counts each read it carries)."""
        metadata = None

        async def connect(self) -> None:
            return None

        async def _hold(self, reads: int):
            nonlocal running, started, peak
            running += reads
            started += reads
            peak = max(peak, running)
            try:
                await gate.wait()
            finally:
                running -= reads

        async def get(self, key: bytes):
            await self._hold(1)
            return None

        async def Txn(self, request, timeout=None, metadata=None):   # noqa: N802
            await self._hold(len(request.success))
            reply = etcd_rpc.TxnResponse(succeeded=True)
            for _ in request.success:
                reply.responses.add(response_range=etcd_rpc.RangeResponse())
            return reply

    client = GatedClient()
    client.kvstub = client

    async def fake_call(coroutine_factory, *, timeout_s=None):
        return await coroutine_factory(client)

    store._call = fake_call
    callers = [asyncio.ensure_future(store.get(f"/topic-{i}")) for i in range(1000)]
    await asyncio.sleep(0.01)
    for caller in callers:
        caller.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    assert peak == 8 and started == 8   # the other 992 never started a read
    gate.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert running == 0 and not store._shielded_reads
    assert await store.get("/after") is None   # the slots were given back


async def test_reads_of_one_turn_go_as_one_transaction_and_each_gets_its_own_answer():
    data = {f"{ROOT}/t/{i:03d}".encode(): f"v{i}".encode() for i in range(100)}
    data.update({f"{ROOT}/cursors/a/{name}".encode(): name.encode() for name in ("s2", "s1", "s3")})
    fake = FakeEtcd(data)
    store = _store_on(fake)
    # Alone: a plain get, as before.
    record = await store.get("/t/007")
    assert record is not None and record.value == b"v7" and record.key == "/t/007" and record.version == 5
    assert fake.calls == ["get"]
    fake.calls.clear()
    fake.reads_per_call.clear()

    keys = [f"/t/{i:03d}" for i in range(100)] + ["/t/missing"]
    got, cursors, absent = await asyncio.gather(
        asyncio.gather(*(store.get(key) for key in keys)),
        store.get_prefix("/cursors/a/"),
        store.get_prefix("/cursors/none/"))
    assert [r.value if r else None for r in got] == [f"v{i}".encode() for i in range(100)] + [None]
    assert [r.key for r in got[:100]] == keys[:100]
    assert [(r.key, r.value) for r in cursors] == [(f"/cursors/a/{n}", n.encode()) for n in ("s1", "s2", "s3")]
    assert absent == []
    # 103 reads in one turn: full transactions of BATCH_MAX reads, then the rest.
    assert fake.calls == ["txn", "txn"] and fake.reads_per_call == [BATCH_MAX, 103 - BATCH_MAX]
    records, revision = await store.get_prefix_at("/cursors/a/")
    assert len(records) == 3 and revision == 9


async def test_a_refused_batch_is_sent_read_by_read_and_an_unreachable_etcd_fails_every_read():
    fake = FakeEtcd({f"{ROOT}/k/{i}".encode(): b"x" for i in range(3)})
    store = _store_on(fake)
    fake.refuse_transactions = True
    got = await asyncio.gather(*(store.get(f"/k/{i}") for i in range(4)))
    assert [r.value if r else None for r in got] == [b"x", b"x", b"x", None]
    assert fake.calls == ["get"] * 4
    fake.refuse_transactions = False
    fake.unavailable = True
    outcomes = await asyncio.gather(*(store.get(f"/k/{i}") for i in range(4)), store.get_prefix("/k/"),
                                    return_exceptions=True)
    assert all(isinstance(outcome, MetadataUnavailable) for outcome in outcomes), outcomes
    fake.unavailable = False
    assert (await store.get("/k/1")).value == b"x"   # the slots were given back
    assert store._read_slots._value == 256
