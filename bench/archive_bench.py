"""The archive's speed (docs/archive.md), against baselines of the same run:

- write: ledger entries (1 KiB messages, in batches of ``--batch-messages`` and not
  batched) archived to Arrow files on the disk under test, the way the archiver does
  it (rows built, Arrow file written temp → fsync → rename → fsync dir, then read back
  and verified), on one worker thread, in MB/s of entry bytes, as a ratio to the same
  disk's raw sequential write + fdatasync bandwidth (bench/harness.py: the median of
  short probes before and after). Aim: >= 50% of the disk. Reported with and without
  the verification read, and per stage (rows + Arrow, file write + fsync, verify).
- drain: one backlog on a real cluster (etcd, 2 bookies, 1 broker), drained by the raw
  consumer (bench/raw_consumer.py) once from the bookies and once from the archive after
  the archiver archived every ledger and deleted its bookie copies; the broker is
  restarted before each drain so neither is served from its caches. Also the broker's
  own archiving throughput (bookie reads included) from its log. Aim: the drain from the
  archive >= the drain from the bookies.

    python bench/archive_bench.py --out bench/results/archive.json

Each part starts from a fresh directory under the temp dir (``--dir`` for another disk),
removed at the end unless ``--keep-data``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))

from archive.location import ArchiveLocation  # noqa: E402
from archive.reader import verify_file  # noqa: E402
from archive.writer import SliceBuilder, WriterConfig, publish, write_temp  # noqa: E402
sys.path.insert(0, BENCH_DIR)
from harness import bench_cluster, disk_baseline, last_json_line, measure_disk, unstable_note  # noqa: E402
from protocol.batch import encode_batch  # noqa: E402
from protocol.codec import encode_stored  # noqa: E402
from protocol.proto.pulsar_api_pb2 import KeyValue, MessageMetadata, SingleMessageMetadata  # noqa: E402

MESSAGE_BYTES = 1024
WRITE_AIM_RATIO = 0.5
PROCESS_TIMEOUT_S = 300.0


# --- write ------------------------------------------------------------------------------------

def make_entries(total_bytes: int, batch_messages: int) -> list[bytes]:
    """Entries of 1 KiB messages with a key and a property each, like a producer's."""
    entries = []
    size = 0
    sequence = 0
    payload = os.urandom(MESSAGE_BYTES)
    while size < total_bytes:
        metadata = MessageMetadata(producer_name="bench", sequence_id=sequence, publish_time=1_700_000_000_000 + sequence)
        if batch_messages > 1:
            singles = []
            for index in range(batch_messages):
                single = SingleMessageMetadata(partition_key=f"key-{(sequence + index) % 1000}")
                single.properties.append(KeyValue(key="n", value=str(sequence + index)))
                singles.append((single, payload))
            metadata.num_messages_in_batch = batch_messages
            stored = encode_stored(metadata, encode_batch(singles))
        else:
            metadata.partition_key = f"key-{sequence % 1000}"
            metadata.properties.append(KeyValue(key="n", value=str(sequence)))
            stored = encode_stored(metadata, payload)
        entries.append(stored)
        size += len(stored)
        sequence += max(batch_messages, 1)
    return entries


def archive_entries(location: ArchiveLocation, entries: list[bytes], config: WriterConfig, *, verify: bool) -> dict:
    """Archives entries as one ledger, slice by slice; seconds per stage."""
    stages = {"rows_and_arrow_s": 0.0, "write_fsync_rename_s": 0.0, "verify_s": 0.0}
    files = 0
    started = time.perf_counter()
    cpu_started = time.process_time()
    builder = SliceBuilder(config, "persistent://public/default/bench", -1, 1)

    def flush(builder: SliceBuilder) -> None:
        nonlocal files
        t0 = time.perf_counter()
        batches, metadata = builder.finish()
        t1 = time.perf_counter()
        written = write_temp(location, "persistent/public/default/bench", batches, metadata)
        publish(location, written)
        t2 = time.perf_counter()
        if verify:
            verify_file(written.url, size_bytes=written.size_bytes, crc32c_expected=written.crc32c)
        t3 = time.perf_counter()
        stages["rows_and_arrow_s"] += t1 - t0
        stages["write_fsync_rename_s"] += t2 - t1
        stages["verify_s"] += t3 - t2
        files += 1

    for entry_id, stored in enumerate(entries):
        t0 = time.perf_counter()
        builder.add_entry(entry_id, stored)
        stages["rows_and_arrow_s"] += time.perf_counter() - t0
        if builder.full:
            flush(builder)
            builder = SliceBuilder(config, "persistent://public/default/bench", -1, 1)
    if not builder.empty:
        flush(builder)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    entry_bytes = sum(len(e) for e in entries)
    # The CPU time tells what one core does when the machine is shared (this process
    # runs only this thread while it archives).
    return {"entries": len(entries), "entry_bytes": entry_bytes, "files": files, "seconds": round(seconds, 3),
            "MB_per_s": round(entry_bytes / seconds / 1e6, 1), "cpu_seconds": round(cpu_seconds, 3),
            "MB_per_cpu_s": round(entry_bytes / cpu_seconds / 1e6, 1) if cpu_seconds > 0 else None,
            "stages": {name: round(value, 3) for name, value in stages.items()}}


