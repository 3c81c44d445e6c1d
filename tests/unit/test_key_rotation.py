"""A token key rotated by replacing its file (as a Kubernetes Secret is) takes effect
without a restart: common/tokens.KeyFileVerifier reads the file again once it changed
(looked at every recheck interval), keeps the key in use while the file is unreadable
or half-written, and never rereads an inline key; a bookie's interceptor forgets the
token it remembered as verified when the key changes, so a token of the old key is
refused at once rather than until it expires."""

from __future__ import annotations

import base64
import os
import time

import grpc
import pytest

from bookie.security import BookieSecurityConfig, TokenInterceptor
from runtime import tokens
from common.errors import AuthenticationFailed, ConfigError
from runtime.tokens import KeyFileVerifier, TokenSigner, create_secret_key


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _replace(path, data: bytes) -> None:
    """Writes the file anew with a modification time surely different from before."""
    path.write_bytes(data)
    later = time.time_ns() + 10_000_000
    os.utime(path, ns=(later, later))


def test_a_replaced_key_file_is_read_again_after_the_recheck_interval(tmp_path):
    first, second = create_secret_key(), create_secret_key()
    path = tmp_path / "secret.key"
    path.write_bytes(first)
    clock = _Clock()
    keys = KeyFileVerifier(f"file://{path}", public_key=False, recheck_s=2.0, clock=clock)
    old_token = TokenSigner.with_secret_key(first).create("broker")
    new_token = TokenSigner.with_secret_key(second).create("broker")
    assert keys.current().claims(old_token)["sub"] == "broker" and keys.generation == 1

    _replace(path, second)
    clock.now += 1.0                      # within the interval: the file is not looked at
    assert keys.current().claims(old_token)["sub"] == "broker"
    clock.now += 1.0
    with pytest.raises(AuthenticationFailed):
        keys.current().claims(old_token)
    assert keys.current().claims(new_token)["sub"] == "broker" and keys.generation == 2

    # Half-written (too short for a secret key), then gone: the key in use stays.
    _replace(path, b"abc")
    clock.now += 2.0
    assert keys.current().claims(new_token)["sub"] == "broker" and keys.generation == 2
    path.unlink()
    clock.now += 2.0
    assert keys.current().claims(new_token)["sub"] == "broker"


def test_an_inline_key_is_never_reread_and_a_missing_file_fails_at_start(tmp_path):
    secret = create_secret_key()

    keys = KeyFileVerifier("data:;base64," + base64.b64encode(secret).decode(), public_key=False, recheck_s=0.0)
    token = TokenSigner.with_secret_key(secret).create("r")
    assert keys.current().claims(token)["sub"] == "r" and keys.generation == 1
    with pytest.raises(ConfigError):
        KeyFileVerifier(f"file://{tmp_path / 'missing.key'}", public_key=False)


def test_a_bookie_refuses_a_remembered_token_once_its_key_was_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "KEY_RECHECK_S", 0.0)
    first, second = create_secret_key(), create_secret_key()
    path = tmp_path / "secret.key"
    path.write_bytes(first)
    interceptor = TokenInterceptor(BookieSecurityConfig(authentication_enabled=True,
                                                        token_secret_key=f"file://{path}",
                                                        allowed_roles="broker"))

    def check(token: str):
        return interceptor._check([("authorization", f"Bearer {token}")])

    old_token = TokenSigner.with_secret_key(first).create("broker")
    assert check(old_token) is None
    assert check(old_token) is None       # remembered: no second signature check
    _replace(path, second)
    refused = check(old_token)
    assert refused is not None and refused[0] == grpc.StatusCode.UNAUTHENTICATED
    assert check(TokenSigner.with_secret_key(second).create("broker")) is None
    other_role = check(TokenSigner.with_secret_key(second).create("someone"))
    assert other_role is not None and other_role[0] == grpc.StatusCode.PERMISSION_DENIED


def test_a_token_file_is_read_again_when_renewed_and_kept_while_half_written(tmp_path):
    path = tmp_path / "service.token"
    path.write_text("first.token\n")
    clock = _Clock()
    source = tokens.TokenFile(str(path), recheck_s=2.0, clock=clock)
    assert source.current() == "first.token"
    _replace(path, b"second.token")
    assert source.current() == "first.token"          # not looked at within the interval
    clock.now += 2.0
    assert source.current() == "second.token"
    _replace(path, b"")                               # being replaced: empty for a moment
    clock.now += 2.0
    assert source.current() == "second.token"
    path.unlink()
    clock.now += 2.0
    assert source.current() == "second.token"
    with pytest.raises(ConfigError):
        tokens.TokenFile(str(tmp_path / "missing.token"))
    (tmp_path / "empty.token").write_text("\n")
    with pytest.raises(ConfigError):
        tokens.TokenFile(str(tmp_path / "empty.token"))
