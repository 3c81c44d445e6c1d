"""The ``magnetar`` command: one entry point, a subcommand per process or tool.

    magnetar bookie …        a bookie (storage node)
    magnetar shell …         BookKeeper-style tools: listbookies, simpletest, readledger …
    magnetar gateway …       an HTTP gateway (produce and consume over HTTP)
    magnetar proxy …         the binary protocol's front door: lookups and connections piped to brokers
    magnetar standalone …    etcd + bookies + brokers + a gateway on this machine
    magnetar produce …       send messages with the official Pulsar client
    magnetar consume …       receive and acknowledge messages
    magnetar admin …         the admin REST API (clusters, tenants, namespaces, topics, brokers)
    magnetar perf …          pulsar-perf-like throughput and latency runs
    magnetar archive …       a topic's Arrow archive: run, status, ls, verify
    magnetar autorecovery …  auditor + replication worker: lost bookies' copies made again
    magnetar tokens …        authentication tokens and keys, like pulsar tokens

Each subcommand's module owns its options (``add_arguments``) and wiring (``main``).
Every option of the command that runs (and the global ones) can also come from the
environment as ``MAGNETAR_<FLAG>`` (``--http-port`` from ``MAGNETAR_HTTP_PORT``); a flag
given on the command line wins. magnetar/env_flags.py has the mapping's rules.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Mapping, Sequence

from common.version import __version__
from magnetar import env_flags, logs


# name -> (module with add_arguments/main, one-line help). A module is imported only
# when its command runs, so a bookie never loads the Pulsar client library, and a
# broken tool cannot stop the servers from starting.
COMMANDS: dict[str, tuple[str, str]] = {
    "bookie": ("bookie.main", "run a bookie"),
    "broker": ("broker.main", "run a broker"),
    "gateway": ("gateway.main", "run an HTTP gateway"),
    "proxy": ("proxy.main", "run a proxy: the binary protocol's front door for clients outside the cluster"),
    "shell": ("ledger.shell", "ledger and bookie tools"),
    "standalone": ("magnetar.standalone", "a whole cluster on this machine"),
    "produce": ("magnetar.tools.produce", "send messages to a topic"),
    "consume": ("magnetar.tools.consume", "receive and acknowledge messages"),
    "admin": ("magnetar.tools.admin", "admin REST client"),
    "perf": ("magnetar.tools.perf", "throughput and latency runs"),
    "archive": ("magnetar.tools.archive", "a topic's Arrow archive: run, status, ls, verify"),
    "autorecovery": ("magnetar.autorecovery", "auditor and replication worker (re-replicates lost copies)"),
    "tokens": ("magnetar.tools.tokens", "authentication tokens and keys: create-secret-key, create-key-pair, "
                                        "create, show, validate"),
}


_ENVIRONMENT_HELP = ("Every option may also be set in the environment as MAGNETAR_<FLAG> (--http-port as "
                     "MAGNETAR_HTTP_PORT; commas for a repeatable flag; true/false for a switch); a flag on "
                     "the command line wins.")


def _chosen_command(argv: list[str]) -> str | None:
    for token in argv:
        if token in COMMANDS:
            return token
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="magnetar", description="Magnetar messaging", epilog=_ENVIRONMENT_HELP)
    parser.add_argument("--version", action="version", version=f"magnetar {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    # runtime/event_loop.py (docs/performance.md steps 2 and 24: uvloop measured twice, no
    # gain that holds for both standalone shapes).
    parser.add_argument("--event-loop", default="asyncio", choices=["asyncio", "uvloop"],
                        help="the asyncio event loop implementation")
    commands = parser.add_subparsers(dest="command", required=True)
    chosen = _chosen_command(sys.argv[1:] if argv is None else argv)
    for name, (module_path, summary) in COMMANDS.items():
        if name != chosen:
            commands.add_parser(name, help=summary)
            continue
        module = importlib.import_module(module_path)
        command_parser = commands.add_parser(name, help=summary, description=module.__doc__,
                                             formatter_class=argparse.RawDescriptionHelpFormatter,
                                             epilog=_ENVIRONMENT_HELP)
        module.add_arguments(command_parser)
        command_parser.set_defaults(handler=module.main, process=name)
    return parser


def command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    """The subparser of command ``name`` in a parser from ``build_parser``."""
    for action in parser._actions:   # argparse has no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def with_environment(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser for ``argv`` and ``argv`` with the ``MAGNETAR_<FLAG>`` variables of
    ``environ`` added as flags (those the command line does not give)."""
    argv = list(argv)
    parser = build_parser(argv)
    chosen = _chosen_command(argv)
    command = command_parser(parser, chosen) if chosen is not None else None
    try:
        full = env_flags.apply_environment(parser, command, argv, chosen, environ)
    except env_flags.EnvFlagError as error:
        parser.error(str(error))
    return parser, full


def parse_command_line(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """What ``magnetar`` makes of ``argv`` in ``environ``: the one parse the process does
    (tests check the Kubernetes pod specs with it)."""
    parser, full = with_environment(argv, environ)
    return parser.parse_args(full)


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(sys.argv[1:] if argv is None else argv, os.environ)
    logs.configure(args.log_level, args.log_format, process=args.process)
    from runtime.event_loop import install as install_event_loop

    install_event_loop(args.event_loop)
    from common.errors import ConfigError, PortInUse

    try:
        return int(args.handler(args) or 0)
    except PortInUse as error:
        # One line naming the port and the flag that sets it; no traceback.
        print(f"magnetar {args.process}: {error}", file=sys.stderr)
        return 2
    except ConfigError as error:
        print(f"magnetar: configuration error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
