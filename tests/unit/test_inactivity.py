"""The pure rules of subscription expiry and inactive-topic deletion
(broker/inactivity.py): clocks start when something is first seen inactive and stop
when it is seen active; a record carried over (a broker restart) keeps the clock; a
topic with a producer, a reader, a subscription (or, caught-up mode, a backlog) is
never deleted; the namespace's policies win over the broker's."""

from __future__ import annotations

import pytest

from broker.inactivity import (CAUGHT_UP, NO_SUBSCRIPTIONS, ActivityRecord, InactiveTopicPolicy, TopicView,
                               decide, effective_expiry_s, effective_topic_policy, inactive_topic_policy_of)
from common.errors import InvalidArgument

DELETE_60 = InactiveTopicPolicy(True, 60)
NOW = 1_000_000_000


def test_first_sight_starts_the_clocks_and_a_kept_record_keeps_them():
    view = TopicView(producers=0, subscriptions={"a": (0, 5)})
    first = decide(view, ActivityRecord(), DELETE_60, expiry_s=30, now_ms=NOW)
    assert first.record == ActivityRecord(None, {"a": NOW}) and not first.expire and not first.delete_topic
    # 31 s later (a restart in between: only the record survives) the subscription expires,
    # and the topic, now without subscriptions, starts its own clock.
    later = decide(view, ActivityRecord.decode(first.record.encode()), DELETE_60, expiry_s=30, now_ms=NOW + 31_000)
    assert later.expire == ["a"]
    assert later.record == ActivityRecord(NOW + 31_000, {})
    assert not later.delete_topic
    gone = decide(TopicView(0, {}), later.record, DELETE_60, expiry_s=30, now_ms=NOW + 92_000)
    assert gone.delete_topic


def test_activity_stops_the_clocks():
    record = ActivityRecord(NOW, {"a": NOW})
    busy = decide(TopicView(producers=1, subscriptions={"a": (1, 0)}), record, DELETE_60, 30, NOW + 10**9)
    assert busy.record.empty and not busy.expire and not busy.delete_topic


@pytest.mark.parametrize("view", [
    TopicView(producers=1, subscriptions={}),
    TopicView(producers=0, subscriptions={}, readers=1),
    TopicView(producers=0, subscriptions={"a": (0, 0)}),
])
def test_active_topics_are_never_deleted_in_no_subscriptions_mode(view):
    decision = decide(view, ActivityRecord(NOW - 10**9), DELETE_60, expiry_s=None, now_ms=NOW)
    assert not decision.delete_topic


def test_caught_up_mode_deletes_a_topic_whose_subscriptions_have_nothing_left():
    policy = InactiveTopicPolicy(True, 60, CAUGHT_UP)
    caught_up = TopicView(0, {"a": (0, 0)})
    assert decide(caught_up, ActivityRecord(NOW - 61_000), policy, None, NOW).delete_topic
    behind = TopicView(0, {"a": (0, 3)})
    assert not decide(behind, ActivityRecord(NOW - 61_000), policy, None, NOW).delete_topic


def test_deletion_off_keeps_the_clock_but_deletes_nothing():
    decision = decide(TopicView(0, {}), ActivityRecord(NOW - 10**9), InactiveTopicPolicy(False, 60), None, NOW)
    assert not decision.delete_topic and decision.record.topic_inactive_since_ms == NOW - 10**9


def test_namespace_policies_win_over_the_broker_defaults():
    broker = InactiveTopicPolicy(False, 600)
    assert effective_topic_policy(None, broker) is broker
    chosen = effective_topic_policy(inactive_topic_policy_of({"maxInactiveDurationSeconds": 5}), broker)
    assert chosen == InactiveTopicPolicy(True, 5, NO_SUBSCRIPTIONS)
    assert effective_expiry_s(None, 0) is None
    assert effective_expiry_s(0, 2) == 120
    assert effective_expiry_s(3, 2) == 180


@pytest.mark.parametrize("body", [[], {"maxInactiveDurationSeconds": 0}, {"inactiveTopicDeleteMode": "x"},
                                  {"deleteWhileInactive": "yes"}, {"maxInactiveDurationSeconds": True}])
def test_bad_policy_bodies_are_refused(body):
    with pytest.raises(InvalidArgument):
        inactive_topic_policy_of(body)


def test_an_unreadable_record_starts_the_clocks_again():
    assert ActivityRecord.decode(b"{not json").empty
