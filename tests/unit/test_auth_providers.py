"""Several authentication providers at once (broker/authentication.py) and the basic
provider's htpasswd file (runtime/password_file.py).

Proves: bcrypt htpasswd hashes ($2y$/$2b$) verify the right password and refuse others;
a file with a weak hash ($apr1$ MD5-crypt, {SHA}, $1$), a plain-text or a DES line is
refused naming the line and the scheme, never its content, and saying how to make a
bcrypt line; the weak hashes never verify; unknown user and wrong password fail
alike, without the password in the message; a changed file is picked up and a
half-written one leaves the old users in force; the authenticator picks the provider
by method (token, tls from the verified certificate's CN, basic from user:password) and
over HTTP by scheme (Bearer, Basic) or, without a header, the client certificate;
providers not configured are refused; AuthConfig and BrokerConfig refuse incomplete
settings and never show the basic file's inline content; the new flags of the broker
and the gateway are set from MAGNETAR_* variables too; a proxy's forwarded client token
is verified (the named role, its own expiry).
"""

from __future__ import annotations

import base64
import os
import time

import bcrypt
import pytest

import runtime.password_file as password_file
from broker.authentication import AuthConfig, Authenticator
from broker.config import BrokerConfig
from runtime.password_file import PasswordFile, parse, verify
from common.errors import AuthenticationFailed, ConfigError
from runtime.tls import TlsConfig, certificate_common_name
from runtime.tokens import TokenSigner, create_secret_key

# Written by `openssl passwd -apr1 -salt abcdefgh 'pass word'` (and htpasswd -m alike):
# refused as weak.
APR1_PASS_WORD = b"$apr1$abcdefgh$NriZ3KceyQFy368Ufp8U./"
# `htpasswd -s` of "password": refused as weak.
SHA_PASSWORD = b"{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g="


def _bcrypt(password: bytes) -> bytes:
    # htpasswd -B writes $2y$; cost 4 keeps the tests fast (production files use 10+).
    return b"$2y$" + bcrypt.hashpw(password, bcrypt.gensalt(rounds=4))[4:]


BCRYPT_PASSWORD = _bcrypt(b"password")


def _certificate(common_name: str) -> dict:
    return {"subject": ((("countryName", "XX"),), (("commonName", common_name),))}


def test_hashes_verify_only_their_password():
    stored = _bcrypt(b"s3cret")
    assert stored.startswith(b"$2y$")
    assert verify(b"s3cret", stored) and not verify(b"s3cret!", stored)
    assert verify(b"s3cret", b"$2b$" + stored[4:])
    assert not verify(b"x", b"$2y$garbage") and not verify(b"x", b"plain")
    # The weak schemes never verify, even with their right password.
    assert not verify(b"pass word", APR1_PASS_WORD) and not verify(b"password", SHA_PASSWORD)


def test_file_refuses_weak_and_plain_hashes_naming_the_line_only():
    users = parse(b"# users\n\nalice:" + BCRYPT_PASSWORD + b"\n")
    assert users == {"alice": BCRYPT_PASSWORD}
    for text, scheme in ((b"alice:" + BCRYPT_PASSWORD + b"\nbob:" + APR1_PASS_WORD + b"\n", "line 2: a weak hash, refused: Apache MD5"),
                         (b"carol:" + SHA_PASSWORD + b"\n", "line 1: a weak hash, refused: SHA-1"),
                         (b"erin:$1$salt$qJH7.N4xYta3aEG/dfqo/0\n", r"line 1: a weak hash, refused: MD5-crypt \(\$1\$\)"),
                         (b"alice:" + BCRYPT_PASSWORD + b"\ncarol:hunter2\n", "line 2: no bcrypt"),
                         (b"dave:abJnggxhB/yWI\n", "line 1: no bcrypt")):
        with pytest.raises(ConfigError, match=scheme) as refused:
            parse(text)
        message = str(refused.value)
        assert "htpasswd -B" in message
        for secret in ("hunter2", "abJnggxhB", "NriZ3Kce", "W6ph5Mm5", "qJH7"):
            assert secret not in message
    with pytest.raises(ConfigError, match="line 1: not 'user:hash'"):
        parse(b"nocolon\n")


