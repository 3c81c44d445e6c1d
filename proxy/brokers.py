"""The brokers a proxy may reach: exactly those registered in etcd (their leased load
reports under ``/brokers/``). A client names the broker it wants in
``CommandConnect.proxy_to_broker_url``; a name that is not one of these is refused, so
the proxy is never an open relay."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from urllib.parse import urlsplit

from metadata import keys
from metadata.prefix_cache import PrefixCache
from metadata.store import MetadataStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerAddress:
    broker_id: str
    host: str
    port: int
    tls: bool
    web_url: str


def address_key(url: str) -> str | None:
    """``pulsar://Host:6650`` or ``host:6650`` → ``host:6650`` (None if it names no
    host and port)."""
    url = url.strip()
    if not url:
        return None
    if "://" not in url:
        url = "pulsar://" + url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return f"{parts.hostname.lower()}:{port}"


def _addresses(record: bytes) -> list[tuple[str, BrokerAddress]]:
    try:
        report = json.loads(record)
    except ValueError:
        return []
    if not isinstance(report, dict):
        return []
    broker_id = str(report.get("broker_id", ""))
    web_url = str(report.get("web_service_url", ""))
    urls: list[tuple[str, bool]] = [(str(report.get("service_url", "")), False),
                                    (str(report.get("service_url_tls", "")), True)]
    listeners = report.get("listeners") or {}
    if isinstance(listeners, dict):
        urls += [(str(url), str(url).startswith("pulsar+ssl://")) for url in listeners.values()]
    found = []
    for url, tls in urls:
        key = address_key(url)
        if key is None:
            continue
        host, port = key.rsplit(":", 1)
        found.append((key, BrokerAddress(broker_id, host, int(port), tls, web_url)))
    return found


class BrokerDirectory:
    """The live brokers, followed through a watch of their reports."""

    def __init__(self, store: MetadataStore) -> None:
        self._cache = PrefixCache(store, keys.BROKERS)

    async def start(self) -> None:
        await self._cache.start()

    async def close(self) -> None:
        await self._cache.close()

    def _all(self) -> dict[str, BrokerAddress]:
        found: dict[str, BrokerAddress] = {}
        for record in list(self._cache.records.values()):
            for key, address in _addresses(record.value):
                found[key] = address
        return found

    def count(self) -> int:
        return len(self._cache.records)

    def resolve(self, url: str) -> BrokerAddress | None:
        """The registered broker ``url`` names, None if no live broker has it."""
        key = address_key(url)
        return self._all().get(key) if key is not None else None

    def pick(self, exclude: set[str] = frozenset(), tls: bool = False) -> BrokerAddress | None:
        """A live broker for a lookup, at random (plain address unless ``tls``)."""
        candidates = [a for a in self._all().values() if a.tls == tls and a.broker_id not in exclude]
        return random.choice(candidates) if candidates else None

    def web_urls(self) -> list[str]:
        return sorted({a.web_url for a in self._all().values() if a.web_url})
