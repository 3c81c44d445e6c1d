"""Where bundles should live: the leader's placement and shedding policy. Pure.

A broker's load score adds two shares, each in [0, 1] across the cluster: its share of
the bundles and its share of the message traffic (in + out). CPU use is reported but
left out of decisions: brokers sharing a machine see each other's CPU, and that noise
once made bundles swap back and forth. New and orphaned bundles go to the broker with
the lowest score (CPU breaks ties). Shedding moves one bundle at a time from the
highest-scored broker to the lowest, only when their scores differ by more than
``threshold`` and the move narrows the difference by at least ``IMPROVEMENT_MIN`` (so
2-1-1 bundles on three equal brokers stays put instead of oscillating: a move would
only swap 2-1 for 1-2). Recently moved bundles cool down.

Reports lag the moves: a report measures the interval before it was written, and a
moved bundle's traffic shows at its new broker only once the clients have reconnected.
Planned on raw reports, the leader would go on shedding from a broker whose report
still carries traffic that already left (and then shed it all back from the broker
that received too much). So the leader plans on reports corrected by its own moves
that have not settled yet (``with_moves``): a move's traffic, as its source last
reported it, is taken off the source and put on the target until both have reported
an interval that began after the move had time to complete (``settled``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from bundles.records import LoadReport

WEIGHT_BUNDLES = 1.0
WEIGHT_TRAFFIC = 1.0
# A move must narrow the score difference by at least this much (5% of the cluster's
# load): swapping equal loads never qualifies.
IMPROVEMENT_MIN = 0.05


@dataclass(frozen=True)
class Move:
    bundle: str          # "tenant/ns/range"
    source: str
    target: str
    reason: str


@dataclass(frozen=True)
class PendingMove:
    """A move the leader ordered, whose effect the brokers' reports may not show yet."""
    bundle: str
    source: str
    target: str
    rate: float          # the bundle's msgs/s (in + out) when the move was ordered
    ordered_ms: int      # wall clock of the leader


def settled(move: PendingMove, reports: dict[str, LoadReport], interval_ms: int, settle_ms: int) -> bool:
    """True once each end still reporting has written a report whose interval began at
    least ``settle_ms`` after the move was ordered (a broker gone reports nothing)."""
    for broker in (move.source, move.target):
        report = reports.get(broker)
        if report is not None and report.reported_ms - interval_ms < move.ordered_ms + settle_ms:
            return False
    return True


def _with_traffic(report: LoadReport, delta: float, bundle: str, bundle_rate: float | None) -> LoadReport:
    """``report`` with ``delta`` msgs/s added (never below zero) and ``bundle``'s own
    rate set to ``bundle_rate`` (None: removed)."""
    rate_in = report.msg_rate_in + delta
    rate_out = report.msg_rate_out
    if rate_in < 0:
        rate_out = max(rate_out + rate_in, 0.0)
        rate_in = 0.0
    rates = dict(report.bundle_msg_rates)
    if bundle_rate is None:
        rates.pop(bundle, None)
    else:
        rates[bundle] = bundle_rate
    return replace(report, msg_rate_in=rate_in, msg_rate_out=rate_out, bundle_msg_rates=rates)


def with_moves(reports: dict[str, LoadReport], moves: Iterable[PendingMove]) -> dict[str, LoadReport]:
    """The reports as they should read once ``moves`` show in them. A report that
    still counts a moved bundle (its source's, until it let the bundle go) loses that
    traffic, up to the move's rate; the target's is topped up to the move's rate (its
    first report after taking the bundle counts little of it: new topics start their
    counts there). Ends without a report are skipped."""
    adjusted = dict(reports)
    for move in moves:
        source, target = adjusted.get(move.source), adjusted.get(move.target)
        if source is not None and move.bundle in source.bundle_msg_rates:
            shown = source.bundle_msg_rates[move.bundle]
            adjusted[move.source] = _with_traffic(source, -min(shown, move.rate), move.bundle, None)
        if target is not None:
            shown = target.bundle_msg_rates.get(move.bundle, 0.0)
            adjusted[move.target] = _with_traffic(target, max(move.rate - shown, 0.0), move.bundle,
                                                  max(shown, move.rate))
    return adjusted


def _traffic(report: LoadReport) -> float:
    return report.msg_rate_in + report.msg_rate_out


def scores(reports: dict[str, LoadReport], owners: dict[str, str]) -> dict[str, float]:
    """broker id -> load score. ``owners``: bundle -> broker id (the truth on bundles;
    reports may lag it)."""
    total_bundles = max(len(owners), 1)
    total_traffic = sum(_traffic(r) for r in reports.values()) or 1.0
    counts: dict[str, int] = {broker: 0 for broker in reports}
    for broker in owners.values():
        if broker in counts:
            counts[broker] += 1
    return {
        broker: WEIGHT_BUNDLES * counts[broker] / total_bundles + WEIGHT_TRAFFIC * _traffic(report) / total_traffic
        for broker, report in reports.items()
    }


def least_loaded(reports: dict[str, LoadReport], owners: dict[str, str], exclude: set[str] | None = None,
                 ) -> str | None:
    exclude = exclude or set()
    current = scores(reports, owners)
    candidates = sorted((round(score, 6), reports[broker].cpu_fraction, broker)
                        for broker, score in current.items() if broker not in exclude)
    return candidates[0][2] if candidates else None


def plan_shedding(reports: dict[str, LoadReport], owners: dict[str, str], threshold: float,
                  cooling: set[str]) -> Move | None:
    """The one move that best evens the highest and lowest scored brokers, if any."""
    if len(reports) < 2:
        return None
    current = scores(reports, owners)
    ordered = sorted(current.items(), key=lambda item: (item[1], item[0]))
    (low_broker, low_score), (high_broker, high_score) = ordered[0], ordered[-1]
    difference = high_score - low_score
    if difference <= threshold:
        return None
    total_bundles = max(len(owners), 1)
    total_traffic = sum(_traffic(r) for r in reports.values()) or 1.0
    rates = reports[high_broker].bundle_msg_rates
    best: tuple[float, str] | None = None
    for bundle, owner in sorted(owners.items()):
        if owner != high_broker or bundle in cooling:
            continue
        share = WEIGHT_BUNDLES / total_bundles + WEIGHT_TRAFFIC * rates.get(bundle, 0.0) / total_traffic
        after = abs((high_score - share) - (low_score + share))
        if after < difference - IMPROVEMENT_MIN and (best is None or after < best[0]):
            best = (after, bundle)
    if best is None:
        return None
    return Move(best[1], high_broker, low_broker,
                f"scores {high_broker}={high_score:.2f} {low_broker}={low_score:.2f} (threshold {threshold})")
