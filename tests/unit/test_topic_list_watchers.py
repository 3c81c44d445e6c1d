"""Topic-list watchers (broker/topic_list_watchers.py) over the in-memory metadata
store: a watcher starts with the matching topics; a managed-ledger key that appears is
a new topic and one that vanishes a deleted one, each told only to the watchers whose
pattern matches, with the hash of the list after the change; a rewrite of an existing
key (a rollover) tells nobody; the mirror of a namespace is shared and stops with its
last watcher; patterns that cannot be applied and watchers past the per-connection
bound are refused."""

from __future__ import annotations

import asyncio

import pytest

from broker.topic_list import topics_hash
from broker.topic_list_watchers import TopicListWatchers
from common.errors import InvalidArgument, TooManyRequests
from common.topic_name import NamespaceName
from metadata import keys
from metadata.memory_store import MemoryStore

NAMESPACE = NamespaceName("public", "ns")
PREFIX = keys.managed_ledgers_of_namespace("public", "ns")


def _topic(local: str) -> str:
    return f"persistent://public/ns/{local}"


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_updates_reach_matching_watchers_only():
    store = MemoryStore()
    await store.put(PREFIX + "orders-1", b"{}")
    await store.put(PREFIX + "other", b"{}")
    registry = TopicListWatchers(store, watchers_per_connection_max=10)
    orders_updates: list[tuple[list[str], list[str], str]] = []
    all_updates: list[tuple[list[str], list[str], str]] = []
    orders = await registry.watch(NAMESPACE, "persistent://public/ns/orders-.*",
                                  lambda *update: orders_updates.append(update), 0)
    everything = await registry.watch(NAMESPACE, "public/ns/.*", lambda *update: all_updates.append(update), 1)
    assert orders.topics == {_topic("orders-1")}
    assert everything.topics == {_topic("orders-1"), _topic("other")}
    assert registry.namespaces_watched == 1

    await store.put(PREFIX + "orders-2", b"{}")
    await store.put(PREFIX + "other-2", b"{}")
    await store.put(PREFIX + "orders-1", b'{"ledgers": [1]}')     # a rollover: no news
    await store.delete(PREFIX + "orders-1")
    await _settle()
    assert orders_updates == [
        ([_topic("orders-2")], [], topics_hash([_topic("orders-1"), _topic("orders-2")])),
        ([], [_topic("orders-1")], topics_hash([_topic("orders-2")])),
    ]
    assert [update[:2] for update in all_updates] == [
        ([_topic("orders-2")], []), ([_topic("other-2")], []), ([], [_topic("orders-1")])]

    registry.unwatch(orders)
    await store.put(PREFIX + "orders-3", b"{}")
    await _settle()
    assert len(orders_updates) == 2
    assert all_updates[-1][:2] == ([_topic("orders-3")], [])
    registry.unwatch(everything)
    assert registry.namespaces_watched == 0
    await registry.close()


async def test_bad_patterns_and_too_many_watchers_are_refused():
    registry = TopicListWatchers(MemoryStore(), watchers_per_connection_max=2)
    for pattern in ("", "public/ns/(", "x" * 1001):
        with pytest.raises(InvalidArgument):
            await registry.watch(NAMESPACE, pattern, lambda *update: None, 0)
    with pytest.raises(TooManyRequests):
        await registry.watch(NAMESPACE, "public/ns/.*", lambda *update: None, 2)
    assert registry.namespaces_watched == 0
    await registry.close()
