"""Token buckets of the rate limits (broker/rate_limits.py): a full bucket allows one
period's burst, then the rate; debt is paid by waiting, so the long-run rate is the
limit; -1/0 mean no limit; the dispatch throttle's allowance and wait."""

from __future__ import annotations

from broker.rate_limits import (DispatchRateThrottle, PublishWindow, RateLimit, TokenBucket, dispatch_limit,
                                publish_limit)


def test_bucket_bursts_one_period_then_goes_at_the_rate():
    bucket = TokenBucket(rate_per_s=100, capacity=100, now_s=0.0)
    bucket.take(100, 0.0)
    assert bucket.seconds_until(0, 0.0) == 0
    bucket.take(50, 0.0)                       # taken anyway: debt
    assert bucket.tokens == -50
    assert abs(bucket.seconds_until(0, 0.0) - 0.5) < 1e-9
    assert abs(bucket.refill(1.5) - 100) < 1e-9   # full again, never more
    assert bucket.refill(10.0) == 100


def test_long_run_rate_is_the_limit_whatever_the_chunks():
    """Taking 37 at a time whenever the bucket is not in debt: over about 100 s, the
    rate times the time, plus at most one burst and one chunk."""
    bucket = TokenBucket(rate_per_s=200, capacity=200, now_s=0.0)
    now, taken = 0.0, 0
    while now < 100:
        wait = bucket.seconds_until(0, now)
        now += wait
        bucket.take(37, now)
        taken += 37
    # At the last take (time ``now``), the debt is less than one chunk.
    assert 200 * now <= taken <= 200 * now + 200 + 37 + 1e-6


def test_no_limit_values():
    assert publish_limit(None) is None
    assert publish_limit({"publishThrottlingRateInMsg": -1, "publishThrottlingRateInByte": 0}) is None
    assert publish_limit({"publishThrottlingRateInMsg": 5}) == RateLimit(5, None)
    assert dispatch_limit({"dispatchThrottlingRateInMsg": 0, "dispatchThrottlingRateInByte": 9,
                           "ratePeriodInSecond": 3}) == RateLimit(None, 9, 3.0)


def test_dispatch_throttle_allows_what_the_buckets_hold():
    now = [0.0]
    throttle = DispatchRateThrottle(RateLimit(10, None, 1.0), clock=lambda: now[0])
    assert throttle.allowance() == 10
    throttle.consume(12, 1200)
    assert throttle.allowance() == 0
    wait = throttle.retry_after_s()
    assert 0.2 < wait < 0.4        # the debt of 2, then a batch of 1 (0.1 s of rate, at least one)
    now[0] += wait
    assert throttle.allowance() >= 1


def test_a_relative_dispatch_limit_follows_the_publish_rate():
    """relativeToPublishRate: the configured 50 msg/s plus what was published in the last
    whole second; with nothing published, the configured rate again."""
    now = [0.5]
    limit = dispatch_limit({"dispatchThrottlingRateInMsg": 50, "dispatchThrottlingRateInByte": -1,
                            "ratePeriodInSecond": 1, "relativeToPublishRate": True})
    assert limit == RateLimit(50, None, 1.0, relative=True)
    window = PublishWindow()
    throttle = DispatchRateThrottle(limit, clock=lambda: now[0], published=window)

    def dispatched_in(steps: int, published_per_step: int = 0) -> int:
        """Every 10 ms: publishes, then dispatches whatever the throttle allows; what it
        allowed in all."""
        total = 0
        for _ in range(steps):
            now[0] += 0.01
            if published_per_step:
                window.add(published_per_step, published_per_step * 100, now[0])
            allowed = throttle.allowance()
            throttle.consume(allowed, allowed * 100)
            total += allowed
        return total

    dispatched_in(200)                             # the first burst spent
    assert 45 <= dispatched_in(400) / 4 <= 55      # nothing published: the configured rate
    dispatched_in(200, published_per_step=2)       # published at 200 msg/s: a whole second seen
    assert throttle.publish_rates[0] == 200, throttle.publish_rates
    rate = dispatched_in(400, published_per_step=2) / 4
    assert 235 <= rate <= 265, rate                # 50 + 200
    dispatched_in(200)                             # publishing stopped
    assert throttle.publish_rates[0] == 0
    assert 45 <= dispatched_in(400) / 4 <= 55


def test_the_publish_window_counts_the_last_whole_second_only():
    window = PublishWindow()
    window.add(1500, 150_000, 10.2)               # a backlog written in one burst
    assert window.last_second(10.9) == (0, 0)
    assert window.last_second(11.3) == (1500, 150_000)
    assert window.last_second(12.0) == (0, 0)      # long ago: it lifts nothing
    window.add(5, 500, 30.1)
    window.add(5, 500, 31.0)
    assert window.last_second(31.5) == (5, 500)


def test_a_relative_limit_without_a_window_stays_at_the_configured_rate():
    now = [0.0]
    throttle = DispatchRateThrottle(RateLimit(10, None, 1.0, relative=True), clock=lambda: now[0])
    assert throttle.allowance() == 10
    now[0] += 5
    assert throttle.allowance() == 10
