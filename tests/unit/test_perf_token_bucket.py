"""Rate pacing of the perf tools (magnetar/tools/token_bucket.py), pure: time is passed in.

Proves that: the first message may go at once but there is no burst at start; tokens
accrue at the rate and are taken whole; over a long run paced by the bucket the rate is
the target; a stall is caught up only up to the capacity; the wait for the next token
is exact; time going backwards adds nothing; bad settings are programmer errors.
"""

from __future__ import annotations

import pytest

from magnetar.tools.token_bucket import TokenBucket


def test_first_token_at_once_without_a_burst():
    bucket = TokenBucket(1000, capacity=100, now_s=0.0)
    assert bucket.take(0.0, 50) == 1
    assert bucket.take(0.0, 50) == 0


def test_tokens_accrue_at_the_rate_and_are_taken_whole():
    # Rate and times are binary fractions, so the arithmetic is exact.
    bucket = TokenBucket(8, capacity=100, now_s=0.0)
    bucket.take(0.0, 1)
    assert bucket.take(1.3125, 100) == 10      # 10.5 tokens: 10 whole
    assert bucket.take(1.375, 100) == 1        # the half left plus 0.5 more


def test_paced_sender_achieves_the_target_rate():
    rate = 10_000.0
    bucket = TokenBucket(rate, capacity=rate * 0.1, now_s=0.0)
    now, sent = 0.0, 0
    while now < 10.0:
        granted = bucket.take(now, 64)
        sent += granted
        now += bucket.seconds_until_token(now) if granted == 0 else 0.0007  # the time a burst of sends takes
    assert sent == pytest.approx(rate * 10.0, rel=0.01)


def test_a_stall_is_caught_up_only_up_to_capacity():
    bucket = TokenBucket(1000, capacity=50, now_s=0.0)
    bucket.take(0.0, 1)
    assert bucket.take(10.0, 10_000) == 50


def test_seconds_until_token():
    bucket = TokenBucket(100, capacity=10, now_s=0.0)
    assert bucket.seconds_until_token(0.0) == 0.0
    bucket.take(0.0, 1)
    assert bucket.seconds_until_token(0.0) == pytest.approx(0.01)
    assert bucket.seconds_until_token(0.004) == pytest.approx(0.006)
    assert bucket.seconds_until_token(0.01) == 0.0


def test_time_going_backwards_adds_nothing():
    bucket = TokenBucket(8, capacity=100, now_s=5.0)
    bucket.take(5.0, 1)
    assert bucket.take(4.0, 10) == 0
    assert bucket.take(5.25, 10) == 2


def test_taking_nothing_is_allowed():
    assert TokenBucket(10, capacity=1, now_s=0.0).take(0.0, 0) == 0


@pytest.mark.parametrize("rate, capacity", [(0, 10), (-1, 10), (10, 0.5)])
def test_bad_settings_are_programmer_errors(rate, capacity):
    with pytest.raises(AssertionError):
        TokenBucket(rate, capacity=capacity, now_s=0.0)
