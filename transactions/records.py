"""A transaction's identity and the coordinator's record of it (pure).

A transaction id is Pulsar's pair of uint64s: ``most`` names the coordinator that
created it, ``least`` is that coordinator's counter (an etcd counter, so ids never
repeat across failovers). The coordinator keeps one record per transaction that is
open or ending; the record is the transaction's durable state:

    OPEN ──commit──▶ COMMITTING ──(every partition and subscription told)──▶ record deleted
      │                                                                    ▲
      └──abort / timeout──▶ ABORTING ─────────────────────────────────────┘

COMMITTING and ABORTING are the decision: once written (etcd, before END_TXN is
answered), a coordinator that takes over finishes the same decision; a decision never
changes. Partitions and subscriptions are added only while OPEN, and are bounded so
that a record stays far below etcd's value size (1.5 MiB).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace

from common.errors import InvalidTxnStatus, MetadataError, NotAllowed

FORMAT_VERSION = 1
# A transaction's topics and subscriptions: 1,000 each keeps a record (topic names of
# ~100 bytes) near 200 KiB, an eighth of etcd's value limit.
PARTITIONS_PER_TXN_MAX = 1000
SUBSCRIPTIONS_PER_TXN_MAX = 1000
# Pulsar's default transaction timeout is 60 s when the client names none; the most a
# client may ask for (Pulsar's transactionCoordinatorMaxTimeout... is unbounded; ours is
# bounded so an abandoned transaction cannot hold a topic's readers back for long).
TIMEOUT_S_DEFAULT = 60
TIMEOUT_S_MAX = 3600


@dataclass(frozen=True, slots=True, order=True)
class TxnId:
    most: int
    least: int

    def __post_init__(self) -> None:
        assert 0 <= self.most < 2**64, self.most
        assert 0 <= self.least < 2**64, self.least

    def __str__(self) -> str:
        return f"({self.most},{self.least})"

    @property
    def text(self) -> str:
        """The form used in keys and records: ``most:least``."""
        return f"{self.most}:{self.least}"

    @classmethod
    def parse(cls, text: str) -> "TxnId":
        most, _, least = text.partition(":")
        return cls(int(most), int(least))


class TxnStatus(str, enum.Enum):
    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    ABORTING = "ABORTING"


@dataclass(frozen=True, slots=True)
class TxnRecord:
    txn_id: TxnId
    status: TxnStatus
    # Wall-clock (epoch ms): a deadline must survive the coordinator moving to
    # another broker, whose monotonic clock is unrelated.
    deadline_ms: int
    partitions: tuple[str, ...] = ()
    subscriptions: tuple[tuple[str, str], ...] = ()
    # The role that opened it (None with authentication off): only that role, or a
    # superuser, may add to it or end it (Pulsar's verifyTxnOwnership).
    owner: str | None = None
    # When it was opened (epoch ms; 0 in records written before this field existed).
    opened_ms: int = 0

    def owned_by(self, role: str | None) -> bool:
        return self.owner is None or self.owner == role

    @property
    def ending(self) -> bool:
        return self.status is not TxnStatus.OPEN

    @property
    def committing(self) -> bool:
        return self.status is TxnStatus.COMMITTING

    def expired(self, now_ms: int) -> bool:
        return self.status is TxnStatus.OPEN and now_ms >= self.deadline_ms

    def with_partitions(self, topics: list[str]) -> "TxnRecord":
        self._check_open("add partitions to")
        merged = tuple(dict.fromkeys(self.partitions + tuple(topics)))
        if len(merged) > PARTITIONS_PER_TXN_MAX:
            raise NotAllowed(f"transaction {self.txn_id} would span {len(merged)} partitions, more than "
                             f"{PARTITIONS_PER_TXN_MAX}")
        return replace(self, partitions=merged)

    def with_subscriptions(self, subscriptions: list[tuple[str, str]]) -> "TxnRecord":
        self._check_open("add subscriptions to")
        merged = tuple(dict.fromkeys(self.subscriptions + tuple(subscriptions)))
        if len(merged) > SUBSCRIPTIONS_PER_TXN_MAX:
            raise NotAllowed(f"transaction {self.txn_id} would span {len(merged)} subscriptions, more than "
                             f"{SUBSCRIPTIONS_PER_TXN_MAX}")
        return replace(self, subscriptions=merged)

    def ended_by(self, commit: bool) -> "TxnRecord":
        """The record with the decision taken; the same decision again is the same
        record (a retried END_TXN), the other one InvalidTxnStatus."""
        wanted = TxnStatus.COMMITTING if commit else TxnStatus.ABORTING
        if self.status is wanted:
            return self
        if self.status is not TxnStatus.OPEN:
            raise InvalidTxnStatus(f"transaction {self.txn_id} is {self.status.value}: it cannot "
                                   f"{'commit' if commit else 'abort'}")
        return replace(self, status=wanted)

    def _check_open(self, what: str) -> None:
        if self.status is not TxnStatus.OPEN:
            raise InvalidTxnStatus(f"transaction {self.txn_id} is {self.status.value}: cannot {what} it")

    def encode(self) -> bytes:
        return json.dumps({
            "version": FORMAT_VERSION, "txn": self.txn_id.text, "status": self.status.value,
            "deadline_ms": self.deadline_ms, "partitions": list(self.partitions),
            "subscriptions": [list(pair) for pair in self.subscriptions], "owner": self.owner,
            "opened_ms": self.opened_ms,
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "TxnRecord":
        try:
            body = json.loads(data)
            if not isinstance(body, dict) or body.get("version") != FORMAT_VERSION:
                raise ValueError(f"not a version {FORMAT_VERSION} record")
            return cls(TxnId.parse(body["txn"]), TxnStatus(body["status"]), int(body["deadline_ms"]),
                       tuple(str(p) for p in body["partitions"]),
                       tuple((str(t), str(s)) for t, s in body["subscriptions"]),
                       None if body.get("owner") is None else str(body["owner"]),
                       int(body.get("opened_ms", 0)))
        except (ValueError, KeyError, TypeError, AssertionError) as error:
            raise MetadataError(f"undecodable transaction record: {error}") from None


def timeout_ms_for(txn_ttl: int) -> int:
    """The timeout of a new transaction. CommandNewTxn's field is named
    ``txn_ttl_seconds``, but the Java and Go clients put milliseconds in it and
    Pulsar's broker reads it as milliseconds: so does this one. 0 is the default;
    the result is at most TIMEOUT_S_MAX."""
    timeout_ms = txn_ttl or TIMEOUT_S_DEFAULT * 1000
    return min(timeout_ms, TIMEOUT_S_MAX * 1000)
