"""``magnetar admin``: a thin command-line client over Pulsar's admin REST paths, in the
manner of ``pulsar-admin``. Each action is one (or, for a few, two) HTTP requests; the
tool prints JSON on stdout and exits 0: what the server returned (pretty-printed; a
text answer as a JSON string), or, when the server answered with an empty body (most
actions that change something: set-retention, reset-cursor, expire-messages, ...),
``{"ok": true, "action": ..., "method": ..., "path": ..., "status": ...}``. On failure
its last line on stderr is ``magnetar admin: METHOD URL: HTTP status: reason [Error,
code N]`` with the broker's reason and catalogue code (magnetar/tools/failure.py), and
it exits 1 (2 for a command line refused before any request).

    magnetar admin --admin-url http://127.0.0.1:8080 tenants list
    magnetar admin namespaces create my-tenant/my-ns
    magnetar admin namespaces set-retention my-tenant/my-ns --time-minutes 60 --size-mb 1024
    magnetar admin topics create-partitioned my-tenant/my-ns/orders --partitions 4
    magnetar admin topics stats persistent://my-tenant/my-ns/orders-partition-0
    magnetar admin topics reset-cursor my-topic -s my-sub --time 10m
    magnetar admin brokers health
    magnetar admin --request-timeout-s 60 brokers drain     (on the broker's host: its preStop)

Topic names are full (``persistent://t/ns/x``), ``t/ns/x``, or short (``x``, which is
``persistent://public/default/x``, as in Pulsar).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import time

from magnetar.tools.admin_client import AdminClient, AdminError, Response, path
from magnetar.tools.failure import report_admin_error, usage_failure
from protocol.admin_entry import entry_messages, time_text

API = ("admin", "v2")
DEFAULT_TENANT, DEFAULT_NAMESPACE = "public", "default"
# Pulsar's MessageId.earliest and MessageId.latest, as its REST API takes them.
_EARLIEST = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
_LATEST = {"ledgerId": 2**63 - 1, "entryId": 2**63 - 1, "partitionIndex": -1}
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_DURATION_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class UsageError(ValueError):
    pass


def topic_parts(name: str) -> tuple[str, str, str, str]:
    """(domain, tenant, namespace, local name) of a topic name in any of Pulsar's forms."""
    domain = "persistent"
    if "://" in name:
        domain, name = name.split("://", 1)
        if domain not in ("persistent", "non-persistent"):
            raise UsageError(f"unknown topic domain {domain!r} in {name!r}")
    parts = name.split("/")
    if len(parts) == 1:
        return domain, DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]
    if len(parts) >= 3 and all(parts[:3]):
        return domain, parts[0], parts[1], "/".join(parts[2:])
    raise UsageError(f"topic name {name!r} is neither 'tenant/namespace/topic' nor a short name")


def namespace_parts(name: str) -> tuple[str, str]:
    parts = name.split("/")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"namespace {name!r} is not 'tenant/namespace'")
    return parts[0], parts[1]


