"""Tokens (runtime/tokens.py) and the broker's authenticator (broker/authentication.py).

Proves: HS256 and RS256 tokens round-trip to their role; a wrong key, a wrong
algorithm, an expired token, garbage, an over-long token and a token without a subject
all raise AuthenticationFailed (and nothing else) whose message never holds the token;
keys read from file:// and data: values, in DER and PEM; the authenticator takes
CONNECT's (method, data) and HTTP's Bearer header, honours the anonymous role, and
picks up a rewritten key file; AuthConfig refuses inconsistent settings and never
shows an inline key in its repr.
"""

from __future__ import annotations

import base64
import os
import time

import pytest
from cryptography.hazmat.primitives import serialization

import broker.authentication as authentication
from broker.authentication import AuthConfig, Authenticator
from common.errors import AuthenticationFailed, ConfigError
from runtime.tokens import (
    TOKEN_BYTES_MAX,
    TokenSigner,
    TokenVerifier,
    create_key_pair,
    create_secret_key,
    read_key_value,
    unverified_parts,
)


def test_hs256_round_trip_and_wrong_key():
    key = create_secret_key()
    token = TokenSigner.with_secret_key(key).create("alice")
    assert TokenVerifier.with_secret_key(key).role(token) == "alice"
    with pytest.raises(AuthenticationFailed, match="signature") as caught:
        TokenVerifier.with_secret_key(create_secret_key()).role(token)
    assert token not in str(caught.value)


def test_rs256_round_trip_pem_and_der_and_algorithm_confusion():
    private_der, public_der = create_key_pair()
    token = TokenSigner.with_private_key(private_der).create("bob", expiry_s=60)
    assert TokenVerifier.with_public_key(public_der).role(token) == "bob"
    public_pem = serialization.load_der_public_key(public_der).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert TokenVerifier.with_public_key(public_pem).role(token) == "bob"
    # An HS256 token made with the public key's bytes as the secret must not pass.
    forged = _hs256_by_hand({"sub": "root"}, public_der)
    with pytest.raises(AuthenticationFailed):
        TokenVerifier.with_public_key(public_der).role(forged)


def test_expired_and_malformed_tokens_fail_with_our_error_only():
    key = create_secret_key()
    signer, verifier = TokenSigner.with_secret_key(key), TokenVerifier.with_secret_key(key)
    with pytest.raises(AuthenticationFailed, match="expired"):
        verifier.role(signer.create("carol", expiry_s=-1))
    assert verifier.role(signer.create("carol", expiry_s=3600)) == "carol"
    import jwt
    no_subject = jwt.encode({"exp": int(time.time()) + 60}, key, algorithm="HS256")
    for bad in ("", "x", "a.b.c", b"\xff\xfe", "e" * (TOKEN_BYTES_MAX + 1), no_subject,
                jwt.encode({"sub": 7}, key, algorithm="HS256"), jwt.encode({"sub": "x"}, None, algorithm="none")):
        with pytest.raises(AuthenticationFailed):
            verifier.role(bad)


def _hs256_by_hand(claims: dict, key: bytes) -> str:
    """An HS256 token built without PyJWT (which refuses an asymmetric key as a secret)."""
    import hashlib
    import hmac
    import json

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = part(b'{"alg":"HS256","typ":"JWT"}') + "." + part(json.dumps(claims).encode())
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + part(signature)


def test_key_values(tmp_path):
    key = create_secret_key()
    path = tmp_path / "k"
    path.write_bytes(key)
    assert read_key_value(f"file://{path}") == key
    assert read_key_value(str(path)) == key
    assert read_key_value("data:;base64," + base64.b64encode(key).decode()) == key
    with pytest.raises(ConfigError):
        read_key_value(str(tmp_path / "missing"))
    with pytest.raises(ConfigError):
        read_key_value("data:;base64,@@@")
    with pytest.raises(ConfigError):
        TokenVerifier.with_secret_key(b"short")


def test_show_parts_without_verifying():
    token = TokenSigner.with_secret_key(create_secret_key()).create("dave", expiry_s=10, now_s=1000)
    header, claims = unverified_parts(token)
    assert header["alg"] == "HS256" and claims == {"sub": "dave", "exp": 1010}


def test_auth_config_checks_and_hides_inline_keys():
    with pytest.raises(ConfigError):
        AuthConfig(authorization_enabled=True)
    with pytest.raises(ConfigError):
        AuthConfig(authentication_enabled=True)
    with pytest.raises(ConfigError):
        AuthConfig(authentication_enabled=True, token_secret_key="a", token_public_key="b")
    with pytest.raises(ConfigError):
        AuthConfig(authentication_enabled=True, authorization_enabled=True, token_secret_key="data:,")
    inline = "data:;base64," + base64.b64encode(create_secret_key()).decode()
    config = AuthConfig(authentication_enabled=True, token_secret_key=inline, superuser_roles="a, b")
    assert inline not in repr(config)
    assert config.superusers == frozenset({"a", "b"})
    assert AuthConfig() == AuthConfig() and not AuthConfig().authentication_enabled


async def test_authenticator_connect_http_anonymous_and_key_rotation(tmp_path, monkeypatch):
    first, second = create_secret_key(), create_secret_key()
    path = tmp_path / "secret.key"
    path.write_bytes(first)
    monkeypatch.setattr(authentication, "KEY_RECHECK_S", 0.0)   # the key file looked at on every use
    authenticator = Authenticator(AuthConfig(authentication_enabled=True, token_secret_key=f"file://{path}"))
    token = TokenSigner.with_secret_key(first).create("eve", expiry_s=60)
    identity = await authenticator.authenticate("token", token.encode())
    assert identity.role == "eve" and identity.expires_at_s is not None
    assert authenticator.still_valid(identity)
    assert not authenticator.still_valid(identity, now_s=identity.expires_at_s + 1)
    assert (await authenticator.authenticate_http(f"Bearer {token}")).role == "eve"
    for header in (None, "", "Basic abc", "Bearer ", "Digest x"):
        with pytest.raises(AuthenticationFailed):
            await authenticator.authenticate_http(header)
    for method in ("tls", "basic", "sasl"):   # providers not configured
        with pytest.raises(AuthenticationFailed, match="unsupported"):
            await authenticator.authenticate(method, b"x")
    # Rotation: the file is rewritten; after the recheck interval the new key verifies.
    path.write_bytes(second)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    with pytest.raises(AuthenticationFailed):
        await authenticator.authenticate("token", token)
    assert (await authenticator.authenticate("token", TokenSigner.with_secret_key(second).create("eve"))).role == "eve"
    anonymous = Authenticator(AuthConfig(authentication_enabled=True, token_secret_key=f"file://{path}",
                                         anonymous_role="guest"))
    assert (await anonymous.authenticate("", None)).role == "guest"
