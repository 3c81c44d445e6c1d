"""The client-side tools (`magnetar produce|consume|admin|perf`) run as real processes
against a real cluster (etcd, 3 bookies, 1 broker: the module's `pulsar_cluster`), the
way a user runs them: exit codes, stdout JSON and stderr errors are what is checked.

The admin tests walk resources through their life (create, read back, change, delete)
on Pulsar's paths and JSON shapes, each on names of its own, so they share the cluster.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import selectors
import subprocess
import time

import pulsar
import pytest

from magnetar.cli import build_parser
from tests.cluster import python_command, unique

TOOL_TIMEOUT_S = 60


def magnetar(*args: str, timeout_s: float = TOOL_TIMEOUT_S, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(python_command(*args), input=stdin, capture_output=True, timeout=timeout_s)


def json_lines(text: bytes) -> list[dict]:
    return [json.loads(line) for line in text.decode().splitlines() if line.strip()]


def wait_for_line(process: subprocess.Popen, needle: bytes, timeout_s: float) -> None:
    """Reads the process's stderr until a line holds ``needle``; fails on timeout or exit."""
    deadline = time.monotonic() + timeout_s
    seen = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stderr, selectors.EVENT_READ)
        while needle not in seen:
            remaining_s = deadline - time.monotonic()
            assert remaining_s > 0, f"{needle!r} not seen in {timeout_s} s: {seen.decode()[-2000:]}"
            if selector.select(timeout=remaining_s):
                chunk = os.read(process.stderr.fileno(), 65536)
                assert chunk, f"process exited before {needle!r}: {seen.decode()[-2000:]}"
                seen += chunk


@pytest.fixture(scope="module")
def urls(pulsar_cluster):
    broker = pulsar_cluster.brokers[0]
    return broker.service_url, broker.web_service_url


def admin(web_url: str, *args: str):
    """Runs `magnetar admin …` in this process (the same parser and handler as the
    command; the admin tool is plain urllib, and a process per call would cost ~0.4 s),
    asserts it succeeded and printed JSON (every action does); returns it. Exit codes and
    stderr of real processes are checked by test_admin_errors_are_clear."""
    argv = ["admin", "--admin-url", web_url, *args]
    parsed = build_parser(argv).parse_args(argv)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        returncode = parsed.handler(parsed)
    assert returncode == 0, f"admin {' '.join(args)}: {stderr.getvalue()}"
    text = stdout.getvalue().strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise AssertionError(f"admin {' '.join(args)} printed no JSON: {text!r}") from None


def test_produce_then_consume_round_trip_with_keys_and_properties(urls, tmp_path):
    """Proves produce and consume agree on everything a message carries: produce sends
    text messages (each twice, with a key and two properties) and one binary file, and
    prints one id per message in send order; consume from the earliest position prints
    the same ids in order, the key, the properties, event and publish times, the text as
    UTF-8 and the binary payload as base64. Consuming again on the same subscription
    times out (exit 3) with nothing: the acknowledgements were flushed when the first
    consumer closed."""
    service_url, _ = urls
    topic = unique("cli-round-trip")
    binary = bytes([0xff, 0xfe, 0x00, 0x80]) + bytes(range(16))
    binary_path = tmp_path / "payload.bin"
    binary_path.write_bytes(binary)
    produced = magnetar("produce", "--service-url", service_url, topic, "-m", "hello", "-m", "grüße",
                        "--file", str(binary_path), "-n", "2", "--key", "key-1", "--property", "origin=cli",
                        "-p", "run=1", "--event-time-ms", "1700000000000")
    assert produced.returncode == 0, produced.stderr.decode()
    ids = json_lines(produced.stdout)
    assert [line["index"] for line in ids] == list(range(6))
    assert all(line["message_id"]["ledgerId"] >= 0 and line["message_id"]["entryId"] >= 0 for line in ids)

    consumed = magnetar("consume", "--service-url", service_url, topic, "-s", "round-trip", "-n", "6",
                        "--initial-position", "earliest", "--timeout-s", "20")
    assert consumed.returncode == 0, consumed.stderr.decode()
    messages = json_lines(consumed.stdout)
    assert [m["message_id"] for m in messages] == [line["message_id"] for line in ids]
    assert [m["payload"] for m in messages[:4]] == ["hello", "hello", "grüße", "grüße"]
    assert {m["encoding"] for m in messages[:4]} == {"utf-8"}
    assert [m["encoding"] for m in messages[4:]] == ["base64", "base64"]
    assert base64.b64decode(messages[4]["payload"]) == binary
    for message in messages:
        assert message["key"] == "key-1"
        assert message["properties"] == {"origin": "cli", "run": "1"}
        assert message["event_time_ms"] == 1700000000000
        assert message["publish_time_ms"] > 1700000000000
        assert message["topic"] == f"persistent://public/default/{topic}"
        assert message["redelivery_count"] == 0

    again = magnetar("consume", "--service-url", service_url, topic, "-s", "round-trip", "-n", "1",
                     "--timeout-s", "2")
    assert again.returncode == 3, again.stderr.decode()
    assert again.stdout.decode().strip() == ""
    assert "timed out" in again.stderr.decode()


