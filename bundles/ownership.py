"""Bundle ownership on one broker: which broker serves a topic, taking bundles the
leader assigns here, handing bundles over, splitting them, and fencing itself when its
lease may be gone.

Theory of operation:
- Every owner record (``/bundle-owners/...``) is mirrored locally; the owner of a
  topic is the owner of the bundle its name hashes into. A broker serves a topic only
  while it holds that bundle's owner key under its own live lease.
- Taking a bundle: the leader writes an assignment naming a broker; that broker
  creates the owner key (only if absent) under its lease and removes the assignment,
  in one transaction.
- Handing a bundle over (unload, shedding, shutdown): mark the owner record RELEASING
  to the destination (from then on lookups anywhere answer the destination, which
  holds incoming requests until it owns the bundle), close the bundle's topics one by
  one (clients reconnect straight away), then in one transaction delete the owner key
  and assign the bundle to the destination, which takes it. The assignment names the
  topics that were loaded here, and the destination starts loading them as it takes
  the bundle (``preload_topics``), so a reconnecting client finds its topic loaded or
  joins its load rather than starting it. Clients see a reconnect;
  other bundles of this broker are not touched. If etcd keeps failing that last
  transaction, the owner key is deleted on its own so the leader reassigns the bundle:
  it must not stay RELEASING under this broker's live lease with nobody serving it.
- Splitting: one transaction replaces the namespace's boundaries and the owner key of
  the bundle by owner keys of its two halves, still here: nothing is closed. Other
  brokers' cached boundaries go stale; they notice when the bundle they compute has no
  owner record (the split deleted it) and re-read the boundaries then (once per
  lookup, and concurrent lookups share the read).
- Metadata outages: etcd going away stops nothing by itself. While the lease is not
  confirmed but cannot have expired yet (less than ``fence_after_s``, 0.9 of the TTL
  and at least a second before its end, since
  the last refresh etcd confirmed, counted from when that refresh was sent), nobody
  can be given this broker's bundles, so it goes on serving the topics it has loaded:
  appends to their open ledgers, dispatch, acknowledgements (kept in memory until
  the cursor can be saved). From ``OUTAGE_NOTICE_FRACTION`` of the TTL without a
  confirmation it is "metadata-degraded" (logged once per episode): it refuses to
  load a topic it has not loaded (ServiceNotReady, retriable: a load needs etcd
  anyway), as well as every ownership change, which fail on etcd by themselves.
- Self-fencing: when the lease has not been confirmed for ``fence_after_s`` (see bundles/config.py) of its
  TTL, the broker stops serving every bundle at once (before any await), tells its owner
  (``on_fence``: the broker aborts its client connections), then closes
  their topics concurrently, and refuses to serve until the lease is confirmed again (or, if lost, a new one is granted and bundles are taken
  anew). etcd can only hand the bundles to another broker after the full TTL, so two
  brokers never serve one bundle at once; ledger fencing backs this up regardless.
- Every start and end of serving a bundle is logged with wall-clock times
  ("bundle serving started/stopped"; the end is when its topics' closes began, that
  is when it stopped accepting publishes; "bundle topics closed" says when they ended), which
  is what the tests check for overlaps (tests/hosts/checker.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from common.topic_name import NamespaceName, TopicName
from bundles import balancer
from bundles.config import BundlesConfig
from bundles.hashing import BundleIndex, BundleRange, Bundles, default_boundaries
from bundles.records import (
    OWNED,
    RELEASING,
    AssignmentRecord,
    BundlesRecord,
    OwnerRecord,
    TransferRecord,
    decode_reports,
)
from common.errors import (
    MagnetarError,
    MalformedFrame,
    MetadataKeyExists,
    NamespaceNotFound,
    NotOwner,
    PreconditionFailed,
    ServiceNotReady,
)
from runtime.tasks import TaskSet
from metadata import keys
from metadata.prefix_cache import PrefixCache
from metadata.store import Compare, Delete, Lease, MetadataStore, Put, Record

log = logging.getLogger(__name__)

# Bundles whose topics close at once when the broker fences itself. Each close flushes
# cursors and the managed ledger to etcd, which is likely failing just then (that is
# why the lease went unconfirmed): running all of them at once would pile thousands of
# etcd calls onto it; one by one, the last bundle would wait for every other's timeouts.
FENCE_CLOSES_CONCURRENT_MAX = 16
# Attempts at the transaction that ends a release (owner key deleted, the bundle
# assigned to its destination). The bundle is no longer served by then, so giving up
# must still free the key, or it would stay RELEASING under our lease with nobody
# serving the bundle: see release().
RELEASE_ATTEMPTS_MAX = 3
RELEASE_RETRY_S = 0.2
# The share of the lease's TTL without a confirmation after which the broker counts
# etcd as away (metadata-degraded): three refreshes missed with the brokers' 10 s TTL,
# well past one slow reply, well before the fence.
OUTAGE_NOTICE_FRACTION = 0.3
# The lease guard looks at the lease at least this often (see _guard_lease).
GUARD_INTERVAL_S_MAX = 0.25
# A hand-over's assignment names at most this many of the bundle's loaded topics for
# the destination to load at once (the rest load when their clients come).
HANDOVER_TOPICS_MAX = 1000


def _handed_over_topics(assignment: Record) -> list[str]:
    """The topics an assignment names for preloading. Only advice: a record that does
    not decode, or a value that is not a list of names, gives none."""
    try:
        topics = AssignmentRecord.decode(assignment.value).topics
    except MalformedFrame:
        return []
    if not isinstance(topics, list):
        return []
    return [topic for topic in topics if isinstance(topic, str)][:HANDOVER_TOPICS_MAX]


def owners_from(records: Iterable[Record]) -> dict[str, OwnerRecord]:
    """bundle key -> owner record, from ``/bundle-owners/...`` records (bad ones skipped)."""
    result = {}
    for record in records:
        namespace, bundle = keys.split_bundle_key(record.key, keys.BUNDLE_OWNERS)
        try:
            result[bundle_key(namespace, bundle)] = OwnerRecord.decode(record.value)
        except MalformedFrame:
            continue
    return result


def assignments_from(records: Iterable[Record]) -> dict[str, tuple[AssignmentRecord, Record]]:
    """bundle key -> (assignment, its record), from ``/bundle-assignments/...`` records."""
    result = {}
    for record in records:
        namespace, bundle = keys.split_bundle_key(record.key, keys.BUNDLE_ASSIGNMENTS)
        try:
            result[bundle_key(namespace, bundle)] = (AssignmentRecord.decode(record.value), record)
        except MalformedFrame:
            continue
    return result


@dataclass(frozen=True)
class BrokerIdentity:
    broker_id: str
    service_url: str
    web_service_url: str
    # Named listeners: listener name -> pulsar:// URL (advertised listeners).
    listeners: tuple[tuple[str, str], ...] = ()
    # The TLS URLs ("" without TLS), published in load reports for TLS lookups.
    service_url_tls: str = ""
    web_service_url_tls: str = ""


@dataclass(frozen=True)
class BundleOwner:
    broker_id: str
    service_url: str
    web_service_url: str
    is_self: bool
    releasing: bool = False


def bundle_key(namespace: str, bundle: BundleRange | str) -> str:
    name = bundle if isinstance(bundle, str) else bundle.name
    return f"{namespace}/{name}"


class OwnershipManager:
    def __init__(self, store: MetadataStore, config: BundlesConfig, identity: BrokerIdentity, *,
                 loaded_topics: Callable[[], list[TopicName]],
                 close_topics: Callable[[list[TopicName], str, str | None], Awaitable[None]],
                 preload_topics: Callable[[list[str]], None] | None = None,
                 on_fence: Callable[[], None] | None = None) -> None:
        """``close_topics(names, reason, destination)`` closes loaded topics; a hand-over
        names the broker id the bundle goes to (else None), so that their clients can be
        sent there. ``preload_topics`` is handed the topics a hand-over's assignment
        names once this broker has taken the bundle; it must not block (it starts their
        loads). ``on_fence`` is called when the broker fences itself (not when it
        leaves), before its topics close; it must not block."""
        self._store = store
        self.config = config
        self.identity = identity
        self._loaded_topics = loaded_topics
        self._close_topics = close_topics
        self._preload_topics = preload_topics
        self._on_fence = on_fence
        self.lease: Lease | None = None
        self._owners = PrefixCache(store, keys.BUNDLE_OWNERS, self._on_owner_change)
        self._assignments = PrefixCache(store, keys.BUNDLE_ASSIGNMENTS, self._on_assignment_change)
        self._transfers = PrefixCache(store, keys.BUNDLE_TRANSFERS, self._on_transfer_change)
        self._bundles: dict[str, tuple[Bundles, int]] = {}   # namespace -> (bundles, version)
        # Re-reads of a namespace's boundaries are one at a time per namespace, and a
        # caller waiting for one that started after it noticed the need takes its result.
        self._bundles_locks: dict[str, asyncio.Lock] = {}
        self._bundles_reads_started: dict[str, int] = {}
        self._bundles_reads_done: dict[str, int] = {}
        self._serving: dict[str, float] = {}                 # bundle key -> wall time started
        # bundle key -> the etcd revision from which this broker owns it (its take's, its
        # split's, or its owner record's when serving resumes after a fence): an owner
        # key event at or before it describes the bundle before it was ours.
        self._serving_from: dict[str, int] = {}
        self._busy: set[str] = set()                         # bundle keys with an operation running
        self.fenced = False
        # True while etcd has not confirmed the lease for OUTAGE_NOTICE_FRACTION of the
        # TTL (and the broker is not fenced): loaded topics are served, nothing new.
        self.metadata_degraded = False
        self.outages = 0
        self._changed = asyncio.Event()
        # The lease guard, and one task per watch event acted on (taking, transferring or
        # dropping a bundle; at most one runs per bundle, ``_busy``): cancelled and
        # awaited by close.
        self._tasks = TaskSet("bundle ownership")
        self._closing = False
        # Set by retire (a broker leaving): no bundle taken, the lease not renewed.
        self._retired = False

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.lease = await self._store.grant_lease(self.config.lease_ttl_s)
        await self._owners.start()
        await self._assignments.start()
        await self._transfers.start()
        self._tasks.spawn(self._guard_lease(), name="guard-lease")
        # Assignments that were waiting for us before we watched.
        for record in list(self._assignments.records.values()):
            self._on_assignment_change(record.key, None, record)

    async def close(self) -> None:
        self._closing = True
        await self._tasks.close()
        for cache in (self._owners, self._assignments, self._transfers):
            await cache.close()

    # --- namespaces' bundles ------------------------------------------------------------------

    async def bundles_of(self, namespace: NamespaceName, *, refresh: bool = False) -> Bundles:
        """The namespace's bundles: cached, or read from etcd when not cached yet or
        with ``refresh``."""
        cached = self._bundles.get(str(namespace))
        if cached is not None and not refresh:
            return cached[0]
        return await self._refresh_bundles(namespace)

    async def _refresh_bundles(self, namespace: NamespaceName) -> Bundles:
        """Re-reads the boundaries, sharing a read with concurrent callers: a caller that
        finds another's read in flight waits and then reads itself only if no read
        started after it asked (an earlier one may predate the split it is after)."""
        ns = str(namespace)
        wanted = self._bundles_reads_started.get(ns, 0) + 1
        lock = self._bundles_locks.setdefault(ns, asyncio.Lock())
        async with lock:
            if self._bundles_reads_done.get(ns, 0) >= wanted and ns in self._bundles:
                return self._bundles[ns][0]
            started = self._bundles_reads_started.get(ns, 0) + 1
            self._bundles_reads_started[ns] = started
            bundles, _version = await self._load_bundles(namespace)
            self._bundles_reads_done[ns] = started
            return bundles

    async def _load_bundles(self, namespace: NamespaceName) -> tuple[Bundles, int]:
        key = keys.namespace_bundles(namespace.tenant, namespace.namespace)
        record = await self._store.get(key)
        if record is None:
            if await self._store.get(keys.namespace_policies(namespace.tenant, namespace.namespace)) is None:
                raise NamespaceNotFound(f"namespace {namespace} does not exist")
            fresh = BundlesRecord(default_boundaries(self.config.default_bundles))
            try:
                await self._store.create(key, fresh.encode())
            except MetadataKeyExists:
                pass
            record = await self._store.get(key)
            assert record is not None
        bundles = Bundles(tuple(BundlesRecord.decode(record.value).boundaries))
        self._bundles[str(namespace)] = (bundles, record.version)
        return bundles, record.version

    async def bundle_of(self, topic: TopicName, *, refresh: bool = False) -> tuple[str, BundleRange]:
        """The topic's bundle. ``refresh`` re-reads the boundaries from etcd: the cached
        ones go stale when another broker splits a bundle, and the bundle they name then
        has no owner record, which is when callers ask for a refresh."""
        namespace = topic.namespace_name
        bundles = await self.bundles_of(namespace, refresh=refresh)
        return str(namespace), bundles.for_topic(str(topic))

    # --- who serves what -----------------------------------------------------------------------

    def owner_record(self, namespace: str, bundle: BundleRange | str) -> OwnerRecord | None:
        """The bundle's owner record as this broker's watch last saw it (None: no
        owner, or a record that does not decode)."""
        name = bundle if isinstance(bundle, str) else bundle.name
        record = self._owners.get(keys.bundle_owner(namespace, name))
        if record is None:
            return None
        try:
            return OwnerRecord.decode(record.value)
        except MalformedFrame:
            return None

    def _as_owner(self, record: OwnerRecord) -> BundleOwner:
        return BundleOwner(record.broker_id, record.service_url, record.web_service_url,
                           record.broker_id == self.identity.broker_id, record.state == RELEASING)

    def _destination(self, record: OwnerRecord, broker_urls: Callable[[str], tuple[str, str] | None]
                     ) -> BundleOwner | None:
        urls = broker_urls(record.to)
        if urls is None:
            return None
        return BundleOwner(record.to, urls[0], urls[1], record.to == self.identity.broker_id)

    async def owner_of(self, topic: TopicName, broker_urls: Callable[[str], tuple[str, str] | None]
                       ) -> BundleOwner:
        """The broker a client should talk to for ``topic``: its bundle's owner, or the
        destination of a transfer under way. Waits (bounded) while nobody owns it;
        ServiceNotReady when the owner on record is this broker and it is fenced."""
        namespace, bundle = await self.bundle_of(topic)
        deadline = time.monotonic() + self.config.ownership_wait_s
        refreshed = False
        while True:
            record = self.owner_record(namespace, bundle)
            if record is None and not refreshed:
                # Split elsewhere? Once per call: a bundle that merely waits for its
                # first owner would otherwise cost an etcd read per wake-up.
                namespace, bundle = await self.bundle_of(topic, refresh=True)
                refreshed = True
                record = self.owner_record(namespace, bundle)
            if record is not None:
                if record.state == RELEASING and record.to:
                    destination = self._destination(record, broker_urls)
                    if destination is not None:
                        return destination
                owner = self._as_owner(record)
                if owner.is_self and self.fenced:
                    # Our record may be stale (another broker may hold the bundle by
                    # now): naming ourselves would send the client to a broker that
                    # refuses it, once its topics have closed. Ask again later.
                    raise ServiceNotReady("this broker is fenced (its lease is not confirmed): "
                                          "it cannot name the bundle's owner now")
                return owner
            if time.monotonic() > deadline:
                raise ServiceNotReady(f"bundle {bundle_key(namespace, bundle)} has no owner yet")
            await self._wait_change(deadline)

    async def ensure_serving(self, topic: TopicName) -> None:
        """Returns once this broker serves the topic's bundle; raises NotOwner if another
        broker owns it (or is taking it), ServiceNotReady if fenced or after the wait."""
        deadline = time.monotonic() + self.config.ownership_wait_s
        refreshed = False
        while True:
            if self.fenced:
                raise ServiceNotReady("this broker is fenced (its lease is not confirmed)")
            if self.metadata_degraded:
                # Only topics already loaded are served while etcd is away: loading one
                # needs etcd (its ledgers, cursors). The request waits (bounded) for etcd
                # to answer again rather than being refused at once: a short outage then
                # goes unseen, and some clients never retry a refused SUBSCRIBE or
                # PRODUCER (pulsar-client 3.13's C++ core keeps the refused connection).
                if time.monotonic() > deadline:
                    raise ServiceNotReady("the metadata store is unavailable: only loaded topics are served "
                                          "until it answers")
                await self._wait_change(deadline)
                continue
            namespace, bundle = await self.bundle_of(topic)
            record = self.owner_record(namespace, bundle)
            if record is None and not refreshed:
                namespace, bundle = await self.bundle_of(topic, refresh=True)   # split elsewhere? (once per call)
                refreshed = True
                record = self.owner_record(namespace, bundle)
            key = bundle_key(namespace, bundle)
            if record is not None and record.broker_id == self.identity.broker_id and record.state == OWNED \
                    and key in self._serving:
                return
            coming_here = (record is None and self._assigned_here(namespace, bundle)) or (
                record is not None and record.state == RELEASING and record.to == self.identity.broker_id)
            if record is not None and not coming_here and record.broker_id != self.identity.broker_id:
                raise NotOwner(f"bundle {key} is owned by {record.broker_id}")
            if time.monotonic() > deadline:
                raise ServiceNotReady(f"bundle {key} is not served here yet")
            await self._wait_change(deadline)

    async def is_serving(self, topic: TopicName) -> bool:
        if self.fenced:
            return False
        namespace, bundle = await self.bundle_of(topic)
        return bundle_key(namespace, bundle) in self._serving

    def _assigned_here(self, namespace: str, bundle: BundleRange) -> bool:
        record = self._assignments.get(keys.bundle_assignment(namespace, bundle.name))
        if record is None:
            return False
        try:
            return AssignmentRecord.decode(record.value).broker_id == self.identity.broker_id
        except MalformedFrame:
            return False

    async def _wait_change(self, deadline: float) -> None:
        self._changed.clear()
        try:
            async with asyncio.timeout(max(0.01, min(deadline - time.monotonic(), 0.5))):
                await self._changed.wait()
        except TimeoutError:
            pass

    def serving(self) -> list[str]:
        return sorted(self._serving)

    def owners(self) -> dict[str, str]:
        """bundle key -> owner broker id, for every owned bundle of the cluster."""
        return {bkey: record.broker_id for bkey, record in self.owner_records().items()}

    def owner_records(self) -> dict[str, OwnerRecord]:
        """bundle key -> owner record, for every owned bundle of the cluster, from this
        broker's watch (no etcd read)."""
        return owners_from(self._owners.records.values())

    def pending_assignments(self) -> dict[str, tuple[AssignmentRecord, Record]]:
        """bundle key -> (assignment, its record with the version to compare against),
        from this broker's watch."""
        return assignments_from(self._assignments.records.values())

    def handover_target(self, broker_reports: PrefixCache) -> str | None:
        """Where this broker hands a bundle it gives up (unload, shutdown): the least
        loaded other live broker, by their load reports; None if it is the last one."""
        return balancer.least_loaded(decode_reports(broker_reports.records.values()), self.owners(),
                                     exclude={self.identity.broker_id})

    # --- watch events ---------------------------------------------------------------------------

    def _on_owner_change(self, key: str, old: Record | None, new: Record | None) -> None:
        self._changed.set()
        namespace, bundle = keys.split_bundle_key(key, keys.BUNDLE_OWNERS)
        bkey = bundle_key(namespace, bundle)
        mine = False
        if new is not None:
            try:
                mine = OwnerRecord.decode(new.value).broker_id == self.identity.broker_id
            except MalformedFrame:
                pass
        # The revision of the change: a put's own, a deletion's the mirror's (set to the
        # event's revision, or to a reload's, before listeners are told).
        revision = new.version if new is not None else self._owners.revision
        if bkey in self._serving and not mine and revision <= self._serving_from.get(bkey, 0):
            # A change from before we owned the bundle: the owner keys' watch is a
            # stream of its own, and may tell of the previous owner's RELEASING record,
            # or of its deletion, after our take's transaction has answered. Taken for
            # our key vanishing, it stopped the new owner while its key lived on under
            # its lease: "not served here yet" until the clients gave up.
            log.info("owner key change from before this broker took the bundle, ignored: bundle=%s revision=%d "
                     "owned_from=%d", bkey, revision, self._serving_from[bkey])
            return
        if bkey in self._serving and not mine and bkey not in self._busy and not self._closing:
            # Our key vanished or changed hands without us releasing it (lease expired,
            # an operator deleted it): stop serving at once.
            self._tasks.spawn(self._stop_serving(namespace, bundle, "owner key lost"),
                              name=f"stop-serving {bkey}")

    def _on_assignment_change(self, key: str, old: Record | None, new: Record | None) -> None:
        self._changed.set()
        if new is None or self._closing or self._retired:
            return
        try:
            assignment = AssignmentRecord.decode(new.value)
        except MalformedFrame:
            return
        if assignment.broker_id != self.identity.broker_id:
            return
        namespace, bundle = keys.split_bundle_key(key, keys.BUNDLE_ASSIGNMENTS)
        self._tasks.spawn(self._take(namespace, bundle, new), name=f"take {namespace}/{bundle}")

    def _on_transfer_change(self, key: str, old: Record | None, new: Record | None) -> None:
        if new is None or self._closing:
            return
        namespace, bundle = keys.split_bundle_key(key, keys.BUNDLE_TRANSFERS)
        try:
            transfer = TransferRecord.decode(new.value)
        except MalformedFrame:
            return
        me = self.identity.broker_id
        if transfer.to == me:
            return
        if transfer.source:
            if transfer.source != me:
                # Meant for the broker we took the bundle from (its watch delivered the
                # record later than the owner key we wrote): theirs to act on and delete.
                return
            # Addressed to us: acted on even if our mirror of the owner keys lags the
            # transfer watch; release() reads the owner key from etcd and refuses if the
            # bundle is not ours, and the record goes either way.
        else:
            # Written before records named a source: acted on by the owner we see.
            record = self.owner_record(namespace, bundle)
            if record is None or record.broker_id != me:
                return
        self._tasks.spawn(self._transfer_requested(namespace, bundle, transfer, new),
                          name=f"transfer {namespace}/{bundle}")

    # --- taking a bundle ---------------------------------------------------------------------------

    async def _take(self, namespace: str, bundle_name: str, assignment: Record) -> None:
        bkey = bundle_key(namespace, bundle_name)
        if bkey in self._busy or self.fenced or self.lease is None:
            return
        self._busy.add(bkey)
        try:
            tenant, ns = namespace.split("/", 1)
            bundles, _version = await self._load_bundles(NamespaceName(tenant, ns))
            owner_key = keys.bundle_owner(namespace, bundle_name)
            assignment_key = keys.bundle_assignment(namespace, bundle_name)
            if BundleRange.parse(bundle_name) not in bundles.ranges:
                # Split meanwhile: the assignment is stale.
                await self._store.transaction([Compare(assignment_key, assignment.version)], [Delete(assignment_key)])
                return
            record = OwnerRecord(self.identity.broker_id, self.identity.service_url, self.identity.web_service_url,
                                 acquired_ms=int(time.time() * 1000))
            taken = await self._store.transaction(
                [Compare(owner_key, 0), Compare(assignment_key, assignment.version)],
                [Put(owner_key, record.encode(), self.lease.lease_id), Delete(assignment_key)])
            if taken is None:
                return
            self._start_serving(namespace, bundle_name, taken)
            topics = _handed_over_topics(assignment)
            if topics and self._preload_topics is not None:
                self._preload_topics(topics)
        except MagnetarError as error:
            log.warning("taking a bundle failed: bundle=%s error=%s", bkey, error)
        finally:
            self._busy.discard(bkey)
            self._changed.set()

    def _start_serving(self, namespace: str, bundle_name: str, revision: int) -> None:
        # A bundle is served only while its owner key lives under this broker's lease
        # (one owner per bundle per lease): taken by a compare-and-swap under the lease, or
        # found ours again when the lease is confirmed after an outage. ``revision``: the
        # etcd revision at which the key was ours.
        assert self.lease is not None, "serving a bundle with no lease"
        bkey = bundle_key(namespace, bundle_name)
        self._serving[bkey] = time.time()
        self._serving_from[bkey] = revision
        log.info("bundle serving started: bundle=%s broker_id=%s wall_time=%.6f", bkey, self.identity.broker_id,
                 self._serving[bkey])

    async def _stop_serving(self, namespace: str, bundle_name: str, reason: str,
                            destination: str | None = None) -> list[TopicName]:
        """Closes the bundle's topics and stops serving it (idempotent); the topics it
        closed (none if it was not serving the bundle)."""
        bkey = bundle_key(namespace, bundle_name)
        if bkey not in self._serving:
            return []
        self._serving.pop(bkey, None)
        self._serving_from.pop(bkey, None)
        self._changed.set()
        topics = self._topics_by_bundle([bkey]).get(bkey, [])
        await self._close_bundle_topics(bkey, topics, reason, destination)
        return topics

    async def _stop_serving_all(self, reason: str) -> None:
        """Stops serving every bundle: all leave ``_serving`` at once, before any await,
        so nothing is served from here on; then their topics close concurrently (at
        most FENCE_CLOSES_CONCURRENT_MAX bundles at a time)."""
        stopping = list(self._serving)
        self._serving.clear()
        self._serving_from.clear()
        self._changed.set()
        topics = self._topics_by_bundle(stopping)
        slots = asyncio.Semaphore(FENCE_CLOSES_CONCURRENT_MAX)

        async def close(bkey: str) -> None:
            async with slots:
                await self._close_bundle_topics(bkey, topics.get(bkey, []), reason)

        results = await asyncio.gather(*(close(bkey) for bkey in stopping), return_exceptions=True)
        for bkey, result in zip(stopping, results):
            if isinstance(result, MagnetarError):
                log.warning("closing a bundle's topics failed: bundle=%s error=%s", bkey, result)
            elif isinstance(result, BaseException):
                raise result

    async def _close_bundle_topics(self, bkey: str, topics: list[TopicName], reason: str,
                                   destination: str | None = None) -> None:
        # The bundle stopped being served when its topics' closes began: each close
        # tells the topic's producers first, before any await, so nothing is accepted
        # for the bundle from here on; what was accepted before may still be
        # acknowledged while the close waits for it (an old owner's in-flight
        # appends, which fencing of its ledgers bounds). The line says both times.
        # Logged before the close, which may hang on etcd or the bookies (a close that
        # never ended left no line at all: make partitions).
        began = time.time()
        log.info("bundle serving stopped: bundle=%s broker_id=%s reason=%s wall_time=%.6f", bkey,
                 self.identity.broker_id, reason, began)
        try:
            await self._close_topics(topics, reason, destination)
        finally:
            log.info("bundle topics closed: bundle=%s broker_id=%s seconds=%.3f", bkey, self.identity.broker_id,
                     time.time() - began)

    def _topics_by_bundle(self, bundle_keys: list[str]) -> dict[str, list[TopicName]]:
        """The loaded topics of each of the given bundles, in one pass."""
        index = BundleIndex(bundle_keys)
        result: dict[str, list[TopicName]] = {}
        for topic in self._loaded_topics():
            bkey = index.find(str(topic))
            if bkey is not None:
                result.setdefault(bkey, []).append(topic)
        return result

    # --- handing a bundle over ----------------------------------------------------------------------

    async def _transfer_requested(self, namespace: str, bundle_name: str, transfer: TransferRecord,
                                  record: Record) -> None:
        try:
            await self.release(namespace, bundle_name, to=transfer.to or None, reason=transfer.reason or "shedding")
        except MagnetarError as error:
            log.warning("transfer failed: bundle=%s to=%s error=%s", bundle_key(namespace, bundle_name),
                        transfer.to, error)
        finally:
            try:
                await self._store.transaction([Compare(record.key, record.version)], [Delete(record.key)])
            except MagnetarError:
                pass

    async def release(self, namespace: str, bundle_name: str, *, to: str | None, reason: str) -> None:
        """Hands a bundle this broker owns to ``to`` (or frees it for the leader).

        Once the owner record says RELEASING and the topics are closed, the bundle must
        leave this broker whatever etcd does: the final transaction is retried
        (RELEASE_ATTEMPTS_MAX), and if it still fails the owner key is deleted without
        the hand-over, so the leader assigns the bundle anew. Left in place, the key
        would stay RELEASING under our lease (kept alive) with nobody serving the
        bundle and the leader never reassigning it."""
        bkey = bundle_key(namespace, bundle_name)
        owner_key = keys.bundle_owner(namespace, bundle_name)
        # Read from etcd, not the watched mirror: a bundle this broker has just made (the
        # halves of a split) may not have reached the mirror yet, and the version is
        # compared below anyway. A release is rare; one read is cheap.
        current = await self._store.get(owner_key)
        if current is None or OwnerRecord.decode(current.value).broker_id != self.identity.broker_id:
            raise PreconditionFailed(f"bundle {bkey} is not owned by this broker")
        if bkey in self._busy:
            raise PreconditionFailed(f"bundle {bkey} is busy with another operation")
        if to == self.identity.broker_id:
            raise PreconditionFailed(f"bundle {bkey} is already owned by {to}")
        assert self.lease is not None
        self._busy.add(bkey)
        started = time.monotonic()
        try:
            owned = OwnerRecord.decode(current.value)
            releasing = OwnerRecord(owned.broker_id, owned.service_url, owned.web_service_url, RELEASING,
                                    to or "", owned.acquired_ms)
            version = await self._mark_releasing(owner_key, current.version, releasing)
            if version is None:
                raise PreconditionFailed(f"bundle {bkey} changed while being released")
            closed = await self._stop_serving(namespace, bundle_name, f"released: {reason}", to)
            operations: list[Put | Delete] = [Delete(owner_key)]
            if to:
                assignment = AssignmentRecord(to, reason=f"transfer from {self.identity.broker_id}: {reason}",
                                              decided_by=self.identity.broker_id, decided_ms=int(time.time() * 1000),
                                              topics=[str(topic) for topic in closed[:HANDOVER_TOPICS_MAX]])
                operations.append(Put(keys.bundle_assignment(namespace, bundle_name), assignment.encode(),
                                      self.lease.lease_id))
            await self._finish_release(bkey, owner_key, version, operations)
            log.info("bundle released: bundle=%s to=%s reason=%s seconds=%.3f", bkey, to, reason,
                     time.monotonic() - started)
        finally:
            self._busy.discard(bkey)
            self._changed.set()

    async def _mark_releasing(self, owner_key: str, version: int, releasing: OwnerRecord) -> int | None:
        """Writes the RELEASING record; its new version, or None if the key changed. A
        write whose reply was lost is recognised by reading the key back."""
        assert self.lease is not None
        try:
            return await self._store.transaction([Compare(owner_key, version)],
                                                 [Put(owner_key, releasing.encode(), self.lease.lease_id)])
        except MagnetarError:
            record = await self._store.get(owner_key)
            if record is not None and record.value == releasing.encode():
                return record.version   # it landed; lookups already answer the destination
            raise

    async def _finish_release(self, bkey: str, owner_key: str, version: int, operations: list[Put | Delete]) -> None:
        """The last step of a release: the owner key goes (and the destination's
        assignment comes) in one transaction, retried; then without the assignment."""
        for attempt in range(RELEASE_ATTEMPTS_MAX):
            try:
                done = await self._store.transaction([Compare(owner_key, version)], operations)
            except MagnetarError as error:
                log.warning("finishing a bundle release failed: bundle=%s attempt=%d error=%s", bkey, attempt + 1,
                            error)
                await asyncio.sleep(RELEASE_RETRY_S * (attempt + 1))
                continue
            if done is None:
                # Only this broker writes the key at ``version`` (the lease holds it), so
                # it is gone: an earlier attempt landed though its reply was lost, or the
                # lease expired. Either way it is not ours to delete any more.
                log.warning("bundle owner key changed before the release finished: bundle=%s", bkey)
            return
        log.error("bundle release could not hand the bundle over, deleting its owner key for the leader to "
                  "reassign: bundle=%s attempts=%d", bkey, RELEASE_ATTEMPTS_MAX)
        # Guarded by the version all the same: were the key someone else's by now (our
        # lease expired and the leader gave the bundle away), deleting it would drop a
        # live owner.
        done = await self._store.transaction([Compare(owner_key, version)], [Delete(owner_key)])
        if done is None:
            log.warning("bundle owner key changed before the release finished: bundle=%s", bkey)

    async def release_all(self, choose_destination: Callable[[str], str | None]) -> None:
        """Hands every bundle over (graceful shutdown); each to the broker chosen."""
        for bkey in list(self._serving):
            namespace, _, bundle_name = bkey.rpartition("/")
            try:
                await self.release(namespace, bundle_name, to=choose_destination(bkey), reason="shutdown")
            except MagnetarError as error:
                log.warning("releasing a bundle at shutdown failed: bundle=%s error=%s", bkey, error)

    def stop_taking(self) -> None:
        """The broker begins to leave: no bundle assigned to it from now on is taken
        (the leader moves such assignments on once its load report is gone)."""
        self._retired = True

    async def retire(self) -> None:
        """After ``release_all``, as the broker leaves: it takes no more bundles and its
        lease is revoked (a key it still holds goes with it) and never renewed."""
        self._retired = True
        if self.lease is not None:
            await self._store.revoke_lease(self.lease)

    # --- splitting --------------------------------------------------------------------------------------

    async def split(self, namespace: NamespaceName, bundle_name: str) -> tuple[str, str]:
        """Splits an owned bundle in two, both halves staying here; returns their names."""
        ns = str(namespace)
        bkey = bundle_key(ns, bundle_name)
        owner_key = keys.bundle_owner(ns, bundle_name)
        current = self._owners.get(owner_key)
        if current is None or OwnerRecord.decode(current.value).broker_id != self.identity.broker_id \
                or bkey not in self._serving:
            raise PreconditionFailed(f"bundle {bkey} is not served by this broker")
        assert self.lease is not None
        self._busy.add(bkey)
        try:
            bundles, version = await self._load_bundles(namespace)
            bundle = BundleRange.parse(bundle_name)
            split = bundles.with_split(bundle)
            low, high = bundle.split()
            owned = OwnerRecord.decode(current.value)
            half = OwnerRecord(owned.broker_id, owned.service_url, owned.web_service_url, OWNED, "",
                               int(time.time() * 1000))
            bundles_key = keys.namespace_bundles(namespace.tenant, namespace.namespace)
            done = await self._store.transaction(
                [Compare(bundles_key, version), Compare(owner_key, current.version),
                 Compare(keys.bundle_owner(ns, low.name), 0), Compare(keys.bundle_owner(ns, high.name), 0)],
                [Put(bundles_key, BundlesRecord(list(split.boundaries)).encode()), Delete(owner_key),
                 Put(keys.bundle_owner(ns, low.name), half.encode(), self.lease.lease_id),
                 Put(keys.bundle_owner(ns, high.name), half.encode(), self.lease.lease_id)])
            if done is None:
                raise PreconditionFailed(f"bundle {bkey} or its namespace changed during the split")
            self._bundles[ns] = (split, done)
            started = self._serving.pop(bkey)
            self._serving_from.pop(bkey, None)
            for half_key in (bundle_key(ns, low), bundle_key(ns, high)):
                self._serving[half_key] = started
                self._serving_from[half_key] = done
            log.info("bundle split: bundle=%s halves=%s,%s broker_id=%s", bkey, low.name, high.name,
                     self.identity.broker_id)
            return low.name, high.name
        finally:
            self._busy.discard(bkey)
            self._changed.set()

    # --- lease guard (self-fencing) ------------------------------------------------------------------

    async def _guard_lease(self) -> None:
        ttl = self.config.lease_ttl_s
        while not self._closing:
            # Often enough that the fence comes at most GUARD_INTERVAL_S_MAX after
            # fence_after_s, well before etcd could expire the lease.
            await asyncio.sleep(min(ttl / 20, GUARD_INTERVAL_S_MAX))
            lease = self.lease
            if lease is None:
                continue
            unconfirmed_s = time.monotonic() - lease.refreshed_at
            stale = unconfirmed_s > self.config.fence_after_s
            self._note_outage(unconfirmed_s > ttl * OUTAGE_NOTICE_FRACTION and not lease.is_lost, unconfirmed_s)
            if (stale or lease.is_lost) and not self.fenced:
                self.fenced = True
                if self._retired:
                    log.info("lease revoked as the broker leaves: broker_id=%s", self.identity.broker_id)
                else:
                    log.error("lease not confirmed for %.1fs, stopping to serve every bundle: broker_id=%s",
                              time.monotonic() - lease.refreshed_at, self.identity.broker_id)
                    if self._on_fence is not None:
                        self._on_fence()
                await self._stop_serving_all("lease not confirmed")
            if self._retired:
                continue          # leaving: no new lease, no serving again
            if self.fenced and lease.is_lost:
                await self._renew_lease()
            elif self.fenced and not stale:
                # The lease survived: serve again what our live keys still own.
                self.fenced = False
                log.warning("lease confirmed again, serving resumes: broker_id=%s", self.identity.broker_id)
                for key, record in list(self._owners.records.items()):
                    namespace, bundle_name = keys.split_bundle_key(key, keys.BUNDLE_OWNERS)
                    try:
                        owner = OwnerRecord.decode(record.value)
                    except MalformedFrame:
                        continue
                    if owner.broker_id == self.identity.broker_id and owner.state == OWNED:
                        self._start_serving(namespace, bundle_name, record.version)
                self._changed.set()

    def _note_outage(self, unconfirmed: bool, unconfirmed_s: float) -> None:
        """Enters or leaves the metadata-degraded state (logged once each way)."""
        if unconfirmed and not self.metadata_degraded:
            self.metadata_degraded = True
            self.outages += 1
            log.warning("etcd has not confirmed the lease for %.1fs: serving loaded topics only, no new topics or "
                        "ownership changes until it answers (fence at %.1fs): broker_id=%s bundles=%d",
                        unconfirmed_s, self.config.fence_after_s,
                        self.identity.broker_id, len(self._serving))
        elif not unconfirmed and self.metadata_degraded:
            self.metadata_degraded = False
            log.warning("etcd confirms the lease again, metadata outage over: broker_id=%s bundles=%d",
                        self.identity.broker_id, len(self._serving))
            self._changed.set()

    async def _renew_lease(self) -> None:
        old = self.lease
        try:
            self.lease = await self._store.grant_lease(self.config.lease_ttl_s)
        except MagnetarError as error:
            log.warning("granting a new lease failed: error=%s", error)
            return
        self.fenced = False
        log.warning("new lease granted after losing the old one: broker_id=%s lease_id=%x", self.identity.broker_id,
                    self.lease.lease_id)
        if old is not None:
            # "Lost" is this broker's view (no confirmation for a TTL); etcd may still
            # hold the old lease (a new etcd leader extends every lease), and with it
            # this broker's owner keys and perhaps the leader key, for up to a TTL more,
            # during which nobody can be given those bundles though nobody serves them
            # (found by the hosts harness: 11 s more of stall after an etcd majority
            # loss). Nothing is served under it any more (fenced before), so it goes now.
            try:
                await self._store.revoke_lease(old)
                log.info("old lease revoked: broker_id=%s lease_id=%x", self.identity.broker_id, old.lease_id)
            except MagnetarError as error:
                log.warning("revoking the old lease failed (it expires by itself): lease_id=%x error=%s",
                            old.lease_id, error)
        self._changed.set()
