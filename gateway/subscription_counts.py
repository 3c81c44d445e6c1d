"""What the gateway did per subscription, for /metrics: messages pulled (or pushed),
acknowledged, nacked, leases extended and leases that ended without an ack (ran out,
or a nack came due: the message goes back to its subscription), by (topic, subscription).

The label set is bounded: the first ``subscriptions_max`` subscriptions seen get series
of their own and keep them for the life of the process (counters must not vanish and
come back from zero); later ones are counted together under ``topic="_other",
subscription="_other"``. A partition's counts go to its partitioned topic, the name
clients use. Pure bookkeeping: no IO, no clock.
"""

from __future__ import annotations

from common.topic_name import TopicName

KINDS = ("pulled", "acked", "nacked", "extended", "lease_ended")
OTHER = ("_other", "_other")


def topic_label(topic: str) -> str:
    """The partitioned topic of a partition; any other topic name as it is."""
    try:
        name = TopicName.parse(topic)
    except Exception:   # a name that does not parse was refused earlier: keep it as given
        return topic
    return str(name.partitioned_parent) if name.is_partition else topic


class SubscriptionCounts:
    def __init__(self, subscriptions_max: int) -> None:
        assert subscriptions_max >= 0
        self._subscriptions_max = subscriptions_max
        self._counts: dict[tuple[str, str], list[int]] = {}

    def add(self, topic: str, subscription: str, kind: str, count: int = 1) -> None:
        assert count >= 0
        self._counts_of(topic, subscription)[KINDS.index(kind)] += count

    def label(self, topic: str, subscription: str) -> tuple[str, str]:
        """The (topic, subscription) labels this subscription's series have."""
        key = (topic_label(topic), subscription)
        self._counts_of(topic, subscription)
        return key if key in self._counts else OTHER

    def _counts_of(self, topic: str, subscription: str) -> list[int]:
        key = (topic_label(topic), subscription)
        counts = self._counts.get(key)
        if counts is None:
            if len(self._counts) >= self._subscriptions_max + (OTHER in self._counts):
                key = OTHER
            counts = self._counts.setdefault(key, [0] * len(KINDS))
        return counts

    def items(self) -> list[tuple[tuple[str, str], list[int]]]:
        return sorted(self._counts.items())

    def __len__(self) -> int:
        return len(self._counts)
