"""The "subscribed" line consumers print on stderr and runners wait for
(magnetar/tools/perf_stats.py), checked from both ends.

Proves: what ``announce_ready`` prints (with or without details) is recognised by
``is_ready_line``, as text and as bytes; other events, progress lines, plain text,
JSON that is not an object and undecodable bytes are not.
"""

from __future__ import annotations

import json

import pytest

from magnetar.tools.perf_stats import READY_EVENT, announce_ready, is_ready_line


@pytest.mark.parametrize("details", [{}, {"topic": "t", "subscription": "s"}])
def test_what_is_announced_is_recognised(capsys, details):
    announce_ready(**details)
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert json.loads(line) == {"event": READY_EVENT, **details}
    assert is_ready_line(line)
    assert is_ready_line(line.encode() + b"\n")


@pytest.mark.parametrize("line", [
    b'{"event": "closed"}\n', b'{"progress": {"msgs_per_s": 1.0}}\n', b"subscribed\n",
    b'["event", "subscribed"]\n', b"\xff\xfe garbage\n", b"", '{"event": null}',
])
def test_other_lines_are_not(line):
    assert not is_ready_line(line)
