"""GET_TOPICS_OF_NAMESPACE answers (broker/topic_list.py and the connection): a pattern
filters the namespace's topics on whole names without the scheme; the hash of the
answer lets a client that holds the same list get "unchanged" and no names; a pattern
that does not compile (or is too long) is not applied."""

from __future__ import annotations

import pytest

from broker.topic_list import PATTERN_CHARS_MAX, answer, topics_hash
from common.topic_name import TopicName
from protocol.proto import pulsar_api_pb2 as pb
from tests.unit.test_broker_connection import T, connected, settle

TOPICS = ["persistent://public/default/orders-a", "persistent://public/default/orders-b-partition-0",
          "persistent://public/default/other"]


@pytest.mark.parametrize("pattern, expected", [
    ("persistent://public/default/orders-.*", TOPICS[:2]),
    ("public/default/orders-a", TOPICS[:1]),
    ("public/default/orders", []),                          # whole names only
    ("public/default/.*", TOPICS),
])
def test_pattern_filters_whole_names(pattern, expected):
    result = answer(TOPICS, pattern, None)
    assert result.filtered and result.changed
    assert result.topics == expected
    assert result.topics_hash == topics_hash(expected)


@pytest.mark.parametrize("pattern", ["public/default/(", "x" * (PATTERN_CHARS_MAX + 1)])
def test_a_pattern_that_cannot_be_applied_returns_everything_unfiltered(pattern):
    result = answer(TOPICS, pattern, None)
    assert not result.filtered and result.topics == sorted(TOPICS)


def test_same_hash_means_unchanged_and_no_names():
    first = answer(TOPICS, None, None)
    again = answer(list(reversed(TOPICS)), None, first.topics_hash)
    assert not again.changed and again.topics == [] and again.topics_hash == first.topics_hash
    grown = answer(TOPICS + ["persistent://public/default/new"], None, first.topics_hash)
    assert grown.changed and len(grown.topics) == 4 and grown.topics_hash != first.topics_hash


async def test_connection_answers_with_filter_and_hash():
    """Two topics exist; GET_TOPICS_OF_NAMESPACE with a pattern matching one answers
    it, filtered, with a hash; asked again with that hash, it answers unchanged."""
    service, client = await connected()
    for name in ("persistent://public/default/orders-a", "persistent://public/default/other"):
        await service.get_topic(TopicName.parse(name), create=True)
    client.send(pb.CommandGetTopicsOfNamespace(request_id=1, namespace="public/default",
                                               topics_pattern="persistent://public/default/orders-.*"))
    await settle()
    (first,) = client.answers()
    assert first.type == T.GET_TOPICS_OF_NAMESPACE_RESPONSE
    response = first.getTopicsOfNamespaceResponse
    assert list(response.topics) == ["persistent://public/default/orders-a"]
    assert response.filtered and response.changed and response.topics_hash
    client.send(pb.CommandGetTopicsOfNamespace(request_id=2, namespace="public/default",
                                               topics_pattern="persistent://public/default/orders-.*",
                                               topics_hash=response.topics_hash))
    await settle()
    (second,) = client.answers()
    assert not second.getTopicsOfNamespaceResponse.changed
    assert list(second.getTopicsOfNamespaceResponse.topics) == []
    client.transport.close()
    await service.close()
