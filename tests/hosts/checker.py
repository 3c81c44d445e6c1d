"""Validation, Jepsen-style: reads only what was recorded — the clients' histories
(tests/hosts/workload.py), the nemesis's fault log and the brokers' own log lines of
when they served which bundle — and says what went wrong. Pure functions over those
records, no servers asked.

Checks:
- every acknowledged send (a receipt) reaches every subscription (lost = receipts that
  a subscription never delivered); duplicates are counted (at-least-once delivery
  allows them in every mode after a consumer or broker moves; they are reported, and
  a redelivery of the same message id is told apart from a second copy stored);
- receipts of one producer name strictly increasing message ids in send order;
- per producer, messages first delivered in send order where the mode promises it
  (failover: the whole producer's stream; key-shared: per key; shared: no promise);
- never two writers: per bundle, no two brokers' serving intervals overlap
  ("bundle serving started/stopped" lines with wall-clock times), and a ledger fenced
  and recovered by a new owner ends at or after its last acknowledged entry;
- figures per fault: the longest gap between receipts (publish stall) and between
  deliveries (consumers' stall) that overlaps the fault's window.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field

ORDERED_MODES = {"failover": "producer", "key_shared": "key"}
# "stopped" carries when the bundle's topics began closing (producers told, nothing
# accepted after); acknowledgements of appends accepted before may come later, which
# check_recovered_ledgers covers (the next owner's recovery keeps them).
_SERVING = re.compile(r"bundle serving (started|stopped): bundle=(\S+) broker_id=(\S+)(?: reason=.*?)? wall_time=([0-9.]+)")


def read_history(path: str) -> list[dict]:
    events = []
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if line:
                events.append(json.loads(line))
    return events


@dataclass
class Verdict:
    acknowledged: int = 0
    failed_sends: int = 0
    lost: dict[str, list[str]] = field(default_factory=dict)          # subscription -> payload ids
    duplicates: dict[str, int] = field(default_factory=dict)          # subscription -> count
    stored_twice: dict[str, int] = field(default_factory=dict)        # subscription -> count
    order_violations: list[str] = field(default_factory=list)
    receipt_order_violations: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    two_writers: list[str] = field(default_factory=list)
    recovery_short: list[str] = field(default_factory=list)   # a recovered ledger missing an acked entry

    @property
    def lost_count(self) -> int:
        return sum(len(items) for items in self.lost.values())

    @property
    def ok(self) -> bool:
        return not (self.lost_count or self.order_violations or self.receipt_order_violations or self.unexpected
                    or self.two_writers or self.recovery_short)

    def summary(self) -> dict:
        return {"acknowledged": self.acknowledged, "failed_sends": self.failed_sends, "lost": self.lost_count,
                "lost_examples": {sub: items[:5] for sub, items in self.lost.items() if items},
                "duplicates": self.duplicates, "stored_twice": self.stored_twice,
                "order_violations": len(self.order_violations), "order_examples": self.order_violations[:5],
                "receipt_order_violations": len(self.receipt_order_violations),
                "unexpected": len(self.unexpected), "two_writers": self.two_writers[:10],
                "recovery_short": self.recovery_short[:10]}


def check_histories(produced: list[dict], consumed: list[dict]) -> Verdict:
    verdict = Verdict()
    acked: dict[tuple[str, int], dict] = {}
    invoked: set[tuple[str, int]] = set()
    for event in produced:
        if event.get("f") != "send":
            continue
        ident = (event["producer"], event["seq"])
        if event["type"] == "invoke":
            invoked.add(ident)
        elif event["type"] == "ok":
            acked[ident] = event
        elif event["type"] == "fail":
            verdict.failed_sends += 1
    verdict.acknowledged = len(acked)
    # Receipts: a producer's acknowledged message ids increase with its sequence.
    by_producer: dict[str, list[dict]] = defaultdict(list)
    for ident, event in acked.items():
        by_producer[ident[0]].append(event)
    for producer, events in by_producer.items():
        events.sort(key=lambda e: e["seq"])
        for before, after in zip(events, events[1:]):
            if (after["ledger"], after["entry"]) <= (before["ledger"], before["entry"]):
                verdict.receipt_order_violations.append(
                    f"{producer}: seq {after['seq']} at {after['ledger']}:{after['entry']} not after seq "
                    f"{before['seq']} at {before['ledger']}:{before['entry']}")
    # Deliveries per subscription.
    receives: dict[str, list[dict]] = defaultdict(list)
    for event in consumed:
        if event["type"] == "receive":
            receives[event["subscription"]].append(event)
    # Every subscription the consumers opened (their "ready" event names them), also one
    # that never delivered anything.
    modes: dict[str, str] = {}
    for event in consumed:
        if event["type"] == "ready":
            modes.update(event.get("subscriptions", {}))
        elif event["type"] == "receive":
            modes.setdefault(event["subscription"], event["mode"])
    topic_of_producer = {producer: producer.removeprefix("p") for producer in by_producer}
    for subscription in sorted(modes):
        events = sorted(receives[subscription], key=lambda e: e["t"])
        topic = subscription.rsplit("-t", 1)[1]
        first: dict[tuple[str, int], dict] = {}
        duplicates = stored_twice = 0
        for event in events:
            ident = (event["producer"], event["seq"])
            if ident not in invoked:
                verdict.unexpected.append(f"{subscription}: {ident} was never sent")
                continue
            if ident in first:
                duplicates += 1
                if (first[ident]["ledger"], first[ident]["entry"]) != (event["ledger"], event["entry"]):
                    stored_twice += 1
                continue
            first[ident] = event
        verdict.duplicates[subscription] = duplicates
        verdict.stored_twice[subscription] = stored_twice
        wanted = [ident for ident in acked if topic_of_producer.get(ident[0]) == topic]
        lost = sorted(f"{p}|{s}" for p, s in wanted if (p, s) not in first)
        verdict.lost[subscription] = lost
        mode = modes[subscription]
        scope = ORDERED_MODES.get(mode)
        if scope is None:
            continue
        # First deliveries of acknowledged messages, in delivery order, per scope.
        last_seq: dict[tuple, int] = {}
        for event in sorted(first.values(), key=lambda e: e["t"]):
            ident = (event["producer"], event["seq"])
            if ident not in acked:
                continue
            group = (event["producer"],) if scope == "producer" else (event["producer"], event["key"])
            if group in last_seq and event["seq"] < last_seq[group]:
                verdict.order_violations.append(
                    f"{subscription} ({mode}): {event['producer']} seq {event['seq']} after {last_seq[group]}")
            last_seq[group] = max(event["seq"], last_seq.get(group, -1))
    return verdict


_LISTENING = re.compile(r"broker listening: ")


def serving_intervals(broker_logs: dict[str, str], deaths: dict[str, list[float]] | None = None
                      ) -> dict[str, list[tuple[float, float, str]]]:
    """bundle -> [(start, end, broker)]. A broker's log holds one life per start
    ("broker listening"); an interval still open when a life ends by kill -9 ends at
    that kill (``deaths``: each broker's kill times, in order, from the fault log); one
    still open at the end of the log ends at +inf."""
    deaths = deaths or {}
    intervals: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for broker, text in broker_logs.items():
        starts = [match.start() for match in _LISTENING.finditer(text)]
        lives = [text[begin:end] for begin, end in zip([0] + starts[1:], starts[1:] + [len(text)])]
        kill_times = list(deaths.get(broker, []))
        for index, life in enumerate(lives):
            open_since: dict[str, float] = {}
            for match in _SERVING.finditer(life):
                what, bundle, broker_id = match.group(1), match.group(2), match.group(3)
                wall_time = float(match.group(4))
                if what == "started":
                    open_since.setdefault(bundle, wall_time)
                elif bundle in open_since:
                    intervals[bundle].append((open_since.pop(bundle), wall_time, broker_id))
            last_life = index == len(lives) - 1
            end = float("inf") if last_life or index >= len(kill_times) else kill_times[index]
            for bundle, start in open_since.items():
                intervals[bundle].append((start, end, broker))
    return intervals


def check_single_writer(broker_logs: dict[str, str], deaths: dict[str, list[float]] | None = None) -> list[str]:
    """Overlaps of two brokers' serving intervals of one bundle."""
    overlaps = []
    for bundle, spans in serving_intervals(broker_logs, deaths).items():
        spans.sort()
        for index, (start, end, broker) in enumerate(spans):
            for other_start, other_end, other in spans[index + 1:]:
                if other_start >= end:
                    break
                if other != broker:
                    overlaps.append(f"{bundle}: {broker} [{start:.3f}, {end:.3f}] and {other} "
                                    f"[{other_start:.3f}, {other_end:.3f}]")
    return overlaps


def broker_deaths(faults: list[dict]) -> dict[str, list[float]]:
    """Each broker's kill -9 times, in order, from the nemesis's log."""
    deaths: dict[str, list[float]] = defaultdict(list)
    for fault in sorted(faults, key=lambda f: f["start"]):
        if fault["kind"] == "kill-broker":
            deaths[fault["target"]].append(fault["start"])
    return deaths


_RECOVERED = re.compile(r"ledger recovered: ledger_id=(\d+) last_entry_id=(-?\d+)")


def check_recovered_ledgers(produced: list[dict], server_logs: dict[str, str]) -> list[str]:
    """A ledger recovered (fenced and closed by a new owner, or by auto-recovery) ends
    at or after the last entry acknowledged in it: recovery may keep entries whose
    receipt never reached the client (indeterminate sends), never drop an
    acknowledged one."""
    acked_last: dict[int, int] = {}
    for event in produced:
        if event.get("type") == "ok":
            acked_last[event["ledger"]] = max(event["entry"], acked_last.get(event["ledger"], -1))
    problems = []
    for server, text in server_logs.items():
        for match in _RECOVERED.finditer(text):
            ledger_id, last_entry_id = int(match.group(1)), int(match.group(2))
            if ledger_id in acked_last and last_entry_id < acked_last[ledger_id]:
                problems.append(f"{server} recovered ledger {ledger_id} to entry {last_entry_id}, but entry "
                                f"{acked_last[ledger_id]} was acknowledged")
    return problems


def longest_gap(times: list[float], window_start: float, window_end: float) -> float:
    """The longest wait, from the window's start on, between consecutive ``times``
    (sorted) that overlaps [window_start, window_end]: a gap already under way when
    the window opens counts from its start (what came before is an earlier fault's)."""
    longest = 0.0
    previous = None
    for t in times:
        if previous is not None and t >= window_start and previous <= window_end:
            longest = max(longest, t - max(previous, window_start))
        previous = t
    return longest


def fault_figures(faults: list[dict], produced: list[dict], consumed: list[dict],
                  settle_s: float = 2.0) -> list[dict]:
    """Per fault: the longest publish stall (receipts of any one producer) and the
    longest delivery stall (any one subscription) overlapping its window."""
    acks: dict[str, list[float]] = defaultdict(list)
    for event in produced:
        if event.get("type") == "ok":
            acks[event["producer"]].append(event["t"])
    deliveries: dict[str, list[float]] = defaultdict(list)
    for event in consumed:
        if event.get("type") == "receive":
            deliveries[event["subscription"]].append(event["t"])
    for times in list(acks.values()) + list(deliveries.values()):
        times.sort()
    figures = []
    for fault in faults:
        start, end = fault["start"], fault["end"] + settle_s
        figures.append({
            "kind": fault["kind"], "target": fault.get("target", ""), "start": start,
            "duration_s": round(fault["end"] - fault["start"], 3),
            "publish_stall_s": round(max((longest_gap(t, start, end) for t in acks.values()), default=0.0), 3),
            "consume_stall_s": round(max((longest_gap(t, start, end) for t in deliveries.values()), default=0.0), 3),
        })
    return figures


def per_kind(figures: list[dict]) -> dict[str, dict]:
    kinds: dict[str, dict] = {}
    for figure in figures:
        entry = kinds.setdefault(figure["kind"], {"count": 0, "publish_stall_s_max": 0.0, "consume_stall_s_max": 0.0,
                                                  "publish_stall_s_sum": 0.0})
        entry["count"] += 1
        entry["publish_stall_s_max"] = max(entry["publish_stall_s_max"], figure["publish_stall_s"])
        entry["consume_stall_s_max"] = max(entry["consume_stall_s_max"], figure["consume_stall_s"])
        entry["publish_stall_s_sum"] += figure["publish_stall_s"]
    for entry in kinds.values():
        entry["publish_stall_s_mean"] = round(entry.pop("publish_stall_s_sum") / entry["count"], 3)
    return kinds
