"""The ``magnetar`` command: one entry point, a subcommand per process or tool.

    magnetar bookie …        a bookie (storage node)
    magnetar shell …         BookKeeper-style tools: listbookies, simpletest, readledger …
    magnetar standalone …    etcd + bookies (+ brokers) on this machine

Each subcommand's module owns its options (``add_arguments``) and wiring (``main``).
"""

from __future__ import annotations

import argparse
import sys

from magnetar import __version__, logs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="magnetar", description="Magnetar messaging")
    parser.add_argument("--version", action="version", version=f"magnetar {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    commands = parser.add_subparsers(dest="command", required=True)

    from bookie import main as bookie_main

    bookie_parser = commands.add_parser("bookie", help="run a bookie")
    bookie_main.add_arguments(bookie_parser)
    bookie_parser.set_defaults(handler=bookie_main.main, process="bookie")

    from broker import main as broker_main

    broker_parser = commands.add_parser("broker", help="run a broker")
    broker_main.add_arguments(broker_parser)
    broker_parser.set_defaults(handler=broker_main.main, process="broker")

    from ledger import shell

    shell_parser = commands.add_parser("shell", help="ledger and bookie tools")
    shell.add_arguments(shell_parser)
    shell_parser.set_defaults(handler=shell.main, process="shell")

    from magnetar import standalone

    standalone_parser = commands.add_parser("standalone", help="a whole cluster on this machine")
    standalone.add_arguments(standalone_parser)
    standalone_parser.set_defaults(handler=standalone.main, process="standalone")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level, args.log_format, process=args.process)
    from ledger.errors import ConfigError

    try:
        return int(args.handler(args) or 0)
    except ConfigError as error:
        print(f"magnetar: configuration error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
