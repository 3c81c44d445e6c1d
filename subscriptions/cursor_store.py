"""Where cursor state is persisted.

``EtcdCursorStore`` keeps it in one etcd value per subscription (mark-delete position,
the compressed ack bitmaps and partly acknowledged batches). etcd caps values at
1.5 MiB; the ack bitmaps compress well but an adversarial pattern of holes can exceed
that, in which case the save fails loudly (never silently dropping acknowledgements).
"""

from __future__ import annotations

import base64
import json

from broker.position import Position
from ledger.errors import MalformedFrame, PersistenceError
from metadata.store import MetadataStore
from subscriptions.ack_set import AckSet
from subscriptions.cursor import CursorState

# etcd's default request limit is 1.5 MiB; leave room for the key and framing.
VALUE_BYTES_MAX = 1_400_000


def encode_state(state: CursorState) -> bytes:
    return json.dumps({
        "mark_delete": list(state.mark_delete),
        "acked": base64.b64encode(state.acked.encode()).decode(),
        "batches": [[p.ledger_id, p.entry_id, size, str(bits)] for p, (size, bits) in state.batches.items()],
        "properties": state.properties,
    }).encode()


def decode_state(data: bytes) -> CursorState:
    try:
        doc = json.loads(data)
        mark_delete = Position(int(doc["mark_delete"][0]), int(doc["mark_delete"][1]))
        acked = AckSet.decode(base64.b64decode(doc["acked"]))
        batches = {Position(int(l), int(e)): (int(size), int(bits)) for l, e, size, bits in doc.get("batches", [])}
        properties = {str(k): int(v) for k, v in doc.get("properties", {}).items()}
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise MalformedFrame(f"bad cursor record: {error}") from None
    return CursorState(mark_delete, acked, batches, properties)


class EtcdCursorStore:
    def __init__(self, store: MetadataStore, key: str) -> None:
        self._store = store
        self._key = key

    async def load(self) -> CursorState | None:
        record = await self._store.get(self._key)
        return decode_state(record.value) if record is not None else None

    async def save(self, state: CursorState) -> None:
        value = encode_state(state)
        if len(value) > VALUE_BYTES_MAX:
            raise PersistenceError(f"cursor state of {len(value)} bytes is too large for etcd ({self._key})")
        await self._store.put(self._key, value)

    async def delete(self) -> None:
        await self._store.delete(self._key)
