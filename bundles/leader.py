"""The leader broker: elected through etcd, it keeps every bundle of every namespace
owned by a live broker and evens out load.

Election: whoever creates ``/leader`` under its own lease leads; the others watch the
key and try again when it goes (the leader died or stepped down). Every ``interval``
the leader:
- assigns each bundle that has no owner and no live assignment to the least loaded
  live broker (assignments go under the leader's lease, so a dead leader's pending
  decisions vanish with it and its successor decides again);
- replaces assignments to brokers that went away or did not act in time;
- when shedding is on, asks the owner of one bundle of the busiest broker to hand it to
  the least busy one (a transfer record), if that evens them out (bundles/balancer.py).
  It plans on the load reports corrected by its own moves that the reports do not show
  yet (their traffic taken off the source, put on the target): planned on raw reports,
  which lag, it went on shedding from a broker whose traffic had already left and
  then shed it back — bundles moved three times where once would do.

Owners and assignments come from the OwnershipManager's watched mirrors when the
leader is given one (no etcd read per round); they may lag etcd a little, which costs
nothing but a lost compare-and-set: every decision is a transaction that compares the
versions it was based on. Without one, each round reads them from etcd.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from bundles import balancer
from bundles.config import BundlesConfig
from bundles.hashing import Bundles
from bundles.ownership import BrokerIdentity, OwnershipManager, assignments_from, bundle_key, owners_from
from bundles.records import AssignmentRecord, BundlesRecord, LeaderRecord, LoadReport, TransferRecord, decode_reports
from bundles.rounds import run_round
from common.errors import MagnetarError, MalformedFrame, MetadataKeyExists
from runtime.tasks import cancel_and_wait, log_failure
from metadata import keys
from metadata.prefix_cache import PrefixCache
from metadata.store import Compare, Delete, Lease, MetadataStore, Put, Record

log = logging.getLogger(__name__)


class Leader:
    def __init__(self, store: MetadataStore, config: BundlesConfig, identity: BrokerIdentity,
                 lease: Callable[[], Lease | None], brokers: PrefixCache, *,
                 ownership: OwnershipManager | None = None) -> None:
        self._store = store
        self._ownership = ownership
        self.config = config
        self.identity = identity
        self._lease = lease
        self._brokers = brokers
        self._leader = PrefixCache(store, keys.LEADER, self._on_leader_change)
        self.is_leader = False
        self._wake = asyncio.Event()
        # bundle key -> when we assigned it (kept while the assignment is pending) and
        # when we moved or assigned it (kept for the cooldown: a bundle that just got an
        # owner, at start-up or after a failover, is not shed before the cooldown ends,
        # as Pulsar's shedding grace period keeps recently loaded bundles put); both
        # pruned every round.
        self._assigned_at: dict[str, float] = {}
        self._moved_at: dict[str, float] = {}
        # bundle key -> the last move ordered for it, until the reports show it
        # (balancer.settled) or it is older than _move_expiry_s; at most one per bundle.
        self._unsettled: dict[str, balancer.PendingMove] = {}
        self._task: asyncio.Task[None] | None = None
        self.moves = 0
        # Rounds run, and when the last one that ended well ended (monotonic).
        self.rounds = 0
        self.last_good_round = 0.0

    async def start(self) -> None:
        await self._leader.start()
        try:
            await self._campaign()   # a lone broker leads as soon as it serves
        except MagnetarError as error:
            log.warning("first leader campaign failed: error=%s", error)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="leader rounds")
        self._task.add_done_callback(lambda task: log_failure(task, owner="leader"))

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        await self._leader.close()

    def leader(self) -> LeaderRecord | None:
        record = self._leader.get(keys.LEADER)
        if record is None:
            return None
        try:
            return LeaderRecord.decode(record.value)
        except MalformedFrame:
            return None

    def _on_leader_change(self, key: str, old, new) -> None:
        if new is None:
            self.is_leader = False
            self._wake.set()
        else:
            try:
                self.is_leader = LeaderRecord.decode(new.value).broker_id == self.identity.broker_id
            except MalformedFrame:
                self.is_leader = False

    async def step_down(self) -> None:
        if self.is_leader:
            self.is_leader = False
            try:
                record = self._leader.get(keys.LEADER)
                if record is not None:
                    await self._store.transaction([Compare(keys.LEADER, record.version)], [Delete(keys.LEADER)])
            except MagnetarError:
                pass

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.config.leader_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            self.rounds += 1
            # Bounded and logged (bundles/rounds.py): a round that waited for ever on etcd
            # once left bundles unowned for minutes without a line in the log.
            if await run_round(self._round(), what="leader", bound_s=self.config.round_timeout_s):
                self.last_good_round = time.monotonic()

    async def _round(self) -> None:
        if not self.is_leader:
            await self._campaign()
        if self.is_leader:
            await self._decide()

    async def _campaign(self) -> None:
        lease = self._lease()
        if lease is None or lease.is_lost or self._leader.get(keys.LEADER) is not None:
            return
        record = LeaderRecord(self.identity.broker_id, self.identity.web_service_url, self.identity.service_url,
                              int(time.time() * 1000))
        try:
            await self._store.create(keys.LEADER, record.encode(), lease=lease)
        except MetadataKeyExists:
            return
        self.is_leader = True
        log.info("elected leader: broker_id=%s", self.identity.broker_id)

    # --- decisions ---------------------------------------------------------------------------

    def _reports(self) -> dict[str, LoadReport]:
        return decode_reports(self._brokers.records.values())

    async def _owners_and_assignments(self) -> tuple[dict[str, str], dict[str, tuple[AssignmentRecord, Record]]]:
        if self._ownership is not None:
            return self._ownership.owners(), self._ownership.pending_assignments()
        owners = {bkey: record.broker_id
                  for bkey, record in owners_from(await self._store.get_prefix(keys.BUNDLE_OWNERS)).items()}
        return owners, assignments_from(await self._store.get_prefix(keys.BUNDLE_ASSIGNMENTS))

    async def _all_bundles(self) -> list[str]:
        namespaces = [r.key[len(keys.NAMESPACES):-len("/policies")]
                      for r in await self._store.get_prefix(keys.NAMESPACES, keys_only=True)
                      if r.key.endswith("/policies")]
        result = []
        for namespace in namespaces:
            tenant, ns = namespace.split("/", 1)
            record = await self._store.get(keys.namespace_bundles(tenant, ns))
            if record is None:
                continue  # created on first use of the namespace by some broker
            bundles = Bundles(tuple(BundlesRecord.decode(record.value).boundaries))
            result.extend(bundle_key(namespace, r) for r in bundles.ranges)
        return result

    async def _decide(self) -> None:
        lease = self._lease()
        if lease is None or lease.is_lost:
            return
        raw_reports = self._reports()
        if not raw_reports:
            return
        owners, assignments = await self._owners_and_assignments()
        now = time.monotonic()
        planned = dict(owners)
        all_bundles = await self._all_bundles()
        self._prune(set(all_bundles), owners, now)
        self._prune_unsettled(raw_reports, set(all_bundles))
        reports = balancer.with_moves(raw_reports, self._unsettled.values())
        for bkey in all_bundles:
            if bkey in owners:
                continue
            pending = assignments.get(bkey)
            if pending is not None:
                assignment, record = pending
                fresh = now - self._assigned_at.get(bkey, now) < self.config.assignment_timeout_s
                if assignment.broker_id in reports and fresh:
                    planned[bkey] = assignment.broker_id
                    self._assigned_at.setdefault(bkey, now)
                    continue
            target = balancer.least_loaded(reports, planned)
            if target is None:
                return
            namespace, _, bundle = bkey.rpartition("/")
            key = keys.bundle_assignment(namespace, bundle)
            new = AssignmentRecord(target, reason="unowned", decided_by=self.identity.broker_id,
                                   decided_ms=int(time.time() * 1000))
            expected = pending[1].version if pending is not None else 0
            if await self._store.transaction([Compare(key, expected), Compare(keys.bundle_owner(namespace, bundle), 0)],
                                             [Put(key, new.encode(), lease.lease_id)]) is not None:
                self._assigned_at[bkey] = now
                self._moved_at[bkey] = now
                planned[bkey] = target
                log.info("bundle assigned: bundle=%s broker_id=%s", bkey, target)
        # Shed only when every bundle is owned (nothing was just assigned or pending).
        if self.config.shedding_enabled and len(planned) == len(owners):
            await self._shed(reports, owners, lease)

    def _prune(self, existing: set[str], owners: dict[str, str], now: float) -> None:
        """Forgets assignment times of bundles that are owned now or gone (split), and
        move times past the cooldown. A stale assignment time would also be wrong, not
        just wasted memory: a later assignment of the same bundle would look timed out
        from the start."""
        for bkey in [b for b in self._assigned_at if b in owners or b not in existing]:
            del self._assigned_at[bkey]
        cooldown_s = self.config.shedding_cooldown_s
        for bkey in [b for b, at in self._moved_at.items() if now - at >= cooldown_s or b not in existing]:
            del self._moved_at[bkey]

    def _prune_unsettled(self, reports: dict[str, LoadReport], existing: set[str]) -> None:
        """Forgets moves the reports show now, moves of bundles gone (split), and moves
        older than ``_move_expiry_s`` (one that never completed, or brokers whose
        clocks run behind the leader's: the correction must not outlive its use)."""
        interval_ms = int(self.config.report_interval_s * 1000)
        settle_ms = int(self.config.move_settle_s * 1000)
        now_ms = int(time.time() * 1000)
        expiry_ms = int(self._move_expiry_s * 1000)
        for bkey, move in list(self._unsettled.items()):
            if (bkey not in existing or now_ms - move.ordered_ms > expiry_ms
                    or balancer.settled(move, reports, interval_ms, settle_ms)):
                del self._unsettled[bkey]

    @property
    def _move_expiry_s(self) -> float:
        """A move not shown in the reports by now will not be: the source acts within
        the assignment timeout, the reports follow within settle + two intervals."""
        return self.config.assignment_timeout_s + self.config.move_settle_s + 2 * self.config.report_interval_s

    async def _shed(self, reports: dict[str, LoadReport], owners: dict[str, str], lease: Lease) -> None:
        now = time.monotonic()
        cooling = {b for b, at in self._moved_at.items() if now - at < self.config.shedding_cooldown_s}
        live_owners = {b: o for b, o in owners.items() if o in reports}
        move = balancer.plan_shedding(reports, live_owners, self.config.shedding_threshold, cooling)
        if move is None:
            return
        namespace, _, bundle = move.bundle.rpartition("/")
        key = keys.bundle_transfer(namespace, bundle)
        record = TransferRecord(move.target, reason=f"load: {move.reason}", decided_ms=int(time.time() * 1000),
                                source=move.source)
        if await self._store.transaction([Compare(key, 0)], [Put(key, record.encode(), lease.lease_id)]) is not None:
            self._moved_at[move.bundle] = now
            rate = reports[move.source].bundle_msg_rates.get(move.bundle, 0.0)
            self._unsettled[move.bundle] = balancer.PendingMove(move.bundle, move.source, move.target, rate,
                                                                record.decided_ms)
            self.moves += 1
            log.info("bundle shed: bundle=%s from=%s to=%s reason=%s", move.bundle, move.source, move.target,
                     move.reason)
        else:
            await self._clear_stale_transfer(key, move.bundle)

    async def _clear_stale_transfer(self, key: str, bkey: str) -> None:
        """A transfer record nobody acted on (its source had lost the bundle or died
        before it saw the record) would stay as long as this leader's lease and block
        every later move of the bundle — and, the plan being the same each round, all
        shedding. One older than the assignment timeout is deleted (by its version)."""
        existing = await self._store.get(key)
        if existing is None:
            return
        try:
            decided_ms = TransferRecord.decode(existing.value).decided_ms
        except MalformedFrame:
            decided_ms = 0
        age_s = time.time() - decided_ms / 1000
        if age_s < self.config.assignment_timeout_s:
            return
        if await self._store.transaction([Compare(key, existing.version)], [Delete(key)]) is not None:
            log.warning("stale bundle transfer cleared: bundle=%s age_s=%.1f", bkey, age_s)
