"""``magnetar shell``: BookKeeper-style tools for operators and tests.

    listbookies     registered bookies (id, address, add socket address, read-only, free space)
    simpletest      write N entries to a new ledger through bookie failures; report
    readledger      read a whole ledger verifying digests (optionally recovering it)
    ledgermetadata  print a ledger's metadata
    listledgers     list ledger ids
    deleteledger    delete a ledger
    recoverledger   fence and close a ledger
    listunderreplicated   ledgers the auditor recorded as under-replicated
    decommissionbookie    mark a bookie for decommissioning; return once no ledger names it
    recover               re-replicate now every closed ledger naming a (dead) bookie

Every command prints, as its last line, one JSON object with its result, so scripts and
tests can parse it; progress goes to stdout as JSON lines before that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time

from runtime.config_options import add_config_options
from common.errors import MagnetarError
from ledger.client import LedgerClient
from ledger.config import BOOKIE_CLIENT_SECURITY_OPTIONS, AutoRecoveryConfig, LedgerClientConfig, bookie_client_security
from ledger.metadata import LedgerMetadata
from ledger.reader import LedgerReader
from ledger.replication import ReplicationWorker
from ledger.under_replication import UnderReplicatedRecord, under_replicated_fragments
from metadata import keys, open_store
from metadata.etcd_tls import add_etcd_tls_arguments, etcd_tls_from_args

_PATTERN_HEAD = struct.Struct(">QQ")

# Between rounds of `recover` over ledgers another worker held or that failed.
RECOVER_RETRY_S = 0.5


def pattern_payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    """The payload simpletest writes: ids first, then a byte that depends on the entry,
    so that readledger --check-pattern can tell a misplaced or altered entry."""
    head = _PATTERN_HEAD.pack(ledger_id, entry_id)
    if size <= len(head):
        return head[:size]
    return head + bytes([(entry_id * 31 + ledger_id) % 251]) * (size - len(head))


def _emit(document: dict) -> None:
    print(json.dumps(document), flush=True)


_METADATA_HELP = "etcd://host:port[,host:port...] (before or after the command)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # --metadata is accepted before the command (magnetar shell --metadata URL listbookies)
    # and after it (magnetar shell listbookies --metadata URL); main checks it was given.
    parser.add_argument("--metadata", default=None, help=_METADATA_HELP)
    add_etcd_tls_arguments(parser)   # before the command
    # Before the command: bookies with authentication on refuse a client without a
    # token, and bookies serving TLS one without --bookie-tls (ledger/config.py).
    add_config_options(parser, BOOKIE_CLIENT_SECURITY_OPTIONS)
    commands = parser.add_subparsers(dest="shell_command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        # SUPPRESS: a command's parser must not reset a --metadata given before it.
        sub.add_argument("--metadata", default=argparse.SUPPRESS, help=_METADATA_HELP)
        return sub

    command("listbookies", "registered bookies").add_argument(
        "--readonly", action="store_true", help="only read-only bookies")

    simple = command("simpletest", "write N entries to a new ledger")
    simple.add_argument("--ensemble", type=int, default=3)
    simple.add_argument("--write-quorum", type=int, default=2)
    simple.add_argument("--ack-quorum", type=int, default=2)
    simple.add_argument("--entries", type=int, default=1000)
    simple.add_argument("--size", type=int, default=1024, help="payload bytes per entry")
    simple.add_argument("--window", type=int, default=1000, help="adds in flight at once")
    simple.add_argument("--progress-interval-s", type=float, default=0.5)
    simple.add_argument("--delete", action="store_true",
                        help="delete the ledger once written and closed (a check that leaves nothing behind: "
                             "a ledger kept on every bookie could never be re-replicated off one)")

    read = command("readledger", "read a whole ledger, verifying digests")
    read.add_argument("--ledger", type=int, required=True)
    read.add_argument("--recover", action="store_true", help="fence and close the ledger first")
    read.add_argument("--check-pattern", action="store_true", help="payloads must be simpletest's")
    read.add_argument("--batch", type=int, default=1000)

    meta = command("ledgermetadata", "print a ledger's metadata")
    meta.add_argument("--ledger", type=int, required=True)
    command("listledgers", "list ledger ids")
    delete = command("deleteledger", "delete a ledger")
    delete.add_argument("--ledger", type=int, required=True)
    recover = command("recoverledger", "fence and close a ledger")
    recover.add_argument("--ledger", type=int, required=True)
    command("listunderreplicated", "ledgers recorded as under-replicated")
    decommission = command("decommissionbookie", "mark a bookie for decommissioning and wait until "
                                                 "no ledger names it (auto-recovery must be running)")
    decommission.add_argument("--bookie-id", required=True, help="the bookie to empty (its registered id)")
    decommission.add_argument("--timeout-s", type=float, default=3600.0,
                              help="give up (exit 1) after this long; the mark stays")
    decommission.add_argument("--progress-interval-s", type=float, default=2.0)
    decommission.add_argument("--no-wait", action="store_true",
                              help="mark it and return at once, printing what still names it (then close "
                                   "the open ledgers on it, e.g. by restarting the brokers, and run it again "
                                   "without this to wait)")
    recover_bookie = command("recover", "re-replicate now every closed ledger naming the bookie "
                                        "(no grace period; run by this command, not the workers)")
    recover_bookie.add_argument("--bookie-id", required=True, help="the dead bookie whose copies to make again")
    recover_bookie.add_argument("--wait-s", type=float, default=120.0,
                                help="how long to keep retrying ledgers another worker holds or that failed")


async def _list_bookies(client: LedgerClient, args: argparse.Namespace) -> int:
    bookies = sorted(client.registry.all(), key=lambda b: b.bookie_id)
    if args.readonly:
        bookies = [b for b in bookies if b.read_only]
    _emit({"bookies": [{"bookie_id": b.bookie_id, "address": b.address, "add_address": b.add_address,
                        "read_only": b.read_only,
                        "free_bytes": b.free_bytes, "disk_usage_ratio": round(b.disk_usage_ratio, 4)}
                       for b in bookies]})
    return 0


async def _simple_test(client: LedgerClient, args: argparse.Namespace) -> int:
    started = time.monotonic()
    handle = await client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
    ledger_id = handle.ledger_id
    _emit({"event": "created", "ledger_id": ledger_id, "ensemble": list(handle.metadata.current_ensemble)})
    window = asyncio.Semaphore(max(1, args.window))
    error: MagnetarError | None = None
    last_progress = time.monotonic()
    futures: list[asyncio.Future[int]] = []

    def release(_future: asyncio.Future[int]) -> None:
        window.release()

    for entry_id in range(args.entries):
        if handle.failure is not None:
            break
        await window.acquire()
        try:
            future = handle.submit_nowait(pattern_payload(ledger_id, entry_id, args.size))
        except MagnetarError as failure:
            error = failure
            window.release()
            break
        future.add_done_callback(release)
        futures.append(future)
        now = time.monotonic()
        if now - last_progress >= args.progress_interval_s:
            last_progress = now
            _emit({"event": "progress", "acked": handle.last_add_confirmed + 1, "submitted": entry_id + 1,
                   "ensemble": list(handle.metadata.current_ensemble)})
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures and error is None:
        error = failures[0] if isinstance(failures[0], MagnetarError) else MagnetarError(str(failures[0]))
    acked = sum(1 for o in outcomes if not isinstance(o, BaseException))
    # Acknowledgements are in entry order, so the acked entries are exactly 0..acked-1.
    assert acked == handle.last_add_confirmed + 1, (acked, handle.last_add_confirmed)
    closed = False
    try:
        await handle.close()
        closed = True
    except MagnetarError as close_error:
        error = error or close_error
    seconds = time.monotonic() - started
    deleted = False
    if closed and args.delete:
        await client.delete_ledger(ledger_id)
        deleted = True
    fragments = [{"first_entry_id": f.first_entry_id, "bookies": list(f.bookies)} for f in handle.metadata.fragments]
    _emit({"ledger_id": ledger_id, "acked": acked, "last_entry_id": handle.last_add_confirmed,
           "requested": args.entries, "ensemble_changes": handle.ensemble_changes, "fragments": fragments,
           "closed": closed, "deleted": deleted, "error": str(error) if error else None,
           "error_code": error.code if error else 0,
           "seconds": round(seconds, 3), "adds_per_s": round(acked / seconds, 1) if seconds > 0 else 0.0})
    return 0 if acked == args.entries and closed else 1


async def _read_ledger(client: LedgerClient, args: argparse.Namespace) -> int:
    reader = await client.open_ledger(args.ledger, recovery=args.recover)
    metadata = reader.metadata
    last_entry_id = metadata.last_entry_id if metadata.is_closed else await reader.read_last_add_confirmed()
    good = 0
    unreadable: list[int] = []
    pattern_errors: list[int] = []
    first_error: str | None = None
    entry_id = 0
    while entry_id <= last_entry_id:
        end = min(entry_id + args.batch - 1, last_entry_id)
        try:
            entries = await reader.read(entry_id, end)
        except MagnetarError:
            # Find the bad ones one by one so the report names them.
            entries = []
            for single in range(entry_id, end + 1):
                try:
                    entries.extend(await reader.read(single, single))
                except MagnetarError as error:
                    unreadable.append(single)
                    first_error = first_error or str(error)
        for entry in entries:
            good += 1
            if args.check_pattern:
                expected = pattern_payload(args.ledger, entry.entry_id, len(entry.payload))
                if entry.payload != expected:
                    pattern_errors.append(entry.entry_id)
        entry_id = end + 1
    document = {"ledger_id": args.ledger, "state": metadata.state.value if metadata.is_closed else "OPEN",
                "entries": good, "last_entry_id": last_entry_id, "digest_errors": reader.stats.digest_errors,
                "digest_error_entries": sorted(reader.stats.digest_error_entries)[:100],
                "unreadable": len(unreadable), "unreadable_entries": unreadable[:100],
                "pattern_errors": len(pattern_errors), "error": first_error}
    if not metadata.is_closed and not args.recover:
        # An open ledger is read up to the last-add-confirmed the bookies know, which the
        # writer piggybacks on its next add: up to its last few entries behind the
        # writer's own (what `magnetar admin topics internal-stats` shows for a topic's
        # ledger). Not a loss: read again later, or close it with --recover (which
        # fences the writer).
        document["note"] = ("ledger is open: read up to the last-add-confirmed the bookies know, which may lag "
                            "the writer's own by its latest entries (internal-stats shows the writer's); "
                            "--recover closes it first (and fences the writer)")
    _emit(document)
    return 0 if not unreadable and not pattern_errors and reader.stats.digest_errors == 0 else 1


def _ledgers_naming(ledgers: list[LedgerMetadata], bookie_id: str) -> tuple[list[int], list[int]]:
    """(closed, not closed) ids of ledgers whose fragments name the bookie."""
    closed = [m.ledger_id for m in ledgers if bookie_id in m.all_bookies() and m.is_closed]
    other = [m.ledger_id for m in ledgers if bookie_id in m.all_bookies() and not m.is_closed]
    return closed, other


async def _all_ledgers(client: LedgerClient) -> list[LedgerMetadata]:
    out: list[LedgerMetadata] = []
    for record in await client.store.get_prefix(keys.LEDGERS):
        try:
            out.append(LedgerMetadata.decode(record.value))
        except MagnetarError:
            continue
    return out


async def _list_under_replicated(client: LedgerClient) -> int:
    found = []
    for record in await client.store.get_prefix(keys.UNDER_REPLICATED):
        try:
            decoded = UnderReplicatedRecord.decode(record.value)
        except MagnetarError:
            continue
        found.append({"ledger_id": decoded.ledger_id, "fragments": decoded.fragment_indices,
                      "missing_bookies": decoded.missing_bookies, "marked_at_ms": decoded.marked_at_ms})
    _emit({"under_replicated": found, "count": len(found)})
    return 0


async def _decommission(client: LedgerClient, args: argparse.Namespace) -> int:
    """Marks the bookie (no new ledger or replacement chooses it; the auditor records
    its closed ledgers) and waits until no ledger names it. Open ledgers on it are
    their writers' until they close (a broker rolls its ledgers over)."""
    await client.store.put(keys.decommissioned(args.bookie_id), b"{}")
    started = time.monotonic()
    deadline = started + args.timeout_s
    while True:
        closed, other = _ledgers_naming(await _all_ledgers(client), args.bookie_id)
        if args.no_wait:
            _emit({"bookie_id": args.bookie_id, "marked": True, "decommissioned": not closed and not other,
                   "closed_ledgers_left": len(closed), "open_ledgers_left": len(other)})
            return 0
        if not closed and not other:
            _emit({"bookie_id": args.bookie_id, "decommissioned": True,
                   "seconds": round(time.monotonic() - started, 3)})
            return 0
        if time.monotonic() >= deadline:
            _emit({"bookie_id": args.bookie_id, "decommissioned": False, "closed_ledgers_left": len(closed),
                   "open_ledgers_left": len(other), "error": "timed out"})
            return 1
        _emit({"event": "progress", "closed_ledgers_left": len(closed), "open_ledgers_left": len(other)})
        await asyncio.sleep(args.progress_interval_s)


