"""The metadata store: every piece of cluster metadata, on etcd (see store.py)."""

from __future__ import annotations

from metadata.store import MetadataStore


def open_store(url: str, *, root: str | None = None) -> MetadataStore:
    """Opens the store named by ``etcd://host:port[,host:port...][/root]``; ``memory://``
    gives an in-process store (tests, simulation)."""
    if url.startswith("memory://"):
        from metadata.memory_store import MemoryStore

        return MemoryStore()
    from metadata.etcd_store import EtcdStore, parse_metadata_url

    config = parse_metadata_url(url) if root is None else parse_metadata_url(url, root=root)
    return EtcdStore(config)
