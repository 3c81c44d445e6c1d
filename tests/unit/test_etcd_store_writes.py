"""EtcdStore transactions asked for in the same turn of the loop (issue 40): sent as one
etcd transaction when their keys do not overlap, with each caller's answer exactly what
it would have been alone.

What it proves:
- compare-and-sets of different keys in one turn go as one transaction; each caller gets
  the batch's revision, which is its key's new version (a further compare-and-set with
  it succeeds);
- when one compare of a batch fails, nothing of the batch was applied, each is sent
  again alone, and only the one whose compare failed gets None (MetadataVersionConflict
  through compare_and_set); the others are applied;
- two writes of one key in one turn are never combined (etcd refuses a duplicate key):
  they go one after the other, so exactly one of two racing creations wins;
- a batch refused as a whole (a lease etcd does not know) is sent call by call, and
  only the call with the unknown lease fails; etcd away fails each call with
  MetadataUnavailable;
- ``disjoint_groups`` puts a call sharing a key with an earlier one in a later group
  (groups are sent in order, so calls on one key keep their order), and keeps to the
  size bounds.

How: an EtcdStore whose ``_call`` is replaced by a fake that runs the store's own
request factory against a fake etcd: a dict of key -> (value, mod revision), applying
a transaction's compares and operations as etcd does (no etcd is needed).
"""

from __future__ import annotations

import asyncio

import aetcd.rpc as etcd_rpc
import pytest

from common.errors import MetadataLeaseExpired, MetadataUnavailable, MetadataVersionConflict
from metadata.etcd_batches import disjoint_groups
from metadata.etcd_store import EtcdStore, EtcdStoreConfig
from metadata.store import Compare, Put


class FakeEtcd:
    def __init__(self) -> None:
        self.data: dict[bytes, tuple[bytes, int]] = {}
        self.revision = 1
        self.transactions: list[int] = []   # operations per transaction received
        self.leases = {0}
        self.unavailable = False
        self.metadata = None
        self.kvstub = self

    async def connect(self) -> None:
        return None

    async def Txn(self, request, timeout=None, metadata=None):   # noqa: N802 (gRPC's name)
        if self.unavailable:
            raise MetadataUnavailable("etcd call failed: UNAVAILABLE: connection refused")
        keys = [getattr(op, op.WhichOneof("request")).key for op in request.success]
        assert len(keys) == len(set(keys)), "etcd refuses a duplicate key in one transaction"
        for op in request.success:
            if op.WhichOneof("request") == "request_put" and op.request_put.lease not in self.leases:
                raise MetadataLeaseExpired("etcd call failed: NOT_FOUND: requested lease not found")
        self.transactions.append(len(request.success))
        reply = etcd_rpc.TxnResponse()
        held = all(self.data.get(c.key, (b"", 0))[1] == c.mod_revision for c in request.compare)
        reply.succeeded = held
        if held:
            self.revision += 1
            for op in request.success:
                if op.WhichOneof("request") == "request_put":
                    self.data[op.request_put.key] = (op.request_put.value, self.revision)
                else:
                    self.data.pop(op.request_delete_range.key, None)
        reply.header.revision = self.revision
        return reply


@pytest.fixture
def etcd_and_store():
    fake = FakeEtcd()
    store = EtcdStore(EtcdStoreConfig(endpoints=(("127.0.0.1", 1),), root="/r", lease_thread=False))

    async def fake_call(coroutine_factory, *, timeout_s=None):
        return await coroutine_factory(fake)

    store._call = fake_call
    return fake, store


async def test_writes_of_one_turn_on_different_keys_go_as_one_transaction(etcd_and_store):
    fake, store = etcd_and_store
    versions = await asyncio.gather(*(store.compare_and_set(f"/k/{i}", b"v1", expected_version=0) for i in range(10)))
    assert fake.transactions == [10]
    assert len(set(versions)) == 1 and versions[0] == fake.revision
    assert all(fake.data[f"/r/k/{i}".encode()] == (b"v1", versions[0]) for i in range(10))
    # The revision is each key's version: the next compare-and-set with it succeeds.
    again = await asyncio.gather(*(store.compare_and_set(f"/k/{i}", b"v2", expected_version=versions[0])
                                   for i in range(10)))
    assert all(version > versions[0] for version in again)


async def test_a_failed_compare_fails_only_its_own_write(etcd_and_store):
    fake, store = etcd_and_store
    await store.compare_and_set("/k/stale", b"v1", expected_version=0)
    fake.transactions.clear()
    outcomes = await asyncio.gather(
        *(store.compare_and_set(f"/k/{i}", b"new", expected_version=0) for i in range(3)),
        store.compare_and_set("/k/stale", b"lost", expected_version=1),   # not its version
        return_exceptions=True)
    assert [isinstance(o, int) for o in outcomes] == [True, True, True, False]
    assert isinstance(outcomes[3], MetadataVersionConflict)
    assert fake.transactions == [4, 1, 1, 1, 1]   # the batch (not applied), then each alone
    assert fake.data[b"/r/k/stale"][0] == b"v1"
    assert all(fake.data[f"/r/k/{i}".encode()][0] == b"new" for i in range(3))


async def test_two_writes_of_one_key_in_one_turn_are_not_combined(etcd_and_store):
    fake, store = etcd_and_store
    outcomes = await asyncio.gather(store.transaction([Compare("/owner", 0)], [Put("/owner", b"a")]),
                                    store.transaction([Compare("/owner", 0)], [Put("/owner", b"b")]),
                                    store.transaction([Compare("/other", 0)], [Put("/other", b"c")]))
    assert outcomes[0] is not None and outcomes[1] is None and outcomes[2] is not None
    assert fake.data[b"/r/owner"][0] == b"a"
    assert fake.transactions == [2, 1]   # "/owner" + "/other" together, then the second "/owner" alone


async def test_a_batch_refused_whole_is_sent_call_by_call_and_etcd_away_fails_each(etcd_and_store):
    fake, store = etcd_and_store
    outcomes = await asyncio.gather(store.transaction([], [Put("/a", b"1")]),
                                    store.transaction([], [Put("/b", b"2", lease_id=99)]),
                                    return_exceptions=True)
    assert isinstance(outcomes[0], int) and isinstance(outcomes[1], MetadataLeaseExpired)
    assert b"/r/a" in fake.data and b"/r/b" not in fake.data
    fake.unavailable = True
    outcomes = await asyncio.gather(*(store.transaction([], [Put(f"/c/{i}", b"x")]) for i in range(3)),
                                    return_exceptions=True)
    assert all(isinstance(o, MetadataUnavailable) for o in outcomes), outcomes


def test_disjoint_groups_keep_order_and_bounds():
    calls = [({"a"}, 1, 1), ({"b"}, 1, 1), ({"a", "c"}, 1, 2), ({"d"}, 0, 1), ({"c"}, 1, 1)]
    assert disjoint_groups(calls) == [[0, 1, 3], [2], [4]]
    assert disjoint_groups([({i}, 1, 1) for i in range(5)], ops_max=2) == [[0, 1], [2, 3], [4]]
    assert disjoint_groups([({"big"}, 0, 9), ({"x"}, 0, 1)], ops_max=4) == [[0], [1]]
