"""Tokens for authentication, like ``pulsar tokens``:

    magnetar tokens create-secret-key [--output FILE]          HS256 secret key (raw bytes to
                                                              FILE, mode 0600; base64 on stdout)
    magnetar tokens create-key-pair --output-private-key F --output-public-key F
                                                              RS256 key pair, DER like Pulsar's
    magnetar tokens create --subject ROLE (--secret-key K | --private-key K) [--expiry-time 30d]
    magnetar tokens show (--token T | --token-file F)        header and claims, unchecked
    magnetar tokens validate (--token T | --token-file F) (--secret-key K | --public-key K)

A key K is ``file:///path`` (or a path) or ``data:;base64,...``. Expiry times take a unit:
s, m, h, d, w, y (``30d``); without ``--expiry-time`` a token never expires.
``validate`` exits 1 for a token that does not verify, saying why (never the token).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys

from common.errors import AuthenticationFailed
from runtime.tokens import (
    TokenSigner,
    TokenVerifier,
    create_key_pair,
    create_secret_key,
    read_key_value,
    unverified_parts,
)

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400, "y": 365 * 86_400}


def expiry_seconds(text: str) -> int:
    """``30d`` -> seconds; a bare number is seconds."""
    text = text.strip()
    unit = text[-1:].lower()
    number = text[:-1] if unit in _UNITS_S else text
    try:
        value = int(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an expiry time: {text!r} (e.g. 30s, 10m, 2h, 7d, 1y)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("an expiry time must be positive")
    return value * _UNITS_S.get(unit, 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="tokens_command", required=True)
    secret = commands.add_parser("create-secret-key", help="a new HS256 secret key")
    secret.add_argument("--output", help="file for the raw key (mode 0600); default: base64 on stdout")
    secret.add_argument("--base64", action="store_true", help="with --output: write the key in base64")
    pair = commands.add_parser("create-key-pair", help="a new RS256 key pair")
    pair.add_argument("--output-private-key", required=True)
    pair.add_argument("--output-public-key", required=True)
    create = commands.add_parser("create", help="a token for a role")
    create.add_argument("--subject", "-s", required=True, help="the role")
    keys = create.add_mutually_exclusive_group(required=True)
    keys.add_argument("--secret-key", help="file:///path or data:;base64,...")
    keys.add_argument("--private-key", help="file:///path or data:;base64,...")
    create.add_argument("--expiry-time", "--expiry", "-e", type=expiry_seconds, dest="expiry_s",
                        help="e.g. 30m, 12h, 30d, 1y (default: never)")
    for name, help_text in (("show", "a token's header and claims (not verified)"),
                            ("validate", "verify a token and print its claims")):
        command = commands.add_parser(name, help=help_text)
        source = command.add_mutually_exclusive_group(required=True)
        source.add_argument("--token", "-t")
        source.add_argument("--token-file", "-f")
        if name == "validate":
            verify = command.add_mutually_exclusive_group(required=True)
            verify.add_argument("--secret-key")
            verify.add_argument("--public-key")


def _write_private(path: str, data: bytes) -> None:
    """Writes a key readable by this user only (created 0600, never widened)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


def _token_of(args: argparse.Namespace) -> str:
    if args.token is not None:
        return args.token.strip()
    path = args.token_file[len("file://"):] if args.token_file.startswith("file://") else args.token_file
    with open(path, encoding="ascii") as handle:
        return handle.read().strip()


def main(args: argparse.Namespace) -> int:
    command = args.tokens_command
    if command == "create-secret-key":
        key = create_secret_key()
        if args.output:
            _write_private(args.output, base64.b64encode(key) if args.base64 else key)
        else:
            print(base64.b64encode(key).decode())
        return 0
    if command == "create-key-pair":
        private_der, public_der = create_key_pair()
        _write_private(args.output_private_key, private_der)
        with open(args.output_public_key, "wb") as handle:
            handle.write(public_der)
        return 0
    if command == "create":
        signer = (TokenSigner.with_secret_key(read_key_value(args.secret_key)) if args.secret_key
                  else TokenSigner.with_private_key(read_key_value(args.private_key)))
        print(signer.create(args.subject, expiry_s=args.expiry_s))
        return 0
    token = _token_of(args)
    if command == "show":
        try:
            header, claims = unverified_parts(token)
        except AuthenticationFailed as error:
            print(f"magnetar tokens show: {error}", file=sys.stderr)
            return 1
        print(json.dumps(header))
        print(json.dumps(claims))
        return 0
    assert command == "validate", command
    verifier = (TokenVerifier.with_secret_key(read_key_value(args.secret_key)) if args.secret_key
                else TokenVerifier.with_public_key(read_key_value(args.public_key)))
    try:
        claims = verifier.claims(token)
    except AuthenticationFailed as error:
        print(f"magnetar tokens validate: invalid token: {error}", file=sys.stderr)
        return 1
    print(json.dumps(claims))
    return 0

