"""The load report a broker publishes under ``/brokers/<id>`` (leased): CPU, message
rates, connections, topics and bundles, every ``report_interval_s``. The leader reads
all of them to place and shed bundles; a broker whose report vanished is gone."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable

from bundles.config import BundlesConfig
from bundles.hashing import BundleIndex
from bundles.ownership import OwnershipManager
from bundles.rounds import run_round
from bundles.records import LoadReport
from metadata import keys
from metadata.store import MetadataStore

log = logging.getLogger(__name__)


class LoadReporter:
    def __init__(self, store: MetadataStore, config: BundlesConfig, ownership: OwnershipManager,
                 counters: Callable[[], tuple[dict[str, tuple[int, int]], int]]) -> None:
        """``counters`` returns ({topic name: (messages in, messages out)}, connections)."""
        self._store = store
        self.config = config
        self._ownership = ownership
        self._counters = counters
        self._started_ms = int(time.time() * 1000)
        self._last: tuple[float, float, dict[str, tuple[int, int]]] | None = None
        self.last_report: LoadReport | None = None
        # Rounds run, and when the last one that ended well ended (monotonic).
        self.rounds = 0
        self.last_good_round = 0.0

    def build(self) -> LoadReport:
        now = time.monotonic()
        times = os.times()
        cpu_seconds = times.user + times.system
        topics, connections = self._counters()
        cpu_fraction = rate_in = rate_out = 0.0
        bundle_rates: dict[str, float] = {}
        serving = self._ownership.serving()
        index = BundleIndex(serving)
        if self._last is not None:
            elapsed = max(now - self._last[0], 1e-6)
            cpu_fraction = (cpu_seconds - self._last[1]) / elapsed
            for name, (messages_in, messages_out) in topics.items():
                before = self._last[2].get(name, (messages_in, messages_out))
                topic_in = max(messages_in - before[0], 0) / elapsed
                topic_out = max(messages_out - before[1], 0) / elapsed
                rate_in += topic_in
                rate_out += topic_out
                bundle = index.find(name)
                if bundle is not None:
                    bundle_rates[bundle] = bundle_rates.get(bundle, 0.0) + topic_in + topic_out
        self._last = (now, cpu_seconds, topics)
        identity = self._ownership.identity
        return LoadReport(identity.broker_id, identity.service_url, identity.web_service_url,
                          cpu_fraction=round(cpu_fraction, 4), msg_rate_in=round(rate_in, 1),
                          msg_rate_out=round(rate_out, 1), connections=connections, topics=len(topics),
                          bundles=serving, bundle_msg_rates={k: round(v, 1) for k, v in bundle_rates.items()},
                          reported_ms=int(time.time() * 1000), started_ms=self._started_ms,
                          listeners=dict(identity.listeners),
                          service_url_tls=identity.service_url_tls, web_service_url_tls=identity.web_service_url_tls)

    async def publish(self) -> None:
        lease = self._ownership.lease
        if lease is None or lease.is_lost:
            return
        report = self.build()
        self.last_report = report
        await self._store.put(keys.broker(report.broker_id), report.encode(), lease=lease)

    async def run(self) -> None:
        while True:
            self.rounds += 1
            # Bounded and logged (bundles/rounds.py): "load report round failed" names a
            # failed round, a stalled one is logged and cancelled at its bound.
            if await run_round(self.publish(), what="load report", bound_s=self.config.round_timeout_s):
                self.last_good_round = time.monotonic()
            await asyncio.sleep(self.config.report_interval_s)