async def write_part(args: argparse.Namespace) -> dict:
    base_dir = tempfile.mkdtemp(prefix="magnetar-archive-bench-write-", dir=args.dir)
    try:
        before = await measure_disk(base_dir, args.raw_seconds)
        cases = []
        for batch_messages in (args.batch_messages, 1):
            entries = make_entries(args.write_mib * 1024 * 1024, batch_messages)
            for verify in (True, False):
                for compression in args.compressions:
                    location = ArchiveLocation(os.path.join(base_dir, f"archive-{len(cases)}"))
                    config = WriterConfig(batch_rows_max=8192, compression=compression)
                    result = await asyncio.to_thread(archive_entries, location, entries, config, verify=verify)
                    result.update({"batch_messages": batch_messages, "verify": verify, "compression": compression})
                    cases.append(result)
                    print(json.dumps({"part": "write", **result}), flush=True)
                    shutil.rmtree(os.path.join(base_dir, f"archive-{len(cases) - 1}"), ignore_errors=True)
        after = await measure_disk(base_dir, args.raw_seconds)
        baseline = disk_baseline(before, after)
        for case in cases:
            case["ratio_to_disk"] = round(case["MB_per_s"] / baseline["median"], 3)
            case["meets_aim"] = case["ratio_to_disk"] >= WRITE_AIM_RATIO
        return {"raw_write_fdatasync_MB_per_s": baseline, "cases": cases, "aim_ratio_to_disk": WRITE_AIM_RATIO}
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)


# --- drain ------------------------------------------------------------------------------------

def http(method: str, url: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


async def run_process(argv: list[str]) -> dict:
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(PROCESS_TIMEOUT_S):
        stdout, stderr = await process.communicate()
    summary = last_json_line(stdout.decode(errors="replace"))
    if process.returncode != 0 or summary is None:
        raise RuntimeError(f"{argv[1]} failed ({process.returncode}): {stderr.decode(errors='replace')[-2000:]}")
    return summary


async def drain(broker, topic: str, subscription: str, messages: int, permits: int) -> dict:
    summary = await run_process([
        sys.executable, os.path.join(BENCH_DIR, "raw_consumer.py"), topic, "--service-url", broker.service_url,
        "-s", subscription, "-t", "exclusive", "--initial-position", "earliest", "--messages", str(messages),
        "--seconds", str(PROCESS_TIMEOUT_S - 30), "--permits", str(permits), "--ack", "individual",
        "--ack-group-entries", "1"])
    return {key: summary.get(key) for key in ("messages", "entries", "seconds", "msgs_per_s", "MB_per_s", "errors")
            if key in summary} | {"summary": summary}


async def drain_part(args: argparse.Namespace) -> dict:
    messages = -(-args.drain_messages // args.batch_messages) * args.batch_messages
    async with bench_cluster("magnetar-archive-bench-drain-", directory=args.dir, keep_data=args.keep_data) as cluster:
        archive_dir = os.path.join(cluster.base_dir, "archive")
        await cluster.start_bookies(2)
        [broker] = await cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "2", "--write-quorum", "2", "--ack-quorum", "2",
            "--ledger-max-entries", str(args.ledger_entries), "--archive-url", archive_dir,
            "--archive-check-interval-s", "0.5"])
        local = f"drain-{int(time.time())}"
        topic = f"persistent://public/default/{local}"
        admin = f"{broker.web_service_url}/admin/v2"
        topic_path = f"{admin}/persistent/public/default/{urllib.parse.quote(local)}"
        http("PUT", topic_path)
        for subscription in ("from-bookies", "from-archive"):
            http("PUT", f"{topic_path}/subscription/{subscription}", {"ledgerId": -1, "entryId": -1})
        produced = await run_process([
            sys.executable, os.path.join(BENCH_DIR, "raw_producer.py"), topic, "--service-url", broker.service_url,
            "--messages", str(messages), "--batch-messages", str(args.batch_messages),
            "--message-bytes", str(MESSAGE_BYTES), "--window-entries", "64"])
        print(json.dumps({"part": "drain", "produced": produced}), flush=True)
        http("PUT", f"{topic_path}/unload")           # closes the last ledger: everything archivable

        await broker.terminate()
        await broker.start()
        from_bookies = await drain(broker, topic, "from-bookies", messages, args.permits)
        print(json.dumps({"part": "drain", "from": "bookies", **from_bookies}), flush=True)

        archive_started = time.monotonic()
        http("POST", f"{admin}/namespaces/public/default/offloadPolicies",
             {"managedLedgerOffloadThresholdInBytes": 0, "managedLedgerOffloadDeletionLagInMillis": 0})
        ledgers = [l["ledgerId"] for l in http("GET", f"{topic_path}/internalStats")["ledgers"]][:-1]
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while True:
            manifest = http("GET", f"{topic_path}/archive")
            released = {l["ledger_id"] for l in manifest["ledgers"] if l["bookie_deleted_ms"] > 0}
            if set(ledgers) <= released:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"archiving did not finish: {len(released)} of {len(ledgers)} ledgers")
            await asyncio.sleep(0.2)
        archive_seconds = time.monotonic() - archive_started
        archived = re.findall(r"ledger archived: .* entries=(\d+) rows=(\d+) files=(\d+) size_bytes=(\d+) "
                              r"seconds=([\d.]+)", broker.log_text())
        archive_files_bytes = sum(int(a[3]) for a in archived)
        broker_archive_s = sum(float(a[4]) for a in archived)
        entry_bytes = round(messages * MESSAGE_BYTES / 1e6, 1)

        await broker.terminate()
        await broker.start()
        from_archive = await drain(broker, topic, "from-archive", messages, args.permits)
        print(json.dumps({"part": "drain", "from": "archive", **from_archive}), flush=True)
        ratio = (from_archive["msgs_per_s"] / from_bookies["msgs_per_s"]
                 if from_archive.get("msgs_per_s") and from_bookies.get("msgs_per_s") else None)
        return {
            "messages": messages, "batch_messages": args.batch_messages, "ledgers": len(ledgers),
            "from_bookies": from_bookies, "from_archive": from_archive,
            "archive_over_bookies": round(ratio, 3) if ratio else None,
            "meets_aim": bool(ratio and ratio >= 1.0),
            "archiving": {"wall_seconds_until_all_released": round(archive_seconds, 2),
                          "broker_seconds_archiving": round(broker_archive_s, 2),
                          "file_bytes": archive_files_bytes,
                          "file_MB_per_s_while_archiving": round(archive_files_bytes / broker_archive_s / 1e6, 1)
                          if broker_archive_s else None, "produced_MB": entry_bytes},
        }


