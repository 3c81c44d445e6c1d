"""The garbage collector's pauses (runtime/gc_pauses.py), measured in this process.

Proves that: while installed, every collection is observed once in the histogram of
its generation; removing stops it and leaves other callbacks alone; installing twice
observes once; the loop monitor installs it while it runs and removes it when
cancelled; ``freeze_startup_heap`` collects garbage first and then takes every live
object out of later collections' walks (a full collection then visits only what was
made after it), while what was frozen is still freed by reference counting.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

from prometheus_client import CollectorRegistry

from runtime.gc_pauses import GcPauses, freeze_startup_heap
from runtime.loop_monitor import LoopMonitor


def _count(registry: CollectorRegistry, generation: int, prefix: str = "test") -> float:
    value = registry.get_sample_value(f"{prefix}_gc_pause_seconds_count", {"generation": str(generation)})
    return value or 0.0


def test_each_collection_is_observed_once_under_its_generation() -> None:
    registry = CollectorRegistry()
    pauses = GcPauses(registry, "test")
    others: list[str] = []

    def other(phase: str, info: dict) -> None:
        others.append(phase)

    gc.callbacks.append(other)
    try:
        pauses.install()
        pauses.install()
        gc.collect(1)
        gc.collect(2)
        gc.collect(2)
        assert [_count(registry, g) for g in (0, 1, 2)] == [0, 1, 2]
        assert pauses.longest_s > 0
        total = registry.get_sample_value("test_gc_pause_seconds_sum", {"generation": "2"})
        assert 0 < total < 5
        pauses.remove()
        pauses.remove()
        gc.collect(2)
        assert _count(registry, 2) == 2
        assert other in gc.callbacks and others.count("stop") == 4
    finally:
        gc.callbacks.remove(other)
        pauses.remove()


async def test_the_loop_monitor_measures_pauses_while_it_runs() -> None:
    registry = CollectorRegistry()
    monitor = LoopMonitor(registry, "test_loop")
    task = asyncio.get_running_loop().create_task(monitor.run())
    await asyncio.sleep(0.02)
    gc.collect(2)
    assert _count(registry, 2, "test_loop") == 1
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    gc.collect(2)
    assert _count(registry, 2, "test_loop") == 1
    assert monitor.gc_pauses._callback not in gc.callbacks


class _Node:
    pass


def test_freeze_startup_heap_collects_first_then_keeps_the_live_heap_out_of_collections() -> None:
    cycle = _Node()
    cycle.self = cycle
    garbage = weakref.ref(cycle)
    del cycle
    kept = _Node()
    try:
        frozen = freeze_startup_heap()
        assert garbage() is None, "a garbage cycle alive before the freeze was frozen instead of collected"
        # The count only falls after the freeze, as frozen objects die by reference
        # counting (another thread of a test worker may drop one at any moment).
        assert frozen > 1000 and 0 <= frozen - gc.get_freeze_count() < 1000
        assert not any(obj is kept for obj in gc.get_objects()), "a frozen object is still walked by collections"
        # Frozen objects still die by reference counting.
        alive = weakref.ref(kept)
        del kept
        assert alive() is None
    finally:
        gc.unfreeze()
