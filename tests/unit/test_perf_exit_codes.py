"""``magnetar perf``'s exit code (magnetar/tools/perf.py main), with a fake runner and
client: no broker, no sockets.

Proves: 0 only for a clean run; 1 when the run had errors, and 1 when a producer gave
up waiting for sends that were neither acknowledged nor failed (``drained`` false: a run
whose sends are unresolved is not a success, whatever its rate); 3 when a consumer
asked for N messages got fewer. The summary is printed in every case.
"""

from __future__ import annotations

import json

import pytest

from magnetar.cli import build_parser
from magnetar.tools import perf


class _FakeClient:
    closed = False

    def close(self) -> None:
        self.closed = True


def _run(monkeypatch, capsys, argv: list[str], summary: dict) -> tuple[int, str, str]:
    client = _FakeClient()
    monkeypatch.setattr(perf, "open_client", lambda _args: client)

    class Runner:
        @staticmethod
        def check_arguments(_args) -> None:
            return None

        def __init__(self, _client, _args) -> None:
            pass

        def run(self) -> dict:
            return dict(summary)

    args = build_parser(argv).parse_args(argv)
    args.perf_runner = Runner
    code = perf.main(args)
    assert client.closed
    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1]) == summary
    return code, out, err


def _produced(**changes) -> dict:
    summary = {"mode": "produce", "sent": 100, "messages": 100, "errors": 0, "first_error": None, "drained": True}
    summary.update(changes)
    return summary


def test_clean_produce_exits_0(monkeypatch, capsys):
    code, _, err = _run(monkeypatch, capsys, ["perf", "produce", "t"], _produced())
    assert code == 0
    assert err == ""


def test_undrained_produce_exits_1(monkeypatch, capsys):
    code, _, err = _run(monkeypatch, capsys, ["perf", "produce", "t"], _produced(messages=90, drained=False))
    assert code == 1
    assert "10 sends neither acknowledged nor failed" in err
    assert err.strip().endswith("[OperationTimeout, code 5002]"), err


def test_errors_exit_1(monkeypatch, capsys):
    code, _, err = _run(monkeypatch, capsys, ["perf", "produce", "t"],
                        _produced(messages=97, errors=3, first_error="Timeout"))
    assert code == 1
    assert "3 errors: first: Timeout" in err
    assert err.strip().endswith("[OperationTimeout, code 5002]"), err     # the catalogue tag ends the line


@pytest.mark.parametrize("received, expected", [(50, 0), (49, perf.EXIT_TIMED_OUT)])
def test_consume_short_of_its_count_exits_3(monkeypatch, capsys, received, expected):
    summary = {"mode": "consume", "messages": received, "errors": 0, "first_error": None}
    code, _, _ = _run(monkeypatch, capsys, ["perf", "consume", "t", "--messages", "50"], summary)
    assert code == expected