def message_id_body(text: str) -> dict:
    """``earliest``, ``latest`` or ``ledger:entry`` as Pulsar's REST message id."""
    if text == "earliest":
        return dict(_EARLIEST)
    if text == "latest":
        return dict(_LATEST)
    try:
        ledger_id, entry_id = (int(part) for part in text.split(":")[:2])
    except ValueError:
        raise UsageError(f"message id {text!r} is not 'earliest', 'latest' or 'ledgerId:entryId'") from None
    return {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": -1}


def timestamp_ms(args: argparse.Namespace, now_s: float) -> int:
    """--timestamp (ms since the epoch) or --time (a duration back from now: 30s, 10m, 2h, 1d)."""
    if args.timestamp is not None:
        return args.timestamp
    match = _DURATION.match(args.time)
    if not match:
        raise UsageError(f"--time {args.time!r} is not a duration such as 30s, 10m, 2h, 1d")
    return int((now_s - int(match.group(1)) * _DURATION_S[match.group(2)]) * 1000)


def _topic(name: str, *rest: str) -> str:
    return path(*API, *topic_parts(name), *rest)


def _namespace(name: str, *rest: str) -> str:
    return path(*API, "namespaces", *namespace_parts(name), *rest)


def _force(args: argparse.Namespace) -> dict | None:
    return {"force": "true"} if args.force else None


# --- actions: (client, args) -> Response -------------------------------------------

def clusters_list(client, args):
    return client.get(path(*API, "clusters"))


def clusters_get(client, args):
    return client.get(path(*API, "clusters", args.cluster))


def tenants_list(client, args):
    return client.get(path(*API, "tenants"))


def tenants_create(client, args):
    allowed = args.allowed_clusters
    if allowed is None:
        # pulsar-admin allows every cluster when none is named.
        allowed = clusters_list(client, args).document() or []
    body = {"adminRoles": args.admin_roles or [], "allowedClusters": allowed}
    return client.request("PUT", path(*API, "tenants", args.tenant), body=body)


def tenants_get(client, args):
    return client.get(path(*API, "tenants", args.tenant))


def tenants_delete(client, args):
    return client.request("DELETE", path(*API, "tenants", args.tenant), query=_force(args))


def namespaces_list(client, args):
    return client.get(path(*API, "namespaces", args.tenant))


def namespaces_create(client, args):
    body = {"bundles": {"numBundles": args.bundles}} if args.bundles is not None else None
    return client.request("PUT", _namespace(args.namespace), body=body)


def namespaces_delete(client, args):
    return client.request("DELETE", _namespace(args.namespace), query=_force(args))


def namespaces_get(client, args):
    return client.get(_namespace(args.namespace))


def namespaces_topics(client, args):
    return client.get(_namespace(args.namespace, "topics"))


def namespaces_set_retention(client, args):
    body = {"retentionTimeInMinutes": args.time_minutes, "retentionSizeInMB": args.size_mb}
    return client.request("POST", _namespace(args.namespace, "retention"), body=body)


def namespaces_set_deduplication(client, args):
    return client.request("POST", _namespace(args.namespace, "deduplication"), body=args.enable)


def namespaces_get_deduplication(client, args):
    return client.get(_namespace(args.namespace, "deduplication"))


def namespaces_get_retention(client, args):
    return client.get(_namespace(args.namespace, "retention"))


def namespaces_set_persistence(client, args):
    if not args.ensemble >= args.write_quorum >= args.ack_quorum >= 1:
        raise UsageError("persistence wants ensemble >= write-quorum >= ack-quorum >= 1")
    body = {"bookkeeperEnsemble": args.ensemble, "bookkeeperWriteQuorum": args.write_quorum,
            "bookkeeperAckQuorum": args.ack_quorum, "managedLedgerMaxMarkDeleteRate": args.mark_delete_max_rate}
    return client.request("POST", _namespace(args.namespace, "persistence"), body=body)


def namespaces_get_persistence(client, args):
    return client.get(_namespace(args.namespace, "persistence"))


def namespaces_set_auto_topic_creation(client, args):
    body = {"allowAutoTopicCreation": args.enable, "topicType": args.type}
    if args.type == "partitioned":
        body["defaultNumPartitions"] = args.num_partitions
    return client.request("POST", _namespace(args.namespace, "autoTopicCreation"), body=body)


def namespaces_unload(client, args):
    if args.bundle:
        return client.request("PUT", _namespace(args.namespace, args.bundle, "unload"),
                              query={"destinationBroker": args.destination_broker})
    if args.destination_broker:
        raise SystemExit("--destinationBroker needs --bundle")
    return client.request("PUT", _namespace(args.namespace, "unload"))


def namespaces_bundles(client, args):
    return client.get(_namespace(args.namespace, "bundles"))


def namespaces_bundle_owners(client, args):
    return client.get(_namespace(args.namespace, "bundleOwners"))


def namespaces_split_bundle(client, args):
    return client.request("PUT", _namespace(args.namespace, args.bundle, "split"),
                          query={"unload": "true" if args.unload else None})


def namespaces_permissions(client, args):
    return client.get(_namespace(args.namespace, "permissions"))


def namespaces_grant_permission(client, args):
    return client.request("POST", _namespace(args.namespace, "permissions", args.role), body=args.actions)


def namespaces_revoke_permission(client, args):
    return client.request("DELETE", _namespace(args.namespace, "permissions", args.role))


def topics_list(client, args):
    return client.get(path(*API, "persistent", *namespace_parts(args.namespace)))


def topics_list_partitioned(client, args):
    return client.get(path(*API, "persistent", *namespace_parts(args.namespace), "partitioned"))


def topics_create(client, args):
    return client.request("PUT", _topic(args.topic))


def topics_delete(client, args):
    return client.request("DELETE", _topic(args.topic), query=_force(args))


def topics_stats(client, args):
    return client.get(_topic(args.topic, "stats"))


def topics_partitioned_stats(client, args):
    return client.get(_topic(args.topic, "partitioned-stats"),
                      query={"perPartition": "true" if args.per_partition else "false"})


def topics_internal_stats(client, args):
    return client.get(_topic(args.topic, "internalStats"))


def topics_create_partitioned(client, args):
    # Pulsar's body for the partition count is the bare JSON number.
    return client.request("PUT", _topic(args.topic, "partitions"), body=args.partitions)


def topics_update_partitioned(client, args):
    return client.request("POST", _topic(args.topic, "partitions"), body=args.partitions)


def topics_get_partitioned(client, args):
    return client.get(_topic(args.topic, "partitions"))


def topics_delete_partitioned(client, args):
    return client.request("DELETE", _topic(args.topic, "partitions"), query=_force(args))


def topics_subscriptions(client, args):
    return client.get(_topic(args.topic, "subscriptions"))


def topics_create_subscription(client, args):
    return client.request("PUT", _topic(args.topic, "subscription", args.subscription),
                          body=message_id_body(args.message_id))


def topics_delete_subscription(client, args):
    return client.request("DELETE", _topic(args.topic, "subscription", args.subscription), query=_force(args))


def topics_reset_cursor(client, args):
    if args.message_id is not None:
        return client.request("POST", _topic(args.topic, "subscription", args.subscription, "resetcursor"),
                              body=message_id_body(args.message_id))
    if args.timestamp is None and args.time is None:
        raise UsageError("reset-cursor wants --timestamp MS, --time DURATION or --message-id ID")
    return client.request("POST", _topic(args.topic, "subscription", args.subscription, "resetcursor",
                                         str(timestamp_ms(args, time.time()))))


def topics_skip_all(client, args):
    return client.request("POST", _topic(args.topic, "subscription", args.subscription, "skip_all"))


def topics_skip(client, args):
    return client.request("POST", _topic(args.topic, "subscription", args.subscription, "skip", str(args.count)))


def topics_expire_messages(client, args):
    return client.request("POST", _topic(args.topic, "subscription", args.subscription, "expireMessages",
                                         str(args.expire_time)))


def topics_expire_messages_all(client, args):
    return client.request("POST", _topic(args.topic, "all_subscription", "expireMessages", str(args.expire_time)))


def topics_compact(client, args):
    return client.request("PUT", _topic(args.topic, "compaction"))


def topics_compaction_status(client, args):
    return client.get(_topic(args.topic, "compaction"))


def topics_terminate_partitioned(client, args):
    return client.request("POST", _topic(args.topic, "terminate", "partitions"))


def messages_of(response: Response) -> list[dict]:
    """The messages of one entry as ``GET .../position/{n}`` or ``.../ledger/{l}/entry/{e}``
    answer it (protocol/admin_entry.py): a batch entry is split into its messages.
    Payloads print as text when they are UTF-8, else as base64."""
    printed = []
    for message in entry_messages(response.headers, response.body):
        message_id = f"{message.ledger_id}:{message.entry_id}"
        printed.append({"message_id": message_id if message.batch_index < 0 else f"{message_id}:{message.batch_index}",
                        "publish_time": time_text(message.publish_time_ms) if message.publish_time_ms else None,
                        "producer_name": message.producer, "sequence_id": message.sequence_id,
                        "properties": message.properties,
                        **({"key": message.key} if message.key is not None else {}), **_payload(message.payload)})
    return printed


def _payload(data: bytes) -> dict:
    try:
        return {"payload": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


def _json_response(document) -> Response:
    return Response(200, "application/json", json.dumps(document).encode())


def topics_peek_messages(client, args):
    """The subscription's next ``count`` unacknowledged entries, their messages one by
    one (the cursor does not move)."""
    messages = []
    for position in range(1, args.count + 1):
        try:
            response = client.get(_topic(args.topic, "subscription", args.subscription, "position", str(position)))
        except AdminError as error:
            if error.status == 404 and position > 1:
                break                                   # the backlog is shorter
            raise
        messages += messages_of(response)
    return _json_response(messages)


def topics_get_message_by_id(client, args):
    ledger_id, entry_id = _ledger_entry(args.message_id)
    return _json_response(messages_of(client.get(_topic(args.topic, "ledger", str(ledger_id), "entry", str(entry_id)))))


def topics_examine_message(client, args):
    return _json_response(messages_of(client.get(_topic(args.topic, "examinemessage"), query={
        "initialPosition": args.initial_position, "messagePosition": str(args.message_position)})))


def _ledger_entry(text: str) -> tuple[int, int]:
    parts = text.split(":")
    if len(parts) < 2 or not all(part.lstrip("-").isdigit() for part in parts[:2]):
        raise UsageError(f"a message id is ledger:entry, not {text!r}")
    return int(parts[0]), int(parts[1])


def topics_unload(client, args):
    return client.request("PUT", _topic(args.topic, "unload"))


def topics_terminate(client, args):
    return client.request("POST", _topic(args.topic, "terminate"))


def topics_last_message_id(client, args):
    return client.get(_topic(args.topic, "lastMessageId"))


def topics_lookup(client, args):
    return client.get(path("lookup", "v2", "topic", *topic_parts(args.topic)))


def brokers_list(client, args):
    cluster = args.cluster
    if cluster is None:
        clusters = clusters_list(client, args).document() or []
        if len(clusters) != 1:
            raise UsageError(f"name the cluster: the server knows {clusters}")
        cluster = clusters[0]
    return client.get(path(*API, "brokers", cluster))


def brokers_health(client, args):
    return client.get(path(*API, "brokers", "health"))


def brokers_drain(client, args):
    return client.request("POST", path(*API, "brokers", "drain"))


def brokers_leader(client, args):
    return client.get(path(*API, "brokers", "leaderBroker"))


# --- argument parsing -------------------------------------------------------------

def _csv(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def _add_switch(parser: argparse.ArgumentParser) -> None:
    """--enable / --disable, one of them required (``args.enable``)."""
    switch = parser.add_mutually_exclusive_group(required=True)
    switch.add_argument("--enable", dest="enable", action="store_true")
    switch.add_argument("--disable", dest="enable", action="store_false")


def _action(actions, name: str, handler, summary: str) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=summary, description=summary)
    parser.set_defaults(admin_action=handler)
    return parser


def _add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="also when in use")


def _add_clusters(resources) -> None:
    actions = resources.add_parser("clusters", help="clusters").add_subparsers(dest="action", required=True)
    _action(actions, "list", clusters_list, "list the clusters")
    _action(actions, "get", clusters_get, "a cluster's configuration").add_argument("cluster")


def _add_tenants(resources) -> None:
    actions = resources.add_parser("tenants", help="tenants").add_subparsers(dest="action", required=True)
    _action(actions, "list", tenants_list, "list the tenants")
    create = _action(actions, "create", tenants_create, "create a tenant")
    create.add_argument("tenant")
    create.add_argument("--admin-roles", type=_csv, default=None, help="comma-separated roles")
    create.add_argument("--allowed-clusters", type=_csv, default=None,
                        help="comma-separated clusters (default: every cluster)")
    _action(actions, "get", tenants_get, "a tenant's configuration").add_argument("tenant")
    delete = _action(actions, "delete", tenants_delete, "delete a tenant")
    delete.add_argument("tenant")
    _add_force(delete)


def _add_namespaces(resources) -> None:
    actions = resources.add_parser("namespaces", help="namespaces and their policies").add_subparsers(
        dest="action", required=True)
    _action(actions, "list", namespaces_list, "a tenant's namespaces").add_argument("tenant")
    create = _action(actions, "create", namespaces_create, "create a namespace")
    create.add_argument("namespace", metavar="TENANT/NAMESPACE")
    create.add_argument("--bundles", type=int, default=None, help="number of bundles")
    delete = _action(actions, "delete", namespaces_delete, "delete a namespace")
    delete.add_argument("namespace", metavar="TENANT/NAMESPACE")
    _add_force(delete)
    for name in ("get", "policies"):
        _action(actions, name, namespaces_get, "a namespace's policies").add_argument(
            "namespace", metavar="TENANT/NAMESPACE")
    _action(actions, "topics", namespaces_topics, "a namespace's topics").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    retention = _action(actions, "set-retention", namespaces_set_retention,
                        "keep acknowledged messages this long / this much")
    retention.add_argument("namespace", metavar="TENANT/NAMESPACE")
    retention.add_argument("--time-minutes", type=int, required=True, help="-1: forever")
    retention.add_argument("--size-mb", type=int, required=True, help="-1: no size limit")
    _action(actions, "get-retention", namespaces_get_retention, "the retention policy").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    deduplication = _action(actions, "set-deduplication", namespaces_set_deduplication,
                            "drop a producer's resends by sequence id (idempotent produce)")
    deduplication.add_argument("namespace", metavar="TENANT/NAMESPACE")
    _add_switch(deduplication)
    _action(actions, "get-deduplication", namespaces_get_deduplication, "the deduplication policy").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    persistence = _action(actions, "set-persistence", namespaces_set_persistence,
                          "ensemble size and quorums of the namespace's ledgers")
    persistence.add_argument("namespace", metavar="TENANT/NAMESPACE")
    persistence.add_argument("--ensemble", type=int, required=True)
    persistence.add_argument("--write-quorum", type=int, required=True)
    persistence.add_argument("--ack-quorum", type=int, required=True)
    persistence.add_argument("--mark-delete-max-rate", type=float, default=0.0)
    _action(actions, "get-persistence", namespaces_get_persistence, "the persistence policy").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    auto = _action(actions, "set-auto-topic-creation", namespaces_set_auto_topic_creation,
                   "whether producers and consumers may create topics by using them")
    auto.add_argument("namespace", metavar="TENANT/NAMESPACE")
    _add_switch(auto)
    auto.add_argument("--type", default="non-partitioned", choices=["non-partitioned", "partitioned"])
    auto.add_argument("--num-partitions", type=int, default=1, help="with --type partitioned")
    unload = _action(actions, "unload", namespaces_unload,
                     "hand a namespace's bundles (or one, with --bundle) to other brokers")
    unload.add_argument("namespace", metavar="TENANT/NAMESPACE")
    unload.add_argument("-b", "--bundle", default=None, help="a bundle, e.g. 0x00000000_0x40000000")
    unload.add_argument("-d", "--destinationBroker", dest="destination_broker", default=None,
                        help="with --bundle: the broker (its id, as bundle-owners names it) to hand it to")
    _action(actions, "bundles", namespaces_bundles, "a namespace's bundle boundaries").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    _action(actions, "bundle-owners", namespaces_bundle_owners, "which broker owns each bundle").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    split = _action(actions, "split-bundle", namespaces_split_bundle, "split a bundle in two")
    split.add_argument("namespace", metavar="TENANT/NAMESPACE")
    split.add_argument("-b", "--bundle", required=True, help="e.g. 0x00000000_0x40000000")
    split.add_argument("--unload", action="store_true", help="then hand the halves to other brokers")
    _action(actions, "permissions", namespaces_permissions, "roles and what each may do").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    grant = _action(actions, "grant-permission", namespaces_grant_permission, "let a role produce and/or consume")
    grant.add_argument("namespace", metavar="TENANT/NAMESPACE")
    grant.add_argument("--role", required=True)
    grant.add_argument("--actions", type=_csv, required=True, help="comma-separated: produce,consume")
    revoke = _action(actions, "revoke-permission", namespaces_revoke_permission, "take a role's permissions away")
    revoke.add_argument("namespace", metavar="TENANT/NAMESPACE")
    revoke.add_argument("--role", required=True)


def _add_topics(resources) -> None:
    actions = resources.add_parser("topics", help="topics, partitioned topics, subscriptions").add_subparsers(
        dest="action", required=True)
    _action(actions, "list", topics_list, "a namespace's topics").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    _action(actions, "list-partitioned", topics_list_partitioned, "a namespace's partitioned topics").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")

    def topic_action(name, handler, summary, *, force=False, subscription=False):
        parser = _action(actions, name, handler, summary)
        parser.add_argument("topic", metavar="TOPIC")
        if force:
            _add_force(parser)
        if subscription:
            parser.add_argument("-s", "--subscription", required=True)
        return parser

    topic_action("create", topics_create, "create a non-partitioned topic")
    topic_action("delete", topics_delete, "delete a topic", force=True)
    topic_action("stats", topics_stats, "a topic's stats (rates, backlog, subscriptions)")
    topic_action("partitioned-stats", topics_partitioned_stats, "a partitioned topic's stats").add_argument(
        "--per-partition", action="store_true")
    topic_action("internal-stats", topics_internal_stats, "a topic's managed ledger and cursors")
    topic_action("create-partitioned", topics_create_partitioned, "create a partitioned topic").add_argument(
        "--partitions", type=int, required=True)
    topic_action("update-partitioned", topics_update_partitioned, "add partitions").add_argument(
        "--partitions", type=int, required=True)
    topic_action("get-partitioned", topics_get_partitioned, "a partitioned topic's metadata")
    topic_action("delete-partitioned", topics_delete_partitioned, "delete a partitioned topic", force=True)
    topic_action("subscriptions", topics_subscriptions, "a topic's subscriptions")
    topic_action("create-subscription", topics_create_subscription, "create a subscription",
                 subscription=True).add_argument(
        "-m", "--message-id", default="latest", help="where it starts: latest (default), earliest or ledger:entry")
    topic_action("delete-subscription", topics_delete_subscription, "delete a subscription",
                 force=True, subscription=True)
    reset = topic_action("reset-cursor", topics_reset_cursor, "move a subscription's cursor", subscription=True)
    where = reset.add_mutually_exclusive_group()
    where.add_argument("--timestamp", type=int, default=None, help="ms since the epoch")
    where.add_argument("-t", "--time", default=None, help="a duration back from now: 30s, 10m, 2h, 1d")
    where.add_argument("-m", "--message-id", default=None, help="earliest, latest or ledger:entry")
    topic_action("skip-all", topics_skip_all, "acknowledge a subscription's whole backlog", subscription=True)
    topic_action("skip", topics_skip, "acknowledge the next N messages of a subscription",
                 subscription=True).add_argument("-n", "--count", type=int, required=True)
    topic_action("expire-messages", topics_expire_messages, "acknowledge a subscription's messages older than "
                 "a time", subscription=True).add_argument("-t", "--expire-time", type=int, required=True,
                                                           help="seconds")
    topic_action("expire-messages-all-subscriptions", topics_expire_messages_all,
                 "acknowledge every subscription's messages older than a time").add_argument(
        "-t", "--expire-time", type=int, required=True, help="seconds")
    topic_action("peek-messages", topics_peek_messages, "the next messages of a subscription, without consuming "
                 "them", subscription=True).add_argument("-n", "--count", type=int, default=1)
    topic_action("get-message-by-id", topics_get_message_by_id, "the message(s) of the entry at ledger:entry"
                 ).add_argument("-m", "--message-id", required=True, help="ledger:entry")
    examine = topic_action("examine-message", topics_examine_message,
                           "the n-th message from the oldest stored, or back from the newest")
    examine.add_argument("-i", "--initial-position", choices=["earliest", "latest"], default="latest")
    examine.add_argument("-m", "--message-position", type=int, default=1)
    topic_action("compact", topics_compact, "start compacting the topic (every partition of a partitioned one)")
    topic_action("compaction-status", topics_compaction_status, "the last compaction's status")
    topic_action("terminate-partitioned", topics_terminate_partitioned,
                 "seal every partition of a partitioned topic; their last message ids")
    topic_action("unload", topics_unload, "close the topic on its broker (clients reconnect)")
    topic_action("terminate", topics_terminate, "seal the topic: no more messages")
    topic_action("last-message-id", topics_last_message_id, "the id of the topic's last message")
    topic_action("lookup", topics_lookup, "which broker serves the topic")


def _add_brokers(resources) -> None:
    actions = resources.add_parser("brokers", help="brokers").add_subparsers(dest="action", required=True)
    _action(actions, "list", brokers_list, "a cluster's active brokers").add_argument(
        "cluster", nargs="?", default=None, help="default: the only cluster")
    _action(actions, "health", brokers_health, "the broker's health check")
    _action(actions, "leader", brokers_leader, "the leader broker")
    _action(actions, "drain", brokers_drain,
            "hand every bundle of the broker at --admin-url to others (from its own host; a preStop hook)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin-url", default="http://127.0.0.1:8080", help="a broker's HTTP URL")
    parser.add_argument("--request-timeout-s", type=float, default=30.0)
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token", default=None, help="authentication token (prefer --token-file: ps shows arguments)")
    token.add_argument("--token-file", default=None, help="file holding the authentication token")
    parser.add_argument("--tls-trust-certs-file", default="",
                        help="CA of the brokers' certificates, for an https:// --admin-url (default: the system's)")
    parser.add_argument("--no-tls-hostname-verification", dest="tls_hostname_verification", action="store_false",
                        help="accept a broker certificate signed by the CA that does not name the host (a redirect "
                             "to a topic's owner names its pod IP in Kubernetes)")
    resources = parser.add_subparsers(dest="resource", required=True)
    _add_clusters(resources)
    _add_tenants(resources)
    _add_namespaces(resources)
    _add_topics(resources)
    _add_brokers(resources)


def render(response: Response, args: argparse.Namespace | None = None) -> str:
    """The JSON the tool prints for a successful action: the server's document, or for
    an empty answer a short record of what was done."""
    document = response.document()
    if document is None and response.method == "GET":
        return "null"                       # read: nothing set (get-deduplication of a new namespace)
    if document is None:
        action = f"{args.resource} {args.action}" if args is not None else None
        document = {"ok": True, "action": action, "method": response.method, "path": response.path,
                    "status": response.status}
    return json.dumps(document, indent=2, sort_keys=False)


def main(args: argparse.Namespace) -> int:
    token = args.token
    if args.token_file:
        with open(args.token_file, encoding="ascii") as handle:
            token = handle.read().strip()
    client = AdminClient(args.admin_url, timeout_s=args.request_timeout_s, token=token,
                         tls_trust_certs_file=args.tls_trust_certs_file,
                         tls_hostname_verification=args.tls_hostname_verification)
    try:
        response = args.admin_action(client, args)
    except UsageError as error:
        usage_failure("admin", str(error))
        return 2
    except AdminError as error:
        report_admin_error("admin", error)
        return 1
    print(render(response, args), flush=True)
    return 0