def test_produce_quiet_summary_and_batching(urls):
    """Proves --batching and --quiet: 200 messages sent with batching enabled are all
    acknowledged, share batch entries (batch indexes >= 0), and the summary line counts
    them; a shared subscription consumes all 200."""
    service_url, _ = urls
    topic = unique("cli-batching")
    produced = magnetar("produce", "--service-url", service_url, topic, "-m", "batched", "-n", "200",
                        "--batching", "--quiet")
    assert produced.returncode == 0, produced.stderr.decode()
    (summary,) = json_lines(produced.stdout)
    assert summary["sent"] == 200 and summary["failed"] == 0
    assert summary["first_message_id"]["batchIndex"] >= 0
    consumed = magnetar("consume", "--service-url", service_url, topic, "-s", "batched", "-t", "shared",
                        "-n", "200", "--initial-position", "earliest", "--timeout-s", "20", "--quiet")
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert json_lines(consumed.stdout)[0]["received"] == 200


def test_produce_fails_loudly_without_a_broker():
    """Proves that a produce which cannot reach a broker exits non-zero with the client's
    error on stderr, and prints nothing on stdout."""
    result = magnetar("produce", "--service-url", "pulsar://127.0.0.1:1", "--operation-timeout-s", "2",
                      "nowhere", "-m", "lost")
    assert result.returncode == 1
    assert result.stdout.decode().strip() == ""
    assert "magnetar produce:" in result.stderr.decode()


def test_client_failures_end_with_the_brokers_reason_and_a_catalogue_code(urls):
    """Proves the last stderr line of a failed produce or consume names the broker's own
    reason (not only the official client's result) and a catalogue code, and stdout
    stays empty: a subscription held Shared refuses an Exclusive consumer (the broker's
    "is Shared, not Exclusive"); a topic of a tenant that does not exist (the broker's
    "namespace ... does not exist"); a topic name with a space (refused by the broker's
    name check, naming the character); an unreachable broker."""
    service_url, _ = urls
    topic = unique("held")
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        client.subscribe(topic, "billing", consumer_type=pulsar.ConsumerType.Shared)    # held Shared
        exclusive = magnetar("consume", "--service-url", service_url, topic, "-s", "billing", "-t", "exclusive",
                             "--timeout-s", "2", "--operation-timeout-s", "10")
    finally:
        client.close()
    last = exclusive.stderr.decode().strip().splitlines()[-1]
    assert exclusive.returncode == 1, exclusive.stderr.decode()
    assert exclusive.stdout.decode().strip() == ""
    assert last.startswith(f"magnetar consume: subscribing to {topic}: subscription billing is Shared, "
                           "not Exclusive"), last
    assert last.endswith("[NotAllowed, code 4006]"), last

    missing = magnetar("produce", "--service-url", service_url, "no-such-tenant/ns/t", "-m", "x",
                       "--operation-timeout-s", "5")
    last = missing.stderr.decode().strip().splitlines()[-1]
    assert missing.returncode == 1 and missing.stdout.decode().strip() == ""
    assert "namespace no-such-tenant/ns does not exist" in last and last.endswith("[TopicNotFound, code 4001]"), last

    spaced = magnetar("produce", "--service-url", service_url, "my topic", "-m", "x", "--operation-timeout-s", "5")
    last = spaced.stderr.decode().strip().splitlines()[-1]
    assert spaced.returncode == 1
    assert "may not hold whitespace" in last and last.endswith("[InvalidArgument, code 1002]"), last

    nowhere = magnetar("consume", "--service-url", "pulsar://127.0.0.1:1", "t", "-s", "s",
                       "--operation-timeout-s", "2", "--timeout-s", "2")
    last = nowhere.stderr.decode().strip().splitlines()[-1]
    assert nowhere.returncode == 1 and last.startswith("magnetar consume: subscribing to t:"), last
    assert last.endswith("[ServiceNotReady, code 5003]") or last.endswith("[OperationTimeout, code 5002]"), last


