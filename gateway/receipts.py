"""Receipt handles: what a pulled message comes with, and all any gateway instance needs
to acknowledge it, give it back (nack) or extend its lease. Pure: bytes and keys in,
values or typed errors out; the caller passes the time.

A handle is self-describing and signed: the fields below, then an HMAC-SHA256 (cut to
16 bytes) over everything before it, under a key of the cluster secret named by its key
id (``key_id``: keys rotate by adding a new signing key and keeping the old one for
verification until the longest lease has passed). Encoded as URL-safe base64 without
padding, so it travels in JSON and URLs unchanged. The fixed-size fields come first, in
one struct, with the lengths of the text fields that follow (one unpack per handle: the
gateway decodes one per message acknowledged).

    offset  size  field            meaning
    0       1     version          FORMAT_VERSION
    1       1     mode             index in MODES
    2       8     instance_id      the issuing gateway process (random at its start)
    10      8     ledger_id        u64
    18      8     entry_id         u64
    26      4     partition        i32 (-1: not partitioned)
    30      4     batch_index      i32 (-1: not in a batch)
    34      4     batch_size       i32 (0: not in a batch)
    38      4     attempt          u32, the delivery attempt (1 = first delivery)
    42      8     deadline_ms      u64, the lease deadline, Unix ms
    50      1     key_id size      u8
    51      1     cluster size     u8
    52      2     issuer_url size  u16
    54      2     topic size       u16
    56      2     subscription size u16
    58      2     consumer size    u16
    60      ...   key_id, cluster, issuer_url (where that gateway answers HTTP), topic
                  (persistent://tenant/ns/name[-partition-i]), subscription, consumer (the
                  consumer or broadcast member name, "" if none): UTF-8, in that order
    end-16  16    signature        HMAC-SHA256(key, every byte before it)[:16]

FORMAT_VERSION 1: the layout above.

Checks, in order, each with its own error: the text decodes and parses (InvalidReceipt),
the version is known (InvalidReceipt), the cluster is ours (ReceiptForeign), the key id
is one of ours and the signature verifies (ReceiptForged). Whether the handle names the
topic and subscription of the request, and whether its lease is still running, is for
the caller (``check_scope``, ``deadline_ms``): an acknowledgement after the deadline is
still worth applying, an extension is not.
"""

from __future__ import annotations

import binascii
import hmac
import struct
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError, InvalidReceipt, ReceiptForeign, ReceiptForged

FORMAT_VERSION = 1
FORMAT_VERSION_MIN = 1
SIGNATURE_BYTES = 16
# Handles are a few hundred bytes; anything much longer is not one of ours and is
# refused before any decoding work.
HANDLE_CHARS_MAX = 4096
MODES = ("shared", "key_shared", "exclusive", "failover", "broadcast")
# A key must carry real entropy: 128 bits at least.
KEY_BYTES_MIN = 16

_HEAD = struct.Struct(">BB8sQQiiiIQBBHHHH")
try:   # OpenSSL's HMAC object, without hmac.HMAC's Python wrapper
    from _hashlib import hmac_new as _hmac_new
except ImportError:  # pragma: no cover - a Python built without OpenSSL
    _hmac_new = hmac.new

# HMAC-SHA256 states with a key already absorbed, by key: signing or verifying copies
# one and hashes only the body (half the cost of a one-shot HMAC, which sets the key up
# again on every call). Bounded; emptied when full (a cache of the cluster's few keys).
_KEYED: dict[bytes, Any] = {}
_KEYED_MAX = 64


def _signature(key: bytes, body: bytes) -> bytes:
    """HMAC-SHA256(key, body) cut to SIGNATURE_BYTES."""
    keyed = _KEYED.get(key)
    if keyed is None:
        if len(_KEYED) >= _KEYED_MAX:
            _KEYED.clear()
        keyed = _KEYED[key] = _hmac_new(key, digestmod="sha256")
    state = keyed.copy()
    state.update(body)
    return state.digest()[:SIGNATURE_BYTES]
_b2a = binascii.b2a_base64
_a2b = binascii.a2b_base64
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")
_PADDING = (b"", b"===", b"==", b"=")
assert _HEAD.size == 60
_TEXT_SIZE_MAX = (255, 255, 65535, 65535, 65535, 65535)


@dataclass(slots=True)
class Receipt:
    cluster: str
    instance_id: bytes
    issuer_url: str
    topic: str
    subscription: str
    consumer: str
    mode: str
    ledger_id: int
    entry_id: int
    partition: int
    batch_index: int
    batch_size: int
    attempt: int
    deadline_ms: int

    @property
    def position(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)

    def check_scope(self, topic: str, subscription: str) -> None:
        """ReceiptForeign unless this handle is of ``topic`` (or one of its partitions)
        and ``subscription``."""
        if self.subscription != subscription:
            raise ReceiptForeign(f"receipt belongs to subscription {self.subscription!r}, not {subscription!r}")
        if self.topic != topic and not self.topic.startswith(f"{topic}-partition-"):
            raise ReceiptForeign(f"receipt belongs to topic {self.topic}, not {topic}")