async def _recover_bookie(client: LedgerClient, args: argparse.Namespace) -> int:
    """Records each closed ledger naming the bookie as under-replicated (so that bookie
    GC leaves the copies in progress alone), then replicates it here, under the same
    per-ledger lock the workers take. A ledger whose lock an auto-recovery worker holds
    (or whose copy failed) is tried again until ``--wait-s`` has passed: the command
    answers when no closed ledger names the bookie any more, or says which are left."""
    config = AutoRecoveryConfig()
    worker = ReplicationWorker(client.context, config, f"shell-recover-{args.bookie_id}")
    missing = {args.bookie_id}
    done = retries = 0
    deadline = time.monotonic() + args.wait_s
    try:
        while True:
            pending = 0
            for metadata in await _all_ledgers(client):
                indices, named = under_replicated_fragments(metadata, missing)
                if not indices:
                    continue
                record = UnderReplicatedRecord(metadata.ledger_id, indices, named, int(time.time() * 1000), "shell")
                await client.store.put(keys.under_replicated(metadata.ledger_id), record.encode())
                if await worker.replicate_locked(metadata.ledger_id):
                    done += 1
                else:
                    pending += 1
            if not pending or time.monotonic() >= deadline:
                break
            retries += 1
            await asyncio.sleep(RECOVER_RETRY_S)
    finally:
        await worker.close()
    closed, other = _ledgers_naming(await _all_ledgers(client), args.bookie_id)
    _emit({"bookie_id": args.bookie_id, "ledgers_replicated": done, "retry_rounds": retries,
           "closed_ledgers_left": len(closed), "open_ledgers_left": len(other),
           "bytes_replicated": worker.stats.bytes_replicated, "entries_replicated": worker.stats.entries_replicated})
    return 0 if not closed else 1


