"""Namespace policies that act on topics as time passes: message TTL and backlog
quotas, as Pulsar defines them.

- **Message TTL** (``message_ttl_in_seconds``): on every check, each durable
  subscription's messages published more than the TTL ago are acknowledged for it
  (the mark-delete position moves past them; Pulsar's message expiry).
- **Backlog quotas** (``backlog_quota_map``): ``destination_storage`` limits the
  backlog's size (``limitSize`` bytes: the slowest durable subscription's unconsumed
  entries times the topic's mean entry size, the estimate Pulsar uses too);
  ``message_age`` limits the age of the oldest unconsumed message (``limitTime`` s).
  Past a limit, by the quota's policy:
  - ``producer_request_hold``: producers are refused with
    ProducerBlockedQuotaExceededError (the client keeps retrying, so its sends wait)
    and attached ones are closed (they reconnect into that refusal);
  - ``producer_exception``: the same with ProducerBlockedQuotaExceededException (the
    client fails its sends);
  - ``consumer_backlog_eviction``: the oldest unconsumed entries of the subscriptions
    past the limit are skipped until they are within it.
  Producers are checked when they are created and on every periodic check; and the
  size quota of a producer-blocking policy is checked on **every SEND** too (against
  the quota the topic last learnt, with the appends not yet confirmed counted): a SEND
  that finds the backlog past it is not stored, and its producer is closed at once —
  the client resends it after reconnecting, into the refusal (hold: it retries;
  exception: it fails). So the backlog passes the quota by at most one entry, not by
  what producers send between two periodic checks. The age quota needs a read of the
  oldest unconsumed entry and stays periodic.

The checks run every ``policy_check_interval_s`` on the loaded topics whose namespace
sets one of these policies (``TopicUpkeep.run_policies``, broker/topic_upkeep.py); what they did is counted
in ``PolicyCounters`` and shown in /metrics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ProducerBlockedQuota, ProducerBlockedQuotaException
from common.position import Position
from metadata.policies import NamespacePolicies

if TYPE_CHECKING:
    from broker.producer import Producer
    from broker.topic import PersistentTopic
    from subscriptions.subscription import Subscription

log = logging.getLogger(__name__)

HOLD, EXCEPTION, EVICTION = "producer_request_hold", "producer_exception", "consumer_backlog_eviction"


@dataclass
class PolicyCounters:
    messages_expired: int = 0            # entries acknowledged by TTL
    entries_evicted: int = 0             # entries skipped by consumer_backlog_eviction
    producers_refused: int = 0           # producer creations refused by a quota
    producers_disconnected: int = 0      # attached producers closed by a quota
    sends_refused: int = 0               # SENDs not stored because a size quota was passed
    compactions_started: int = 0         # compactions started by a namespace's compactionThreshold


def has_time_policies(policies: NamespacePolicies) -> bool:
    """True when the namespace sets a message TTL or a backlog quota."""
    return bool(policies.message_ttl_in_seconds) or _size_limit(policies) is not None \
        or _age_limit(policies) is not None


def _size_limit(policies: NamespacePolicies) -> tuple[int, str] | None:
    quota = policies.backlog_quota_map.get("destination_storage")
    if not quota:
        return None
    limit = int(quota.get("limitSize", quota.get("limit", -1)))
    return (limit, quota.get("policy", HOLD)) if limit >= 0 else None


def _age_limit(policies: NamespacePolicies) -> tuple[int, str] | None:
    quota = policies.backlog_quota_map.get("message_age")
    if not quota:
        return None
    limit = int(quota.get("limitTime", -1))
    return (limit, quota.get("policy", HOLD)) if limit >= 0 else None


def size_quota(policies: NamespacePolicies) -> tuple[int, str] | None:
    """The destination_storage quota (limit bytes, policy), if the namespace sets one."""
    return _size_limit(policies)


def send_refusal(topic: "PersistentTopic", size_bytes: int) -> str | None:
    """Why a SEND of ``size_bytes`` must not be stored now (a producer-blocking size
    quota is passed), or None. Cheap: no IO. The backlog counts appends not yet
    confirmed, at the topic's mean entry size (this SEND's size while the topic has no
    entry yet)."""
    quota = topic.backlog_size_quota
    if quota is None or quota[1] == EVICTION:
        return None
    backlog_bytes = int(topic.backlog_entries(pending=True) * (topic.mean_entry_bytes() or size_bytes))
    if backlog_bytes <= quota[0]:
        return None
    return f"backlog of {backlog_bytes} bytes is over the {quota[0]}-byte quota"


def close_producer(topic: "PersistentTopic", producer: "Producer", reason: str, counters: PolicyCounters) -> None:
    """Closes an attached producer because of a quota (it reconnects into the refusal),
    once the receipts of its earlier SENDs are out: a client fails what it has no
    receipt for when it is then refused, so a stored message must not lose its receipt."""
    if producer.closed or producer.closing:
        return
    log.info("producer closed by backlog quota: topic=%s producer=%s reason=%s", topic.full_name,
             producer.name, reason)
    counters.producers_disconnected += 1

    def on_closed() -> None:
        producer.closed = True
        topic.remove_producer(producer)

    producer.connection.close_producer_after_sends(producer, on_closed)


async def exceeded_quota(topic: "PersistentTopic", policies: NamespacePolicies) -> tuple[str, str] | None:
    """(policy, what was exceeded) of the first backlog quota the topic is past; None
    when within every quota."""
    size = _size_limit(policies)
    if size is not None:
        backlog_bytes = topic.backlog_bytes()
        if backlog_bytes > size[0]:
            return size[1], f"backlog of {backlog_bytes} bytes is over the {size[0]}-byte quota"
    age = _age_limit(policies)
    if age is not None:
        oldest_ms = await topic.oldest_unconsumed_publish_ms()
        if oldest_ms is not None and time.time() * 1000 - oldest_ms > age[0] * 1000:
            return age[1], f"oldest unconsumed message is older than the {age[0]} s quota"
    return None


async def check_producer_allowed(topic: "PersistentTopic", policies: NamespacePolicies,
                                 counters: PolicyCounters) -> None:
    """Raises the quota error a new producer gets while a producer-blocking quota is
    exceeded."""
    exceeded = await exceeded_quota(topic, policies)
    if exceeded is None or exceeded[0] == EVICTION:
        return
    counters.producers_refused += 1
    policy, reason = exceeded
    message = f"topic {topic.full_name}: {reason}"
    if policy == EXCEPTION:
        raise ProducerBlockedQuotaException(message)
    raise ProducerBlockedQuota(message)


async def enforce(topic: "PersistentTopic", policies: NamespacePolicies, counters: PolicyCounters) -> None:
    """One periodic check of a topic: TTL, then the backlog quotas."""
    now_ms = int(time.time() * 1000)
    ttl_s = policies.message_ttl_in_seconds or 0
    if ttl_s > 0:
        counters.messages_expired += await expire_before(topic, now_ms - ttl_s * 1000)
    exceeded = await exceeded_quota(topic, policies)
    if exceeded is None:
        return
    policy, reason = exceeded
    if policy == EVICTION:
        counters.entries_evicted += await _evict(topic, policies, now_ms)
        return
    for producer in list(topic.producers.values()):
        close_producer(topic, producer, reason, counters)


async def expire_before(topic: "PersistentTopic", cutoff_ms: int,
                        subscriptions: "list[Subscription] | None" = None) -> int:
    """Acknowledges, for every durable subscription of ``subscriptions`` (default: all
    of the topic's), what was published before ``cutoff_ms``; returns the entries that
    this acknowledged."""
    chosen = [s for s in (subscriptions if subscriptions is not None else topic.subscriptions.values())
              if s.cursor.durable]
    if not chosen:
        return 0
    first_kept = await topic.find_position_by_time(cutoff_ms)
    return sum(subscription.skip_before(first_kept, topic.entries_between) for subscription in chosen)


async def _evict(topic: "PersistentTopic", policies: NamespacePolicies, now_ms: int) -> int:
    evicted = 0
    size = _size_limit(policies)
    if size is not None and size[1] == EVICTION:
        mean = topic.mean_entry_bytes()
        keep_entries = int(size[0] // mean) if mean > 0 else 0
        for subscription in list(topic.subscriptions.values()):
            cursor = subscription.cursor
            if not cursor.durable:
                continue
            backlog = topic.entries_between(cursor.mark_delete_position, topic.ledger.last_confirmed)
            if backlog > keep_entries:
                first_kept = topic.position_after(cursor.mark_delete_position, backlog - keep_entries + 1)
                evicted += subscription.skip_before(first_kept, topic.entries_between)
    age = _age_limit(policies)
    if age is not None and age[1] == EVICTION:
        evicted += await expire_before(topic, now_ms - age[0] * 1000)
    if evicted:
        log.info("backlog evicted by quota: topic=%s entries=%d", topic.full_name, evicted)
    return evicted
