"""Garbage-collector pauses: how long each cyclic collection stopped the process.

A collection of the oldest generation walks every tracked object and holds the
interpreter meanwhile; in a server with a large heap that is a pause of milliseconds
that every request in flight waits through. Exported per generation as a Prometheus
histogram, measured with ``gc.callbacks`` (two ``perf_counter`` calls per collection).
"""

from __future__ import annotations

import gc
import time

from prometheus_client import CollectorRegistry, Histogram

from common.histograms import STAGE_BUCKETS_S

GENERATIONS = (0, 1, 2)


def freeze_startup_heap() -> int:
    """Collects once, then moves every object alive now (the imported modules, the
    configuration, the servers just built) into the collector's permanent generation,
    where no later collection walks them (``gc.freeze``). Called once a server serves:
    a full collection in a broker then walks what the traffic made, not the hundreds of
    thousands of objects its imports left (bench/results/server_cpu.md). Nothing is
    leaked: frozen objects are freed by reference counting as before, only cycles among
    them wait for the process to end. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Records each collection's duration while installed. ``gc.callbacks`` is one list
    for the whole process: every installed instance sees every collection, and each
    removes only its own callback."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        histogram = Histogram(f"{prefix}_gc_pause_seconds",
                              "How long a cyclic garbage collection held the process, by generation",
                              ["generation"], buckets=STAGE_BUCKETS_S, registry=registry)
        self._observe = tuple(histogram.labels(generation=str(g)).observe for g in GENERATIONS)
        self._started = 0.0
        self.longest_s = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started:
            pause = time.perf_counter() - self._started
            self._started = 0.0
            self._observe[min(info.get("generation", 2), 2)](pause)
            if pause > self.longest_s:
                self.longest_s = pause

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass
