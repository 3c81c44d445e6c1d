"""Namespace bundles: the 32-bit hash space of topic names split into ranges. Pure.

A topic belongs to the bundle whose range holds the CRC32C of its full name (each
partition of a partitioned topic hashes on its own name, so partitions spread). A
namespace starts with ``DEFAULT_BUNDLES`` equal ranges; splitting a range at its middle
gives two halves. Ranges are half-open, [lower, upper), except the last, which holds
0xffffffff too; names follow Pulsar's "0x00000000_0x40000000" form.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable

import crc32c

from common.errors import InvalidArgument

HASH_MAX = 0xFFFFFFFF
FULL_UPPER = 0x100000000   # exclusive end of the hash space
DEFAULT_BUNDLES = 4
# A range is never split below this many hashes (keeps names and arithmetic sane).
RANGE_WIDTH_MIN = 2


def topic_hash(topic_name: str) -> int:
    return crc32c.crc32c(topic_name.encode())


@dataclass(frozen=True, order=True, slots=True)
class BundleRange:
    lower: int
    upper: int   # exclusive; FULL_UPPER for the last range

    def __post_init__(self) -> None:
        assert 0 <= self.lower < self.upper <= FULL_UPPER, (self.lower, self.upper)

    def contains(self, value: int) -> bool:
        return self.lower <= value < self.upper

    @property
    def name(self) -> str:
        """Pulsar's form: the upper end exclusive, except the last range's, written
        0xffffffff (2**32 does not fit eight hex digits)."""
        return f"0x{self.lower:08x}_0x{min(self.upper, HASH_MAX):08x}"

    @classmethod
    def parse(cls, name: str) -> "BundleRange":
        try:
            low_text, high_text = name.split("_")
            lower, high = int(low_text, 16), int(high_text, 16)
        except ValueError:
            raise InvalidArgument(f"bad bundle name {name!r} (want 0xLLLLLLLL_0xUUUUUUUU)") from None
        upper = FULL_UPPER if high == HASH_MAX else high
        if not 0 <= lower < upper <= FULL_UPPER:
            raise InvalidArgument(f"bad bundle range {name!r}")
        return cls(lower, upper)

    def split(self) -> tuple["BundleRange", "BundleRange"]:
        if self.upper - self.lower < 2 * RANGE_WIDTH_MIN:
            raise InvalidArgument(f"bundle {self.name} is too small to split")
        middle = self.lower + (self.upper - self.lower) // 2
        return BundleRange(self.lower, middle), BundleRange(middle, self.upper)


def default_boundaries(count: int = DEFAULT_BUNDLES) -> list[int]:
    if not 1 <= count <= 1024:
        raise InvalidArgument("a namespace has between 1 and 1024 bundles")
    step = FULL_UPPER // count
    return [i * step for i in range(count)] + [FULL_UPPER]


@dataclass(frozen=True)
class Bundles:
    """A namespace's ranges, as sorted boundaries: range i is [b[i], b[i+1])."""

    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        bounds = self.boundaries
        if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != FULL_UPPER:
            raise InvalidArgument("bundle boundaries must start at 0 and end at 2**32")
        if any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise InvalidArgument("bundle boundaries must increase")

    @property
    def ranges(self) -> list[BundleRange]:
        return [BundleRange(a, b) for a, b in zip(self.boundaries, self.boundaries[1:])]

    def find(self, value: int) -> BundleRange:
        index = bisect.bisect_right(self.boundaries, value) - 1
        return BundleRange(self.boundaries[index], self.boundaries[index + 1])

    def for_topic(self, topic_name: str) -> BundleRange:
        return self.find(topic_hash(topic_name))

    def with_split(self, bundle: BundleRange) -> "Bundles":
        if bundle not in self.ranges:
            raise InvalidArgument(f"bundle {bundle.name} is not a bundle of this namespace")
        lower_half, _upper_half = bundle.split()
        return Bundles(tuple(sorted(set(self.boundaries) | {lower_half.upper})))


def namespace_of(topic_name: str) -> str:
    """"tenant/namespace" of a full topic name ("persistent://tenant/namespace/local")."""
    tenant, namespace, _local = topic_name.partition("://")[2].split("/", 2)
    return f"{tenant}/{namespace}"


class BundleIndex:
    """Finds which of the given bundles ("tenant/namespace/range" keys) a topic falls
    in: each bundle name is parsed once, then a lookup is a hash and a bisection. For
    loops over every loaded topic (load reports, closing a bundle's topics), which
    parsed every bundle name for every topic before.

    It answers from the ranges the keys name (disjoint within a namespace, as a
    broker's served bundles are), not from a namespace's cached boundaries: a bundle
    being stopped must find all of its topics even if the boundaries changed since
    (another broker split it after taking it over), or it would keep serving some."""

    def __init__(self, bundle_keys: Iterable[str]) -> None:
        by_namespace: dict[str, list[tuple[int, BundleRange, str]]] = {}
        for key in bundle_keys:
            namespace, _, name = key.rpartition("/")
            bundle = BundleRange.parse(name)
            by_namespace.setdefault(namespace, []).append((bundle.lower, bundle, key))
        self._lowers: dict[str, list[int]] = {}
        self._ranges: dict[str, list[tuple[BundleRange, str]]] = {}
        for namespace, entries in by_namespace.items():
            entries.sort(key=lambda entry: entry[0])
            self._lowers[namespace] = [lower for lower, _, _ in entries]
            self._ranges[namespace] = [(bundle, key) for _, bundle, key in entries]

    def find(self, topic_name: str) -> str | None:
        """The key of the bundle holding ``topic_name`` (a full name), or None."""
        namespace = namespace_of(topic_name)
        lowers = self._lowers.get(namespace)
        if lowers is None:
            return None
        value = topic_hash(topic_name)
        index = bisect.bisect_right(lowers, value) - 1
        if index < 0:
            return None
        bundle, key = self._ranges[namespace][index]
        return key if bundle.contains(value) else None
