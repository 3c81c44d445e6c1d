"""A partitioned topic's stats from its partitions' (broker/stats.py partitioned_stats).

What it proves: the topic-level counters and rates are the sums over the partitions;
subscriptions are merged by name (their counters summed, their consumers concatenated
in partition-index order); publishers are merged the way Pulsar merges them: by
producer name when the client supports partial producers (one producer, one name on
every partition), otherwise position by position across the partitions taken in
partition-index order (2 before 10, whatever the dict order); every averageMsgSize is
recomputed from the merged throughput and rate (0 when nothing flows); the
per-partition detail is present only when asked; and the partitions' own stats are
never modified.

How: hand-built partition stats in the shape topic_stats returns, with distinct
numbers per partition so any wrong sum or pairing shows.
"""

from __future__ import annotations

import copy

import pytest

from broker.stats import partitioned_stats

TOPIC = "persistent://public/default/t"


def _publisher(name: str, rate: float, throughput: float, *, partial: bool = False, producer_id: int = 0) -> dict:
    return {"producerName": name, "producerId": producer_id, "accessMode": "Shared", "msgRateIn": rate,
            "msgThroughputIn": throughput, "averageMsgSize": throughput / rate if rate else 0.0,
            "address": "/127.0.0.1:5000", "connectedSince": "2026-01-01T00:00:00.000Z", "metadata": {},
            "supportsPartialProducer": partial}


def _subscription(backlog: int, rate_out: float, out: int, unacked: int, consumers: list[str],
                  sub_type: str = "Shared") -> dict:
    return {"msgRateOut": rate_out, "msgThroughputOut": rate_out * 100, "msgOutCounter": out, "msgBacklog": backlog,
            "backlogSize": backlog * 100, "unackedMessages": unacked, "type": sub_type, "activeConsumerName": None,
            "isDurable": True, "consumers": [{"consumerName": c} for c in consumers]}


def _partition(index: int, *, publishers: list[dict] | None = None, subscriptions: dict | None = None) -> dict:
    """Distinct numbers per partition: base = index + 1."""
    base = index + 1
    publishers = publishers if publishers is not None else []
    rate_in = sum(p["msgRateIn"] for p in publishers)
    throughput_in = sum(p["msgThroughputIn"] for p in publishers)
    subscriptions = subscriptions if subscriptions is not None else {}
    return {
        "msgRateIn": rate_in, "msgThroughputIn": throughput_in,
        "msgRateOut": sum(s["msgRateOut"] for s in subscriptions.values()),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in subscriptions.values()),
        "bytesInCounter": 1000 * base, "msgInCounter": 10 * base,
        "msgOutCounter": sum(s["msgOutCounter"] for s in subscriptions.values()),
        "averageMsgSize": throughput_in / rate_in if rate_in else 0.0,
        "storageSize": 5000 * base,
        "backlogSize": max((s["backlogSize"] for s in subscriptions.values()), default=0),
        "publishers": publishers, "subscriptions": subscriptions, "replication": {},
    }


def _name(index: int) -> str:
    return f"{TOPIC}-partition-{index}"


def test_topic_counters_and_rates_are_summed():
    """Every summed field is the exact sum; averageMsgSize is total throughput over
    total rate, not a mean of the partitions' averages."""
    partitions = {
        _name(0): _partition(0, publishers=[_publisher("a", 10.0, 1000.0)]),
        _name(1): _partition(1, publishers=[_publisher("b", 30.0, 9000.0)],
                             subscriptions={"s": _subscription(3, 2.0, 7, 1, ["c1"])}),
        _name(2): _partition(2, subscriptions={"s": _subscription(4, 5.0, 11, 2, ["c2"])}),
    }
    total = partitioned_stats(partitions, 3, per_partition=False)
    for field in ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "bytesInCounter",
                  "msgInCounter", "msgOutCounter", "storageSize"):
        assert total[field] == sum(p[field] for p in partitions.values()), field
    assert (total["bytesInCounter"], total["msgInCounter"], total["storageSize"]) == (6000, 60, 30000)
    assert (total["msgRateIn"], total["msgThroughputIn"]) == (40.0, 10000.0)
    assert (total["msgRateOut"], total["msgOutCounter"]) == (7.0, 18)
    assert total["averageMsgSize"] == 250.0          # 10000 / 40; the partitions' mean would be 200
    assert total["metadata"] == {"partitions": 3}
    assert total["replication"] == {}


def test_no_traffic_gives_zero_average_and_empty_lists():
    """No rate means averageMsgSize 0 (no division by zero); no partitions loaded is valid."""
    total = partitioned_stats({_name(0): _partition(0)}, 4, per_partition=False)
    assert total["averageMsgSize"] == 0.0
    assert total["publishers"] == [] and total["subscriptions"] == {}
    assert total["metadata"] == {"partitions": 4}
    empty = partitioned_stats({}, 2, per_partition=True)
    assert empty["msgInCounter"] == 0 and empty["publishers"] == [] and empty["partitions"] == {}


