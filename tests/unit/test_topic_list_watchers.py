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


async def test_connection_serves_watchers_and_refuses_bad_requests():
    """Over a broker connection (the unit harness, in-memory store): a watcher gets its
    topics, then an update when a topic is
    created; a second watcher with the same id and a pattern that does not compile are
    refused with ERROR; WATCH_TOPIC_LIST_CLOSE is answered SUCCESS, also for an unknown
    id; a closed connection leaves no mirror behind."""
    from common.topic_name import TopicName
    from protocol.proto import pulsar_api_pb2 as pb
    from tests.unit.test_broker_connection import T, connected, settle

    service, client = await connected()
    await service.get_topic(TopicName.parse("persistent://public/default/orders-a"), create=True)
    client.send(pb.CommandWatchTopicList(request_id=1, watcher_id=5, namespace="public/default",
                                         topics_pattern="persistent://public/default/orders-.*"))
    await settle()
    (success,) = client.answers()
    assert success.type == T.WATCH_TOPIC_LIST_SUCCESS
    assert list(success.watchTopicListSuccess.topic) == ["persistent://public/default/orders-a"]
    await service.get_topic(TopicName.parse("persistent://public/default/orders-b"), create=True)
    await settle()
    (update,) = client.answers()
    assert update.type == T.WATCH_TOPIC_UPDATE
    assert list(update.watchTopicUpdate.new_topics) == ["persistent://public/default/orders-b"]
    client.send(pb.CommandWatchTopicList(request_id=2, watcher_id=5, namespace="public/default",
                                         topics_pattern="persistent://public/default/.*"))
    client.send(pb.CommandWatchTopicList(request_id=3, watcher_id=6, namespace="public/default",
                                         topics_pattern="persistent://public/default/("))
    await settle()
    errors = client.answers()
    assert [(e.type, e.error.request_id) for e in errors] == [(T.ERROR, 2), (T.ERROR, 3)]
    client.send(pb.CommandWatchTopicListClose(request_id=4, watcher_id=5))
    client.send(pb.CommandWatchTopicListClose(request_id=5, watcher_id=99))
    await settle()
    assert [(a.type, a.success.request_id) for a in client.answers()] == [(T.SUCCESS, 4), (T.SUCCESS, 5)]
    assert service.topic_list_watchers.namespaces_watched == 0
    client.send(pb.CommandWatchTopicList(request_id=6, watcher_id=7, namespace="public/default",
                                         topics_pattern="persistent://public/default/.*"))
    await settle()
    assert client.answers()[0].type == T.WATCH_TOPIC_LIST_SUCCESS
    assert service.topic_list_watchers.namespaces_watched == 1
    client.transport.close()
    await settle()
    assert service.topic_list_watchers.namespaces_watched == 0
    await service.close()
