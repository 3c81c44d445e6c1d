"""Where a publish spends its time, from the servers' own Prometheus histograms.

A benchmark scrapes every server's /metrics before and after a workload; the
difference of each stage histogram (bucket counts, sum, count) covers exactly the
samples of that workload. Reported per stage: samples, mean and the p50 / p99 read
from the buckets (linear inside a bucket, as Prometheus' histogram_quantile does).
The means of consecutive stages add up to the path; percentiles of stages do not.

``STAGES`` lists the stages in path order: (key, metric name, what it covers). A stage
whose metric no server exports is left out, so the report works against an older build.
Parsing and arithmetic are pure; ``scrape_all`` is the only IO.
"""

from __future__ import annotations

import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 5.0

STAGES: list[tuple[str, str, str]] = [
    ("broker_send_decode", "magnetar_broker_send_decode_seconds",
     "broker: a SEND's bytes read until its entry is appended to the managed ledger"),
    ("broker_ledger_queue", "magnetar_broker_managed_ledger_queue_seconds",
     "broker: an append waiting for a ledger (rollover) before it is submitted"),
    ("broker_ledger_add", "magnetar_broker_ledger_add_seconds",
     "broker: an entry submitted to its ledger until the ack quorum confirmed it (in order)"),
    ("broker_bookie_send_wait", "magnetar_broker_bookie_add_send_wait_seconds",
     "broker: an add queued for a bookie until its add-stream message is written"),
    ("broker_bookie_round_trip", "magnetar_broker_bookie_add_round_trip_seconds",
     "broker: an add-stream message written until the bookie's reply is read"),
    ("bookie_add", "magnetar_bookie_add_batch_latency_seconds",
     "bookie: an add batch's arrival until its reply is handed to gRPC (journal included)"),
    ("bookie_journal_queue_wait", "magnetar_bookie_journal_queue_wait_seconds",
     "bookie: an add waiting in the journal queue until its group's write began"),
    ("bookie_journal_round", "magnetar_bookie_journal_round_latency_seconds",
     "bookie: a journal group handed to the IO thread until the loop has the result"),
    ("bookie_journal_write", "magnetar_bookie_journal_write_latency_seconds",
     "bookie: a journal group's write(2)"),
    ("bookie_journal_fdatasync", "magnetar_bookie_journal_fdatasync_latency_seconds",
     "bookie: a journal group's fdatasync(2)"),
    ("bookie_ack_back", "magnetar_bookie_add_reply_latency_seconds",
     "bookie: a batch's fdatasync done until its reply is written"),
    ("broker_publish", "magnetar_broker_publish_latency_seconds",
     "broker: a SEND handled until its receipt is written (storage included)"),
    ("broker_dispatch", "magnetar_broker_dispatch_seconds",
     "broker: the newest confirmed entry until written to a tailing consumer"),
]

# Not stages of the path but what can stall any of them: each process's cyclic garbage
# collections over the workload (all generations; ``samples`` is how many there were).
PAUSES: list[tuple[str, str, str]] = [
    ("broker_gc_pause", "magnetar_broker_gc_pause_seconds",
     "broker: a cyclic garbage collection (any generation) held the process"),
    ("bookie_gc_pause", "magnetar_bookie_gc_pause_seconds",
     "bookies: a cyclic garbage collection (any generation) held the process"),
]


def parse_histograms(text: str) -> dict[str, dict]:
    """{metric: {"buckets": [(upper, cumulative)], "sum": s, "count": n}} for every
    histogram in a scrape (labels, if any, are added up)."""
    found: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        entry = found.setdefault(family.name, {"buckets": {}, "sum": 0.0, "count": 0.0})
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                entry["buckets"][bound] = entry["buckets"].get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                entry["sum"] += sample.value
            elif sample.name.endswith("_count"):
                entry["count"] += sample.value
    return {name: {"buckets": sorted(e["buckets"].items()), "sum": e["sum"], "count": e["count"]}
            for name, e in found.items()}


def merge(scrapes: list[dict[str, dict]]) -> dict[str, dict]:
    """Several servers' histograms of one name as one (e.g. every bookie's)."""
    merged: dict[str, dict] = {}
    for histograms in scrapes:
        for name, histogram in histograms.items():
            if name not in merged:
                merged[name] = {"buckets": list(histogram["buckets"]), "sum": histogram["sum"],
                                "count": histogram["count"]}
                continue
            target = merged[name]
            bounds = dict(target["buckets"])
            for bound, value in histogram["buckets"]:
                bounds[bound] = bounds.get(bound, 0.0) + value
            target["buckets"] = sorted(bounds.items())
            target["sum"] += histogram["sum"]
            target["count"] += histogram["count"]
    return merged


def difference(after: dict, before: dict | None) -> dict:
    if before is None:
        return after
    previous = dict(before["buckets"])
    return {"buckets": [(bound, value - previous.get(bound, 0.0)) for bound, value in after["buckets"]],
            "sum": after["sum"] - before["sum"], "count": after["count"] - before["count"]}


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile from cumulative buckets (upper bound, count), linear inside a bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def breakdown(before: dict[str, dict], after: dict[str, dict]) -> dict:
    """Per stage (STAGES order, then the derived ones, then PAUSES) over the span
    between two ``scrape_all`` results."""
    result = _summaries(STAGES, before, after)
    result.update(derived(result))
    result.update(_summaries(PAUSES, before, after))
    return result


def _summaries(histograms: list[tuple[str, str, str]], before: dict[str, dict], after: dict[str, dict]) -> dict:
    """Samples, mean, p50 and p99 (ms) of each histogram with samples in the span."""
    def ms(value: float | None) -> float | None:
        return round(value * 1000, 3) if value is not None else None

    result = {}
    for key, metric, meaning in histograms:
        if metric not in after:
            continue
        delta = difference(after[metric], before.get(metric))
        count = delta["count"]
        if count <= 0:
            continue
        result[key] = {"samples": int(count), "mean_ms": ms(delta["sum"] / count),
                       "p50_ms": ms(quantile(0.5, delta["buckets"])), "p99_ms": ms(quantile(0.99, delta["buckets"])),
                       "what": meaning}
    return result


def derived(stages: dict) -> dict:
    """Stages no one histogram covers, as differences of means (approximate: the two
    histograms may weigh their samples differently, per entry or per batch)."""
    found = {}

    def mean(key: str) -> float | None:
        return stages[key]["mean_ms"] if key in stages else None

    round_trip, bookie_add = mean("broker_bookie_round_trip"), mean("bookie_add")
    if round_trip is not None and bookie_add is not None:
        found["grpc_transport"] = {"mean_ms": round(round_trip - bookie_add, 3),
                                   "what": "derived: broker_bookie_round_trip - bookie_add (gRPC both ways)"}
    publish, ledger_add = mean("broker_publish"), mean("broker_ledger_add")
    if publish is not None and ledger_add is not None:
        queue = mean("broker_ledger_queue") or 0.0
        found["broker_receipt_back"] = {
            "mean_ms": round(publish - ledger_add - queue, 3),
            "what": "derived: broker_publish - broker_ledger_queue - broker_ledger_add (ordering, receipt)"}
    return found


def scrape_all(urls: list[str]) -> dict[str, dict]:
    """Every server's histograms, merged by name (an unreachable server counts as none)."""
    scrapes = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                scrapes.append(parse_histograms(response.read().decode()))
        except OSError:
            continue
    return merge(scrapes)
