"""The one catalogue of Magnetar's operating errors, shared by bookie, ledger client,
broker and gateway.

Every class carries a stable numeric ``code`` (never reused once published), a
``retriable`` flag that tells a caller whether trying again may succeed, and the
``http_status`` a REST shell answers with. The receiving side of any wire rebuilds the
typed error with :func:`error_for_code`, so a fenced ledger raised on a bookie is a
``LedgerFenced`` in the broker too.

Code ranges:
    1000-1999  bad input and configuration (the caller's fault, never retriable)
    2000-2999  ledgers and entries
    3000-3999  metadata store (etcd)
    4000-4999  broker and topics
    5000-5999  capacity, time and availability (mostly retriable)
    6000-6999  the archive (Arrow files of archived ledgers, their manifest)
    7000-7999  security: authentication, authorization, abuse limits
"""

from __future__ import annotations

from typing import ClassVar


class MagnetarError(Exception):
    """Base of every operating error. Subclasses set the three class variables."""

    code: ClassVar[int] = 1000
    retriable: ClassVar[bool] = False
    http_status: ClassVar[int] = 500

    def __init__(self, message: str = "") -> None:
        self.message = message or self.__class__.__name__
        super().__init__(self.message)

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "error": self.__class__.__name__, "message": self.message}


# A LedgerError is any error about ledgers and entries; the style guide names the
# family after it, and callers catch it to mean "the storage path said no".
class LedgerError(MagnetarError):
    code = 2000


# --- 1000: bad input and configuration -------------------------------------------

class ConfigError(MagnetarError):
    """An operator setting is invalid; the message names the field."""

    code, http_status = 1001, 400


class InvalidArgument(MagnetarError):
    code, http_status = 1002, 400


class MalformedFrame(MagnetarError):
    """Bytes from a peer do not parse as the format says; the peer is to blame."""

    code, http_status = 1003, 400


class EntryTooLarge(MagnetarError):
    code, http_status = 1004, 413

    def __init__(self, size_bytes: int, size_bytes_max: int) -> None:
        self.size_bytes = size_bytes
        self.size_bytes_max = size_bytes_max
        super().__init__(f"entry of {size_bytes} bytes exceeds the limit of {size_bytes_max}")


class DigestMismatch(LedgerError):
    """An entry's CRC32C does not match its bytes: corruption or a bad writer."""

    code, http_status = 2013, 422

    def __init__(self, ledger_id: int, entry_id: int, detail: str = "") -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        suffix = f": {detail}" if detail else ""
        super().__init__(f"digest mismatch: ledger_id={ledger_id} entry_id={entry_id}{suffix}")


class NotFound(MagnetarError):
    """A named thing (tenant, namespace, topic, subscription...) does not exist."""

    code, http_status = 1006, 404


class AlreadyExists(MagnetarError):
    code, http_status = 1007, 409


class Unauthorized(MagnetarError):
    code, http_status = 1008, 401


class PortInUse(ConfigError):
    """A server could not listen on a port the operator chose (or left at its
    default): another process has it, or the address is not this host's. The message
    names the flag to change."""

    code, http_status = 1009, 400

    def __init__(self, flag: str, host: str, port: int, reason: str = "already in use") -> None:
        self.flag = flag
        self.host = host
        self.port = port
        super().__init__(f"cannot listen on {host}:{port} ({flag} {port}): {reason}; "
                         f"stop the process holding it or give another {flag}")


class InvalidReceipt(MagnetarError):
    """A gateway receipt handle that does not decode: garbage, truncated, or a format
    version this gateway does not read."""

    code, http_status = 1010, 400


class ReceiptForged(MagnetarError):
    """A receipt handle whose signature does not verify with any key of this cluster."""

    code, http_status = 1011, 403


class ReceiptForeign(MagnetarError):
    """A genuine receipt handle used where it does not belong: issued by another
    cluster, or for another topic or subscription than the request names."""

    code, http_status = 1012, 400


class LeaseExpired(MagnetarError):
    """The lease of a received message is over (its deadline passed, it was nacked, or
    the gateway holding it is gone): the message is back in its subscription."""

    code, http_status = 1013, 410


class LimitExceeded(MagnetarError):
    """A request is larger than a limit allows (body bytes, messages per batch, wait or
    lease length); the message names the limit. Repeating it unchanged cannot succeed."""

    code, http_status = 1014, 413

    def __init__(self, limit: str, value: int, value_max: int) -> None:
        self.limit = limit
        self.value = value
        self.value_max = value_max
        super().__init__(f"{limit} {value} exceeds the limit of {value_max}")


