"""metadata/start_retry.py: a starting process's first metadata calls survive a slow etcd."""

from __future__ import annotations

import pytest

from common.errors import ConfigError, MetadataUnavailable
from metadata import start_retry
from metadata.start_retry import while_unavailable


@pytest.fixture(autouse=True)
def _short_delays(monkeypatch):
    monkeypatch.setattr(start_retry, "RETRY_DELAY_S_MIN", 0.001)
    monkeypatch.setattr(start_retry, "RETRY_DELAY_S_MAX", 0.002)


def failing_times(count: int, error: Exception):
    calls = []

    async def call():
        calls.append(1)
        if len(calls) <= count:
            raise error
        return "answer"
    return call, calls


async def test_unavailable_then_answering_is_retried_until_it_answers():
    call, calls = failing_times(3, MetadataUnavailable("connection attempt timed out"))
    assert await while_unavailable("cookie check", call, wait_s=5) == "answer"
    assert len(calls) == 4


async def test_still_unavailable_at_the_deadline_raises_the_error():
    call, calls = failing_times(10**9, MetadataUnavailable("etcd away"))
    with pytest.raises(MetadataUnavailable):
        await while_unavailable("cookie check", call, wait_s=0.05)
    assert len(calls) >= 2


async def test_other_errors_are_not_retried():
    call, calls = failing_times(1, ConfigError("cookie does not match"))
    with pytest.raises(ConfigError):
        await while_unavailable("cookie check", call, wait_s=5)
    assert len(calls) == 1
