"""The JSON of a topic's stats and internal stats, with Pulsar's field names. Pure: it
reads a loaded PersistentTopic (its managed ledger, producers, subscriptions, cursors
and consumers) and the time it is given, and returns plain dicts; no clock, no IO, no
logging.

Theory of operation:
- Counters (``msgInCounter``, ``bytesInCounter``, ``msgOutCounter`` ...) are what the
  topic, producers, dispatchers and consumers count since the topic was loaded, as in
  Pulsar, where they also restart from zero when a topic moves.
- Rates are measured, never guessed: a ``RateMeter`` keeps the last sample of each
  counter it was shown and divides the growth by the time between samples. The first
  look at a counter answers 0, and so does a counter that nothing moved. Samples are
  taken when stats are asked for, at most once per ``window_s_min`` per counter (a
  quicker second look repeats the last measured rate rather than measuring over a few
  milliseconds). A counter that went down (a consumer or topic object replaced under the
  same key) restarts its measurement instead of answering a negative rate.
- Out-rates are per consumer (a consumer's counters only grow while it lives);
  a subscription's rate is the sum over its consumers, and a topic's the sum over its
  subscriptions. A consumer that left stops counting, so no departure shows as a drop.
- Backlog is counted in entries (a batch is one entry), as Pulsar's ``msgBacklog`` is.
  ``backlogSize`` is an estimate: backlog entries times the topic's mean stored entry
  size (Pulsar estimates it too). The topic's ``backlogSize`` is its slowest
  subscription's; a partitioned topic's, the sum over its partitions (as Pulsar sums).
- Internal stats describe the managed ledger: ledgers with their entry counts and sizes
  (-1 while a rolled-over ledger is still being closed and its count is not final), the
  current ledger, and each cursor's mark-delete and read positions.
"""

from __future__ import annotations

import collections
import datetime
from typing import TYPE_CHECKING, Hashable

from common.position import Position
from common.topic_name import TopicName

if TYPE_CHECKING:
    from broker.consumer import Consumer
    from broker.producer import Producer
    from broker.topic import PersistentTopic
    from subscriptions.subscription import Subscription

# A counter is measured over at least this long; Pulsar refreshes its rates every
# statsUpdateFrequencyInSecs (60 s), too slow for an operator watching a test, and a
# window of a few milliseconds would mostly measure scheduling noise.
RATE_WINDOW_S_MIN = 1.0
# Samples kept (one per topic, producer and consumer seen); beyond this the least
# recently sampled are dropped. 100,000 samples are a few tens of MB at most.
RATE_SAMPLES_MAX = 100_000
# A sample not refreshed for this long belongs to something gone (a closed consumer).
RATE_SAMPLE_TTL_S = 600.0

# ProducerAccessMode names (PulsarApi.proto).
_ACCESS_MODES = {0: "Shared", 1: "Exclusive", 2: "WaitForExclusive", 3: "ExclusiveWithFencing"}

# Fields a partitioned topic's stats sum over its partitions.
_SUMMED_TOPIC_FIELDS = ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "bytesInCounter",
                        "msgInCounter", "msgOutCounter", "storageSize")
_SUMMED_SUBSCRIPTION_FIELDS = ("msgRateOut", "msgThroughputOut", "msgOutCounter", "msgBacklog", "backlogSize",
                               "unackedMessages")
_SUMMED_PUBLISHER_FIELDS = ("msgRateIn", "msgThroughputIn")


class _Sample:
    __slots__ = ("time_s", "counters", "rates")

    def __init__(self, time_s: float, counters: tuple[int, ...], rates: tuple[float, ...]) -> None:
        self.time_s = time_s
        self.counters = counters
        self.rates = rates