# --- 2000: ledgers and entries ------------------------------------------------------

class LedgerFenced(LedgerError):
    code, http_status = 2001, 409

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        super().__init__(f"ledger {ledger_id} is fenced")


class NoSuchLedger(LedgerError):
    code, http_status = 2002, 404

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        super().__init__(f"no such ledger: ledger_id={ledger_id}")


class NoSuchEntry(LedgerError):
    code, http_status = 2003, 404

    def __init__(self, ledger_id: int, entry_id: int) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        super().__init__(f"no such entry: ledger_id={ledger_id} entry_id={entry_id}")


class LedgerClosed(LedgerError):
    code, http_status = 2004, 409

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        super().__init__(f"ledger {ledger_id} is closed")


class NotEnoughBookies(LedgerError):
    """Fewer writable bookies are registered than an ensemble needs."""

    code, retriable, http_status = 2005, True, 503

    def __init__(self, needed: int, available: int) -> None:
        self.needed = needed
        self.available = available
        super().__init__(f"not enough writable bookies: needed={needed} available={available}")


class BookieReadOnly(LedgerError):
    code, retriable, http_status = 2006, True, 503

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        super().__init__(f"bookie {bookie_id} is read-only")


class BookieUnavailable(LedgerError):
    """A bookie did not answer (connection refused, reset, timed out)."""

    code, retriable, http_status = 2007, True, 503

    def __init__(self, bookie_id: str, detail: str = "") -> None:
        self.bookie_id = bookie_id
        suffix = f": {detail}" if detail else ""
        super().__init__(f"bookie {bookie_id} unavailable{suffix}")


class LedgerRecoveryFailed(LedgerError):
    code, retriable, http_status = 2008, True, 503


class EntryIdOutOfRange(LedgerError):
    """A read asked for entries past the end of a closed ledger, or a negative id."""

    code, http_status = 2009, 400

    def __init__(self, ledger_id: int, entry_id: int, last_entry_id: int) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.last_entry_id = last_entry_id
        super().__init__(
            f"entry out of range: ledger_id={ledger_id} entry_id={entry_id} "
            f"last_entry_id={last_entry_id}"
        )


class LedgerMetadataConflict(LedgerError):
    """A compare-and-swap on ledger metadata lost to another writer."""

    code, retriable, http_status = 2010, True, 409


class BookieStorageError(LedgerError):
    """The bookie's own disk failed an operation (full disk, IO error)."""

    code, http_status = 2011, 507


class AddTimeout(LedgerError):
    code, retriable, http_status = 2012, True, 504


class ReplicationFailed(LedgerError):
    """Auto-recovery could not re-replicate a fragment this time (no surviving replica
    answered, no bookie to copy to, or the target refused); another attempt follows."""

    code, retriable, http_status = 2014, True, 503


# --- 3000: metadata store ------------------------------------------------------------

class MetadataError(MagnetarError):
    code, retriable, http_status = 3000, True, 503


class MetadataUnavailable(MetadataError):
    code, retriable, http_status = 3001, True, 503


class MetadataVersionConflict(MetadataError):
    """A compare-and-swap found another revision than expected."""

    code, retriable, http_status = 3002, True, 409

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"metadata version conflict: key={key}")


class MetadataKeyExists(MetadataError):
    code, retriable, http_status = 3003, False, 409

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"metadata key exists: key={key}")


class MetadataNoSuchKey(MetadataError):
    code, retriable, http_status = 3004, False, 404

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"metadata key not found: key={key}")


class MetadataLeaseExpired(MetadataError):
    code, retriable, http_status = 3005, True, 503


# --- 4000: broker and topics --------------------------------------------------------

class BrokerError(MagnetarError):
    code, http_status = 4000, 500


class TopicNotFound(BrokerError):
    code, http_status = 4001, 404


class ProducerBusy(BrokerError):
    code, http_status = 4002, 409


class ConsumerBusy(BrokerError):
    code, http_status = 4003, 409


class TopicTerminated(BrokerError):
    code, http_status = 4004, 409


class TopicFenced(BrokerError):
    """The topic was closed here (unload, ownership lost, or its ledger fenced by a new
    owner): clients look it up again."""

    code, retriable, http_status = 4005, True, 503


class NotAllowed(BrokerError):
    code, http_status = 4006, 403


