"""The rate meter behind the admin stats' msgRateIn/msgRateOut (broker/stats.py RateMeter).

Proves: the first look at a key answers 0; a later look answers the growth per second
over a window of at least ``window_s_min``; a quicker look answers the last measured
rate; counters that went down (a restart) give 0, not a negative rate; at most
``samples_max`` keys are kept, the oldest pruned first.

How: counter tuples and clock readings passed in by hand (the meter reads no clock).
"""

from __future__ import annotations

from broker.stats import RateMeter


def test_rates_over_a_window_restarts_and_pruning():
    meter = RateMeter(window_s_min=1.0, samples_max=3)
    assert meter.rates("a", (0, 0), 100.0) == (0.0, 0.0)
    assert meter.rates("a", (10, 1000), 102.0) == (5.0, 500.0)
    assert meter.rates("a", (99, 9999), 102.5) == (5.0, 500.0)     # inside the window
    assert meter.rates("a", (20, 2000), 104.0) == (5.0, 500.0)
    assert meter.rates("a", (3, 300), 106.0) == (0.0, 0.0)          # restarted counters
    for key in ("b", "c", "d"):
        meter.rates(key, (0,), 107.0)
    assert len(meter) == 3
    assert meter.rates("a", (30, 3000), 108.0) == (0.0, 0.0)        # "a" was pruned