def test_subscriptions_merge_by_name_with_consumers_in_partition_order():
    """Same-named subscriptions add up; a subscription on one partition only is kept as
    it is; consumers are listed partition 2's before partition 10's."""
    partitions = {
        _name(10): _partition(10, subscriptions={"s": _subscription(5, 1.0, 100, 3, ["c10"]),
                                                 "only-10": _subscription(1, 0.5, 1, 0, ["x"], "Exclusive")}),
        _name(2): _partition(2, subscriptions={"s": _subscription(7, 2.0, 200, 4, ["c2a", "c2b"])}),
    }
    total = partitioned_stats(partitions, 11, per_partition=False)
    assert list(total["subscriptions"]) == ["only-10", "s"]        # sorted by name
    merged = total["subscriptions"]["s"]
    assert (merged["msgBacklog"], merged["backlogSize"], merged["unackedMessages"]) == (12, 1200, 7)
    assert (merged["msgRateOut"], merged["msgThroughputOut"], merged["msgOutCounter"]) == (3.0, 300.0, 300)
    assert [c["consumerName"] for c in merged["consumers"]] == ["c2a", "c2b", "c10"]
    assert merged["type"] == "Shared"
    assert total["subscriptions"]["only-10"] == partitions[_name(10)]["subscriptions"]["only-10"]


def test_partial_producers_merge_by_name():
    """A client that supports partial producers uses one name on every partition: those
    entries become one publisher whose rates are the sums, wherever they stand in each
    partition's list."""
    partitions = {
        _name(0): _partition(0, publishers=[_publisher("p-a", 1.0, 100.0, partial=True),
                                            _publisher("p-b", 2.0, 400.0, partial=True)]),
        _name(1): _partition(1, publishers=[_publisher("p-b", 6.0, 800.0, partial=True),
                                            _publisher("p-a", 3.0, 200.0, partial=True)]),
        _name(2): _partition(2, publishers=[_publisher("p-a", 4.0, 700.0, partial=True)]),
    }
    total = partitioned_stats(partitions, 3, per_partition=False)
    by_name = {p["producerName"]: p for p in total["publishers"]}
    assert len(total["publishers"]) == 2
    assert (by_name["p-a"]["msgRateIn"], by_name["p-a"]["msgThroughputIn"]) == (8.0, 1000.0)
    assert (by_name["p-b"]["msgRateIn"], by_name["p-b"]["msgThroughputIn"]) == (8.0, 1200.0)
    assert by_name["p-a"]["averageMsgSize"] == 125.0
    assert by_name["p-b"]["averageMsgSize"] == 150.0


def test_other_producers_merge_position_by_position():
    """Without partial-producer support each partition's producer has its own name, so
    Pulsar pairs them by position: the i-th publisher of every partition makes the i-th
    merged one. A partition with more publishers adds entries at the end."""
    partitions = {
        _name(0): _partition(0, publishers=[_publisher("x-0", 1.0, 10.0), _publisher("y-0", 2.0, 40.0)]),
        _name(1): _partition(1, publishers=[_publisher("x-1", 3.0, 30.0), _publisher("y-1", 4.0, 80.0),
                                            _publisher("z-1", 5.0, 500.0)]),
        _name(2): _partition(2, publishers=[_publisher("x-2", 6.0, 60.0)]),
    }
    total = partitioned_stats(partitions, 3, per_partition=False)
    rates = [(p["msgRateIn"], p["msgThroughputIn"], p["averageMsgSize"]) for p in total["publishers"]]
    assert rates == [(10.0, 100.0, 10.0), (6.0, 120.0, 20.0), (5.0, 500.0, 100.0)]
    # The identity fields are the first partition's (in index order).
    assert [p["producerName"] for p in total["publishers"]] == ["x-0", "y-0", "z-1"]


def test_positions_follow_partition_index_not_dict_or_text_order():
    """Partitions 10 and 2, listed 10 first: index order takes partition 2's publishers
    as the first of each pair (text order would put "-partition-10" first too)."""
    partitions = {
        _name(10): _partition(10, publishers=[_publisher("from-10", 1.0, 10.0)]),
        _name(2): _partition(2, publishers=[_publisher("from-2", 2.0, 20.0), _publisher("extra-2", 1.0, 5.0)]),
    }
    total = partitioned_stats(partitions, 11, per_partition=False)
    assert [p["producerName"] for p in total["publishers"]] == ["from-2", "extra-2"]
    assert [p["msgRateIn"] for p in total["publishers"]] == [3.0, 1.0]


