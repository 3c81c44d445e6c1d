"""Flags from the environment: ``MAGNETAR_<FLAG>`` sets ``--<flag>`` of the command that runs.

The one mapping (what a container image and the Kubernetes manifests in k8s/ rely on):

    --metadata            MAGNETAR_METADATA=etcd://etcd-0.etcd:2379
    --http-port           MAGNETAR_HTTP_PORT=8000
    --advertised-address  MAGNETAR_ADVERTISED_ADDRESS=10.1.2.3:6650
    --log-format          MAGNETAR_LOG_FORMAT=json          (the global options too)

The variable's name is ``MAGNETAR_`` and the long flag without its dashes, upper-cased,
``-`` turned into ``_``. Only the options of the top-level parser and of the command being
run are mapped (not those of a tool's own subcommands, such as ``admin topics …``), and
never ``--help``, ``--version`` or a hidden option. Values:

- a flag that takes a value: the value as it would be written after the flag;
- a repeatable flag (``--ledger-dir``): values separated by commas, one flag each;
- a switch (``--no-shedding``): ``1``, ``true``, ``yes`` or ``on`` gives it; ``0``,
  ``false``, ``no``, ``off`` or empty leaves it out; anything else is an error.

**Flags win over the environment**: a flag given on the command line (``--port 1`` or
``--port=1``) is never also taken from ``MAGNETAR_PORT``. Values from the environment are
parsed by the command's own argparse parser, exactly as if typed, so a bad value fails the
same way as a bad flag.

Variables that match no flag of the command are left alone: ``MAGNETAR_GATEWAY_SECRET``
is read by the gateway itself (a secret has no flag, so it never shows in a process list).
Kubernetes adds ``<SERVICE>_PORT``-style variables for every Service of a namespace (its
"service links"); a Service named ``magnetar`` would so set ``MAGNETAR_PORT``. The manifests
turn service links off (``enableServiceLinks: false``), and a pod spec keeps to that.
"""

from __future__ import annotations

import argparse
from typing import Mapping, Sequence

PREFIX = "MAGNETAR_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class EnvFlagError(ValueError):
    """A MAGNETAR_* variable whose value its flag cannot take (a switch set to 'maybe')."""


def env_name(flag: str) -> str:
    """``--http-port`` -> ``MAGNETAR_HTTP_PORT``."""
    assert flag.startswith("--"), flag
    return PREFIX + flag[2:].upper().replace("-", "_")


def mapped_flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """{env variable name: action} for the parser's own long options that the environment may set."""
    mapped: dict[str, argparse.Action] = {}
    for action in parser._actions:   # argparse keeps no public list of its actions
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        for flag in action.option_strings:
            if flag.startswith("--"):
                mapped[env_name(flag)] = action
    return mapped


def _given(argv: Sequence[str], action: argparse.Action) -> bool:
    for token in argv:
        if token == "--":
            break
        for flag in action.option_strings:
            if token == flag or token.startswith(flag + "="):
                return True
    return False


def env_tokens(parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The command-line tokens the environment adds for ``parser``'s options that ``argv``
    does not give; EnvFlagError for a switch variable that is neither true nor false."""
    tokens: list[str] = []
    seen: set[int] = set()
    for name, action in sorted(mapped_flags(parser).items()):
        if name not in environ or id(action) in seen or _given(argv, action):
            continue
        seen.add(id(action))
        value = environ[name]
        flag = next(f for f in action.option_strings if f.startswith("--"))
        if action.nargs == 0:   # store_true, store_const and the like: a switch
            lowered = value.strip().lower()
            if lowered in _TRUE:
                tokens.append(flag)
            elif lowered not in _FALSE:
                raise EnvFlagError(f"{name}={value!r}: {flag} is a switch; use 1/true/yes/on or 0/false/no/off")
            continue
        if isinstance(action, argparse._AppendAction):
            for part in value.split(","):
                tokens.append(f"{flag}={part.strip()}")
            continue
        tokens.append(f"{flag}={value}")
    return tokens


def apply_environment(top: argparse.ArgumentParser, command: argparse.ArgumentParser | None,
                      argv: Sequence[str], command_name: str | None,
                      environ: Mapping[str, str]) -> list[str]:
    """``argv`` with the environment's tokens added: the top-level parser's before the
    command's name, the command's right after it (where argparse expects each)."""
    argv = list(argv)
    if command_name is None or command_name not in argv:
        return env_tokens(top, argv, environ) + argv
    at = argv.index(command_name)
    before, after = argv[:at], argv[at + 1:]
    top_tokens = env_tokens(top, before, environ)
    command_tokens = env_tokens(command, after, environ) if command is not None else []
    return [*top_tokens, *before, command_name, *command_tokens, *after]
