"""Choosing bookies for ensembles. Pure: the caller passes the registered bookies and a
random generator.

Only writable (not read-only) bookies are chosen. Among them the choice is random,
weighted toward free space so that a fuller disk takes new ledgers more slowly, and
never twice the same bookie in one ensemble. Bookies the caller asks to avoid (the
ones that failed an add lately) are chosen only when the others are not enough.
"""

from __future__ import annotations

import random
from typing import AbstractSet, Sequence

from common.errors import NotEnoughBookies
from metadata.bookie_record import BookieRecord


def _weighted_sample(candidates: list[BookieRecord], count: int, rng: random.Random) -> list[BookieRecord]:
    chosen: list[BookieRecord] = []
    pool = list(candidates)
    for _ in range(count):
        # Weight by free space, with a floor so a bookie reporting 0 is still usable.
        weights = [max(b.free_bytes, 1) ** 0.5 + 1.0 for b in pool]
        pick = rng.choices(range(len(pool)), weights=weights, k=1)[0]
        chosen.append(pool.pop(pick))
    return chosen


def choose_ensemble(bookies: Sequence[BookieRecord], ensemble_size: int, rng: random.Random,
                    exclude: AbstractSet[str] | None = None, avoid: AbstractSet[str] = frozenset()
                    ) -> tuple[str, ...]:
    """``ensemble_size`` writable bookies, none in ``exclude``. Bookies in ``avoid`` (the
    client's quarantine, ledger/quarantine.py) are taken only when the others are not
    enough, and then only as many as are missing."""
    exclude = exclude or set()
    candidates = sorted((b for b in bookies if not b.read_only and b.bookie_id not in exclude),
                        key=lambda b: b.bookie_id)
    if len(candidates) < ensemble_size:
        raise NotEnoughBookies(ensemble_size, len(candidates))
    preferred = [b for b in candidates if b.bookie_id not in avoid] if avoid else candidates
    if len(preferred) >= ensemble_size:
        return tuple(b.bookie_id for b in _weighted_sample(preferred, ensemble_size, rng))
    avoided = [b for b in candidates if b.bookie_id in avoid]
    chosen = preferred + _weighted_sample(avoided, ensemble_size - len(preferred), rng)
    rng.shuffle(chosen)
    return tuple(b.bookie_id for b in chosen)


def choose_replacement(bookies: Sequence[BookieRecord], ensemble: Sequence[str], rng: random.Random,
                       exclude: AbstractSet[str] | None = None, avoid: AbstractSet[str] = frozenset()) -> str:
    """A writable bookie not in ``ensemble`` nor in ``exclude``; one in ``avoid`` only if
    no other is left."""
    excluded = set(ensemble) | set(exclude or ())
    return choose_ensemble(bookies, 1, rng, excluded, avoid)[0]