async def _run(args: argparse.Namespace) -> int:
    store = open_store(args.metadata, tls=etcd_tls_from_args(args))
    client = LedgerClient(store, LedgerClientConfig(**bookie_client_security(args)))
    try:
        await client.start()
        command = args.shell_command
        if command == "listbookies":
            return await _list_bookies(client, args)
        if command == "simpletest":
            return await _simple_test(client, args)
        if command == "readledger":
            return await _read_ledger(client, args)
        if command == "ledgermetadata":
            metadata = await client.ledger_metadata(args.ledger)
            _emit(json.loads(metadata.encode()))
            return 0
        if command == "listledgers":
            _emit({"ledgers": await client.list_ledgers()})
            return 0
        if command == "deleteledger":
            await client.delete_ledger(args.ledger)
            _emit({"deleted": args.ledger})
            return 0
        if command == "listunderreplicated":
            return await _list_under_replicated(client)
        if command == "decommissionbookie":
            return await _decommission(client, args)
        if command == "recover":
            return await _recover_bookie(client, args)
        if command == "recoverledger":
            reader: LedgerReader = await client.open_ledger(args.ledger, recovery=True)
            _emit({"ledger_id": args.ledger, "last_entry_id": reader.metadata.last_entry_id,
                   "state": reader.metadata.state.value})
            return 0
        raise AssertionError(command)
    except MagnetarError as error:
        _emit({"error": error.message, "error_code": error.code})
        # The last line on stderr, as every magnetar tool ends a failure: what failed, the
        # reason, the catalogue class and code (magnetar/tools/failure.py's shape).
        print(f"magnetar shell: {args.shell_command}: {' '.join(error.message.split())} "
              f"[{type(error).__name__}, code {error.code}]", file=sys.stderr, flush=True)
        return 1
    finally:
        await client.close()
        await store.close()


def main(args: argparse.Namespace) -> int:
    if not args.metadata:
        print("magnetar shell: error: the following argument is required: --metadata "
              "(before or after the command)", file=sys.stderr)
        return 2
    return asyncio.run(_run(args))