class RateMeter:
    """Per-second rates of monotone counters, measured between successive looks."""

    def __init__(self, *, window_s_min: float = RATE_WINDOW_S_MIN, samples_max: int = RATE_SAMPLES_MAX,
                 sample_ttl_s: float = RATE_SAMPLE_TTL_S) -> None:
        assert window_s_min > 0
        assert samples_max >= 1
        self._window_s_min = window_s_min
        self._samples_max = samples_max
        self._sample_ttl_s = sample_ttl_s
        # Ordered by last refresh, oldest first, so pruning pops from the front.
        self._samples: collections.OrderedDict[Hashable, _Sample] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._samples)

    def rates(self, key: Hashable, counters: tuple[int, ...], now_s: float) -> tuple[float, ...]:
        sample = self._samples.get(key)
        if sample is not None and len(sample.counters) == len(counters) and now_s >= sample.time_s:
            elapsed = now_s - sample.time_s
            if elapsed < self._window_s_min:
                return sample.rates
            if all(new >= old for new, old in zip(counters, sample.counters)):
                rates = tuple((new - old) / elapsed for new, old in zip(counters, sample.counters))
            else:
                rates = tuple(0.0 for _ in counters)   # the counters restarted
        else:
            rates = tuple(0.0 for _ in counters)
        self._samples.pop(key, None)
        self._samples[key] = _Sample(now_s, counters, rates)
        self._prune(now_s)
        assert all(rate >= 0 for rate in rates), rates
        return rates

    def _prune(self, now_s: float) -> None:
        samples = self._samples
        while samples:
            oldest = next(iter(samples.values()))
            if len(samples) <= self._samples_max and now_s - oldest.time_s <= self._sample_ttl_s:
                break
            samples.popitem(last=False)


def iso_time(time_ms: int) -> str:
    """Pulsar's timestamp strings: ISO-8601 in UTC with milliseconds."""
    moment = datetime.datetime.fromtimestamp(time_ms / 1000, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_id_json(position: Position, partition_index: int = -1, batch_index: int = -1) -> dict:
    """A message id as Pulsar's admin API writes one (MessageIdImpl's JSON)."""
    doc: dict = {"ledgerId": position.ledger_id, "entryId": position.entry_id, "partitionIndex": partition_index}
    if batch_index >= 0:
        doc["batchIndex"] = batch_index
    return doc


# --- topic stats --------------------------------------------------------------------------

def _mean_entry_size(topic: "PersistentTopic") -> float:
    entries = topic.ledger.number_of_entries()
    return topic.ledger.total_size() / entries if entries > 0 else 0.0


def publisher_stats(topic: "PersistentTopic", producer: "Producer", meter: RateMeter, now_s: float) -> dict:
    rate, throughput = meter.rates(("producer", topic.full_name, id(producer)),
                                   (producer.messages_in, producer.bytes_in), now_s)
    return {
        "producerName": producer.name,
        "producerId": producer.producer_id,
        "accessMode": _ACCESS_MODES.get(producer.access_mode, str(producer.access_mode)),
        "msgRateIn": rate,
        "msgThroughputIn": throughput,
        "averageMsgSize": throughput / rate if rate > 0 else 0.0,
        "address": producer.address,
        "connectedSince": iso_time(producer.connected_at_ms),
        "metadata": dict(producer.metadata),
        "supportsPartialProducer": bool(getattr(producer.connection, "supports_partial_producer", False)),
    }


def consumer_stats(consumer: "Consumer", unacked_messages: int, meter: RateMeter, now_s: float) -> dict:
    rate, throughput = meter.rates(("consumer", id(consumer)), (consumer.messages_out, consumer.bytes_out), now_s)
    return {
        "consumerName": consumer.name,
        "msgRateOut": rate,
        "msgThroughputOut": throughput,
        "msgOutCounter": consumer.messages_out,
        "bytesOutCounter": consumer.bytes_out,
        "availablePermits": consumer.permits,
        "unackedMessages": unacked_messages,
        "address": consumer.address,
        "connectedSince": iso_time(consumer.connected_at_ms),
        "metadata": dict(consumer.metadata),
    }


def subscription_stats(topic: "PersistentTopic", subscription: "Subscription", meter: RateMeter, now_s: float,
                       mean_entry_size: float) -> dict:
    consumers = [consumer_stats(c, subscription.dispatcher.unacked_messages(c), meter, now_s)
                 for c in subscription.consumers]
    backlog = subscription.cursor.backlog_entries(topic.entries_between)
    active = getattr(subscription.dispatcher, "active", None)
    return {
        "msgRateOut": sum(c["msgRateOut"] for c in consumers),
        "msgThroughputOut": sum(c["msgThroughputOut"] for c in consumers),
        "msgOutCounter": subscription.dispatcher.messages_dispatched,
        "msgBacklog": backlog,
        "backlogSize": int(backlog * mean_entry_size),
        "unackedMessages": sum(c["unackedMessages"] for c in consumers),
        "type": subscription.type_name,
        "activeConsumerName": active.name if active is not None else None,
        "isDurable": subscription.cursor.durable,
        "consumers": consumers,
    }


def topic_stats(topic: "PersistentTopic", meter: RateMeter, now_s: float) -> dict:
    """Pulsar's TopicStats for one (non-partitioned or partition) topic."""
    rate_in, throughput_in = meter.rates(("topic", topic.full_name, id(topic)),
                                         (topic.messages_in, topic.bytes_in), now_s)
    mean_entry_size = _mean_entry_size(topic)
    publishers = [publisher_stats(topic, p, meter, now_s) for p in topic.producers.values()]
    subscriptions = {name: subscription_stats(topic, s, meter, now_s, mean_entry_size)
                     for name, s in sorted(topic.subscriptions.items())}
    return {
        "msgRateIn": rate_in,
        "msgThroughputIn": throughput_in,
        "msgRateOut": sum(s["msgRateOut"] for s in subscriptions.values()),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in subscriptions.values()),
        "bytesInCounter": topic.bytes_in,
        "msgInCounter": topic.messages_in,
        "msgOutCounter": sum(s["msgOutCounter"] for s in subscriptions.values()),
        "averageMsgSize": throughput_in / rate_in if rate_in > 0 else 0.0,
        "storageSize": topic.ledger.total_size(),
        "backlogSize": max((s["backlogSize"] for s in subscriptions.values()), default=0),
        "publishers": publishers,
        "subscriptions": subscriptions,
        "replication": {},
    }