def test_mixed_partial_and_positional_producers():
    """Partial producers do not take up positions: the positional pairing counts only
    the other publishers of each partition. A partial producer with an empty name
    cannot be matched by name and is paired by position."""
    partitions = {
        _name(0): _partition(0, publishers=[_publisher("shared", 1.0, 10.0, partial=True),
                                            _publisher("a0", 2.0, 20.0)]),
        _name(1): _partition(1, publishers=[_publisher("a1", 3.0, 30.0),
                                            _publisher("shared", 4.0, 40.0, partial=True)]),
        _name(2): _partition(2, publishers=[_publisher("", 5.0, 50.0, partial=True)]),
    }
    total = partitioned_stats(partitions, 3, per_partition=False)
    assert len(total["publishers"]) == 2
    by_name = {p["producerName"]: p for p in total["publishers"]}
    assert (by_name["shared"]["msgRateIn"], by_name["shared"]["msgThroughputIn"]) == (5.0, 50.0)
    assert (by_name["a0"]["msgRateIn"], by_name["a0"]["msgThroughputIn"]) == (10.0, 100.0)   # a0 + a1 + ""
    assert by_name["a0"]["averageMsgSize"] == 10.0


def test_zero_rate_publisher_average_is_zero():
    """A merged publisher with no traffic has averageMsgSize 0."""
    partitions = {_name(0): _partition(0, publishers=[_publisher("idle", 0.0, 0.0, partial=True)]),
                  _name(1): _partition(1, publishers=[_publisher("idle", 0.0, 0.0, partial=True)])}
    (publisher,) = partitioned_stats(partitions, 2, per_partition=False)["publishers"]
    assert publisher["averageMsgSize"] == 0.0


@pytest.mark.parametrize("per_partition", [True, False])
def test_per_partition_flag(per_partition: bool):
    """perPartition=true returns every partition's own stats; false returns an empty map."""
    partitions = {_name(1): _partition(1, publishers=[_publisher("a", 1.0, 2.0)]),
                  _name(0): _partition(0, publishers=[_publisher("b", 3.0, 4.0)])}
    total = partitioned_stats(partitions, 2, per_partition=per_partition)
    if per_partition:
        assert total["partitions"] == partitions
        assert set(total["partitions"]) == {_name(0), _name(1)}
    else:
        assert total["partitions"] == {}


def test_the_partitions_own_stats_are_not_modified():
    """Merging works on copies: the per-partition detail returned alongside (and the
    caller's dicts) keep their own numbers and consumer lists."""
    partitions = {
        _name(0): _partition(0, publishers=[_publisher("p", 1.0, 10.0, partial=True), _publisher("q", 1.0, 1.0)],
                             subscriptions={"s": _subscription(1, 1.0, 1, 1, ["c0"])}),
        _name(1): _partition(1, publishers=[_publisher("p", 2.0, 20.0, partial=True), _publisher("r", 3.0, 3.0)],
                             subscriptions={"s": _subscription(2, 2.0, 2, 2, ["c1"])}),
    }
    before = copy.deepcopy(partitions)
    total = partitioned_stats(partitions, 2, per_partition=True)
    assert partitions == before
    assert total["partitions"] == before
    # Two calls on the same input agree (nothing accumulated into the input).
    assert partitioned_stats(partitions, 2, per_partition=True) == total


def test_more_partitions_than_declared_is_a_programming_error():
    """More partition stats than the declared count trips the assertion."""
    with pytest.raises(AssertionError):
        partitioned_stats({_name(0): _partition(0), _name(1): _partition(1)}, 1, per_partition=False)


def test_two_partitions_as_the_admin_api_returns_them():
    """Moved from the admin REST integration suite, where it needed no cluster. Two
    partitions of one producer and one subscription: the topic's counters, storage and
    backlog sizes are summed (backlogSize too, which the tests above do not sum), the
    publisher comes out as exactly its name, summed rates and recomputed average, the
    subscription's backlog is summed and its consumers listed in partition order."""
    def partition(rate: float, count: int, backlog: int) -> dict:
        return {"msgRateIn": rate, "msgThroughputIn": rate * 10, "msgRateOut": 0.0, "msgThroughputOut": 0.0,
                "bytesInCounter": count * 10, "msgInCounter": count, "msgOutCounter": 0, "storageSize": count * 20,
                "backlogSize": backlog * 20, "averageMsgSize": 10.0,
                "publishers": [{"producerName": "p", "msgRateIn": rate, "msgThroughputIn": rate * 10}],
                "subscriptions": {"s": {"msgRateOut": 0.0, "msgThroughputOut": 0.0, "msgOutCounter": 0,
                                        "msgBacklog": backlog, "backlogSize": backlog * 20, "unackedMessages": 0,
                                        "type": "Exclusive", "consumers": [{"consumerName": f"c{count}"}]}}}

    total = partitioned_stats({"t-partition-0": partition(2.0, 5, 1), "t-partition-1": partition(4.0, 7, 3)}, 3,
                              per_partition=False)
    assert (total["msgRateIn"], total["msgInCounter"], total["storageSize"]) == (6.0, 12, 240)
    assert total["averageMsgSize"] == 10.0 and total["backlogSize"] == 80
    assert total["publishers"] == [{"producerName": "p", "msgRateIn": 6.0, "msgThroughputIn": 60.0,
                                    "averageMsgSize": 10.0}]
    assert total["subscriptions"]["s"]["msgBacklog"] == 4
    assert [c["consumerName"] for c in total["subscriptions"]["s"]["consumers"]] == ["c5", "c7"]
    assert total["metadata"] == {"partitions": 3} and total["partitions"] == {}
