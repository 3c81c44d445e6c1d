"""The Grafana dashboards' queries return data from a real Prometheus scraping a real
cluster, and the alert rules load in it and name only series that exist.

A cluster (etcd, 2 bookies, a broker, a gateway, ``magnetar autorecovery``) gets
traffic: the official client publishes to a topic and a shared consumer leaves some
messages unacknowledged; HTTP clients pull through the gateway from the same
subscription and acknowledge. Debian's ``prometheus`` server (installed by
``make setup``) is started on a free loopback port with a temporary configuration
scraping every process each second and loading ops/prometheus/alerts.yml. Then every
panel's query of ops/grafana/*.json (variables set to the produced topic and
subscription, ``$__rate_interval`` to 10 s) must return at least one series, every
template variable must have values, and every metric an alert rule reads must be
among the scraped series. Also: the JSON files are what ops/grafana/generate.py writes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import aiohttp
import pytest
import yaml

from tests.cluster import ManagedProcess, free_port, python_command, unique
from tests.integration.gateway_helpers import Gateway

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAFANA_DIR = os.path.join(ROOT, "ops", "grafana")
ALERTS = os.path.join(ROOT, "ops", "prometheus", "alerts.yml")
_AUTORECOVERY_READY = re.compile(r"autorecovery listening: id=(\S+) http_address=(\S+)")
# How long every panel gets to show data once the traffic is done (scrapes are 1 s apart).
PANELS_DEADLINE_S = 20.0


def _generator():
    spec = importlib.util.spec_from_file_location("grafana_generate", os.path.join(GRAFANA_DIR, "generate.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_dashboard_files_are_what_the_generator_writes():
    """The committed JSON cannot drift from ops/grafana/generate.py."""
    for name, text in _generator().rendered().items():
        with open(os.path.join(GRAFANA_DIR, name), encoding="utf-8") as handle:
            assert handle.read() == text, f"ops/grafana/{name} is stale: run python ops/grafana/generate.py"


def _api(base_url: str, path: str, **params: str) -> dict:
    url = f"{base_url}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        document = json.loads(response.read())
    assert document["status"] == "success", document
    return document["data"]


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def _alert_metric_names() -> set[str]:
    with open(ALERTS, encoding="utf-8") as handle:
        rules = [rule for group in yaml.safe_load(handle)["groups"] for rule in group["rules"]]
    names = set()
    for rule in rules:
        for name in re.findall(r"\b((?:pulsar|magnetar)_[a-z0-9_]+)", rule["expr"]):
            names.add(name)
    return names


@pytest.fixture
async def prometheus_server(tmp_path):
    """Starts ``prometheus`` later (``start(targets)``); stops it (SIGKILL) afterwards."""
    binary = shutil.which("prometheus")
    assert binary, "the prometheus server is missing: run `make setup` (Debian's prometheus package)"
    processes: list[subprocess.Popen] = []

    async def start(targets: dict[str, list[str]]) -> str:
        port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [ALERTS],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": addresses}]}
                               for job, addresses in targets.items()],
        }
        config_path = tmp_path / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        log = open(tmp_path / "prometheus.log", "wb")
        processes.append(subprocess.Popen(
            [binary, f"--config.file={config_path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert processes[-1].poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{base_url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return base_url
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus did not get ready within 30 s"
            await asyncio.sleep(0.2)

    yield start
    for process in processes:
        process.kill()
        process.wait()


async def test_every_panel_returns_series_from_a_real_prometheus(cluster, prometheus_server, tmp_path):
    """Every panel and variable of ops/grafana/*.json has data in a real Prometheus
    after real traffic, and the alert rules load there and read existing series."""
    import pulsar

    bookies = await cluster.start_bookies(2)
    (broker,) = await cluster.start_brokers(1)
    (gateway_process,) = await cluster.start_gateways(1)
    autorecovery = ManagedProcess("autorecovery", python_command(
        "autorecovery", "--metadata", cluster.metadata_url, "--http-port", "0", "--audit-interval-s", "0.5"),
        str(tmp_path / "autorecovery.log"))
    autorecovery.spawn()
    try:
        autorecovery_address = (await autorecovery.wait_for_log(_AUTORECOVERY_READY)).group(2)
        base_url = await prometheus_server({
            "broker": [_host_port(broker.web_service_url)],
            "bookie": [b.http_address for b in bookies],
            "gateway": [_host_port(gateway_process.url)],
            "autorecovery": [autorecovery_address],
        })
        name = unique("dash")
        topic = f"persistent://public/default/{name}"
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                        receiver_queue_size=5)
            producer = client.create_producer(topic, batching_enabled=False)
            for index in range(200):
                producer.send(f"m-{index}".encode())
            for _ in range(5):
                consumer.receive(timeout_millis=10_000)   # held, not acknowledged
            async with aiohttp.ClientSession() as session:
                gateway = Gateway(gateway_process.url, session)
                path = f"persistent/public/default/{name}"
                taken = await gateway.pull(path, "sub", max_messages=20, wait_ms=5000, lease_ms=60_000)
                assert taken
                await gateway.ack(path, "sub", taken[:10])
                # Traffic spread over a few scrapes, so that rates have two samples.
                for _ in range(4):
                    for _ in range(20):
                        producer.send(b"more")
                    await asyncio.sleep(1)
                await _check_panels(base_url, topic)
            producer.close()
            consumer.close()
        finally:
            client.close()
    finally:
        await autorecovery.terminate()


async def _check_panels(base_url: str, topic: str) -> None:
    # The topic as a regex matches itself (its "." would match any character: harmless;
    # PromQL strings take no "\-" escapes, so re.escape would not do).
    values = {"$topic": topic, "$subscription": "sub", "$namespace": "public/default",
              "$instance": ".+", "$__rate_interval": "10s"}
    queries: list[tuple[str, str]] = []
    variables: list[tuple[str, str, str]] = []
    for file_name in sorted(os.listdir(GRAFANA_DIR)):
        if not file_name.endswith(".json"):
            continue
        with open(os.path.join(GRAFANA_DIR, file_name), encoding="utf-8") as handle:
            document = json.load(handle)
        for panel in document["panels"]:
            for target in panel["targets"]:
                expr = target["expr"]
                for variable, text in values.items():
                    expr = expr.replace(variable, text)
                assert "$" not in expr, (file_name, panel["title"], expr)
                queries.append((f"{file_name}: {panel['title']}", expr))
        for variable in document["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
                assert match, variable["definition"]
                selector = match.group(1)
                for name, text in values.items():
                    selector = selector.replace(name, text)
                variables.append((f"{file_name}: ${variable['name']}", selector, match.group(2)))
    assert len(queries) >= 40
    deadline = time.monotonic() + PANELS_DEADLINE_S
    empty: list[str] = []
    while True:
        empty = []
        for title, expr in queries:
            result = await asyncio.to_thread(_api, base_url, "/api/v1/query", query=expr)
            if not result["result"]:
                empty.append(f"{title}: {expr}")
        for title, selector, label in variables:
            found = await asyncio.to_thread(_api, base_url, f"/api/v1/label/{label}/values", **{"match[]": selector})
            if not found:
                empty.append(f"{title}: label_values({selector}, {label})")
        if not empty or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    assert not empty, "panels or variables without data:\n" + "\n".join(empty)
    scraped = set(await asyncio.to_thread(_api, base_url, "/api/v1/label/__name__/values"))
    # Histogram rules read <name>_bucket / _count: those are what is scraped.
    missing = sorted(name for name in _alert_metric_names() if name not in scraped)
    assert not missing, f"alert rules read series nothing exports: {missing}"
    rules = await asyncio.to_thread(_api, base_url, "/api/v1/rules")
    loaded = [rule["name"] for group in rules["groups"] for rule in group["rules"]]
    assert len(loaded) >= 8, loaded
