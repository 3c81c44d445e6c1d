"""Which archive files a read covers: the topics an option names (a list, or a pattern
over a namespace's topics) and their archive manifests, from any broker's admin REST
(docs/archive.md, "REST and tools"). Shell: blocking HTTP on the planning worker.

The manifest is the truth about the archive: a file counts only once its ledger's
record names it (archive/manifest.py), so files no record names (a crashed write, an
attempt that lost the race) are never read, and each named file's size is checked
before it is opened.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid

from common.errors import ConfigError, MagnetarError, TopicNotFound
from common.topic_name import TopicName

# Planning asks one broker a few small questions; a broker answers in milliseconds,
# thirty seconds covers a topic load waiting on etcd.
HTTP_TIMEOUT_S = 30.0


def _get_json(url: str) -> object:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise TopicNotFound(f"not found: {url}") from None
        raise MagnetarError(f"admin request failed: url={url} status={error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        raise MagnetarError(f"admin request failed: url={url} error={error}") from None


def _call(method: str, url: str) -> None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=HTTP_TIMEOUT_S):
            pass
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise TopicNotFound(f"not found: {method} {url}") from None
        raise MagnetarError(f"admin request failed: {method} url={url} status={error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        raise MagnetarError(f"admin request failed: {method} url={url} error={error}") from None


def resolve_topics(admin_url: str, topics: tuple[str, ...], pattern: str | None, namespace: str | None) -> list[str]:
    """The full topic names a read covers, sorted."""
    if pattern is None:
        return sorted(topics)
    assert namespace is not None
    listed = _get_json(f"{admin_url}/admin/v2/persistent/{namespace}")
    if not isinstance(listed, list):
        raise ConfigError(f"namespace {namespace} topic list is not a list")
    regex = re.compile(pattern)
    names = set()
    for name in listed:
        topic = TopicName.parse(name)
        # A partition is read through its partitioned topic's manifest.
        parent = str(topic.partitioned_parent)
        if regex.fullmatch(parent) or regex.fullmatch(str(topic)):
            names.add(parent)
    return sorted(names)


def ledgers(admin_url: str, topic: str) -> list[dict]:
    """The archived ledgers of a topic (every partition's, for a partitioned topic),
    as the manifest's LedgerRecord JSON, ordered by (topic, ledger_id)."""
    name = TopicName.parse(topic)
    manifest = _get_json(f"{admin_url}/admin/v2/{name.rest_path}/archive")
    assert isinstance(manifest, dict), manifest
    return sorted(manifest["ledgers"], key=lambda ledger: (ledger["topic"], ledger["ledger_id"]))


def last_message_position(admin_url: str, topic: str) -> tuple[int, int] | None:
    """The (ledger_id, entry_id) of a topic's last message, None when it has none."""
    name = TopicName.parse(topic)
    answer = _get_json(f"{admin_url}/admin/v2/{name.rest_path}/lastMessageId")
    assert isinstance(answer, dict), answer
    ledger_id, entry_id = int(answer.get("ledgerId", -1)), int(answer.get("entryId", -1))
    if ledger_id < 0 or entry_id < 0:
        return None
    return ledger_id, entry_id


def topic_ledgers(admin_url: str, topic: str) -> list[tuple[int, int | None]]:
    """The ledgers of a topic's (or a partition's) managed ledger, oldest first, as
    ``(ledger_id, entries)``; the last one, being written, has ``entries`` None."""
    name = TopicName.parse(topic)
    answer = _get_json(f"{admin_url}/admin/v2/{name.rest_path}/internalStats")
    assert isinstance(answer, dict), answer
    listed = [(int(ledger["ledgerId"]), int(ledger["entries"])) for ledger in answer.get("ledgers", [])]
    # entries is -1 for a closed ledger whose count the broker does not know yet.
    return [(ledger_id, entries if index < len(listed) - 1 and entries >= 0 else None)
            for index, (ledger_id, entries) in enumerate(listed)]


def position_at_time(admin_url: str, topic: str, timestamp_ms: int) -> tuple[int, int]:
    """The position of a topic's (or a partition's) first entry published at or after
    ``timestamp_ms`` (the position after its last entry if none), found by the broker's
    own search over the topic's entries: a durable subscription made for the question,
    reset to the time, read and deleted."""
    name = TopicName.parse(topic)
    subscription = f"spark-time-{uuid.uuid4().hex[:12]}"
    base = f"{admin_url}/admin/v2/{name.rest_path}/subscription/{subscription}"
    _call("PUT", base)
    try:
        _call("POST", f"{base}/resetcursor/{timestamp_ms}")
        answer = _get_json(f"{admin_url}/admin/v2/{name.rest_path}/internalStats")
        assert isinstance(answer, dict), answer
        position = answer["cursors"][subscription]["readPosition"]
    finally:
        _call("DELETE", f"{base}?force=true")
    ledger_id, _, entry_id = str(position).partition(":")
    return int(ledger_id), int(entry_id)


def service_url_of(admin_url: str, topic: str) -> str:
    """A broker's Pulsar-protocol URL, from the admin URL's lookup of ``topic`` (Pulsar's
    ``/lookup/v2/topic/...``: ``brokerUrl``, else ``brokerUrlTls``)."""
    name = TopicName.parse(topic)
    answer = _get_json(f"{admin_url}/lookup/v2/topic/{name.rest_path}")
    assert isinstance(answer, dict), answer
    url = answer.get("brokerUrl") or answer.get("brokerUrlTls")
    if not isinstance(url, str) or not url.startswith(("pulsar://", "pulsar+ssl://")):
        raise ConfigError(f"the lookup of {topic} at {admin_url} named no pulsar:// URL ({answer}); "
                          "give option serviceUrl")
    return url


def partition_count(admin_url: str, topic: str) -> int:
    name = TopicName.parse(topic)
    answer = _get_json(f"{admin_url}/admin/v2/{name.rest_path}/partitions")
    assert isinstance(answer, dict), answer
    return int(answer.get("partitions", 0))


__all__ = ["service_url_of", "ledgers", "resolve_topics", "last_message_position", "partition_count", "position_at_time", "topic_ledgers", "urllib"]