@dataclass(frozen=True)
class ReceiptKeys:
    """The cluster secret: keys by id; ``signing_key_id`` signs, every key verifies."""

    cluster: str
    keys: dict[str, bytes]
    signing_key_id: str

    def __post_init__(self) -> None:
        if not self.cluster or len(self.cluster.encode()) > 255:
            raise ConfigError("cluster must be 1-255 bytes")
        if self.signing_key_id not in self.keys:
            raise ConfigError(f"signing key id {self.signing_key_id!r} is not among the keys")
        for key_id, key in self.keys.items():
            if not key_id or len(key_id.encode()) > 255 or ":" in key_id or "," in key_id:
                raise ConfigError(f"receipt key id {key_id!r} must be 1-255 bytes without ':' or ','")
            if len(key) < KEY_BYTES_MIN:
                raise ConfigError(f"receipt key {key_id!r} is shorter than {KEY_BYTES_MIN} bytes")

    @classmethod
    def parse(cls, cluster: str, text: str) -> "ReceiptKeys":
        """``kid:secret[,kid:secret...]``; the first signs. Secrets are used as UTF-8
        bytes (generate them with ``openssl rand -hex 32``)."""
        keys: dict[str, bytes] = {}
        first = None
        for part in text.split(","):
            key_id, sep, secret = part.strip().partition(":")
            if not sep:
                raise ConfigError("receipt secret must be kid:secret[,kid:secret...]")
            if key_id in keys:
                raise ConfigError(f"receipt key id {key_id!r} given twice")
            keys[key_id] = secret.encode()
            first = first or key_id
        assert first is not None
        return cls(cluster, keys, first)


class ReceiptContext:
    """What every receipt of one gateway consumer shares (the key, the head's mode and
    instance id, the text fields and their sizes), laid out once: ``handle`` then packs
    only the per-message numbers, signs and encodes. A pull renders one receipt per
    message, so this is on the gateway's hot path."""

    __slots__ = ("_key", "_mode_index", "_instance_id", "_texts", "_sizes", "_fields")

    def __init__(self, keys: ReceiptKeys, instance_id: bytes, issuer_url: str, topic: str, subscription: str,
                 consumer: str, mode: str) -> None:
        assert len(instance_id) == 8, instance_id
        texts = [keys.signing_key_id.encode(), keys.cluster.encode(), issuer_url.encode(), topic.encode(),
                 subscription.encode(), consumer.encode()]
        for text, size_max in zip(texts, _TEXT_SIZE_MAX):
            assert len(text) <= size_max, (text[:64], size_max)
        self._key = keys.keys[keys.signing_key_id]
        self._mode_index = MODES.index(mode)
        self._instance_id = instance_id
        self._texts = b"".join(texts)
        self._sizes = tuple(len(text) for text in texts)
        # The text fields as decode gives them back (receipt's fields, in its order).
        self._fields = (keys.cluster, instance_id, issuer_url, topic, subscription, consumer, mode)

    def handle(self, ledger_id: int, entry_id: int, partition: int, batch_index: int, batch_size: int,
               attempt: int, deadline_ms: int) -> str:
        body = _HEAD.pack(FORMAT_VERSION, self._mode_index, self._instance_id, ledger_id, entry_id, partition,
                          batch_index, batch_size, attempt, deadline_ms, *self._sizes) + self._texts
        raw = body + _signature(self._key, body)
        return _b2a(raw, newline=False).translate(_TO_URLSAFE).rstrip(b"=").decode("ascii")


    def receipt(self, ledger_id: int, entry_id: int, partition: int, batch_index: int, batch_size: int,
                attempt: int, deadline_ms: int) -> Receipt:
        """What ``decode`` gives back for the handle ``handle`` makes of the same numbers."""
        return Receipt(*self._fields, ledger_id, entry_id, partition, batch_index, batch_size, attempt,
                       deadline_ms)


class IssuedReceipts:
    """Handles this instance issued lately, with their receipts: an acknowledgement that
    comes back to the issuing instance with a handle it remembers (the very string it
    signed) has its receipt without being decoded and verified again, which is most of
    an ack's cost per message. Anything else (another instance's handle, one forgotten,
    a forgery) is decoded and verified in full, so the answer is the same either way.
    Bounded in handles and in their characters (long topic and consumer names make long
    handles): the oldest are forgotten first; a handle is forgotten once used."""

    def __init__(self, size_max: int, chars_max: int) -> None:
        self.size_max = size_max
        self.chars_max = chars_max
        self.chars = 0
        self._receipts: dict[str, Receipt] = {}

    def __len__(self) -> int:
        return len(self._receipts)

    def add(self, handle: str, receipt: Receipt) -> None:
        receipts = self._receipts
        self.chars += len(handle)
        while receipts and (len(receipts) >= self.size_max or self.chars > self.chars_max):
            oldest = next(iter(receipts))   # dicts keep insertion order
            del receipts[oldest]
            self.chars -= len(oldest)
        receipts[handle] = receipt

    def take(self, handle: object) -> Receipt | None:
        """The receipt of ``handle`` if this instance issued it and remembers it (then
        forgotten); None otherwise."""
        if type(handle) is not str:
            return None
        receipt = self._receipts.pop(handle, None)
        if receipt is not None:
            self.chars -= len(handle)
        return receipt