async def main_async(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(),
                     "message_bytes": MESSAGE_BYTES,
                     "settings": {k: v for k, v in vars(args).items() if k not in ("out", "dir", "keep_data")}}
    results["write"] = await write_part(args)
    if args.drain_messages > 0:
        results["drain"] = await drain_part(args)
    results["total_seconds"] = round(time.monotonic() - started, 1)
    return results


def print_table(results: dict) -> None:
    write = results["write"]
    raw = write["raw_write_fdatasync_MB_per_s"]
    print(f"\nwrite (disk: raw write+fdatasync {raw['median']} MB/s{unstable_note(raw)}; aim "
          f">= {write['aim_ratio_to_disk']:.0%} of it)")
    print(f"{'batch':>5} {'compression':>11} {'verify':>6} {'MB/s':>8} {'ratio':>6} {'met':>4} {'MB/cpu-s':>9}  "
          "stages (s)")
    for case in write["cases"]:
        print(f"{case['batch_messages']:>5} {case['compression']:>11} {str(case['verify']):>6} {case['MB_per_s']:>8} "
              f"{case['ratio_to_disk']:>6} {'yes' if case['meets_aim'] else 'no':>4} {case['MB_per_cpu_s']:>9}  "
              f"{case['stages']}")
    drain = results.get("drain")
    if drain:
        print(f"\ndrain of {drain['messages']} messages (batches of {drain['batch_messages']}, {drain['ledgers']} "
              f"ledgers): bookies {drain['from_bookies']['msgs_per_s']} msgs/s, archive "
              f"{drain['from_archive']['msgs_per_s']} msgs/s, archive/bookies {drain['archive_over_bookies']} "
              f"(aim >= 1: {'met' if drain['meets_aim'] else 'not met'})")
        print(f"archiving in the broker: {drain['archiving']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/archive.json")
    parser.add_argument("--dir", default=None, help="where the data goes (default: the temp dir)")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--write-mib", type=int, default=256, help="entry bytes archived per write case")
    parser.add_argument("--batch-messages", type=int, default=100)
    parser.add_argument("--compressions", nargs="+", default=["none", "lz4"])
    parser.add_argument("--raw-seconds", type=float, default=5.0, help="disk probing time, before and after")
    parser.add_argument("--drain-messages", type=int, default=400_000, help="0: skip the drain part")
    parser.add_argument("--ledger-entries", type=int, default=1000)
    parser.add_argument("--permits", type=int, default=20_000)
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    results = asyncio.run(main_async(args))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2)
    print_table(results)
    print(f"results in {args.out} ({results['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
