"""The client side of tests/hosts/test_etcd_cut.py, run as its own process inside a host's
network namespace (``python -m tests.hosts.etcd_cut_client <metadata url>``): an
EtcdStore (with its lease thread), and on it a broker's ownership manager, load reporter
and leader, as a broker has them.

It talks to the test over stdin/stdout, one JSON object a line:
- it prints ``{"event": "ready"}`` once everything runs against a reachable etcd;
- on ``cut`` (the test has blackholed etcd) it calls every store operation again and
  again for ``CUT_S``, each call watched by a deadline of its own well past the store's
  call timeout, and prints ``{"event": "cut", ...}``: how many calls, how they failed,
  the ones that outlived their bound (``hangs``) or failed with anything but a
  MagnetarError (``foreign``: callers catch only those);
- on ``heal`` it waits until every operation succeeds again and both loops have had a
  good round since the heal, bounded by ``HEAL_S``, and prints ``{"event": "healed", ...}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from bundles.config import BundlesConfig
from bundles.leader import Leader
from bundles.load import LoadReporter
from bundles.ownership import BrokerIdentity, OwnershipManager
from common.errors import MagnetarError, MetadataKeyExists
from metadata import keys
from metadata.etcd_store import EtcdStore, parse_metadata_url
from metadata.prefix_cache import PrefixCache
from metadata.store import Compare, Put

CALL_TIMEOUT_S = 2.0
# A call that has not ended this long after it began outlived its bound: a hang.
HANG_S = CALL_TIMEOUT_S + 3.0
CUT_S = 20.0       # longer than gRPC's keep-alive (10 s + 5 s) kills the connection after
HEAL_S = 20.0


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def read_line() -> str:
    return (await asyncio.to_thread(sys.stdin.readline)).strip()


def operations(store: EtcdStore, lease_box: list):
    counter = iter(range(10**9))

    async def get():
        await store.get("/cut/key")

    async def get_prefix():
        await store.get_prefix("/cut/")

    async def put():
        await store.put("/cut/key", b"v")

    async def leased_put():
        await store.put("/cut/leased", b"v", lease=lease_box[0])

    async def transaction():
        await store.transaction([Compare("/cut/txn", 0)], [Put(f"/cut/txn-{next(counter)}", b"v")])

    async def create():
        try:
            await store.create(f"/cut/created-{next(counter)}", b"v")
        except MetadataKeyExists:
            pass

    async def delete():
        await store.delete(f"/cut/created-{next(counter)}")

    async def grant():
        lease = await store.grant_lease(4)
        await store.revoke_lease(lease)

    return {"get": get, "get_prefix": get_prefix, "put": put, "leased_put": leased_put,
            "transaction": transaction, "create": create, "delete": delete, "grant": grant}


def note_foreign(stats: dict, name: str, error: str) -> None:
    stats["foreign_count"] += 1
    if len(stats["foreign"]) < 5:
        stats["foreign"].append({"op": name, "error": error})


async def hammer(name: str, operation, until: float, stats: dict) -> None:
    """Calls ``operation`` until ``until``; each call is a task watched by HANG_S, so a
    hang is seen (and counted) instead of stopping this loop."""
    while time.monotonic() < until:
        started = time.monotonic()
        task = asyncio.ensure_future(operation())
        done, _ = await asyncio.wait({task}, timeout=HANG_S)
        elapsed = time.monotonic() - started
        stats["calls"] += 1
        if not done:
            stats["hangs"].append({"op": name, "at_s": round(started - stats["t0"], 1)})
            task.cancel()
            continue       # left to end by itself: a hang must not stop the count
        if task.cancelled():
            # Nobody cancelled it: a cancellation out of the store is a foreign error
            # (a caller takes it for its own and ends without a word).
            note_foreign(stats, name, "CancelledError")
            continue
        error = task.exception()
        if error is None:
            stats["ok"] += 1
        elif isinstance(error, MagnetarError):
            stats["failed"][type(error).__name__] = stats["failed"].get(type(error).__name__, 0) + 1
        else:
            note_foreign(stats, name, repr(error)[:200])
        stats["max_s"] = max(stats["max_s"], round(elapsed, 2))
        await asyncio.sleep(0.05)


async def main(url: str) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_metadata_url(url)
    from dataclasses import replace
    store = EtcdStore(replace(config, call_timeout_s=CALL_TIMEOUT_S))
    bundles_config = BundlesConfig(lease_ttl_s=6, report_interval_s=0.5, leader_interval_s=0.3,
                                  round_timeout_s=8)
    identity = BrokerIdentity("cut-broker", "pulsar://127.0.0.1:6650", "http://127.0.0.1:8080")

    async def close_topics(names, reason, destination):
        return None

    ownership = OwnershipManager(store, bundles_config, identity, loaded_topics=list, close_topics=close_topics)
    brokers = PrefixCache(store, keys.BROKERS)
    reporter = LoadReporter(store, bundles_config, ownership, lambda: ({}, 0))
    leader = Leader(store, bundles_config, identity, lambda: ownership.lease, brokers, ownership=ownership)
    await brokers.start()
    await ownership.start()
    await reporter.publish()
    await leader.start()
    reporter_task = asyncio.ensure_future(reporter.run())
    lease_box = [await store.grant_lease(30)]
    ops = operations(store, lease_box)
    for operation in ops.values():
        await operation()
    emit("ready", leader=leader.is_leader)

    assert await read_line() == "cut"
    stats = {"calls": 0, "ok": 0, "failed": {}, "hangs": [], "foreign": [], "foreign_count": 0, "max_s": 0.0, "t0": time.monotonic()}
    until = time.monotonic() + CUT_S
    await asyncio.gather(*(hammer(name, op, until, stats) for name, op in ops.items()))
    stats.pop("t0")
    emit("cut", **stats, leader_rounds=leader.rounds, reports=reporter.rounds)

    assert await read_line() == "heal"
    healed_at = time.monotonic()
    deadline = healed_at + HEAL_S
    pending = dict(ops)
    errors: dict[str, str] = {}
    lease_box[0] = None
    while time.monotonic() < deadline and (pending or lease_box[0] is None):
        if lease_box[0] is None:
            try:
                lease_box[0] = await asyncio.wait_for(store.grant_lease(30), HANG_S)
            except (MagnetarError, TimeoutError) as error:
                errors["grant"] = repr(error)[:200]
                await asyncio.sleep(0.2)
                continue
        for name, operation in list(pending.items()):
            try:
                await asyncio.wait_for(operation(), HANG_S)
                del pending[name]
            except (MagnetarError, TimeoutError) as error:
                errors[name] = repr(error)[:200]
        await asyncio.sleep(0.2)
    # Both loops must have completed a good round after the heal.
    while time.monotonic() < deadline and (leader.last_good_round < healed_at or reporter.last_good_round < healed_at):
        await asyncio.sleep(0.2)
    emit("healed", pending=sorted(pending), errors={k: v for k, v in errors.items() if k in pending},
         seconds=round(time.monotonic() - healed_at, 1),
         leader_ok=leader.last_good_round >= healed_at, reporter_ok=reporter.last_good_round >= healed_at,
         reporter_task_alive=not reporter_task.done(), leader_task_alive=leader.running)
    reporter_task.cancel()
    for closing in (leader.close(), ownership.close(), brokers.close(), store.close()):
        try:
            await asyncio.wait_for(closing, 15)
        except Exception as error:  # report, the test judges
            emit("close_failed", error=repr(error)[:200])
    emit("closed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
