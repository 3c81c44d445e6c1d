"""The data source's options, parsed once (on the driver's planning worker) into typed
values; a bad option is a ConfigError naming it. Names follow Spark's Kafka source
where the idea is the same.

Reads:
    topic / topics / pattern   one topic, a comma-separated list, or a regular expression
                               over the full topic names of ``namespace`` (exactly one of
                               the three)
    namespace                  tenant/namespace that ``pattern`` searches
    adminUrl                   a broker's HTTP URL: topic lists and archive manifests
    serviceUrl                 a broker's pulsar:// URL: the live tail, and writes (reads
                               that need it and lack it ask adminUrl's lookup for one)
    startingOffsets            "earliest" (default) or "LEDGER:ENTRY" (inclusive)
    endingOffsets              "latest" (default) or "LEDGER:ENTRY" (exclusive)
    startingTimestamp          publish time in ms since the epoch (inclusive)
    endingTimestamp            publish time in ms since the epoch (exclusive)
    includeUnarchived          "true" (default): the whole topic, the archive and the
                               entries not yet archived, read through a broker as a
                               non-durable reader; "false": only the archive's files
    rowsPerPartition           files holding more rows are split by record batches into
                               partitions of about this many rows (default 1,000,000)
    metricsDir                 a local directory where each planning and each task
                               writes its counters as a JSON file (tests, benchmarks)
    tailTimeoutMs              how long a tail read waits for the broker (default 60,000)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from common.errors import ConfigError, InvalidArgument
from common.topic_name import TopicName

Position = tuple[int, int]

# A task reads at most this many rows per partition by default: a million rows of
# 1 KiB payloads is about a GiB, a few seconds of one core.
ROWS_PER_PARTITION_DEFAULT = 1_000_000
TAIL_TIMEOUT_MS_DEFAULT = 60_000


@dataclass(frozen=True)
class ReadOptions:
    topics: tuple[str, ...]            # full names; empty when ``pattern`` is used
    pattern: str | None
    namespace: str | None
    admin_url: str
    service_url: str | None
    starting_position: Position | None        # None: earliest
    ending_position: Position | None          # None: latest (exclusive bound otherwise)
    starting_timestamp_ms: int | None
    ending_timestamp_ms: int | None
    include_unarchived: bool
    rows_per_partition: int
    metrics_dir: str | None
    tail_timeout_ms: int
    # An S3-compatible store's endpoint for s3:// archive files ("": the executors'
    # MAGNETAR_ARCHIVE_ENDPOINT_URL, else AWS); credentials come from the executors'
    # environment or credentials file, never from an option (plans get logged).
    archive_endpoint_url: str = ""

    def use_archive_endpoint(self) -> None:
        """Points this process's s3:// reads at the option's endpoint (on every task:
        executors are other processes)."""
        if self.archive_endpoint_url:
            from archive.location import use_endpoint

            use_endpoint(self.archive_endpoint_url)


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands options over case-insensitively (CaseInsensitiveDict), but a plain
    # dict from a test may not be: look the name up both ways.
    value = options.get(name)
    if value is None:
        value = options.get(name.lower())
    return None if value is None or value == "" else str(value)


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = _get(options, name)
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name} must be true or false, not {value!r}")


def _integer(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    value = _get(options, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, not {value!r}") from None
    if number < minimum:
        raise ConfigError(f"option {name} must be >= {minimum}, not {number}")
    return number


def parse_position(text: str, name: str) -> Position:
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if match is None:
        raise ConfigError(f"option {name} must be LEDGER:ENTRY, not {text!r}")
    return int(match.group(1)), int(match.group(2))


def topic_name(text: str, name: str) -> str:
    try:
        return str(TopicName.parse(text.strip()))
    except InvalidArgument as error:
        raise ConfigError(f"option {name}: {error}") from None


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    topic = _get(options, "topic")
    topics = _get(options, "topics")
    pattern = _get(options, "pattern")
    if sum(value is not None for value in (topic, topics, pattern)) != 1:
        raise ConfigError("exactly one of the options topic, topics and pattern is required")
    names: tuple[str, ...] = ()
    if topic is not None:
        names = (topic_name(topic, "topic"),)
    elif topics is not None:
        names = tuple(dict.fromkeys(topic_name(part, "topics") for part in topics.split(",") if part.strip()))
        if not names:
            raise ConfigError("option topics names no topic")
    namespace = _get(options, "namespace")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(f"option pattern is not a regular expression: {error}") from None
        if namespace is None or not re.fullmatch(r"[\w.-]+/[\w.-]+", namespace):
            raise ConfigError("option pattern needs option namespace as tenant/namespace")
    admin_url = _get(options, "adminUrl")
    if admin_url is None or not admin_url.startswith(("http://", "https://")):
        raise ConfigError("option adminUrl (a broker's http:// URL) is required")
    service_url = _get(options, "serviceUrl")
    if service_url is not None and not service_url.startswith(("pulsar://", "pulsar+ssl://")):
        raise ConfigError(f"option serviceUrl must be a pulsar:// URL, not {service_url!r}")
    # The whole topic by default, as a user (and Spark's Kafka source) expects: an
    # archive-only read of a topic nothing was archived of yet is an empty table.
    include_unarchived = _boolean(options, "includeUnarchived", True)
    starting = _get(options, "startingOffsets")
    ending = _get(options, "endingOffsets")
    starting_position = None if starting in (None, "earliest") else parse_position(starting, "startingOffsets")
    ending_position = None if ending in (None, "latest") else parse_position(ending, "endingOffsets")
    starting_timestamp_ms = _integer(options, "startingTimestamp", None, 0)
    ending_timestamp_ms = _integer(options, "endingTimestamp", None, 0)
    return ReadOptions(
        topics=names, pattern=pattern, namespace=namespace, admin_url=admin_url.rstrip("/"),
        service_url=service_url, starting_position=starting_position, ending_position=ending_position,
        starting_timestamp_ms=starting_timestamp_ms, ending_timestamp_ms=ending_timestamp_ms,
        include_unarchived=include_unarchived,
        rows_per_partition=_integer(options, "rowsPerPartition", ROWS_PER_PARTITION_DEFAULT, 1),
        metrics_dir=_get(options, "metricsDir"),
        tail_timeout_ms=_integer(options, "tailTimeoutMs", TAIL_TIMEOUT_MS_DEFAULT, 1),
        archive_endpoint_url=archive_endpoint_option(options))


def archive_endpoint_option(options: Mapping[str, str]) -> str:
    endpoint = _get(options, "archiveEndpointUrl") or ""
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"option archiveEndpointUrl must be an http:// or https:// URL, not {endpoint!r}")
    return endpoint
