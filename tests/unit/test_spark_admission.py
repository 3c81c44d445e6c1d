"""The micro-batch admission of minMessagesPerTrigger / maxTriggerDelay
(spark/admission.py) and the stream reader's checks of those options.

Proves that: the first trigger is never put off; later ones are put off below the
minimum until the delay since the last admitted batch has passed, and let through at
the minimum at once; each admission restarts the clock; the delay parses as the Kafka
source's durations (15m default) and refuses anything else; the reader refuses
maxTriggerDelay without a minimum and a minimum above maxMessagesPerTrigger.
"""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from spark.admission import DEFAULT_DELAY_S, TriggerAdmission, parse_delay_s


def test_the_first_trigger_is_never_put_off():
    assert TriggerAdmission(minimum=100, delay_s=60).admit(now_s=5.0, available=1)


def test_below_the_minimum_waits_for_the_delay_since_the_last_batch():
    rule = TriggerAdmission(minimum=10, delay_s=30)
    assert rule.admit(0.0, 3)
    assert not rule.admit(1.0, 9)
    assert not rule.admit(29.9, 9)
    assert rule.admit(30.0, 9)          # the delay passed: what is there is read
    assert not rule.admit(31.0, 1)      # the clock restarted at 30.0
    assert rule.admit(60.0, 1)


def test_the_minimum_lets_a_batch_through_at_once_and_restarts_the_clock():
    rule = TriggerAdmission(minimum=10, delay_s=30)
    assert rule.admit(0.0, 1)
    assert rule.admit(2.0, 10)
    assert not rule.admit(31.0, 9)      # 29 s since the batch at 2.0
    assert rule.admit(32.0, 9)


@pytest.mark.parametrize(("text", "seconds"), [
    (None, DEFAULT_DELAY_S), ("15m", 900.0), ("30s", 30.0), ("500ms", 0.5), ("2h", 7200.0),
    ("1500", 1.5), (" 5 min ", 300.0)])
def test_delays_parse_as_the_kafka_source_writes_them(text, seconds):
    assert parse_delay_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-5s", "1.5s", "5d", "10 minutes"])
def test_other_delays_are_refused(text):
    with pytest.raises(ConfigError, match="maxTriggerDelay"):
        parse_delay_s(text)


def test_the_reader_refuses_a_delay_without_a_minimum_and_a_minimum_above_the_maximum():
    from spark.stream import MagnetarStreamReader
    base = {"adminUrl": "http://127.0.0.1:1", "serviceUrl": "pulsar://127.0.0.1:1", "topic": "t"}
    with pytest.raises(ConfigError, match="needs minMessagesPerTrigger"):
        MagnetarStreamReader({**base, "maxTriggerDelay": "1m"})
    with pytest.raises(ConfigError, match="above maxMessagesPerTrigger"):
        MagnetarStreamReader({**base, "minMessagesPerTrigger": "50", "maxMessagesPerTrigger": "10"})
    reader = MagnetarStreamReader({**base, "minMessagesPerTrigger": "5", "maxTriggerDelay": "30s"})
    assert reader.admission == TriggerAdmission(minimum=5, delay_s=30.0)
