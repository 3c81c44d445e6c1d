"""Receipt handles (gateway/receipts.py).

What it proves: a handle round-trips every field; any change to its bytes (one flipped
bit anywhere) is refused as forged or invalid, never accepted; a handle of another
cluster is foreign, of another subscription or topic out of scope; garbage of any kind
raises InvalidReceipt (and nothing else); keys rotate (old handles verify while their
key is kept, then are forged); the key set's config is validated.
How: tables of cases, and hypothesis for arbitrary input.
"""

from __future__ import annotations

import base64
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ConfigError, InvalidReceipt, MagnetarError, ReceiptForeign, ReceiptForged
from gateway.receipts import MODES, Receipt, ReceiptKeys, decode, encode

KEYS = ReceiptKeys("standalone", {"k1": b"a" * 32}, "k1")


def receipt(**changes) -> Receipt:
    base = Receipt("standalone", b"\x01" * 8, "http://127.0.0.1:8081", "persistent://public/default/orders",
                   "billing", "", "shared", 12, 345, -1, 3, 10, 2, 1_800_000_000_000)
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("mode", MODES)
def test_round_trip_keeps_every_field(mode):
    """decode(encode(r)) == r, for every mode and for long and unicode fields."""
    original = receipt(mode=mode, consumer="wörker-1" * 20, topic="persistent://t/n/" + "x" * 500,
                       partition=7, batch_index=-1, batch_size=0, ledger_id=2**63, entry_id=0)
    handle = encode(original, KEYS)
    assert set(handle) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert decode(handle, KEYS) == original


def test_every_single_bit_flip_is_refused():
    """No bit of a handle can change without the change being caught."""
    raw = bytearray(base64.urlsafe_b64decode(encode(receipt(), KEYS) + "=="))
    for bit in range(len(raw) * 8):
        changed = bytearray(raw)
        changed[bit // 8] ^= 1 << (bit % 8)
        handle = base64.urlsafe_b64encode(bytes(changed)).rstrip(b"=").decode()
        with pytest.raises((ReceiptForged, InvalidReceipt, ReceiptForeign)):
            decode(handle, KEYS)


def test_foreign_cluster_and_scope():
    """Another cluster's handle is ReceiptForeign; so is one used for another
    subscription or topic; a partition's handle is in scope of its topic."""
    other = ReceiptKeys("elsewhere", {"k1": b"a" * 32}, "k1")
    with pytest.raises(ReceiptForeign, match="cluster"):
        decode(encode(receipt(cluster="elsewhere"), other), KEYS)
    decoded = decode(encode(receipt(topic="persistent://public/default/orders-partition-3"), KEYS), KEYS)
    decoded.check_scope("persistent://public/default/orders", "billing")
    with pytest.raises(ReceiptForeign, match="subscription"):
        decoded.check_scope("persistent://public/default/orders", "shipping")
    with pytest.raises(ReceiptForeign, match="topic"):
        decoded.check_scope("persistent://public/default/orders-eu", "billing")


def test_another_secret_means_forged():
    """A handle signed with another secret under the same key id does not verify."""
    impostor = ReceiptKeys("standalone", {"k1": b"b" * 32}, "k1")
    with pytest.raises(ReceiptForged, match="signature"):
        decode(encode(receipt(), impostor), KEYS)
    with pytest.raises(ReceiptForged, match="key id"):
        decode(encode(receipt(), ReceiptKeys("standalone", {"k9": b"a" * 32}, "k9")), KEYS)


def test_key_rotation():
    """New handles are signed with the first key; old ones verify while their key is
    listed, and are forged once it is dropped."""
    old_handle = encode(receipt(), KEYS)
    rotated = ReceiptKeys.parse("standalone", "k2:" + "c" * 32 + ",k1:" + "a" * 32)
    assert rotated.signing_key_id == "k2"
    assert decode(old_handle, rotated) == receipt()
    new_handle = encode(receipt(), rotated)
    assert decode(new_handle, ReceiptKeys.parse("standalone", "k2:" + "c" * 32)) == receipt()
    with pytest.raises(ReceiptForged):
        decode(new_handle, KEYS)


@pytest.mark.parametrize("handle", ["", "!!!", "a", "AAAA", "A" * 5000, 12, None, ["x"],
                                    base64.urlsafe_b64encode(b"\x02" + b"x" * 40).decode(),
                                    base64.urlsafe_b64encode(b"\x01\xff" + b"x" * 40).decode()])
def test_garbage_is_invalid(handle):
    """Not a handle at all: InvalidReceipt (never another exception)."""
    with pytest.raises((InvalidReceipt, ReceiptForged)):
        decode(handle, KEYS)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=400), st.binary(max_size=300).map(
    lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode())))
