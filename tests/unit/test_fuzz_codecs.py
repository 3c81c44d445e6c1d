"""Property-based fuzzing of the wire codecs, with a bounded budget (a few seconds in
``make test``; ``make fuzz`` runs the long version, bench/fuzz_codec.py).

Proves: any byte string, any mutation of a valid frame (bit flips, truncations,
splices, rewritten length fields) and any field-level mutation (random and edge
values in the command's fields, re-encoded), fed to the Pulsar frame decoder in any split,
decodes or raises MalformedFrame (our error type) and nothing else, and the valid
seeds decode whole in any split; the bookie's entry check raises only MalformedFrame
or DigestMismatch for any bytes or mutated entry, and passes the seeds.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import DigestMismatch, MalformedFrame
from tests.fuzz_inputs import check_entry, decode_all, mutate, mutate_fields, seed_entries, seed_frames

SEEDS = seed_frames()
ENTRIES = seed_entries()
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

splits = st.lists(st.integers(min_value=0, max_value=4096), max_size=6)


def _decode_ours_only(data: bytes, cuts: list[int]) -> None:
    try:
        decode_all(data, cuts)
    except MalformedFrame:
        pass


@FUZZ
@given(st.binary(max_size=2048), splits)
def test_random_bytes_raise_only_our_error(data, cuts):
    _decode_ours_only(data, cuts)


@FUZZ
@given(st.integers(min_value=0, max_value=2**32 - 1), st.lists(st.sampled_from(range(len(SEEDS))), min_size=1,
                                                              max_size=4), splits)
def test_mutated_frames_raise_only_our_error(seed, picks, cuts):
    rng = random.Random(seed)
    stream = b"".join(mutate(rng, SEEDS[i], SEEDS) if rng.random() < 0.7 else SEEDS[i] for i in picks)
    _decode_ours_only(stream, cuts)


@FUZZ
@given(st.integers(min_value=0, max_value=2**32 - 1), st.sampled_from(range(len(SEEDS))), splits)
def test_field_mutated_frames_raise_only_our_error(seed, pick, cuts):
    """Valid framing with fuzzed field values (what the live fuzz sends most)."""
    _decode_ours_only(mutate_fields(random.Random(seed), SEEDS[pick]), cuts)


@settings(max_examples=50, deadline=None, derandomize=True)
@given(splits)
def test_valid_frames_decode_whole_in_any_split(cuts):
    stream = b"".join(SEEDS)
    assert decode_all(stream, cuts) == len(SEEDS)
    assert decode_all(stream, list(range(len(stream)))[:: max(1, len(stream) // 97)]) == len(SEEDS)


@FUZZ
@given(st.one_of(st.binary(max_size=512), st.builds(lambda seed, index: mutate(random.Random(seed), ENTRIES[index]),
                                                      st.integers(0, 2**32 - 1), st.integers(0, len(ENTRIES) - 1))))
def test_entry_check_raises_only_our_errors(data):
    try:
        check_entry(data)
    except (MalformedFrame, DigestMismatch):
        pass


def test_seed_entries_verify():
    for entry in ENTRIES:
        check_entry(entry)