def test_password_file_checks_reloads_and_remembers(tmp_path, monkeypatch):
    path = tmp_path / "users.htpasswd"
    path.write_bytes(b"alice:" + _bcrypt(b"wonder land") + b"\nbob:" + BCRYPT_PASSWORD + b"\n")
    users = PasswordFile(f"file://{path}")
    assert users.check(b"alice:wonder land") == "alice"
    assert users.check(b"alice:wonder land") == "alice"   # remembered: no second bcrypt
    assert users.check(b"bob:password") == "bob"
    messages = set()
    for credentials in (b"alice:wrong", b"mallory:wonder land"):
        with pytest.raises(AuthenticationFailed) as refused:
            users.check(credentials)
        messages.add(refused.value.message)
    assert messages == {"unknown user or wrong password"}
    for credentials in (b"no-colon", b":password", b"alice:" + b"x" * 2000):
        with pytest.raises(AuthenticationFailed):
            users.check(credentials)
    # Users change without a restart; a broken rewrite keeps the previous users.
    monkeypatch.setattr(password_file, "RECHECK_S", 0.0)
    path.write_bytes(b"carol:" + BCRYPT_PASSWORD + b"\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert users.check(b"carol:password") == "carol"
    with pytest.raises(AuthenticationFailed):
        users.check(b"bob:password")
    path.write_bytes(b"carol:plaintext\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 20_000_000))
    assert users.check(b"carol:password") == "carol"
    inline = PasswordFile("data:;base64," + base64.b64encode(b"dan:" + BCRYPT_PASSWORD).decode())
    assert inline.check(b"dan:password") == "dan"
    with pytest.raises(ConfigError):
        PasswordFile(str(tmp_path / "missing"))


def test_certificate_common_name():
    assert certificate_common_name(_certificate("app-1")) == "app-1"
    assert certificate_common_name({"subject": ((("organizationName", "x"),),)}) is None
    assert certificate_common_name(None) is None and certificate_common_name({}) is None


async def test_authenticator_with_three_providers(tmp_path):
    key = create_secret_key()
    key_path, users_path = tmp_path / "secret.key", tmp_path / "users"
    key_path.write_bytes(key)
    users_path.write_bytes(b"basic-user:" + _bcrypt(b"pw:with colon") + b"\n")
    authenticator = Authenticator(AuthConfig(authentication_enabled=True, authentication_providers="token, tls,basic",
                                             token_secret_key=f"file://{key_path}",
                                             basic_auth_file=str(users_path)))
    token = TokenSigner.with_secret_key(key).create("token-role")
    assert (await authenticator.authenticate("token", token)).role == "token-role"
    identity = await authenticator.authenticate("tls", None, _certificate("cert-role"))
    assert (identity.role, identity.method, identity.expires_at_s) == ("cert-role", "tls", None)
    identity = await authenticator.authenticate("basic", b"basic-user:pw:with colon")
    assert (identity.role, identity.method) == ("basic-user", "basic")
    with pytest.raises(AuthenticationFailed, match="client certificate"):
        await authenticator.authenticate("tls", None, None)
    with pytest.raises(AuthenticationFailed):
        await authenticator.authenticate("basic", b"basic-user:nope")
    with pytest.raises(AuthenticationFailed, match="no credentials"):
        await authenticator.authenticate("", None, _certificate("cert-role"))   # binary: tls must be asked for
    # HTTP: the scheme picks the provider; no header and a certificate is tls.
    basic = "Basic " + base64.b64encode(b"basic-user:pw:with colon").decode()
    assert (await authenticator.authenticate_http(basic)).role == "basic-user"
    assert (await authenticator.authenticate_http(f"Bearer {token}", _certificate("x"))).role == "token-role"
    assert (await authenticator.authenticate_http(None, _certificate("cert-role"))).role == "cert-role"
    for header in ("Basic !!!", "Basic " + base64.b64encode(b"basic-user:nope").decode(), None):
        with pytest.raises(AuthenticationFailed) as refused:
            await authenticator.authenticate_http(header)
        assert "nope" not in refused.value.message
    # Only the configured providers: basic alone refuses tokens and certificates.
    only_basic = Authenticator(AuthConfig(authentication_enabled=True, authentication_providers="basic",
                                          basic_auth_file=str(users_path)))
    for method, data in (("token", token), ("tls", None)):
        with pytest.raises(AuthenticationFailed, match="unsupported.*supported: basic"):
            await only_basic.authenticate(method, data, _certificate("cert-role"))
    with pytest.raises(AuthenticationFailed, match="no credentials"):
        await only_basic.authenticate_http(None, _certificate("cert-role"))


async def test_the_none_method_is_anonymous_when_an_anonymous_role_is_set(tmp_path):
    """The official clients configured without authentication send the method name
    ``none`` (AuthenticationDisabled): like no method at all (and an HTTP request with no
    Authorization header), it gets the anonymous role when one is set, and is refused,
    naming the providers to use, when not. Other unknown methods stay refused."""
    key = create_secret_key()
    key_path = tmp_path / "secret.key"
    key_path.write_bytes(key)
    settings = dict(authentication_enabled=True, authentication_providers="token,tls",
                    token_secret_key=f"file://{key_path}")
    with_anonymous = Authenticator(AuthConfig(**settings, anonymous_role="anonymous"))
    for method, data in (("none", None), ("none", b""), ("", None), ("", b"")):
        identity = await with_anonymous.authenticate(method, data)
        assert (identity.role, identity.method, identity.expires_at_s) == ("anonymous", "", None)
    assert (await with_anonymous.authenticate_http(None)).role == "anonymous"
    # Real credentials still name their own role, and a bad token is not anonymous.
    token = TokenSigner.with_secret_key(key).create("token-role")
    assert (await with_anonymous.authenticate("token", token)).role == "token-role"
    assert (await with_anonymous.authenticate_http(f"Bearer {token}")).role == "token-role"
    with pytest.raises(AuthenticationFailed):
        await with_anonymous.authenticate("token", b"not-a-token")
    with pytest.raises(AuthenticationFailed, match="unsupported.*'kerberos'"):
        await with_anonymous.authenticate("kerberos", b"x")
    without = Authenticator(AuthConfig(**settings))
    for method in ("none", ""):
        with pytest.raises(AuthenticationFailed, match="no credentials.*no anonymous role.*tls, token"):
            await without.authenticate(method, None)
    with pytest.raises(AuthenticationFailed, match="no anonymous role"):
        await without.authenticate_http(None)


def test_config_refuses_incomplete_provider_settings(tmp_path):
    with pytest.raises(ConfigError, match="unknown"):
        AuthConfig(authentication_enabled=True, authentication_providers="token,kerberos", token_secret_key="k")
    with pytest.raises(ConfigError, match="basic_auth_file"):
        AuthConfig(authentication_enabled=True, authentication_providers="basic")
    with pytest.raises(ConfigError, match="at least one"):
        AuthConfig(authentication_enabled=True, authentication_providers=" , ")
    # Without the token provider no token key is needed.
    tls_only = AuthConfig(authentication_enabled=True, authentication_providers="tls")
    assert tls_only.providers == ("tls",)
    with pytest.raises(ConfigError, match="trust_certs_file"):
        BrokerConfig(metadata_url="etcd://127.0.0.1:2379", auth=tls_only)
    cert = tmp_path / "c.pem"
    BrokerConfig(metadata_url="etcd://127.0.0.1:2379", auth=tls_only,
                 tls=TlsConfig(cert_file=str(cert), key_file=str(cert), trust_certs_file=str(cert)))
    inline = "data:;base64," + base64.b64encode(b"u:" + BCRYPT_PASSWORD).decode()
    config = AuthConfig(authentication_enabled=True, authentication_providers="basic", basic_auth_file=inline)
    assert inline not in repr(config) and BCRYPT_PASSWORD[10:30].decode() not in repr(config)


def test_the_new_flags_come_from_the_environment_too():
    """MAGNETAR_<FLAG> (magnetar/env_flags.py) sets the providers' flags of the broker
    and the gateway like any other."""
    from broker.main import config_from_args
    from magnetar.cli import parse_command_line

    args = parse_command_line(["broker", "--metadata", "etcd://127.0.0.1:2379"], {
        "MAGNETAR_AUTHENTICATION_PROVIDERS": "token,tls,basic", "MAGNETAR_BASIC_AUTH_FILE": "/etc/users",
        "MAGNETAR_PROXY_ROLES": "gateway"})
    auth = config_from_args(args).auth
    assert (auth.providers, auth.basic_auth_file, auth.proxies) == (("token", "tls", "basic"), "/etc/users",
                                                                    frozenset({"gateway"}))
    args = parse_command_line(["gateway", "--service-url", "pulsar://127.0.0.1:6650"], {
        "MAGNETAR_AUTHENTICATION_PROVIDERS": "basic,tls", "MAGNETAR_TLS_TRUST_CERTS_FILE": "/etc/ca.pem"})
    assert (args.authentication_providers, args.tls_trust_certs_file) == ("basic,tls", "/etc/ca.pem")


async def test_a_proxys_client_is_verified_when_its_token_is_forwarded(tmp_path):
    """A proxy role naming its client (``original_principal``): with the client's token
    forwarded (``original_auth_data``) the broker verifies it — it must prove the named
    role, and its expiry is the connection's; without one, the proxy's word and the
    proxy's expiry; a method this broker cannot verify from data stays the proxy's word;
    a role that is no proxy role may name no one."""
    key = create_secret_key()
    (tmp_path / "secret.key").write_bytes(key)
    signer = TokenSigner.with_secret_key(key)
    authenticator = Authenticator(AuthConfig(authentication_enabled=True, proxy_roles="proxy-role",
                                             token_secret_key=f"file://{tmp_path}/secret.key"))
    proxy = await authenticator.authenticate("token", signer.create("proxy-role", expiry_s=3600))
    alice_token = signer.create("alice", expiry_s=60)
    identity = await authenticator.proxied_client(proxy, "alice", "token", alice_token)
    assert identity.role == "alice" and identity.expires_at_s is not None
    assert identity.expires_at_s < proxy.expires_at_s - 3000                 # alice's, not the proxy's
    assert (await authenticator.proxied_client(proxy, "alice", "token")).expires_at_s == proxy.expires_at_s
    assert (await authenticator.proxied_client(proxy, "alice", "basic", "alice:pw")).role == "alice"
    with pytest.raises(AuthenticationFailed, match="another role"):
        await authenticator.proxied_client(proxy, "alice", "token", signer.create("mallory"))
    with pytest.raises(AuthenticationFailed, match="expired"):
        await authenticator.proxied_client(proxy, "alice", "token", signer.create("alice", expiry_s=-60))
    mallory = await authenticator.authenticate("token", signer.create("mallory"))
    with pytest.raises(AuthenticationFailed, match="not a proxy role"):
        await authenticator.proxied_client(mallory, "alice", "token", alice_token)
