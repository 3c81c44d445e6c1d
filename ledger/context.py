"""What every ledger handle needs from its client: the metadata store, the bookie
registry, the pool of bookie connections, configuration, a random source and the
quarantine of bookies that failed lately."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ledger.bookie_client import BookieClientPool
from ledger.bookie_registry import BookieRegistry
from ledger.config import LedgerClientConfig
from ledger.quarantine import BookieQuarantine
from common.errors import LedgerMetadataConflict, NoSuchLedger
from ledger.metadata import LedgerMetadata, VersionedMetadata
from metadata import keys
from metadata.store import MetadataStore


@dataclass
class LedgerContext:
    store: MetadataStore
    registry: BookieRegistry
    pool: BookieClientPool
    config: LedgerClientConfig
    rng: random.Random
    # Bookies that failed an add lately: chosen last (ledger/quarantine.py).
    quarantine: BookieQuarantine = field(default_factory=lambda: BookieQuarantine(0.0))

    async def read_metadata(self, ledger_id: int) -> VersionedMetadata:
        record = await self.store.get(keys.ledger(ledger_id))
        if record is None:
            raise NoSuchLedger(ledger_id)
        return VersionedMetadata(LedgerMetadata.decode(record.value), record.version)

    async def write_metadata(self, metadata: LedgerMetadata, expected_version: int) -> VersionedMetadata:
        """Compare-and-swap; raises LedgerMetadataConflict if someone changed it first."""
        from common.errors import MetadataVersionConflict

        try:
            version = await self.store.compare_and_set(keys.ledger(metadata.ledger_id), metadata.encode(),
                                                       expected_version=expected_version)
        except MetadataVersionConflict:
            raise LedgerMetadataConflict(f"ledger {metadata.ledger_id} metadata changed concurrently") from None
        return VersionedMetadata(metadata, version)
