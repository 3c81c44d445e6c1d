"""The event-loop choice (common/event_loop.py), with no sockets.

Proves that: ``auto`` gives uvloop to the server commands and the standard loop to the
tools and the standalone supervisor; a named loop is taken as named; the command line
takes ``--event-loop`` (and MAGNETAR_EVENT_LOOP from the environment) before the command.
"""

from __future__ import annotations

import pytest

from common.event_loop import SERVER_COMMANDS, chosen_loop
from magnetar.cli import parse_command_line


@pytest.mark.parametrize("command", sorted(SERVER_COMMANDS))
def test_auto_is_uvloop_for_servers(command: str) -> None:
    assert chosen_loop("auto", command) == "uvloop"


@pytest.mark.parametrize("command", ["standalone", "produce", "perf", "shell", None])
def test_auto_is_asyncio_for_the_rest(command: str | None) -> None:
    assert chosen_loop("auto", command) == "asyncio"


def test_named_loops_are_taken_as_named() -> None:
    assert chosen_loop("asyncio", "broker") == "asyncio"
    assert chosen_loop("uvloop", "produce") == "uvloop"


def test_command_line_and_environment() -> None:
    argv = ["bookie", "--metadata", "etcd://127.0.0.1:2379", "--journal-dir", "j", "--ledger-dir", "l"]
    assert parse_command_line(argv, {}).event_loop == "auto"
    assert parse_command_line(["--event-loop", "asyncio", *argv], {}).event_loop == "asyncio"
    assert parse_command_line(argv, {"MAGNETAR_EVENT_LOOP": "asyncio"}).event_loop == "asyncio"