def test_arbitrary_input_raises_only_catalogue_errors(handle):
    """Whatever the text, decode raises one of the three receipt errors."""
    try:
        decode(handle, KEYS)
    except (InvalidReceipt, ReceiptForged, ReceiptForeign):
        pass


@pytest.mark.parametrize("text, problem", [
    ("nocolon", "kid:secret"),
    ("k1:short", "shorter than"),
    ("k1:" + "a" * 32 + ",k1:" + "b" * 32, "given twice"),
    (":" + "a" * 32, "1-255 bytes"),
])
def test_bad_key_config_names_the_problem(text, problem):
    with pytest.raises(ConfigError, match=problem):
        ReceiptKeys.parse("standalone", text)


def test_errors_are_4xx_and_not_retriable():
    for cls in (InvalidReceipt, ReceiptForged, ReceiptForeign):
        assert issubclass(cls, MagnetarError)
        assert 400 <= cls.http_status < 500 and not cls.retriable


def test_the_signature_is_hmac_sha256_under_the_named_key_whatever_was_signed_before():
    """The last 16 bytes are HMAC-SHA256(key, the rest), as the standard library computes
    it, under each handle's own key: signing with keyed states kept per key (a cache)
    never mixes the keys of handles signed one after the other."""
    import hashlib
    import hmac

    rotated = ReceiptKeys("standalone", {"k2": b"b" * 40, "k1": b"a" * 32}, "k2")
    for keys, key in ((KEYS, b"a" * 32), (rotated, b"b" * 40), (KEYS, b"a" * 32)):
        for attempt in (1, 2):
            handle = encode(receipt(attempt=attempt), keys)
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
            assert raw[-16:] == hmac.new(key, raw[:-16], hashlib.sha256).digest()[:16]
            assert decode(handle, rotated).attempt == attempt


def test_issued_receipts_give_back_what_decode_would_once_and_stay_bounded():
    """A remembered handle's receipt equals its decoding; it is handed out once (then
    the handle decodes as any other); the oldest are forgotten past the bound; anything
    not issued (a forgery, a non-string) is not found, so it goes through decode."""
    from gateway.receipts import IssuedReceipts, ReceiptContext

    context = ReceiptContext(KEYS, b"\x01" * 8, "http://127.0.0.1:8081", "persistent://public/default/orders",
                             "billing", "wörker", "key_shared")
    issued = IssuedReceipts(3, 10_000)
    handles = []
    for index in range(4):
        numbers = (12, 345 + index, -1, index, 10, 2, 1_800_000_000_000)
        handle = context.handle(*numbers)
        issued.add(handle, context.receipt(*numbers))
        handles.append(handle)
    assert len(issued) == 3 and issued.take(handles[0]) is None          # the oldest, forgotten
    remembered = issued.take(handles[1])
    assert remembered == decode(handles[1], KEYS)
    assert issued.take(handles[1]) is None                                # once
    forged = handles[2][:-2] + ("A" if handles[2][-2] != "A" else "B") + handles[2][-1]
    assert issued.take(forged) is None and issued.take(None) is None and issued.take(["x"]) is None
    with pytest.raises(ReceiptForged):
        decode(forged, KEYS)
    assert issued.chars == sum(len(handle) for handle in handles[2:])
    # The character bound: handles past it push the oldest out, and at least the newest stays.
    small = IssuedReceipts(100, 2 * len(handles[0]))
    for handle in handles:
        small.add(handle, decode(handle, KEYS))
    assert len(small) == 2 and small.chars <= small.chars_max
    assert small.take(handles[3]) == decode(handles[3], KEYS) and small.take(handles[1]) is None