def partitioned_stats(partitions: dict[str, dict], partition_count: int, *, per_partition: bool) -> dict:
    """Pulsar's PartitionedTopicStats: the partitions' stats summed (subscriptions
    merged by name; publishers as Pulsar merges them: by producer name where the client
    supports partial producers — one producer, one name on every partition — and
    otherwise position by position, since such clients' per-partition producers have
    names of their own), plus each partition's own when asked."""
    assert partition_count >= len(partitions), (partition_count, len(partitions))
    total: dict = {field: 0 for field in _SUMMED_TOPIC_FIELDS}
    total["backlogSize"] = 0
    by_name: dict[str, dict] = {}
    by_position: list[dict] = []
    subscriptions: dict[str, dict] = {}
    for _partition, stats in sorted(partitions.items(), key=lambda item: TopicName.parse(item[0]).partition_index):
        for field in _SUMMED_TOPIC_FIELDS:
            total[field] += stats[field]
        total["backlogSize"] += stats["backlogSize"]
        position = 0
        for publisher in stats["publishers"]:
            if publisher.get("supportsPartialProducer") and publisher["producerName"]:
                merged = by_name.get(publisher["producerName"])
                if merged is None:
                    by_name[publisher["producerName"]] = dict(publisher)
                    continue
            elif position < len(by_position):
                merged = by_position[position]
                position += 1
            else:
                by_position.append(dict(publisher))
                position += 1
                continue
            for field in _SUMMED_PUBLISHER_FIELDS:
                merged[field] += publisher[field]
        for name, subscription in stats["subscriptions"].items():
            merged = subscriptions.get(name)
            if merged is None:
                subscriptions[name] = {**subscription, "consumers": list(subscription["consumers"])}
            else:
                for field in _SUMMED_SUBSCRIPTION_FIELDS:
                    merged[field] += subscription[field]
                merged["consumers"].extend(subscription["consumers"])
    publishers = [*by_name.values(), *by_position]
    for publisher in publishers:
        rate = publisher["msgRateIn"]
        publisher["averageMsgSize"] = publisher["msgThroughputIn"] / rate if rate > 0 else 0.0
    rate_in = total["msgRateIn"]
    return {
        **total,
        "averageMsgSize": total["msgThroughputIn"] / rate_in if rate_in > 0 else 0.0,
        "publishers": publishers,
        "subscriptions": dict(sorted(subscriptions.items())),
        "replication": {},
        "metadata": {"partitions": partition_count},
        "partitions": dict(sorted(partitions.items())) if per_partition else {},
    }