class SubscriptionNotFound(BrokerError):
    code, http_status = 4007, 404


class PersistenceError(BrokerError):
    """Storing a message failed (bookies unavailable); the producer may retry."""

    code, retriable, http_status = 4008, True, 503


class ChecksumError(BrokerError):
    code, http_status = 4009, 400


class TooManyRequests(BrokerError):
    code, retriable, http_status = 4010, True, 429


class ProducerBlockedQuota(BrokerError):
    code, http_status = 4011, 409


class ProducerBlockedQuotaException(ProducerBlockedQuota):
    """A backlog quota with policy producer_exception is exceeded: the client fails
    its sends (ProducerBlockedQuota itself is the hold policy: the client retries)."""

    code, http_status = 4032, 409


class IncompatibleSchema(BrokerError):
    code, http_status = 4012, 409


class PreconditionFailed(BrokerError):
    code, http_status = 4013, 412


class NamespaceNotFound(NotFound):
    code, http_status = 4014, 404


class TenantNotFound(NotFound):
    code, http_status = 4015, 404


class NotOwner(BrokerError):
    """This broker does not own the topic's bundle (the caller should look it up)."""

    code, retriable, http_status = 4016, True, 503


class ProducerFenced(BrokerError):
    """An exclusive producer lost the topic to another (ExclusiveWithFencing, or the
    topic epoch moved past the one it held)."""

    code, http_status = 4031, 409


class ProducerNameInUse(BrokerError):
    """An idempotent produce names a producer that another connection (another gateway,
    still writing that producer's earlier request) has registered on the topic: retry
    once it is done."""

    code, retriable, http_status = 4018, True, 409


class EncryptionRequired(BrokerError):
    """A producer that does not encrypt, on a topic whose namespace requires encryption
    (Pulsar's ``encryption_required``; Pulsar answers it MetadataError)."""

    code, http_status = 4041, 412


# Transactions (4070-4079): Pulsar's transaction ServerErrors, in our catalogue.
class TransactionNotFound(BrokerError):
    """No open transaction has this id: it never existed, or it ended (committed,
    aborted, timed out) and its record is gone."""

    code, http_status = 4070, 404


class InvalidTxnStatus(BrokerError):
    """The transaction is not in a state that allows the request (a send after commit
    began, a commit of an aborted transaction)."""

    code, http_status = 4071, 409


class TransactionConflict(BrokerError):
    """A message is acknowledged in one open transaction already, and another
    transaction acknowledges it too."""

    code, http_status = 4072, 409


class TransactionCoordinatorNotFound(BrokerError):
    """The transaction coordinator asked for does not exist, or this broker does not
    serve it (the client looks the coordinator's topic up again)."""

    code, retriable, http_status = 4073, True, 503


class NotSupported(BrokerError):
    """A feature Magnetar does not offer (e.g. topic compaction): said plainly."""

    code, http_status = 4017, 501


# --- 5000: capacity, time, availability -------------------------------------------

class Overloaded(MagnetarError):
    code, retriable, http_status = 5001, True, 503


class OperationTimeout(MagnetarError):
    code, retriable, http_status = 5002, True, 504


class ServiceNotReady(MagnetarError):
    code, retriable, http_status = 5003, True, 503


class ShuttingDown(MagnetarError):
    code, retriable, http_status = 5004, True, 503


# --- 6000: the archive ------------------------------------------------------------------

class ArchiveError(MagnetarError):
    """Archiving a ledger, or reading an archived one, failed."""

    code, http_status = 6000, 500


class ArchiveCorrupt(ArchiveError):
    """An archive file does not hold what its metadata and checksums say: a flipped
    byte, a truncation, a foreign file. Never returned as data. ``batch_index`` is the
    record batch at fault (None: the file as a whole, e.g. its footer)."""

    code, http_status = 6001, 422

    def __init__(self, url: str, detail: str, batch_index: int | None = None) -> None:
        self.url = url
        self.detail = detail
        self.batch_index = batch_index
        where = f" record batch {batch_index}" if batch_index is not None else ""
        super().__init__(f"archive file {url}{where} is corrupt: {detail}")


class ArchiveFormatUnsupported(ArchiveError):
    """The file's format version is outside what this reader understands."""

    code, http_status = 6002, 422

    def __init__(self, url: str, format_version: int, supported: tuple[int, int]) -> None:
        self.url = url
        self.format_version = format_version
        super().__init__(f"archive file {url} has format version {format_version}; this reader reads "
                         f"{supported[0]}..{supported[1]}")


