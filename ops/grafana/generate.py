"""Writes Magnetar's Grafana dashboards (ops/grafana/*.json) from the panel lists below.

    python ops/grafana/generate.py            # rewrite the JSON files
    python ops/grafana/generate.py --check    # exit 1 if a JSON file differs from this

Plain Grafana dashboard JSON (schema 39, time-series and stat panels), with no library:
each panel is (title, PromQL, legend, unit). Queries use the dashboard's variables
(``$datasource``, ``$namespace``, ``$topic``, ``$subscription``, ``$instance``) and
``$__rate_interval``. tests/integration/test_dashboards.py runs every query against a
real Prometheus scraping a real cluster and fails on one that returns no series, and
checks the JSON files are what this script writes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str
    legend: str = ""
    unit: str = "short"
    kind: str = "timeseries"      # or "stat"


@dataclass(frozen=True)
class Variable:
    name: str
    metric: str                   # label_values(<metric>, <label>)
    label: str


def _p99(histogram: str, by: str = "", selector: str = "") -> str:
    group = f"{by}, le" if by else "le"
    matchers = f"{{{selector}}}" if selector else ""
    return f"histogram_quantile(0.99, sum by ({group}) (rate({histogram}_bucket{matchers}[{RATE}])))"


CLUSTER = (
    "Magnetar cluster", "magnetar-cluster", (), [
        Panel("Brokers holding their lease", "sum(magnetar_broker_lease_held)", kind="stat"),
        Panel("Topics", "sum(pulsar_topics_count)", kind="stat"),
        Panel("Under-replicated ledgers", "max(magnetar_autorecovery_under_replicated_ledgers)", kind="stat"),
        Panel("Read-only bookies", "sum(magnetar_bookie_read_only)", kind="stat"),
        Panel("Messages in / s", "sum by (namespace) (pulsar_rate_in)", "{{namespace}}", "msg/s"),
        Panel("Messages out / s", "sum by (namespace) (pulsar_rate_out)", "{{namespace}}", "msg/s"),
        Panel("Bytes in / s", "sum by (namespace) (pulsar_throughput_in)", "{{namespace}}", "Bps"),
        Panel("Bytes out / s", "sum by (namespace) (pulsar_throughput_out)", "{{namespace}}", "Bps"),
        Panel("Backlog by namespace (entries)", "sum by (namespace) (pulsar_msg_backlog)", "{{namespace}}"),
        Panel("Storage by namespace", "sum by (namespace) (pulsar_storage_size)", "{{namespace}}", "bytes"),
        Panel("Subscriptions furthest behind (entries)", "topk(10, pulsar_subscription_back_log)",
              "{{topic}} {{subscription}}"),
        Panel("Publish latency p99 by broker", _p99("magnetar_broker_publish_latency_seconds", "instance"),
              "{{instance}}", "s"),
        Panel("Fullest bookie directory", "max by (instance) (magnetar_bookie_directory_usage_ratio)",
              "{{instance}}", "percentunit"),
        Panel("Gateway requests / s by status",
              f"sum by (status) (rate(magnetar_gateway_request_latency_seconds_count[{RATE}]))", "{{status}}",
              "reqps"),
        Panel("Topics without series of their own (metrics limit)", "sum(magnetar_broker_metrics_topics_folded)",
              kind="stat"),
    ])

_TOPIC = 'topic=~"$topic"'
TOPIC = (
    "Magnetar topic", "magnetar-topic",
    (Variable("namespace", "pulsar_topics_count", "namespace"),
     Variable("topic", 'pulsar_rate_in{namespace=~"$namespace"}', "topic")), [
        Panel("Messages in / s", f"pulsar_rate_in{{{_TOPIC}}}", "{{topic}}", "msg/s"),
        Panel("Messages out / s", f"pulsar_rate_out{{{_TOPIC}}}", "{{topic}}", "msg/s"),
        Panel("Bytes in / s", f"pulsar_throughput_in{{{_TOPIC}}}", "{{topic}}", "Bps"),
        Panel("Bytes out / s", f"pulsar_throughput_out{{{_TOPIC}}}", "{{topic}}", "Bps"),
        Panel("Backlog (entries)", f"pulsar_msg_backlog{{{_TOPIC}}}", "{{topic}}"),
        Panel("Backlog by subscription (entries)", f"pulsar_subscription_back_log{{{_TOPIC}}}", "{{subscription}}"),
        Panel("Storage", f"pulsar_storage_size{{{_TOPIC}}}", "{{topic}}", "bytes"),
        Panel("Producers", f"pulsar_producers_count{{{_TOPIC}}}", "{{topic}}"),
        Panel("Consumers", f"pulsar_consumers_count{{{_TOPIC}}}", "{{topic}}"),
        Panel("Subscriptions", f"pulsar_subscriptions_count{{{_TOPIC}}}", "{{topic}}"),
    ])

_SUB = 'topic=~"$topic", subscription=~"$subscription"'
SUBSCRIPTION = (
    "Magnetar subscription", "magnetar-subscription",
    (Variable("topic", "pulsar_subscription_back_log", "topic"),
     Variable("subscription", 'pulsar_subscription_back_log{topic=~"$topic"}', "subscription")), [
        Panel("Backlog (entries)", f"pulsar_subscription_back_log{{{_SUB}}}", "{{subscription}}"),
        Panel("Messages out / s", f"pulsar_subscription_msg_rate_out{{{_SUB}}}", "{{subscription}}", "msg/s"),
        Panel("Bytes out / s", f"pulsar_subscription_msg_throughput_out{{{_SUB}}}", "{{subscription}}", "Bps"),
        Panel("Unacknowledged messages", f"pulsar_subscription_unacked_messages{{{_SUB}}}", "{{subscription}}"),
        Panel("Consumers", f"pulsar_subscription_consumers_count{{{_SUB}}}", "{{subscription}}"),
        Panel("Delayed messages", f"pulsar_subscription_delayed{{{_SUB}}}", "{{subscription}}"),
        Panel("Gateway leases held", f"magnetar_gateway_subscription_leases_active{{{_SUB}}}", "{{instance}}"),
        Panel("Gateway acks / s", f"rate(magnetar_gateway_subscription_acked_total{{{_SUB}}}[{RATE}])",
              "{{instance}}", "ops"),
        Panel("Gateway leases ended without ack / s",
              f"rate(magnetar_gateway_subscription_lease_ended_total{{{_SUB}}}[{RATE}])", "{{instance}}", "ops"),
    ])

_BOOKIE = 'instance=~"$instance"'
BOOKIE = (
    "Magnetar bookie", "magnetar-bookie",
    (Variable("instance", "magnetar_bookie_read_only", "instance"),), [
        Panel("Read-only", f"magnetar_bookie_read_only{{{_BOOKIE}}}", "{{instance}}", kind="stat"),
        Panel("Disk used by directory", f"magnetar_bookie_directory_usage_ratio{{{_BOOKIE}}}",
              "{{instance}} {{directory}}", "percentunit"),
        Panel("Free bytes by directory", f"magnetar_bookie_directory_free_bytes{{{_BOOKIE}}}",
              "{{instance}} {{directory}}", "bytes"),
        Panel("Adds / s", f"rate(magnetar_bookie_adds_total{{{_BOOKIE}}}[{RATE}])", "{{instance}}", "ops"),
        Panel("Journal queue (records)", f"magnetar_bookie_journal_queue_records{{{_BOOKIE}}}", "{{instance}}"),
        Panel("Journal queue (bytes)", f"magnetar_bookie_journal_queue_bytes{{{_BOOKIE}}}", "{{instance}}",
              "bytes"),
        Panel("Journal fsync latency p99", _p99("magnetar_bookie_journal_fsync_latency_seconds", "instance", _BOOKIE),
              "{{instance}}", "s"),
        Panel("Journal queue wait p99", _p99("magnetar_bookie_journal_queue_wait_seconds", "instance", _BOOKIE),
              "{{instance}}", "s"),
    ])

DASHBOARDS = {"cluster": CLUSTER, "topic": TOPIC, "subscription": SUBSCRIPTION, "bookie": BOOKIE}
_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel(index: int, panel: Panel) -> dict:
    width = 6 if panel.kind == "stat" else 12
    height = 4 if panel.kind == "stat" else 8
    per_row = 24 // width
    return {
        "id": index + 1,
        "type": panel.kind,
        "title": panel.title,
        "datasource": _DATASOURCE,
        "gridPos": {"h": height, "w": width, "x": (index % per_row) * width, "y": index * height // per_row},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {},
        "targets": [{"refId": "A", "datasource": _DATASOURCE, "expr": panel.expr, "legendFormat": panel.legend}],
    }


def _variable(variable: Variable) -> dict:
    query = f"label_values({variable.metric}, {variable.label})"
    return {"name": variable.name, "type": "query", "datasource": _DATASOURCE, "definition": query,
            "query": {"query": query, "refId": f"{variable.name}-values"}, "refresh": 2, "includeAll": True,
            "multi": True, "current": {}, "sort": 1}


def dashboard(title: str, uid: str, variables: tuple[Variable, ...], panels: list[Panel]) -> dict:
    datasource = {"name": "datasource", "type": "datasource", "query": "prometheus", "current": {}}
    return {
        "title": title,
        "uid": uid,
        "schemaVersion": 39,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "tags": ["magnetar"],
        "templating": {"list": [datasource, *(_variable(v) for v in variables)]},
        "panels": [_panel(index, panel) for index, panel in enumerate(panels)],
    }


def rendered() -> dict[str, str]:
    """{file name: JSON text} of every dashboard."""
    return {f"{name}.json": json.dumps(dashboard(*spec), indent=2) + "\n" for name, spec in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs from what would be written")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path = os.path.join(HERE, name)
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
    if args.check and stale:
        print(f"out of date (run python ops/grafana/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