# --- internal stats -------------------------------------------------------------------------

def _ledger_state(topic: "PersistentTopic") -> str:
    """The managed ledger's state, in Pulsar's words."""
    ledger = topic.ledger
    if ledger.fenced_error is not None:
        return "Fenced"
    if ledger.closed:
        return "Closed"
    if ledger.terminated:
        return "Terminated"
    if ledger.current_ledger_id >= 0:
        return "LedgerOpened"
    return "ClosedLedger"   # between ledgers: the next one is being created


def cursor_stats(topic: "PersistentTopic", subscription: "Subscription") -> dict:
    cursor = subscription.cursor
    acked_count = cursor.individually_acked_count
    return {
        "markDeletePosition": str(cursor.mark_delete_position),
        "readPosition": str(cursor.read_position),
        # The ledger holding the cursor's state (-1 while it is inline in etcd); its
        # last entry is not tracked by the cursor store, so that stays unknown (-1).
        "cursorLedger": topic.cursor_ledger_id(subscription.name),
        "cursorLedgerLastEntry": -1,
        # Pulsar lists the acknowledged ranges here; the cursor exposes their count only.
        "individuallyDeletedMessages": "[]" if acked_count == 0
        else f"[{acked_count} entries acknowledged individually]",
        "individuallyDeletedMessagesCount": acked_count,
        "numberOfEntriesSinceFirstNotAckedMessage":
            topic.entries_between(cursor.mark_delete_position, cursor.read_position),
        "active": bool(subscription.consumers),
        "durable": cursor.durable,
    }


def internal_stats(topic: "PersistentTopic") -> dict:
    """Pulsar's PersistentTopicInternalStats (ManagedLedgerInternalStats plus cursors)."""
    ledger = topic.ledger
    infos = ledger.ledger_infos()
    current_ledger_id = ledger.current_ledger_id
    last = ledger.last_confirmed
    current_entries = last.entry_id + 1 if current_ledger_id >= 0 and last.ledger_id == current_ledger_id else 0
    # total_size counts closed ledgers' recorded sizes plus what was written to the
    # current ledger; the difference is the current ledger's size.
    known_size = sum(info.size_bytes for info in infos if info.known)
    current_size = max(0, ledger.total_size() - known_size) if current_ledger_id >= 0 else 0
    ledgers = []
    for info in infos:
        if info.ledger_id == current_ledger_id:
            entries, size = current_entries, current_size
        else:
            entries, size = info.entries, info.size_bytes   # -1 while not final
        ledgers.append({"ledgerId": info.ledger_id, "entries": entries, "size": size, "offloaded": False})
    stats = {
        "entriesAddedCounter": ledger.entries_added,
        "numberOfEntries": ledger.number_of_entries(),
        "totalSize": ledger.total_size(),
        "currentLedgerEntries": current_entries,
        "currentLedgerSize": current_size,
        "lastLedgerCreatedTimestamp": iso_time(infos[-1].created_ms) if infos and infos[-1].created_ms else None,
        "lastConfirmedEntry": str(last),
        "state": _ledger_state(topic),
        "ledgers": ledgers,
        "cursors": {name: cursor_stats(topic, s) for name, s in sorted(topic.subscriptions.items())},
    }
    assert stats["numberOfEntries"] >= 0
    return stats


def partitioned_internal_stats(partitions: dict[str, dict], partition_count: int) -> dict:
    assert partition_count >= len(partitions)
    return {"metadata": {"partitions": partition_count}, "partitions": dict(sorted(partitions.items()))}
