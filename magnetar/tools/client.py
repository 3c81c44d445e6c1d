"""Shared plumbing of the tools that use the official Pulsar client: building a client
whose own logs go to stderr (so that stdout carries only the tools' JSON), and turning
message ids and messages into JSON-ready dicts.

The official client calls back into Python from its own IO threads; an exception that
escapes such a callback terminates the process (pulsar-client's documented behaviour),
so every callback in these tools catches everything and records it instead.

Why the client's logs are rerouted rather than handed to Python logging: pulsar-client
accepts a ``logging.Logger``, but with one the process often aborts at exit ("terminate
called without an active exception"; apache/pulsar-client-python#256; 13 runs in 20 of a
subscribe/receive/close script here). Its console logger has no such problem but writes
to file descriptor 1, where the tools print their JSON. So before the first client is
built, fd 1 is pointed at stderr and Python's ``sys.stdout`` moves to a duplicate of the
original stdout: native writes land on stderr, the tools' output stays on stdout.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import sys

import _pulsar
import pulsar

SUBSCRIPTION_TYPES = {
    "exclusive": pulsar.ConsumerType.Exclusive,
    "shared": pulsar.ConsumerType.Shared,
    "failover": pulsar.ConsumerType.Failover,
    "key_shared": pulsar.ConsumerType.KeyShared,
}

INITIAL_POSITIONS = {
    "earliest": pulsar.InitialPosition.Earliest,
    "latest": pulsar.InitialPosition.Latest,
}


def add_service_url_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service-url", default="pulsar://127.0.0.1:6650",
                        help="the broker's binary-protocol URL (pulsar://host:port) or http:// lookup URL")
    parser.add_argument("--operation-timeout-s", type=int, default=30,
                        help="the client's timeout for lookups, producer and consumer creation")
    parser.add_argument("--token-file", default=None,
                        help="a file holding an authentication token (brokers with authentication on)")


# Payload bytes a tool may have sent and not yet acknowledged, over all its producers.
# The Python API cannot set the client's memory limit (the Java client's default is
# 64 MiB), so the tools bound their own windows by bytes too; half of that default
# keeps a perf run well inside what any Pulsar client would allow.
PENDING_BYTES_MAX = 32 * 1024 * 1024

_native_stdout_rerouted = False


def reroute_native_stdout() -> None:
    """Points fd 1 at stderr and gives Python a private stdout (see the module docstring).
    Idempotent; meant for a tool process, not for a process that shares fd 1 otherwise."""
    global _native_stdout_rerouted
    if _native_stdout_rerouted:
        return
    sys.stdout.flush()
    results_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = open(results_fd, "w", buffering=1, encoding="utf-8", closefd=True)
    _native_stdout_rerouted = True


def open_client(args: argparse.Namespace) -> pulsar.Client:
    reroute_native_stdout()
    # The C++ client logs every connection event at INFO: only warnings and errors
    # unless the operator asked for debug logs.
    debug = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    level = _pulsar.LoggerLevel.Debug if debug else _pulsar.LoggerLevel.Warn
    authentication = None
    if getattr(args, "token_file", None):
        with open(args.token_file, encoding="ascii") as handle:
            authentication = pulsar.AuthenticationToken(handle.read().strip())
    return pulsar.Client(args.service_url, operation_timeout_seconds=args.operation_timeout_s,
                         logger=pulsar.ConsoleLogger(level), authentication=authentication)


def message_id_json(message_id: pulsar.MessageId) -> dict:
    """A message id as Pulsar's admin API spells it (ledgerId, entryId, partitionIndex,
    batchIndex), plus Pulsar's text form ``ledger:entry:partition[:batch]``."""
    ledger_id, entry_id = message_id.ledger_id(), message_id.entry_id()
    partition, batch_index = message_id.partition(), message_id.batch_index()
    text = f"{ledger_id}:{entry_id}:{partition}" + (f":{batch_index}" if batch_index >= 0 else "")
    return {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": partition, "batchIndex": batch_index,
            "text": text}


def payload_json(payload: bytes) -> dict:
    """The payload as UTF-8 text when it decodes, else base64 — and which one it is."""
    try:
        return {"payload": payload.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(payload).decode("ascii"), "encoding": "base64"}


def message_json(message: pulsar.Message) -> dict:
    document = {
        "message_id": message_id_json(message.message_id()),
        "topic": message.topic_name(),
        "key": message.partition_key() or None,
        "properties": dict(message.properties()),
        # 0 means "not set" in Pulsar's API (the producer gave no event time).
        "event_time_ms": message.event_timestamp() or None,
        "publish_time_ms": message.publish_timestamp(),
        "redelivery_count": message.redelivery_count(),
        "size_bytes": len(message.data()),
    }
    document.update(payload_json(message.data()))
    return document


def client_error_text(error: BaseException) -> str:
    """``TopicNotFound: ...`` from a pulsar exception, without the C++ wrapper noise."""
    return f"{type(error).__name__}: {error}"


def report_client_failure(tool: str, args: argparse.Namespace, error: BaseException, *,
                          subscribe: dict | None = None, created: bool = False) -> None:
    """The last line of a tool whose official client failed: the broker's reason and the
    catalogue code. Before the producer or consumer existed (``created`` False), the
    broker is asked again for its reason (magnetar/tools/diagnosis.py); after, the
    client's result stands for it."""
    from magnetar.tools import diagnosis
    from magnetar.tools.failure import print_failure

    official = client_error_text(error)
    if created:
        explanation = diagnosis.from_result(type(error).__name__, official)
    else:
        token = ""
        if getattr(args, "token_file", None):
            with open(args.token_file, encoding="ascii") as handle:
                token = handle.read().strip()
        explanation = diagnosis.explain(args.service_url, token, args.topic, subscribe, official)
    what = f"{'subscribing to' if subscribe is not None else 'producing to'} {args.topic}"
    print_failure(tool, what, explanation.reason, explanation.error_name, explanation.code)
