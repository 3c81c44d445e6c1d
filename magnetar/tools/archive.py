"""``magnetar archive``: the archive of a topic (docs/archive.md), through a broker's admin
REST for what brokers do, and straight from the files for ``verify``. Each action prints
JSON and exits 0; errors go to stderr with exit 1 (2 for bad usage).

    magnetar archive run orders [--upto LEDGER:ENTRY] [--wait-s 60]
                                  archive the closed ledgers of a topic now (up to a
                                  message id; default: all), and wait for the outcome
    magnetar archive status orders
                                  the topic's archiving status (Pulsar's OffloadProcessStatus)
    magnetar archive ls orders    the archive manifest: ledgers, their files' URLs, entry
                                  ranges, rows, sizes, publish time ranges
    magnetar archive verify orders
                                  reads every file of the topic's archive and checks it
                                  whole (size and CRC32C against the manifest, the footer,
                                  every record batch); exit 1 if any is corrupt or missing.
                                  The files must be reachable from here (a local location
                                  on this machine, or an object store URL).
    magnetar archive verify --file /path/to/file.arrow
                                  checks one file's footer and batches (no manifest)
"""

from __future__ import annotations

import argparse
import json
import time

from magnetar.tools.admin import UsageError, topic_parts
from magnetar.tools.admin_client import AdminClient, AdminError, path
from magnetar.tools.failure import print_failure, report_admin_error, usage_failure

# How often `run --wait-s` asks for the status.
_POLL_INTERVAL_S = 0.5


def _topic_path(topic: str, *suffix: str) -> str:
    domain, tenant, namespace, local = topic_parts(topic)
    return path("admin", "v2", domain, tenant, namespace, local, *suffix)


def _print(document: object) -> None:
    print(json.dumps(document, indent=2, sort_keys=True))


def _run(client: AdminClient, args: argparse.Namespace) -> int:
    body = None
    if args.upto:
        ledger, _, entry = args.upto.partition(":")
        try:
            body = {"ledgerId": int(ledger), "entryId": int(entry)}
        except ValueError:
            raise UsageError(f"--upto must be LEDGER:ENTRY, not {args.upto!r}") from None
    client.request("PUT", _topic_path(args.topic, "offload"), body=body)
    deadline = time.monotonic() + args.wait_s
    while True:
        status = client.get(_topic_path(args.topic, "offload")).document()
        if status.get("status") in ("SUCCESS", "ERROR") or time.monotonic() >= deadline:
            break
        time.sleep(_POLL_INTERVAL_S)
    _print(status)
    if status.get("status") == "SUCCESS":
        return 0
    from common.errors import ArchiveError, OperationTimeout

    cls = ArchiveError if status.get("status") == "ERROR" else OperationTimeout
    reason = status.get("lastError") or f"status {status.get('status')} after {args.wait_s:g} s"
    print_failure("archive", f"run {args.topic}", str(reason), cls.__name__, cls.code)
    return 1


def _status(client: AdminClient, args: argparse.Namespace) -> int:
    _print(client.get(_topic_path(args.topic, "offload")).document())
    return 0


def _ls(client: AdminClient, args: argparse.Namespace) -> int:
    _print(client.get(_topic_path(args.topic, "archive")).document())
    return 0


def _verify(client: AdminClient, args: argparse.Namespace) -> int:
    from archive.reader import verify_file        # pyarrow only when verifying
    from common.errors import ArchiveError

    results = []
    if args.file:
        targets = [(url, None, None) for url in args.file]
    else:
        if not args.topic:
            raise UsageError("verify needs a topic or --file")
        manifest = client.get(_topic_path(args.topic, "archive")).document()
        targets = [(f["url"], f["size_bytes"], f["crc32c"]) for ledger in manifest["ledgers"] for f in ledger["files"]]
    failures = 0
    first_failure: ArchiveError | None = None
    for url, size_bytes, checksum in targets:
        try:
            metadata = verify_file(url, size_bytes=size_bytes, crc32c_expected=checksum)
            results.append({"url": url, "ok": True, "rows": metadata.row_count, "batches": len(metadata.batches),
                            "ledger_id": metadata.ledger_id,
                            "entries": [metadata.first_entry_id, metadata.last_entry_id]})
        except ArchiveError as error:
            failures += 1
            first_failure = first_failure or error
            results.append({"url": url, "ok": False, "error": str(error)})
    _print({"files": results, "corrupt": failures})
    if first_failure is not None:
        print_failure("archive", f"verify: {failures} of {len(results)} files failed", first_failure.message,
                      type(first_failure).__name__, first_failure.code)
        return 1
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin-url", default="http://127.0.0.1:8080", help="a broker's HTTP URL")
    parser.add_argument("--request-timeout-s", type=float, default=30.0)
    actions = parser.add_subparsers(dest="archive_action", required=True)
    run = actions.add_parser("run", help="archive a topic's closed ledgers now")
    run.add_argument("topic")
    run.add_argument("--upto", default="", help="LEDGER:ENTRY; default: everything closed")
    run.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the outcome")
    run.set_defaults(archive_handler=_run)
    status = actions.add_parser("status", help="the topic's archiving status")
    status.add_argument("topic")
    status.set_defaults(archive_handler=_status)
    ls = actions.add_parser("ls", help="the topic's archive manifest")
    ls.add_argument("topic")
    ls.set_defaults(archive_handler=_ls)
    verify = actions.add_parser("verify", help="check every archive file of a topic (or given files)")
    verify.add_argument("topic", nargs="?", default="")
    verify.add_argument("--file", action="append", default=[], help="a file URL to check (repeatable)")
    verify.set_defaults(archive_handler=_verify)


def main(args: argparse.Namespace) -> int:
    client = AdminClient(args.admin_url, timeout_s=args.request_timeout_s)
    try:
        return args.archive_handler(client, args)
    except UsageError as error:
        usage_failure("archive", str(error))
        return 2
    except AdminError as error:
        report_admin_error("archive", error)
        return 1
