"""Ledger metadata: what etcd keeps under ``/ledgers/<id>``. Pure (JSON in and out).

A ledger's entries are striped over an ensemble of E bookies, each entry written to Qw
of them and acknowledged once Qa answered. The ensemble may change while the ledger is
written (a bookie failed), so the metadata holds a list of fragments: each fragment
names the first entry it covers and its ensemble; it covers entries up to the next
fragment's first entry. States: OPEN (a writer may add), IN_RECOVERY (another client is
recovering it; the writer is fenced), CLOSED (``last_entry_id`` is final).

Every change is a compare-and-swap on the etcd version the changer read, so two
clients can never both believe their change won.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace

from common.errors import ConfigError, MalformedFrame

METADATA_FORMAT_VERSION = 1


class LedgerState(str, enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclass(frozen=True)
class Fragment:
    first_entry_id: int
    bookies: tuple[str, ...]


@dataclass(frozen=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    state: LedgerState
    fragments: tuple[Fragment, ...]
    last_entry_id: int = -1
    length_bytes: int = 0
    created_ms: int = 0
    custom: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_quorums(self.ensemble_size, self.write_quorum_size, self.ack_quorum_size)
        assert self.fragments, "a ledger has at least one fragment"
        assert self.fragments[0].first_entry_id == 0
        for earlier, later in zip(self.fragments, self.fragments[1:]):
            assert earlier.first_entry_id < later.first_entry_id, (earlier, later)
        for fragment in self.fragments:
            assert len(fragment.bookies) == self.ensemble_size, fragment

    @property
    def is_closed(self) -> bool:
        return self.state == LedgerState.CLOSED

    @property
    def current_ensemble(self) -> tuple[str, ...]:
        return self.fragments[-1].bookies

    def fragment_index_for(self, entry_id: int) -> int:
        assert entry_id >= 0
        index = 0
        for position, fragment in enumerate(self.fragments):
            if fragment.first_entry_id <= entry_id:
                index = position
            else:
                break
        return index

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        return self.fragments[self.fragment_index_for(entry_id)].bookies

    def fragment_last_entry_id(self, index: int, last_entry_id: int) -> int:
        """Last entry a fragment covers, given the ledger's last entry id."""
        if index + 1 < len(self.fragments):
            return self.fragments[index + 1].first_entry_id - 1
        return last_entry_id

    def all_bookies(self) -> set[str]:
        return {bookie for fragment in self.fragments for bookie in fragment.bookies}

    def with_ensemble_from(self, first_entry_id: int, bookies: tuple[str, ...]) -> "LedgerMetadata":
        """A new fragment from ``first_entry_id`` on; replaces the last fragment if it
        starts there too (no entry was ever confirmed in it)."""
        assert first_entry_id >= self.fragments[-1].first_entry_id
        kept = self.fragments
        if kept[-1].first_entry_id == first_entry_id:
            kept = kept[:-1]
        return replace(self, fragments=(*kept, Fragment(first_entry_id, tuple(bookies))))

    def closed(self, last_entry_id: int, length_bytes: int) -> "LedgerMetadata":
        return replace(self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length_bytes=length_bytes)

    def encode(self) -> bytes:
        return json.dumps({
            "format_version": METADATA_FORMAT_VERSION,
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum_size": self.write_quorum_size,
            "ack_quorum_size": self.ack_quorum_size,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length_bytes": self.length_bytes,
            "created_ms": self.created_ms,
            "fragments": [{"first_entry_id": f.first_entry_id, "bookies": list(f.bookies)} for f in self.fragments],
            "custom": self.custom,
        }, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "LedgerMetadata":
        """Parses and checks stored metadata. Anything inconsistent is MalformedFrame:
        bytes from etcd are outside input, never trusted to satisfy our invariants."""
        try:
            doc = json.loads(data)
        except ValueError as error:
            raise MalformedFrame(f"ledger metadata is not JSON: {error}") from None
        if not isinstance(doc, dict):
            raise MalformedFrame("ledger metadata is not a JSON object")
        if _int(doc, "format_version", 0) > METADATA_FORMAT_VERSION:
            raise MalformedFrame(f"ledger metadata format {doc['format_version']} is newer than this client")
        ensemble_size = _int(doc, "ensemble_size")
        write_quorum_size = _int(doc, "write_quorum_size")
        ack_quorum_size = _int(doc, "ack_quorum_size")
        if not ensemble_size >= write_quorum_size >= ack_quorum_size >= 1:
            raise MalformedFrame(f"ledger metadata quorums E={ensemble_size} Qw={write_quorum_size} "
                                 f"Qa={ack_quorum_size} break E >= Qw >= Qa >= 1")
        try:
            state = LedgerState(doc.get("state"))
        except ValueError:
            raise MalformedFrame(f"ledger metadata state {doc.get('state')!r} is unknown") from None
        raw_fragments = doc.get("fragments")
        if not isinstance(raw_fragments, list) or not raw_fragments:
            raise MalformedFrame("ledger metadata has no fragments")
        fragments = []
        for raw in raw_fragments:
            if not isinstance(raw, dict):
                raise MalformedFrame("ledger metadata fragment is not an object")
            bookies = raw.get("bookies")
            if (not isinstance(bookies, list) or len(bookies) != ensemble_size
                    or not all(isinstance(b, str) and b for b in bookies)):
                raise MalformedFrame(f"ledger metadata fragment must list {ensemble_size} bookie ids")
            fragments.append(Fragment(_int(raw, "first_entry_id"), tuple(bookies)))
        if fragments[0].first_entry_id != 0:
            raise MalformedFrame("ledger metadata's first fragment does not start at entry 0")
        if any(a.first_entry_id >= b.first_entry_id for a, b in zip(fragments, fragments[1:])):
            raise MalformedFrame("ledger metadata fragments are not in increasing entry order")
        custom = doc.get("custom", {})
        if not isinstance(custom, dict):
            raise MalformedFrame("ledger metadata custom is not an object")
        return cls(
            ledger_id=_int(doc, "ledger_id"),
            ensemble_size=ensemble_size,
            write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size,
            state=state,
            last_entry_id=_int(doc, "last_entry_id", minimum=-1),
            length_bytes=_int(doc, "length_bytes"),
            created_ms=_int(doc, "created_ms", 0),
            fragments=tuple(fragments),
            custom={str(k): str(v) for k, v in custom.items()},
        )


def _int(doc: dict, name: str, default: int | None = None, *, minimum: int = 0) -> int:
    value = doc.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MalformedFrame(f"ledger metadata field {name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class VersionedMetadata:
    metadata: LedgerMetadata
    version: int   # the etcd version it was read at (the compare-and-swap token)


def validate_quorums(ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
    if not ensemble_size >= write_quorum_size >= ack_quorum_size >= 1:
        raise ConfigError(
            f"quorums must satisfy E >= Qw >= Qa >= 1, got E={ensemble_size} "
            f"Qw={write_quorum_size} Qa={ack_quorum_size}")
