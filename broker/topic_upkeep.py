"""The broker service's passes over its loaded topics (for ``BrokerService``): retention
(managed_ledger/retention.py), the namespaces' and topics' policies — message TTL,
backlog quotas, the compaction threshold (broker/policy_enforcement.py) and rate limits
(broker/rate_limits.py) — the dispatcher invariant (subscriptions/dispatch_watch.py)
and the console's history (broker/stats_history.py). Each pass is a loop the service
owns (its background tasks); an error on one topic is logged and the pass goes on."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from broker import policy_enforcement, rate_limits
from broker.config import BrokerConfig
from broker.publish_limits import PublishLimits
from broker.stats_history import StatsHistory, read_topics
from broker.topic import PersistentTopic
from common.errors import MagnetarError
from metadata.policies import NamespacePolicies

if TYPE_CHECKING:
    from broker.archiver import Archiver
    from broker.resources import Resources

log = logging.getLogger(__name__)


class UpkeptService(Protocol):
    """What the passes need of the broker service (``BrokerService``)."""

    config: BrokerConfig
    resources: Resources
    archiver: Archiver
    stats_history: StatsHistory
    policy_counters: policy_enforcement.PolicyCounters
    publish_limits: PublishLimits
    shutting_down: bool

    def loaded_topics(self) -> list[PersistentTopic]: ...


class TopicUpkeep:
    # The longest a console-history sample works before it lets the loop run others.
    STATS_HISTORY_HOLD_S = 0.005

    def __init__(self, service: UpkeptService) -> None:
        self._service = service
        self._policies_changed = asyncio.Event()
        # The dispatcher invariant since start (check_dispatchers): stalls found, and the
        # longest wait with backlog and permits seen, in seconds.
        self.dispatch_stalls = 0
        self.dispatch_wait_s_max = 0.0
        # The last console-history sample: the time its pass worked in all (reading every
        # loaded topic and recording), and the longest it held the event loop at once.
        self.stats_history_sample_s = 0.0
        self.stats_history_hold_s = 0.0

    async def run_dispatch_watch(self) -> None:
        """Checks the dispatcher invariant of every loaded subscription on an interval
        (subscriptions/dispatch_watch.py): a stall is counted, logged and woken."""
        while not self._service.shutting_down:
            await asyncio.sleep(self._service.config.dispatch_watch_interval_s)
            self.check_dispatchers(time.monotonic())

    def check_dispatchers(self, now_s: float) -> int:
        """One pass of the dispatcher invariant; returns the stalls it found."""
        stalls = 0
        for topic in self._service.loaded_topics():
            for subscription in list(topic.subscriptions.values()):
                dispatcher = subscription.dispatcher
                if not subscription.consumers and dispatcher.watch.resting:
                    # Nothing to watch (no consumer, no wait under way): 100,000 idle
                    # subscriptions made this pass, 4 times a second, most of an idle
                    # broker's CPU (bench/topics_scale.py). Skipping cannot make a stall
                    # up: a wait starts afresh at the first sample after a consumer came.
                    continue
                dispatcher.watch.bound_s = self._service.config.dispatch_stall_bound_s
                if dispatcher.check_progress(now_s):
                    stalls += 1
                self.dispatch_wait_s_max = max(self.dispatch_wait_s_max, dispatcher.watch.wait_s_max)
        self.dispatch_stalls += stalls
        return stalls

    async def run_stats_history(self) -> None:
        """Samples the loaded topics for the console's history, every interval."""
        while not self._service.shutting_down:
            await asyncio.sleep(self._service.config.stats_history_interval_s)
            await self.sample_stats_history()

    async def sample_stats_history(self) -> None:
        """One sample of the loaded topics. The topics are read a few at a time, the loop
        let go every ``STATS_HISTORY_HOLD_S`` of work: 10,000 topics of 10 subscriptions
        take about half a second to read (bench/results/topics_scale_history_sample_*.json),
        which in one go held every connection of the broker that long every 10 s. The
        readings are therefore not of one instant but of the pass (rates over a 10 s
        interval barely notice); recording them is one step."""
        readings = []
        total = longest = 0.0
        started = time.perf_counter()
        for topic in self._service.loaded_topics():
            readings.extend(read_topics((topic,)))
            held = time.perf_counter() - started
            if held >= self.STATS_HISTORY_HOLD_S:
                total += held
                longest = max(longest, held)
                await asyncio.sleep(0)
                started = time.perf_counter()
        self._service.stats_history.sample(readings, time.time() * 1000, time.monotonic())
        held = time.perf_counter() - started
        self.stats_history_sample_s = total + held
        self.stats_history_hold_s = max(longest, held)

    async def run_retention(self) -> None:
        """Trims consumed ledgers of every loaded topic, per its namespace's policy."""
        while not self._service.shutting_down:
            await asyncio.sleep(self._service.config.retention_check_interval_s)
            for topic in self._service.loaded_topics():
                try:
                    policies = await self._service.resources.effective_policies(topic.name)
                    if not policies.deduplicationEnabled and not topic.closing:
                        # A snapshot left from when it was on holds entries: let it go.
                        await topic.set_deduplication(False)
                    retention = policies.retention()
                    await topic.trim_ledgers(retention.retentionTimeInMinutes, retention.retentionSizeInMB,
                                             await self._service.archiver.retention_gate(topic))
                except MagnetarError as error:
                    log.warning("retention check failed: topic=%s error=%s", topic.full_name, error)

    async def run_policies(self) -> None:
        """Applies message TTL, backlog quotas, the compaction threshold and the rate
        limits to the loaded topics whose namespace sets them
        (broker/policy_enforcement.py, broker/rate_limits.py); at once after a policy
        change through this broker's admin API (apply_rate_limits_soon)."""
        while not self._service.shutting_down:
            try:
                async with asyncio.timeout(self._service.config.policy_check_interval_s):
                    await self._policies_changed.wait()
            except TimeoutError:
                pass
            self._policies_changed.clear()
            for topic in self._service.loaded_topics():
                if topic.closing:
                    continue
                try:
                    policies = await self._service.resources.effective_policies(topic.name)
                    self.apply_rate_limits(topic, policies)
                    topic.backlog_size_quota = policy_enforcement.size_quota(policies)
                    if policy_enforcement.has_time_policies(policies):
                        await policy_enforcement.enforce(topic, policies, self._service.policy_counters)
                    if topic.compact_past(policies.compaction_threshold or 0):
                        self._service.policy_counters.compactions_started += 1
                except MagnetarError as error:
                    log.warning("policy check failed: topic=%s error=%s", topic.full_name, error)

    def apply_rate_limits_soon(self) -> None:
        """A namespace's or topic's rate limits changed here: the policy loop applies them now."""
        self._policies_changed.set()

    def apply_rate_limits(self, topic: PersistentTopic, policies: NamespacePolicies) -> None:
        """Sets the topic's publish, dispatch and per-subscription dispatch rate limits
        from its effective policies (the topic's over its namespace's; this cluster's
        entries); a limit that did not change keeps its buckets."""
        limits = rate_limits.topic_rate_limits(policies, self._service.config.cluster)
        publish = limits.publish
        current = topic.publish_rate.limit if topic.publish_rate is not None else None
        if publish != current:
            if topic.publish_rate is not None:
                topic.publish_rate.close()
            topic.publish_rate = rate_limits.PublishRateScope(topic.full_name, publish, self._service.publish_limits) \
                if publish is not None else None
            log.info("publish rate limit set: topic=%s limit=%s", topic.full_name, publish)
        dispatch = limits.dispatch
        current = topic.dispatch_throttle.limit if topic.dispatch_throttle is not None else None
        per_subscription = limits.per_subscription
        current_per_subscription = topic.subscription_throttles.limit \
            if topic.subscription_throttles is not None else None
        if dispatch != current or per_subscription != current_per_subscription:
            relative = any(limit is not None and limit.relative for limit in (dispatch, per_subscription))
            topic.publish_window = (topic.publish_window or rate_limits.PublishWindow()) if relative else None
            published = topic.publish_window
            throttle = topic.dispatch_throttle if dispatch == current else \
                rate_limits.DispatchRateThrottle(dispatch, published=published) if dispatch is not None else None
            topic.set_dispatch_throttle(throttle, rate_limits.SubscriptionDispatchRates(
                per_subscription, throttle, published=published) if per_subscription is not None else None)
            log.info("dispatch rate limits set: topic=%s limit=%s per_subscription=%s", topic.full_name, dispatch,
                     per_subscription)
