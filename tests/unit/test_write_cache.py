"""The write cache (bookie/write_cache.py): journal-durable entries waiting for a flush.

What it proves: get returns what was put; size_bytes and entry_count always equal the
sum and number of the entries held, through overwrites (a recovery re-add of an entry
replaces it and is counted once) and ledger deletions; last_entry_id is the highest id
held; sorted_items lists by ledger then entry whatever the insertion order.

How: small hand cases, then a seeded random sequence of puts and deletes checked
against a plain dict model after every step.
"""

from __future__ import annotations

import random

from bookie.write_cache import WriteCache


def test_put_and_get():
    """Entries come back by (ledger_id, entry_id); absent ones are None."""
    cache = WriteCache()
    cache.put(1, 0, b"a")
    cache.put(2, 0, b"bb")
    assert cache.get(1, 0) == b"a"
    assert cache.get(2, 0) == b"bb"
    assert cache.get(1, 1) is None
    assert cache.get(3, 0) is None
    assert (cache.size_bytes, cache.entry_count, len(cache)) == (3, 2, 2)


def test_overwrite_is_counted_once_with_the_new_size():
    """Putting the same entry again keeps the last bytes and adjusts the size."""
    cache = WriteCache()
    cache.put(1, 5, b"x" * 10)
    cache.put(1, 5, b"y" * 3)
    assert cache.get(1, 5) == b"y" * 3
    assert (cache.size_bytes, cache.entry_count) == (3, 1)
    cache.put(1, 5, b"z" * 40)
    assert (cache.size_bytes, cache.entry_count) == (40, 1)


def test_last_entry_id():
    """The highest entry id held for a ledger, or -1."""
    cache = WriteCache()
    assert cache.last_entry_id(1) == -1
    for entry_id in (3, 9, 4):
        cache.put(1, entry_id, b"e")
    assert cache.last_entry_id(1) == 9
    assert cache.last_entry_id(2) == -1


def test_delete_ledger_releases_its_bytes_only():
    """Deleting a ledger drops its entries and bytes and leaves the others."""
    cache = WriteCache()
    cache.put(1, 0, b"aaaa")
    cache.put(1, 1, b"bb")
    cache.put(2, 0, b"c")
    cache.delete_ledger(1)
    assert cache.get(1, 0) is None
    assert cache.get(2, 0) == b"c"
    assert (cache.size_bytes, cache.entry_count) == (1, 1)
    assert cache.ledger_ids() == {2}
    cache.delete_ledger(7)  # unknown: no effect
    assert (cache.size_bytes, cache.entry_count) == (1, 1)


def test_sorted_items_orders_by_ledger_then_entry():
    """A flush writes each ledger's entries contiguously and in entry order."""
    cache = WriteCache()
    for ledger_id, entry_id in [(3, 2), (1, 1), (3, 0), (2, 5), (1, 0), (3, 1)]:
        cache.put(ledger_id, entry_id, f"{ledger_id}/{entry_id}".encode())
    items = cache.sorted_items()
    assert [(l, e) for l, e, _ in items] == [(1, 0), (1, 1), (2, 5), (3, 0), (3, 1), (3, 2)]
    assert all(entry == f"{l}/{e}".encode() for l, e, entry in items)


def test_random_operations_match_a_dict_model():
    """Seeded puts (with overwrites) and deletes: contents and accounting always agree
    with a plain dict of (ledger_id, entry_id) -> bytes."""
    rng = random.Random(7)
    cache = WriteCache()
    model: dict[tuple[int, int], bytes] = {}
    for _ in range(3000):
        if rng.random() < 0.95:
            key = (rng.randrange(5), rng.randrange(40))
            value = rng.randbytes(rng.randrange(0, 50))
            cache.put(*key, value)
            model[key] = value
        else:
            ledger_id = rng.randrange(6)
            cache.delete_ledger(ledger_id)
            model = {k: v for k, v in model.items() if k[0] != ledger_id}
        assert cache.size_bytes == sum(len(v) for v in model.values())
        assert cache.entry_count == len(model) == len(cache)
    assert [(l, e, v) for l, e, v in cache.sorted_items()] == sorted((k[0], k[1], v) for k, v in model.items())
    for (ledger_id, entry_id), value in model.items():
        assert cache.get(ledger_id, entry_id) == value
    for ledger_id in range(6):
        ids = [e for (l, e) in model if l == ledger_id]
        assert cache.last_entry_id(ledger_id) == (max(ids) if ids else -1)
