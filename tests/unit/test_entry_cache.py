"""The read cache (bookie/read_cache.py): a byte-bounded LRU of flushed or read entries.

What it proves: size_bytes never exceeds the capacity and always equals the bytes held;
the least recently used entries (put or get both count as use) go first; an overwrite
replaces the old bytes in the accounting; entries larger than the whole cache are not
cached - and do not leave an older version of the same entry behind to be served;
delete_ledger drops only that ledger; hits and misses are counted.

How: small hand cases, then a seeded random sequence checked against a reference LRU
model after every step.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from common.entry_cache import EntryCache


def test_evicts_least_recently_put_by_bytes():
    """Four 30-byte entries in a 100-byte cache: the first one goes."""
    cache = EntryCache(100)
    for entry_id in range(4):
        cache.put(1, entry_id, bytes([entry_id]) * 30)
    assert cache.get(1, 0) is None
    assert [cache.get(1, e) for e in (1, 2, 3)] == [b"\x01" * 30, b"\x02" * 30, b"\x03" * 30]
    assert cache.size_bytes == 90
    assert len(cache) == 3


def test_one_large_put_evicts_several():
    """Eviction continues until the new entry fits."""
    cache = EntryCache(100)
    for entry_id in range(5):
        cache.put(1, entry_id, b"x" * 20)
    cache.put(2, 0, b"y" * 70)
    assert cache.size_bytes == 90
    assert [cache.get(1, e) is not None for e in range(5)] == [False, False, False, False, True]
    assert cache.get(2, 0) == b"y" * 70


def test_get_refreshes_recency():
    """A read entry survives the next eviction; the untouched one goes instead."""
    cache = EntryCache(90)
    for entry_id in range(3):
        cache.put(1, entry_id, b"e" * 30)
    assert cache.get(1, 0) is not None
    cache.put(1, 3, b"e" * 30)
    assert cache.get(1, 1) is None
    assert cache.get(1, 0) is not None
    assert cache.get(1, 2) is not None


def test_overwrite_replaces_bytes_and_recency():
    """Putting an entry again counts only the new bytes and makes it most recent."""
    cache = EntryCache(100)
    cache.put(1, 0, b"a" * 40)
    cache.put(1, 1, b"b" * 40)
    cache.put(1, 0, b"A" * 10)
    assert cache.size_bytes == 50
    assert len(cache) == 2
    cache.put(1, 2, b"c" * 60)      # 110 bytes: evicts entry 1, the least recent
    assert cache.get(1, 1) is None
    assert cache.get(1, 0) == b"A" * 10
    assert cache.size_bytes == 70


def test_entry_larger_than_capacity_is_not_cached():
    """An entry bigger than the whole cache is skipped and evicts nothing."""
    cache = EntryCache(100)
    cache.put(1, 0, b"a" * 50)
    cache.put(1, 1, b"b" * 101)
    assert cache.get(1, 1) is None
    assert cache.get(1, 0) == b"a" * 50
    assert cache.size_bytes == 50
    cache.put(1, 2, b"c" * 100)     # exactly the capacity fits
    assert cache.get(1, 2) == b"c" * 100
    assert cache.size_bytes == 100


def test_oversized_overwrite_does_not_leave_the_old_version_behind():
    """When an entry is put again with bytes too large to cache, the cache must not
    keep serving the previous bytes of that entry (a stale read)."""
    cache = EntryCache(100)
    cache.put(1, 0, b"old" * 10)
    cache.put(1, 0, b"new" * 50)
    assert cache.get(1, 0) != b"old" * 10


def test_zero_capacity_caches_nothing():
    """A cache of 0 bytes (read cache disabled) holds no non-empty entry."""
    cache = EntryCache(0)
    cache.put(1, 0, b"a")
    assert cache.get(1, 0) is None
    assert cache.size_bytes == 0


def test_delete_ledger_drops_only_that_ledger():
    """Entries of other ledgers and their bytes stay."""
    cache = EntryCache(1000)
    cache.put(1, 0, b"a" * 10)
    cache.put(2, 0, b"b" * 20)
    cache.put(1, 1, b"c" * 30)
    cache.delete_ledger(1)
    assert cache.size_bytes == 20
    assert len(cache) == 1
    assert cache.get(2, 0) == b"b" * 20
    assert cache.get(1, 1) is None


def test_hits_and_misses_are_counted():
    """Each get is exactly one hit or one miss."""
    cache = EntryCache(100)
    cache.put(1, 0, b"a")
    cache.get(1, 0)
    cache.get(1, 0)
    cache.get(1, 1)
    assert (cache.hits, cache.misses) == (2, 1)


def test_random_operations_match_a_reference_lru():
    """Seeded puts, gets and deletes of varied sizes: same contents, same size_bytes,
    never over capacity (a reference LRU built on OrderedDict is the model)."""
    rng = random.Random(11)
    capacity = 500
    cache = EntryCache(capacity)
    model: OrderedDict[tuple[int, int], bytes] = OrderedDict()
    for _ in range(5000):
        action = rng.random()
        key = (rng.randrange(3), rng.randrange(30))
        if action < 0.5:
            value = rng.randbytes(rng.randrange(0, 120))
            cache.put(*key, value)
            if len(value) <= capacity:
                model.pop(key, None)
                model[key] = value
                while sum(len(v) for v in model.values()) > capacity:
                    model.popitem(last=False)
            else:
                model.pop(key, None)
        elif action < 0.95:
            expected = model.get(key)
            if expected is not None:
                model.move_to_end(key)
            assert cache.get(*key) == expected
        else:
            cache.delete_ledger(key[0])
            for doomed in [k for k in model if k[0] == key[0]]:
                del model[doomed]
        assert cache.size_bytes == sum(len(v) for v in model.values()) <= capacity
        assert len(cache) == len(model)
