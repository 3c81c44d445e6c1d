"""The event-loop choice (runtime/event_loop.py, ``--event-loop``), with no sockets.

Proves that: the command line takes ``--event-loop`` (and MAGNETAR_EVENT_LOOP from the
environment) before the command, the standard loop by default; installing uvloop makes
``asyncio.run`` run on it, and installing asyncio leaves the standard loop.
"""

from __future__ import annotations

import asyncio

from runtime.event_loop import install
from magnetar.cli import parse_command_line


def test_command_line_and_environment() -> None:
    argv = ["bookie", "--metadata", "etcd://127.0.0.1:2379", "--journal-dir", "j", "--ledger-dir", "l"]
    assert parse_command_line(argv, {}).event_loop == "asyncio"
    assert parse_command_line(["--event-loop", "uvloop", *argv], {}).event_loop == "uvloop"
    assert parse_command_line(argv, {"MAGNETAR_EVENT_LOOP": "uvloop"}).event_loop == "uvloop"


def test_install_chooses_the_loop() -> None:
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    try:
        assert install("uvloop") == "uvloop"
        assert asyncio.run(loop_module()).startswith("uvloop")
        assert install("asyncio") == "asyncio"
        assert asyncio.run(loop_module()).startswith("asyncio")
    finally:
        asyncio.set_event_loop_policy(None)