def test_shell_failures_end_with_the_reason_and_a_catalogue_code():
    """Proves `magnetar shell` ends a failure the same way: its JSON on stdout, then on
    stderr one line with the reason and the catalogue tag (etcd unreachable here)."""
    result = magnetar("--log-level", "error", "shell", "--metadata", "etcd://127.0.0.1:1", "listbookies")
    assert result.returncode == 1
    assert json.loads(result.stdout.decode().strip().splitlines()[-1])["error_code"] == 3001
    last = result.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("magnetar shell: listbookies: ") and last.endswith("[MetadataUnavailable, code 3001]"), last


def test_perf_consume_and_paced_produce_report_sane_json(urls, tmp_path):
    """Proves the perf pair measures what it claims: a consumer subscribes first (it says
    so on stderr), a producer paced at 2,000 msgs/s sends 4,000 messages; the producer's
    summary shows the rate held (token bucket) with no errors and ordered publish latency
    percentiles; the consumer got exactly those 4,000, in order (no duplicates, no gaps),
    measured end-to-end latency from the payload's send time for every one, and wrote
    the same summary to --out."""
    service_url, _ = urls
    topic = unique("cli-perf")
    out_path = tmp_path / "consume.json"
    consumer = subprocess.Popen(python_command("perf", "consume", "--service-url", service_url, topic,
                                               "--subscription", "perf", "--messages", "4000", "--seconds", "30",
                                               "--progress-interval-s", "1", "--out", str(out_path)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_line(consumer, b'"event": "subscribed"', timeout_s=30)
        produced = magnetar("perf", "produce", "--service-url", service_url, topic, "--rate", "2000",
                            "--messages", "4000", "--size", "512", "--progress-interval-s", "1")
        stdout, stderr = consumer.communicate(timeout=TOOL_TIMEOUT_S)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert produced.returncode == 0, produced.stderr.decode()
    producer_summary = json_lines(produced.stdout)[-1]
    assert producer_summary["messages"] == 4000 and producer_summary["errors"] == 0
    assert producer_summary["size_bytes"] == 512
    # Paced: never faster than asked (a loaded machine may make it slower, and says so).
    assert 0 < producer_summary["msgs_per_s"] <= 2000 * 1.05, producer_summary
    assert producer_summary["rate_sustained"] == (producer_summary["msgs_per_s"] >= 0.95 * 2000)
    latency = producer_summary["publish_latency_ms"]
    assert latency["count"] == 4000
    assert 0 < latency["p50"] <= latency["p99"] <= latency["p99.9"] <= latency["max"]
    assert any('"progress"' in line for line in produced.stderr.decode().splitlines())

    assert consumer.returncode == 0, stderr.decode()
    consumer_summary = json_lines(stdout)[-1]
    assert consumer_summary["messages"] == 4000
    assert consumer_summary["duplicates"] == 0 and consumer_summary["sequence_gaps"] == 0
    assert consumer_summary["latency_sources"]["payload_header"] == 4000
    end_to_end = consumer_summary["end_to_end_latency_ms"]
    assert 0 < end_to_end["p50"] <= end_to_end["p99"] <= end_to_end["max"] < 30_000
    assert json.loads(out_path.read_text()) == consumer_summary


def test_perf_produce_max_rate_with_and_without_batching(urls):
    """Proves the unpaced producer: with batching off it sends exactly --messages and
    every message is acknowledged; with batching on and --seconds it runs for about that
    long and reports positive throughput, all without errors."""
    service_url, _ = urls
    topic = unique("cli-perf-max")
    unbatched = magnetar("perf", "produce", "--service-url", service_url, topic, "--no-batching",
                         "--messages", "2000", "--max-pending", "200", "--progress-interval-s", "0")
    assert unbatched.returncode == 0, unbatched.stderr.decode()
    summary = json_lines(unbatched.stdout)[-1]
    assert summary["batching"] is False
    assert summary["sent"] == summary["messages"] == 2000 and summary["errors"] == 0
    batched = magnetar("perf", "produce", "--service-url", service_url, topic, "--seconds", "2",
                       "--progress-interval-s", "0")
    assert batched.returncode == 0, batched.stderr.decode()
    summary = json_lines(batched.stdout)[-1]
    assert summary["batching"] is True and summary["drained"] is True
    assert 1.5 <= summary["seconds"] <= 10 and summary["msgs_per_s"] > 0 and summary["MB_per_s"] > 0
    assert summary["messages"] == summary["sent"] and summary["errors"] == 0


def test_admin_brokers_health_list_and_leader(urls):
    """Proves the brokers actions: health (as a real process: exit 0) prints the broker's
    "ok", list (cluster found through the clusters endpoint) names this broker, leader
    names its service URL."""
    _, web_url = urls
    health = magnetar("admin", "--admin-url", web_url, "brokers", "health")
    assert health.returncode == 0, health.stderr.decode()
    assert json.loads(health.stdout) == "ok"           # every action prints JSON, a text answer too
    host_port = web_url.removeprefix("http://")
    assert host_port in admin(web_url, "brokers", "list")
    assert admin(web_url, "brokers", "leader")["serviceUrl"] == web_url


def test_admin_tenant_and_namespace_policies(urls):
    """Proves the tenant and namespace actions against Pulsar's paths and JSON shapes:
    a tenant is created on every cluster when none is named, listed and read back; a
    namespace in it is created, listed, and its retention, persistence and auto topic
    creation policies are set and read back through `namespaces policies`; both are
    deleted again."""
    _, web_url = urls
    tenant = unique("tenant")
    namespace = f"{tenant}/ns"
    assert admin(web_url, "tenants", "create", tenant) == {
        "ok": True, "action": "tenants create", "method": "PUT", "path": f"/admin/v2/tenants/{tenant}", "status": 204}
    assert tenant in admin(web_url, "tenants", "list")
    assert admin(web_url, "tenants", "get", tenant)["allowedClusters"] == admin(web_url, "clusters", "list")
    admin(web_url, "namespaces", "create", namespace)
    assert admin(web_url, "namespaces", "list", tenant) == [namespace]
    admin(web_url, "namespaces", "set-retention", namespace, "--time-minutes", "60", "--size-mb", "100")
    admin(web_url, "namespaces", "set-persistence", namespace, "--ensemble", "2", "--write-quorum", "2",
          "--ack-quorum", "1")
    admin(web_url, "namespaces", "set-auto-topic-creation", namespace, "--disable")
    policies = admin(web_url, "namespaces", "policies", namespace)
    assert policies["retention_policies"] == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}
    assert policies["persistence"]["bookkeeperEnsemble"] == 2
    assert policies["persistence"]["bookkeeperAckQuorum"] == 1
    assert policies["autoTopicCreationOverride"]["allowAutoTopicCreation"] is False
    assert admin(web_url, "namespaces", "get-deduplication", namespace) is None       # unset: off
    admin(web_url, "namespaces", "set-deduplication", namespace, "--enable")
    assert admin(web_url, "namespaces", "get-deduplication", namespace) is True
    admin(web_url, "namespaces", "delete", namespace)
    admin(web_url, "tenants", "delete", tenant)
    assert tenant not in admin(web_url, "tenants", "list")


def test_admin_bundles_split_and_unload(urls):
    """Proves the bundle actions: a new namespace has 4 bundles, owned once a topic in
    each is used; a split of one owned bundle leaves 5 whose boundaries still cover the
    whole hash space; unloading one bundle (here the only broker takes it back) and the
    whole namespace both succeed, and the topic then still takes messages."""
    service_url, web_url = urls
    tenant = unique("tenant")
    namespace = f"{tenant}/ns"
    admin(web_url, "tenants", "create", tenant)
    admin(web_url, "namespaces", "create", namespace)
    bundles = admin(web_url, "namespaces", "bundles", namespace)
    assert bundles["numBundles"] == 4
    assert bundles["boundaries"][0] == "0x00000000" and bundles["boundaries"][-1] == "0xffffffff"
    topic = f"persistent://{namespace}/t"
    produced = magnetar("produce", "--service-url", service_url, topic, "-m", "x", "--quiet")
    assert produced.returncode == 0, produced.stderr.decode()
    owned = [b for b, owner in admin(web_url, "namespaces", "bundle-owners", namespace).items() if owner]
    assert owned
    split = admin(web_url, "namespaces", "split-bundle", namespace, "--bundle", owned[0])
    assert len(split["bundles"]) == 2
    after = admin(web_url, "namespaces", "bundles", namespace)
    assert after["numBundles"] == 5
    assert after["boundaries"][0] == "0x00000000" and after["boundaries"][-1] == "0xffffffff"
    owned = [b for b, owner in admin(web_url, "namespaces", "bundle-owners", namespace).items() if owner]
    admin(web_url, "namespaces", "unload", namespace, "--bundle", owned[0])
    admin(web_url, "namespaces", "unload", namespace)
    produced = magnetar("produce", "--service-url", service_url, topic, "-m", "y", "--quiet")
    assert produced.returncode == 0, produced.stderr.decode()


def test_admin_topics_stats_subscriptions_and_cursor(urls):
    """Proves the topic actions on a topic with 5 messages: it is listed; stats count the
    messages in and show a subscription created at the earliest position with a backlog
    of 5; skip -n 2 leaves 3; skip-all leaves 0; reset-cursor to 1 h ago brings the 5
    back; expiring what is older than an hour leaves them, expiring everything (all
    subscriptions) clears them; internal stats and the last message id name the same ledger as produce did;
    the subscription and the topic are deleted again."""
    service_url, web_url = urls
    topic = unique("cli-stats")
    full_name = f"persistent://public/default/{topic}"
    produced = magnetar("produce", "--service-url", service_url, topic, "-m", "for-stats", "-n", "5", "--quiet")
    assert produced.returncode == 0, produced.stderr.decode()
    last_id = json_lines(produced.stdout)[0]["last_message_id"]
    assert full_name in admin(web_url, "topics", "list", "public/default")
    admin(web_url, "topics", "create-subscription", topic, "-s", "stats-sub", "--message-id", "earliest")
    assert admin(web_url, "topics", "subscriptions", full_name) == ["stats-sub"]

    def backlog() -> int:
        return admin(web_url, "topics", "stats", topic)["subscriptions"]["stats-sub"]["msgBacklog"]

    stats = admin(web_url, "topics", "stats", topic)
    assert stats["msgInCounter"] == 5 and isinstance(stats["publishers"], list)
    assert backlog() == 5
    admin(web_url, "topics", "skip", topic, "-s", "stats-sub", "-n", "2")
    assert backlog() == 3
    admin(web_url, "topics", "skip-all", topic, "-s", "stats-sub")
    assert backlog() == 0
    admin(web_url, "topics", "reset-cursor", topic, "-s", "stats-sub", "--time", "1h")
    assert backlog() == 5
    admin(web_url, "topics", "expire-messages", topic, "-s", "stats-sub", "-t", "3600")
    assert backlog() == 5                   # none is an hour old
    admin(web_url, "topics", "expire-messages-all-subscriptions", topic, "-t", "0")
    assert backlog() == 0
    admin(web_url, "topics", "reset-cursor", topic, "-s", "stats-sub", "--time", "1h")
    assert backlog() == 5
    internal = admin(web_url, "topics", "internal-stats", topic)
    assert internal["ledgers"][-1]["ledgerId"] == last_id["ledgerId"]
    assert "stats-sub" in internal["cursors"]
    last = admin(web_url, "topics", "last-message-id", topic)
    assert (last["ledgerId"], last["entryId"]) == (last_id["ledgerId"], last_id["entryId"])
    admin(web_url, "topics", "delete-subscription", topic, "-s", "stats-sub")
    admin(web_url, "topics", "delete", topic)
    assert full_name not in admin(web_url, "topics", "list", "public/default")


def test_admin_partitioned_topic(urls):
    """Proves the partitioned-topic actions: create with 2 partitions, read the count
    back (Pulsar's {"partitions": n}), grow it to 3, see it listed, compact and
    terminate every partition, delete it."""
    _, web_url = urls
    topic = unique("cli-partitioned")
    admin(web_url, "topics", "create-partitioned", topic, "--partitions", "2")
    assert admin(web_url, "topics", "get-partitioned", topic) == {"partitions": 2}
    admin(web_url, "topics", "update-partitioned", topic, "--partitions", "3")
    assert admin(web_url, "topics", "get-partitioned", topic) == {"partitions": 3}
    assert f"persistent://public/default/{topic}" in admin(web_url, "topics", "list-partitioned", "public/default")
    for index in range(3):                  # a partition exists once something made it
        admin(web_url, "topics", "create", f"{topic}-partition-{index}")
    admin(web_url, "topics", "compact", topic)
    assert admin(web_url, "topics", "compaction-status", f"{topic}-partition-0")["status"] in ("RUNNING", "SUCCESS")
    ended = admin(web_url, "topics", "terminate-partitioned", topic)
    assert sorted(ended) == ["0", "1", "2"] and ended["2"]["partitionIndex"] == 2
    admin(web_url, "topics", "delete-partitioned", topic)


def test_admin_topics_lookup_names_the_serving_broker(urls):
    """Proves `admin topics lookup` (Pulsar's /lookup/v2 path) returns the JSON the broker
    sent, naming this broker's binary and HTTP URLs for a short topic name."""
    service_url, web_url = urls
    document = admin(web_url, "topics", "lookup", unique("cli-lookup"))
    assert document["brokerUrl"] == service_url
    assert document["httpUrl"] == web_url


def test_admin_errors_are_clear(urls):
    """Proves the admin tool's failure modes: an unreachable server and a missing topic
    exit 1 with the method, URL, status and the server's reason on stderr; bad arguments
    exit 2 before any request."""
    _, web_url = urls
    unreachable = magnetar("admin", "--admin-url", "http://127.0.0.1:1", "tenants", "list")
    assert unreachable.returncode == 1
    last_line = unreachable.stderr.decode().strip().splitlines()[-1]
    assert "GET http://127.0.0.1:1/admin/v2/tenants: no response: cannot reach the server" in last_line
    assert last_line.endswith("[ServiceNotReady, code 5003]"), last_line
    missing = magnetar("admin", "--admin-url", web_url, "clusters", "get", "no-such-cluster")
    assert missing.returncode == 1
    assert missing.stderr.decode().strip() == (f"magnetar admin: GET {web_url}/admin/v2/clusters/no-such-cluster: "
                                               "HTTP 404: cluster no-such-cluster does not exist "
                                               "[NotFound, code 1006]")
    usage = magnetar("admin", "--admin-url", web_url, "namespaces", "set-persistence", "public/default",
                     "--ensemble", "1", "--write-quorum", "2", "--ack-quorum", "1")
    assert usage.returncode == 2
    assert "ensemble >= write-quorum >= ack-quorum" in usage.stderr.decode()
    assert usage.stderr.decode().strip().endswith("[InvalidArgument, code 1002]")


def test_admin_peek_and_get_message_by_id(urls):
    """Proves looking at stored messages without consuming them (Pulsar's
    .../subscription/{sub}/position/{n} and .../ledger/{l}/entry/{e}): a subscription's
    first unacknowledged entries come back with payload and metadata — a message stored
    alone with its key and properties, an LZ4-compressed batch of three split into its
    messages, an individually acknowledged entry stepped over — and the backlog does not
    move; examine-message counts from the oldest entry or back from the newest; the raw
    REST answer carries Pulsar's headers and the uncompressed payload;
    past the backlog is 404, a partitioned topic's name 403."""
    import urllib.error
    import urllib.request

    import pulsar

    service_url, web_url = urls
    topic = unique("cli-peek")
    full_name = f"persistent://public/default/{topic}"
    admin(web_url, "topics", "create-subscription", topic, "-s", "look", "--message-id", "earliest")
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        plain = client.create_producer(full_name, producer_name="plain-writer", batching_enabled=False)
        first = plain.send(b"gone", properties={"n": "0"})
        plain.send("héllo".encode(), partition_key="k1", properties={"trace": "t-1", "n": "1"})
        batched = client.create_producer(full_name, batching_enabled=True, batching_max_messages=3,
                                         batching_max_publish_delay_ms=5000,
                                         compression_type=pulsar.CompressionType.LZ4)
        for i in range(3):
            batched.send_async(f"batched-{i}".encode() * 20, None, properties={"i": str(i)})
        batched.flush()
        plain.send(b"\xff\xfe binary")
        consumer = client.subscribe(full_name, "look", consumer_type=pulsar.ConsumerType.Shared)
        received = consumer.receive(10_000)
        assert received.message_id() == first
        consumer.acknowledge(received)             # entry 0 acknowledged on its own
        consumer.close()
    finally:
        client.close()

    def backlog() -> int:
        return admin(web_url, "topics", "stats", topic)["subscriptions"]["look"]["msgBacklog"]

    before = backlog()
    peeked = admin(web_url, "topics", "peek-messages", topic, "-s", "look", "-n", "10")
    assert [m["payload"] for m in peeked] == ["héllo"] + [f"batched-{i}" * 20 for i in range(3)] + [
        base64.b64encode(b"\xff\xfe binary").decode()]
    assert peeked[0]["key"] == "k1" and peeked[0]["properties"] == {"trace": "t-1", "n": "1"}
    assert peeked[0]["producer_name"] == "plain-writer"
    assert [m["properties"] for m in peeked[1:4]] == [{"i": "0"}, {"i": "1"}, {"i": "2"}]
    assert [m["message_id"].count(":") for m in peeked] == [1, 2, 2, 2, 1]   # batch messages carry an index
    assert peeked[4]["encoding"] == "base64"
    assert backlog() == before                      # looking consumed nothing

    ledger_id, entry_id = peeked[1]["message_id"].split(":")[:2]
    by_id = admin(web_url, "topics", "get-message-by-id", topic, "-m", f"{ledger_id}:{entry_id}")
    assert [m["payload"] for m in by_id] == [f"batched-{i}" * 20 for i in range(3)]

    assert [m["payload"] for m in admin(web_url, "topics", "examine-message", topic, "-i", "earliest")] == ["gone"]
    assert admin(web_url, "topics", "examine-message", topic, "-m", "2")[0]["payload"] == "batched-0" * 20
    assert admin(web_url, "topics", "examine-message", topic)[0]["encoding"] == "base64"    # the newest

    base = f"{web_url}/admin/v2/persistent/public/default/{topic}"
    for query, body in (("initialPosition=earliest&messagePosition=4", b"\xff\xfe binary"),
                        ("initialPosition=latest&messagePosition=4", b"gone")):
        with urllib.request.urlopen(f"{base}/examinemessage?{query}", timeout=30) as response:
            assert response.read() == body, query
    with urllib.request.urlopen(f"{base}/subscription/look/position/1", timeout=30) as response:
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert response.headers["X-Pulsar-Message-ID"] == peeked[0]["message_id"]
        assert json.loads(response.headers["X-Pulsar-PROPERTY"]) == {"trace": "t-1", "n": "1"}
        assert response.headers["X-Pulsar-publish-time"].endswith("+0000")
        assert "X-Pulsar-num-batch-message" not in response.headers
        assert response.read() == "héllo".encode()
    with urllib.request.urlopen(f"{base}/subscription/look/position/2", timeout=30) as response:
        assert response.headers["X-Pulsar-num-batch-message"] == "3"
        assert b"batched-2" in response.read()        # uncompressed
    for url, status in [(f"{base}/subscription/look/position/6", 404), (f"{base}/ledger/{ledger_id}/entry/999", 404),
                        (f"{base}/subscription/nobody/position/1", 404), (f"{base}/examinemessage?messagePosition=5", 404),
                        (f"{base}/examinemessage?initialPosition=middle", 400),
                        (f"{base}/examinemessage?messagePosition=0", 400)]:
        try:
            urllib.request.urlopen(url, timeout=30)
            raise AssertionError(f"{url} answered")
        except urllib.error.HTTPError as error:
            assert error.code == status, (url, error.code)
    admin(web_url, "topics", "create-partitioned", f"{topic}-p", "--partitions", "2")
    try:
        urllib.request.urlopen(f"{base}-p/subscription/look/position/1", timeout=30)
        raise AssertionError("a partitioned topic's name was peeked")
    except urllib.error.HTTPError as error:
        assert error.code == 403
