"""One seeded simulation run: a writer (the real ``WriteHandle``) adds entries to a
ledger on 5 simulated bookies while the fault plan drops, delays (and so reorders)
messages, partitions the writer from bookies, crashes and restarts bookies (torn
journal tails, fsync errors); then the writer either closes the ledger or vanishes,
the faults heal, and a second client recovers the ledger (the real ``recover_ledger``:
fence, read forward, re-replicate, close) and reads it (the real ``LedgerReader``).

Checkers, after the run:
- every acknowledged entry is readable, with a valid digest and the payload written;
- the writer's last_add_confirmed never went backwards, nor any bookie's (per ledger,
  across restarts);
- the recovered (closed) ledger ends at or after the last acknowledged entry;
- replicas agree: every copy of an entry on any bookie is the same bytes, and each
  entry up to the end is on at least Qa bookies of its write set.

``run_seed(seed)`` returns a ``SimResult`` whose ``trace`` is a digest of the run's
events with their virtual times (faults, crashes, restarts, the writer's and the
recovery's outcomes; the same seed gives the same trace, in any process and under any
PYTHONHASHSEED) and whose ``violations`` name what broke.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from dataclasses import dataclass, field

from common.entry import verify_entry
from common.errors import MagnetarError
from ledger import quorum, recovery
from ledger.client import LedgerClient
from ledger.config import LedgerClientConfig
from ledger.quorum import write_set
from metadata import keys
from metadata.bookie_record import BookieRecord
from metadata.memory_store import MemoryStore
from tests.sim.bookie import JournalFaults, SimBookie
from tests.sim.clock import run_virtual
from tests.sim.network import NetworkFaults, SimPool

BOOKIE_COUNT = 5
QUORUMS = [(3, 2, 2), (3, 3, 2), (3, 2, 1), (4, 3, 2), (5, 3, 2), (2, 2, 2)]


@dataclass
class SimResult:
    seed: int
    violations: list[str] = field(default_factory=list)
    trace: str = ""
    acked: int = 0
    last_entry_id: int = -1
    crashes: int = 0
    faults: int = 0
    virtual_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


def _client(name: str, store: MemoryStore, bookies: dict[str, SimBookie], faults: NetworkFaults,
            config: LedgerClientConfig, rng: random.Random) -> LedgerClient:
    client = LedgerClient(store, config, rng=rng)
    pool = SimPool(name, bookies, faults, config)
    client.pool = pool          # the port: simulated bookie clients instead of gRPC
    client.context.pool = pool  # type: ignore[assignment]
    return client


async def _scenario(seed: int, result: SimResult) -> None:
    rng = random.Random(seed)
    events: list[str] = []
    loop = asyncio.get_running_loop()

    def event(text: str) -> None:
        events.append(f"{loop.time():.6f} {text}")

    plan_rng = random.Random(rng.getrandbits(64))
    net = NetworkFaults(random.Random(rng.getrandbits(64)), drop_rate=rng.choice([0.0, 0.002, 0.01, 0.03]),
                        delay_spike_rate=rng.choice([0.0, 0.01, 0.05]))
    journal_faults = JournalFaults(random.Random(rng.getrandbits(64)),
                                   fsync_error_rate=rng.choice([0.0, 0.0, 0.001, 0.005]))
    store = MemoryStore()
    bookies: dict[str, SimBookie] = {}

    def on_crash(bookie: SimBookie, why: str) -> None:
        event(f"crash {bookie.bookie_id} ({why})")
        bookie.crash(torn=plan_rng.random() < 0.5)
        result.crashes += 1
        loop.call_later(plan_rng.uniform(0.1, 3.0), restart, bookie)

    def restart(bookie: SimBookie) -> None:
        if not bookie.up:
            bookie.start()
            event(f"restart {bookie.bookie_id} torn_bytes={bookie.torn_bytes}")

    for index in range(BOOKIE_COUNT):
        bookie_id = f"bookie-{index}"
        bookie = bookies[bookie_id] = SimBookie(bookie_id, random.Random(rng.getrandbits(64)), journal_faults,
                                                on_crash)
        bookie.start()
        record = BookieRecord(bookie_id, bookie_id, bookie_id, False, 10**12, 2 * 10**12, 0.5, "sim", 0)
        await store.put(keys.bookie(bookie_id), record.encode())

    config = LedgerClientConfig(add_timeout_s=2.0, read_timeout_s=2.0, control_timeout_s=2.0,
                                metadata_attempts_max=64)
    writer = _client("writer", store, bookies, net, config, random.Random(rng.getrandbits(64)))
    await writer.start()
    ensemble_size, write_quorum, ack_quorum = rng.choice(QUORUMS)
    handle = await writer.create_ledger(ensemble_size, write_quorum, ack_quorum)
    ledger_id = handle.ledger_id
    event(f"ledger {ledger_id} E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}")

    # The fault plan: events at random virtual times while the writer runs.
    horizon_s = 20.0
    fault_count = rng.randrange(0, 8)
    bookie_ids = sorted(bookies)
    for _ in range(fault_count):
        at = plan_rng.uniform(0.0, horizon_s)
        kind = plan_rng.choice(["crash", "crash", "partition", "pause"])
        target = plan_rng.choice(bookie_ids)
        duration = plan_rng.uniform(0.2, 6.0)
        if kind == "crash":
            loop.call_later(at, lambda b=bookies[target]: b.up and on_crash(b, "planned"))
        elif kind == "partition":
            loop.call_later(at, lambda t=target: (net.partitioned.add(("writer", t)), event(f"partition {t}")))
            loop.call_later(at + duration, lambda t=target: net.partitioned.discard(("writer", t)))
        else:   # a paused bookie (SIGSTOP-like): a short partition, nothing answered for a while
            loop.call_later(at, lambda t=target: net.partitioned.add(("writer", t)))
            loop.call_later(at + min(duration, 1.5), lambda t=target: net.partitioned.discard(("writer", t)))
        result.faults += 1

    # The writer: entries in a window, acknowledgements recorded in order.
    payloads: dict[int, bytes] = {}
    acked: list[int] = []
    lac_seen = [-1]
    entry_count = rng.randrange(10, 120)
    window = asyncio.Semaphore(rng.choice([1, 4, 16, 64]))

    def on_ack(future: asyncio.Future[int]) -> None:
        window.release()
        if future.cancelled() or future.exception() is not None:
            return
        acked.append(future.result())
        if handle.last_add_confirmed < lac_seen[0]:
            result.violations.append(f"writer last_add_confirmed went from {lac_seen[0]} to "
                                     f"{handle.last_add_confirmed}")
        lac_seen[0] = max(lac_seen[0], handle.last_add_confirmed)

    writer_crashes = rng.random() < 0.4
    stop_after = rng.randrange(1, entry_count + 1) if writer_crashes else entry_count
    for index in range(stop_after):
        await window.acquire()
        if handle.failure is not None:
            window.release()
            break
        payload = f"{seed}:{index}:".encode() * rng.randrange(1, 20)
        try:
            future = await handle.submit(payload)
        except MagnetarError as error:
            window.release()
            event(f"submit failed {error.code}")
            break
        payloads[index] = payload
        future.add_done_callback(on_ack)
        if rng.random() < 0.2:
            await asyncio.sleep(rng.uniform(0.0, 0.2))
    if writer_crashes:
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        event(f"writer vanishes acked={len(acked)}")
    else:
        try:
            async with asyncio.timeout(120):
                await handle.close()
            event(f"writer closed acked={len(acked)}")
        except (MagnetarError, TimeoutError) as error:
            event(f"writer close failed {type(error).__name__}")

    # Heal: faults stop, every bookie comes back, then recovery by another client.
    await asyncio.sleep(max(0.0, horizon_s + 6.0 - loop.time()))
    net.enabled = False
    net.partitioned.clear()
    journal_faults._fsync_error_rate = 0.0
    for bookie in bookies.values():
        restart(bookie)
    last_acked = max(acked, default=-1)
    if sorted(acked) != list(range(len(acked))):
        result.violations.append(f"acknowledgements not a prefix of entry ids: {sorted(acked)[:10]}...")

    reader_client = _client("recoverer", store, bookies, net, config, random.Random(rng.getrandbits(64)))
    await reader_client.start()
    recovered = None
    for attempt in range(5):
        try:
            recovered = await reader_client.open_ledger(ledger_id, recovery=True)
            break
        except MagnetarError as error:
            event(f"recovery attempt {attempt} failed {error.code}")
            await asyncio.sleep(1.0)
    if recovered is None:
        result.violations.append("recovery never succeeded after the faults healed")
        return
    metadata = recovered.metadata
    result.last_entry_id = metadata.last_entry_id
    result.acked = len(acked)
    event(f"recovered last_entry_id={metadata.last_entry_id} fragments={len(metadata.fragments)}")
    if metadata.last_entry_id < last_acked:
        result.violations.append(f"recovered ledger ends at {metadata.last_entry_id}, before the last "
                                 f"acknowledged entry {last_acked}")
    if metadata.last_entry_id >= 0:
        try:
            entries = await recovered.read(0, metadata.last_entry_id)
        except MagnetarError as error:
            result.violations.append(f"reading 0..{metadata.last_entry_id} failed: {error}")
            entries = []
        for entry in entries:
            expected = payloads.get(entry.entry_id)
            if entry.entry_id in acked and bytes(entry.payload) != expected:
                result.violations.append(f"entry {entry.entry_id} payload differs from what was written")
    # Replicas agree, and Qa copies of every entry up to the end.
    for entry_id in range(metadata.last_entry_id + 1):
        copies = {}
        for bookie in bookies.values():
            assert bookie.storage is not None
            data = bookie.storage.entry(ledger_id, entry_id)
            if data is not None:
                verify_entry(data)
                copies[bookie.bookie_id] = data
        if len(set(copies.values())) > 1:
            result.violations.append(f"entry {entry_id}: replicas differ on {sorted(copies)}")
        ensemble = metadata.ensemble_for(entry_id)
        holders = [ensemble[i] for i in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
                   if ensemble[i] in copies]
        if len(holders) < metadata.ack_quorum_size:
            result.violations.append(f"entry {entry_id}: on {holders} of its write set, fewer than "
                                     f"Qa={metadata.ack_quorum_size}")
    for bookie in bookies.values():
        bookie.check_last_add_confirmed()
        result.violations.extend(bookie.violations)
    result.trace = hashlib.sha256("\n".join(events).encode()).hexdigest()[:16]
    result.virtual_s = loop.time()
    await writer.close()
    await reader_client.close()


@contextlib.contextmanager
def injected_bug(name: str | None):
    """Deliberate bugs the checkers must catch (tests/sim/test_simulation.py):
    ``recovery-skips-last``: ledger recovery forgets the last entry it found, so it
    closes the ledger one entry early. ``ack-one-short``: the writer's ack tracker
    completes an entry one acknowledgement short of Qa."""
    if name is None:
        yield
        return
    if name == "ack-one-short":
        original_complete = quorum.AckTracker.complete

        def complete_one_short(self, limit_entry_id=None):
            saved = self.ack_quorum_size
            self.ack_quorum_size = max(1, saved - 1)
            try:
                return original_complete(self, limit_entry_id)
            finally:
                self.ack_quorum_size = saved

        quorum.AckTracker.complete = complete_one_short
        try:
            yield
        finally:
            quorum.AckTracker.complete = original_complete
        return
    assert name == "recovery-skips-last", name
    original = recovery._read_window

    async def skipping(context, metadata, entry_ids):
        decided = await original(context, metadata, entry_ids)
        found = [entry_id for entry_id, data in decided.items() if data is not None]
        if found and any(data is None for data in decided.values()):
            decided[max(found)] = None   # the ledger "ends" before its last entry
        return decided

    recovery._read_window = skipping
    try:
        yield
    finally:
        recovery._read_window = original


def run_seed(seed: int, bug: str | None = None) -> SimResult:
    result = SimResult(seed)
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)   # the code under test logs every fault it meets
    try:
        with injected_bug(bug):
            run_virtual(_scenario(seed, result))
    except Exception as error:   # a crash of the code under test is a finding too
        result.violations.append(f"simulation raised {type(error).__name__}: {error!r}")
    finally:
        logging.disable(previous)
    return result


def replay_command(seed: int, bug: str | None = None) -> str:
    extra = f" --bug {bug}" if bug else ""
    return f"PYTHONHASHSEED=0 .venv/bin/python -m tests.sim.run --seed {seed}{extra}"