class ArchiveNotFound(ArchiveError):
    """No archive holds what was asked (a ledger, an entry, a file)."""

    code, http_status = 6003, 404


class ArchiveUnavailable(ArchiveError):
    """The archive's storage did not answer or failed an operation (IO error, object
    store down); trying again may succeed."""

    code, retriable, http_status = 6004, True, 503


class MessagesDeleted(ArchiveError):
    """A read asked for messages that are gone from the topic's ledgers and from its
    archive (retention deleted them): the Spark source's ``failOnDataLoss``."""

    code, http_status = 6005, 410

    def __init__(self, topic: str, after: tuple[int, int], upto: tuple[int, int] | None) -> None:
        self.topic = topic
        self.after = after
        self.upto = upto
        until = f"before {upto[0]}:{upto[1]}" if upto is not None else "to the end of what is stored"
        super().__init__(f"messages of {topic} after {after[0]}:{after[1]} {until} were deleted by retention "
                         f"(in neither the topic's ledgers nor its archive)")


class TailGap(ArchiveError):
    """A read through a broker of a fixed range of a topic partition skipped entries of
    the range: it went past the range's last entry without delivering it, or moved to a
    later ledger with entries of the range not delivered (retention removed their ledger
    from the topic once it was archived, while or before the read ran). The reader reads
    the rest from the archive, or fails; it never returns the range short."""

    code, retriable, http_status = 6006, True, 503

    def __init__(self, topic: str, last_seen: tuple[int, int] | None, end: tuple[int, int],
                 delivered: tuple[int, int]) -> None:
        self.topic = topic
        self.last_seen = last_seen
        self.end = end
        self.delivered = delivered
        where = (f"past the range's end {end[0]}:{end[1]} never delivered" if delivered > end
                 else f"in a later ledger, entries between them not delivered (range end {end[0]}:{end[1]})")
        super().__init__(f"tail read of {topic} skipped entries: after {last_seen} the broker delivered "
                         f"{delivered[0]}:{delivered[1]}, {where}")


# --- security (7000-7999) -------------------------------------------------------------


class SecurityError(MagnetarError):
    code, http_status = 7000, 403


class AuthenticationFailed(SecurityError):
    """No credentials where some are required, or credentials that do not verify (a
    wrong signature, an expired token, an unknown method). The message never carries
    the credential itself."""

    code, http_status = 7001, 401


class AuthorizationDenied(SecurityError):
    """An authenticated role that may not do what it asked (no produce or consume
    permission on the namespace, not a tenant admin or superuser)."""

    code, http_status = 7002, 403


class ConnectionLimit(SecurityError):
    """A limit against abuse was hit: connections per address or in total, producers
    or consumers per topic. Retriable: the same request may succeed once others leave."""

    code, retriable, http_status = 7003, True, 429


class UnknownError(MagnetarError):
    """The receiving side got a code it does not know (a newer peer)."""

    code, http_status = 1999, 500


def _all_error_classes() -> list[type[MagnetarError]]:
    found: list[type[MagnetarError]] = []
    pending: list[type[MagnetarError]] = [MagnetarError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def _build_code_table() -> dict[int, type[MagnetarError]]:
    table: dict[int, type[MagnetarError]] = {}
    for cls in _all_error_classes():
        # Two classes on one code would make error_for_code ambiguous across a wire.
        assert cls.code not in table or table[cls.code] is cls, (cls, table.get(cls.code))
        table[cls.code] = cls
    return table


_BY_CODE = _build_code_table()


def register(cls: type[MagnetarError]) -> type[MagnetarError]:
    """Adds a class defined in another module (the broker's errors) to the table."""
    existing = _BY_CODE.get(cls.code)
    assert existing is None or existing is cls, (cls, existing)
    _BY_CODE[cls.code] = cls
    return cls


def error_class_for_code(code: int) -> type[MagnetarError]:
    return _BY_CODE.get(code, UnknownError)


def error_for_code(code: int, message: str) -> MagnetarError:
    """Rebuilds a typed error on the receiving side of a wire.

    The fields a class keeps (ledger_id and so on) are not carried on the wire, only
    the message that was built from them, so the instance is made without calling
    the subclass constructor.
    """
    cls = error_class_for_code(code)
    error = cls.__new__(cls)
    MagnetarError.__init__(error, message)
    return error