def encode(receipt: Receipt, keys: ReceiptKeys) -> str:
    assert receipt.cluster == keys.cluster, (receipt.cluster, keys.cluster)
    assert receipt.attempt >= 1, receipt.attempt
    context = ReceiptContext(keys, receipt.instance_id, receipt.issuer_url, receipt.topic, receipt.subscription,
                             receipt.consumer, receipt.mode)
    return context.handle(receipt.ledger_id, receipt.entry_id, receipt.partition, receipt.batch_index,
                          receipt.batch_size, receipt.attempt, receipt.deadline_ms)


# The text fields of handles seen lately, parsed (the same few consumers' texts come back
# on every acknowledgement): bytes -> (key_id, cluster, issuer_url, topic, subscription,
# consumer). Bounded; emptied when full. Only what verified is kept.
_TEXTS_SEEN: dict[bytes, tuple[str, ...]] = {}
_TEXTS_SEEN_MAX = 1024


def decode(handle: object, keys: ReceiptKeys) -> Receipt:
    """The receipt a handle stands for, verified; raises InvalidReceipt, ReceiptForeign
    or ReceiptForged (nothing else, whatever the input)."""
    if not isinstance(handle, str) or not handle:
        raise InvalidReceipt("a receipt handle is a non-empty string")
    if len(handle) > HANDLE_CHARS_MAX:
        raise InvalidReceipt(f"receipt handle longer than {HANDLE_CHARS_MAX} characters")
    if "+" in handle or "/" in handle:
        raise InvalidReceipt("receipt handle is not URL-safe base64")
    try:
        text = handle.encode("ascii")
        raw = _a2b((text + _PADDING[len(text) % 4]).translate(_FROM_URLSAFE), strict_mode=True)
    except (binascii.Error, ValueError):   # UnicodeEncodeError is a ValueError
        raise InvalidReceipt("receipt handle is not URL-safe base64") from None
    if len(raw) < _HEAD.size + SIGNATURE_BYTES:
        raise InvalidReceipt("receipt handle is too short")
    body, signature = raw[:-SIGNATURE_BYTES], raw[-SIGNATURE_BYTES:]
    if not FORMAT_VERSION_MIN <= body[0] <= FORMAT_VERSION:
        raise InvalidReceipt(f"receipt format version {body[0]} is not one this gateway reads")
    (_version, mode_index, instance_id, ledger_id, entry_id, partition, batch_index, batch_size, attempt,
     deadline_ms, *sizes) = _HEAD.unpack_from(body)
    if _HEAD.size + sum(sizes) != len(body):
        raise InvalidReceipt("receipt handle is truncated or has trailing bytes")
    text_bytes = body[_HEAD.size:]
    texts = _TEXTS_SEEN.get(text_bytes)
    known = texts is not None
    if texts is None:
        parsed = []
        offset = 0
        try:
            for size in sizes:
                parsed.append(text_bytes[offset:offset + size].decode())
                offset += size
        except UnicodeDecodeError:
            raise InvalidReceipt("receipt has a text field that is not UTF-8") from None
        texts = tuple(parsed)
    key_id, cluster, issuer_url, topic, subscription, consumer = texts
    if cluster != keys.cluster:
        raise ReceiptForeign(f"receipt was issued by cluster {cluster!r}, this is {keys.cluster!r}")
    key = keys.keys.get(key_id)
    if key is None:
        raise ReceiptForged(f"receipt is signed with key id {key_id!r}, which this cluster does not have")
    expected = _signature(key, body)
    if not hmac.compare_digest(expected, signature):
        raise ReceiptForged("receipt signature does not verify")
    # Signed by us, so the fields were valid when written; check anyway, cheaply.
    if mode_index >= len(MODES) or attempt < 1 or batch_index < -1 or batch_size < 0 or partition < -1:
        raise InvalidReceipt("receipt fields are out of range")
    if not known:
        if len(_TEXTS_SEEN) >= _TEXTS_SEEN_MAX:
            _TEXTS_SEEN.clear()
        _TEXTS_SEEN[text_bytes] = texts
    return Receipt(cluster, instance_id, issuer_url, topic, subscription, consumer, MODES[mode_index], ledger_id,
                   entry_id, partition, batch_index, batch_size, attempt, deadline_ms)
