"""The metadata store: every piece of cluster metadata, on etcd (see store.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metadata.store import MetadataStore

if TYPE_CHECKING:
    from metadata.etcd_tls import EtcdTlsConfig


def open_store(url: str, *, root: str | None = None, tls: "EtcdTlsConfig | None" = None) -> MetadataStore:
    """Opens the store named by ``etcd://host:port[,host:port...][/root]``; ``memory://``
    gives an in-process store (tests, simulation). ``tls``: TLS toward etcd
    (metadata/etcd_tls.py)."""
    if url.startswith("memory://"):
        from metadata.memory_store import MemoryStore

        return MemoryStore()
    from metadata.etcd_store import EtcdStore, parse_metadata_url

    from metadata.etcd_tls import EtcdTlsConfig

    tls = tls or EtcdTlsConfig()
    config = parse_metadata_url(url, tls=tls) if root is None else parse_metadata_url(url, root=root, tls=tls)
    return EtcdStore(config)
