"""TLS on a real broker (etcd over TLS, 1 bookie, 1 broker with a test CA's certificate, the
plain ports turned off, token authentication on), driven by the official client, raw
sockets and HTTPS.

Proves: the official client connects with ``pulsar+ssl://`` and a trust file and
produces and consumes; a client trusting another CA, and plain text sent to the TLS
port (raw bytes, and the official client with ``pulsar://``), fail cleanly (an error,
the connection closed, the broker still serving); the plain port is not listening;
the admin API over HTTPS answers 200 with a superuser token, 401 without, 403 for
another role; three authentication providers at once (token, tls, basic): the official
client's AuthenticationTLS (role = certificate CN) and AuthenticationBasic are
authorized as their roles, a wrong password is an AuthenticationError (and the same
with magnetar.client, the public asyncio client: token, mTLS, basic), HTTPS takes a
client certificate or Basic credentials, and the gateway takes both (a certificate's
CN asked for through X-Original-Principal, which only a proxy role may send); etcd
serves only TLS with client certificates, and the bookie, the broker (options from
MAGNETAR_ETCD_TLS_*), `magnetar shell` and `magnetar autorecovery` reach it, while a
store without a client certificate, trusting another CA or in plain text is refused;
no log holds the password, its hash, a token or a private key; the bookie (mutual TLS, service tokens) stores what the broker sends
with its client certificate and token, and refuses a ledger client without a token,
with another role's, or without a certificate (AuthenticationFailed / AuthorizationDenied,
and a ledger handle fails at once with it, no ensemble change); and a new certificate
written over the files is served to new handshakes without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import base64
import dataclasses
import glob
import json
import os
import re
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request

import aiohttp
import bcrypt
import pulsar
import pytest

from common.entry import encode_entry
from common.errors import (AuthorizationDenied, BookieUnavailable, ConfigError, MagnetarError, MetadataUnavailable,
                           NotEnoughBookies)
from runtime.tokens import TokenSigner, create_secret_key
from ledger.bookie_client import BookieClient
from ledger.client import LedgerClient
from metadata import open_store
from ledger.config import BookieTlsConfig, LedgerClientConfig
from metadata.etcd_store import EtcdStore, EtcdStoreConfig
from metadata.etcd_tls import EtcdTlsConfig
from tests.integration.gateway_helpers import round_trip_over_https
from tests.cluster import Cluster, ManagedProcess, free_port, python_command, run_cli, unique
from tests.tls_certs import make_pki, reissue_server
from tests.tls_etcd import TlsEtcd, etcd_tls_environment, etcd_tls_flags

SUPERUSER = "tls-admin"
BROKER_ROLE = "broker-service"
BASIC_USER = "basic-app"
BASIC_PASSWORD = "correct horse: battery"
CERT_ROLE = "good-client"   # the CN make_pki gives the client certificate of CA "good"
_TLS_URLS = re.compile(r"service_url_tls=(\S+) web_service_url_tls=(\S+)")


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("tls"))
    pki = make_pki(os.path.join(base, "pki"), "good")
    # etcd itself over TLS only, with client certificates required: every process below
    # that talks to it does so with --etcd-tls-* (the broker from MAGNETAR_ETCD_TLS_*).
    etcd_pki = make_pki(os.path.join(base, "etcd-pki"), "etcd")
    etcd = TlsEtcd(base, etcd_pki)
    etcd.spawn()
    key = create_secret_key()
    key_path = os.path.join(base, "secret.key")
    with open(key_path, "wb") as handle:
        handle.write(key)
    plain_port, plain_http_port = free_port(), free_port()
    # The bookie: mutual TLS with a CA of its own, and service tokens of BROKER_ROLE.
    storage_pki = make_pki(os.path.join(base, "storage-pki"), "storage")
    broker_token_path = os.path.join(base, "broker.token")
    with open(broker_token_path, "w") as handle:
        handle.write(TokenSigner.with_secret_key(key).create(BROKER_ROLE))
    # The basic provider's users (htpasswd -B style; cost 4 keeps the test fast).
    users_path = os.path.join(base, "users.htpasswd")
    with open(users_path, "wb") as handle:
        handle.write(BASIC_USER.encode() + b":$2y$" + bcrypt.hashpw(BASIC_PASSWORD.encode(),
                                                                    bcrypt.gensalt(rounds=4))[4:] + b"\n")
    cluster = Cluster(etcd, base)
    try:
        etcd.wait_healthy()
        asyncio.run(cluster.start_bookies(1, extra_args=[*etcd_tls_flags(etcd_pki),
            "--tls-cert-file", storage_pki.cert_file, "--tls-key-file", storage_pki.key_file,
            "--tls-trust-certs-file", storage_pki.ca_file, "--tls-require-client-cert",
            "--authentication-enabled", "--token-secret-key", f"file://{key_path}", "--allowed-roles", BROKER_ROLE,
            # The add socket too: the broker's adds take it (mutual TLS and the token there).
            "--add-socket-port", "0"]))
        broker = cluster.broker(port=plain_port, http_port=plain_http_port, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1", "--bookie-add-transport", "socket",
            "--bookie-tls", "--bookie-tls-trust-certs-file", storage_pki.ca_file,
            "--bookie-tls-cert-file", storage_pki.client_cert_file, "--bookie-tls-key-file",
            storage_pki.client_key_file, "--bookie-auth-token-file", broker_token_path,
            "--tls-cert-file", pki.cert_file, "--tls-key-file", pki.key_file, "--tls-port", "0",
            "--http-tls-port", "0", "--no-plain-ports", "--tls-reload-check-s", "0.2",
            "--authentication-enabled", "--authorization-enabled", "--superuser-roles", SUPERUSER,
            "--token-secret-key", f"file://{key_path}",
            # Three providers at once: client certificates of the test CA, basic users, tokens.
            "--authentication-providers", "token,tls,basic", "--tls-trust-certs-file", pki.ca_file,
            "--basic-auth-file", f"file://{users_path}", "--proxy-roles", SUPERUSER])
        broker.env = {**os.environ, **etcd_tls_environment(etcd_pki)}
        asyncio.run(broker.start())
        service_url_tls, web_url_tls = _TLS_URLS.search(broker.log_text()).groups()
        signer = TokenSigner.with_secret_key(key)
        token_path = os.path.join(base, "gateway.token")
        with open(token_path, "w") as handle:
            handle.write(signer.create(SUPERUSER))
        # The gateway: HTTPS with the same certificate, to the broker over pulsar+ssl://
        # and https:// (the broker's web_service_url is https without plain ports).
        asyncio.run(cluster.start_gateways(1, extra_args=[
            "--tls-cert-file", pki.cert_file, "--tls-key-file", pki.key_file,
            "--broker-tls-trust-certs-file", pki.ca_file, "--authentication-enabled",
            "--service-token-file", token_path, "--authentication-providers", "token,basic,tls",
            "--tls-trust-certs-file", pki.ca_file]))
        yield {"cluster": cluster, "pki": pki, "storage_pki": storage_pki, "signer": signer, "base": base,
               "etcd": etcd,
               "service_url": service_url_tls, "web_url": web_url_tls, "plain_ports": (plain_port, plain_http_port)}
    finally:
        asyncio.run(cluster.stop())
        etcd.kill9()


def _client(url: str, trust_file: str, token: str) -> pulsar.Client:
    return pulsar.Client(url, tls_trust_certs_file_path=trust_file, tls_validate_hostname=True,
                         authentication=pulsar.AuthenticationToken(token), operation_timeout_seconds=8,
                         connection_timeout_ms=4000)


def test_official_client_over_tls_produces_and_consumes(tls_broker):
    assert tls_broker["service_url"].startswith("pulsar+ssl://")
    client = _client(tls_broker["service_url"], tls_broker["pki"].ca_file, tls_broker["signer"].create(SUPERUSER))
    try:
        topic = f"persistent://public/default/{unique('tls')}"
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"over tls")
        assert consumer.receive(timeout_millis=10_000).data() == b"over tls"
    finally:
        client.close()


def test_wrong_ca_and_plain_text_fail_cleanly(tls_broker):
    other = make_pki(os.path.join(tls_broker["base"], "other"), "other")
    token = tls_broker["signer"].create(SUPERUSER)
    topic = f"persistent://public/default/{unique('tls-bad')}"
    client = _client(tls_broker["service_url"], other.ca_file, token)
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(topic)
    finally:
        client.close()
    host, port = tls_broker["service_url"].removeprefix("pulsar+ssl://").rsplit(":", 1)
    plain = pulsar.Client(f"pulsar://{host}:{port}", operation_timeout_seconds=5, connection_timeout_ms=3000)
    try:
        with pytest.raises(pulsar.PulsarException):
            plain.create_producer(topic)
    finally:
        plain.close()
    # Raw Pulsar bytes (a CONNECT frame) to the TLS port: no Pulsar answer, closed.
    body = b"\x08\x02\x12\x04\x0a\x02hi"
    frame = struct.pack(">II", len(body) + 4, len(body)) + body
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(frame)
        received = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    assert not received or received[0] == 0x15, received[:16]   # nothing, or a TLS alert record
    # The plain ports are not listening.
    for plain_port in tls_broker["plain_ports"]:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", plain_port), timeout=2).close()
    test_official_client_over_tls_produces_and_consumes(tls_broker)   # still serving


def _https(url: str, trust_file: str, token: str | None) -> int:
    context = ssl.create_default_context(cafile=trust_file)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_admin_over_https_with_tokens(tls_broker):
    url = f"{tls_broker['web_url']}/admin/v2/tenants"
    assert url.startswith("https://")
    ca = tls_broker["pki"].ca_file
    assert _https(url, ca, tls_broker["signer"].create(SUPERUSER)) == 200
    assert _https(url, ca, None) == 401
    assert _https(url, ca, tls_broker["signer"].create("somebody-else")) == 403


async def test_gateway_over_https_to_a_tls_broker(tls_broker):
    """HTTPS produce and pull through a gateway whose brokers speak only TLS."""
    gateway = tls_broker["cluster"].gateways[0]
    assert gateway.url.startswith("https://"), gateway.url
    await round_trip_over_https(gateway.url, tls_broker["pki"].ca_file, tls_broker["signer"].create(SUPERUSER),
                                unique("gw-tls"), "via https")


async def _try_add_and_read(config: LedgerClientConfig, bookie) -> tuple[str, str]:
    """(the outcome of a read, of an add then a read back): 'ok' or the error."""
    client = BookieClient(bookie.bookie_id, bookie.address, dataclasses.replace(
        config, add_timeout_s=5.0, read_timeout_s=5.0))
    ledger_id = 900_000 + int.from_bytes(os.urandom(3), "big")
    outcomes = []
    try:
        for step in ("read", "add"):
            try:
                async with asyncio.timeout(20):
                    if step == "add":
                        await client.add(ledger_id, 0, encode_entry(ledger_id, 0, -1, 5, b"probe"))
                    results = await client.read(ledger_id, [0], 1 << 20)
                    if step == "add":
                        assert results[0].entry is not None
                outcomes.append("ok")
            except MagnetarError as error:
                outcomes.append(f"{type(error).__name__}: {error.message}")
    finally:
        await client.close()
    return outcomes[0], outcomes[1]


@contextlib.asynccontextmanager
async def _ledger_client(tls_broker, config: LedgerClientConfig):
    """A started ledger client of the module's cluster (etcd over mutual TLS)."""
    etcd_pki = tls_broker["etcd"].pki
    store = open_store(tls_broker["cluster"].metadata_url,
                       tls=EtcdTlsConfig(etcd_pki.ca_file, etcd_pki.client_cert_file, etcd_pki.client_key_file))
    client = LedgerClient(store, config)
    try:
        await client.start()
        yield client
    finally:
        await client.close()
        await store.close()


async def test_bookie_refuses_unauthenticated_adds_and_reads(tls_broker):
    """The broker above stored through this bookie with its certificate and token (the
    other tests produce and consume); a ledger client without a token, with another
    role's token, or without a client certificate is refused; with both it works."""
    cluster, pki, signer, base = (tls_broker["cluster"], tls_broker["storage_pki"], tls_broker["signer"],
                                  tls_broker["base"])
    bookie = cluster.bookies[0]
    tls = BookieTlsConfig(trust_certs_file=pki.ca_file, cert_file=pki.client_cert_file,
                          key_file=pki.client_key_file)
    with_tls = LedgerClientConfig(bookie_tls_enabled=True, bookie_tls=tls)
    read, add = await _try_add_and_read(with_tls, bookie)            # no token
    assert "UNAUTHENTICATED" in read and add != "ok", (read, add)
    assert read.startswith("AuthenticationFailed") and add.startswith("AuthenticationFailed"), (read, add)
    other_token = os.path.join(base, "other.token")
    with open(other_token, "w") as handle:
        handle.write(signer.create("someone-else"))
    read, add = await _try_add_and_read(dataclasses.replace(with_tls, bookie_auth_token_file=other_token), bookie)
    assert "PERMISSION_DENIED" in read and add != "ok", (read, add)
    assert read.startswith("AuthorizationDenied") and add.startswith("AuthorizationDenied"), (read, add)
    # A writer (a ledger handle) with a refused token fails with the authentication
    # error itself, without spending its ensemble changes on a bookie that is fine.
    async with _ledger_client(tls_broker, dataclasses.replace(with_tls, bookie_auth_token_file=other_token)) \
            as writer:
        handle = await writer.create_ledger(1, 1, 1)
        with pytest.raises(AuthorizationDenied):
            async with asyncio.timeout(60):   # a guard against a hang, not a measure
                await handle.add(b"refused")
        assert handle.ensemble_changes == 0
    right_token = os.path.join(base, "right.token")
    with open(right_token, "w") as handle:
        handle.write(signer.create(BROKER_ROLE))
    no_client_cert = LedgerClientConfig(bookie_tls_enabled=True, bookie_tls=BookieTlsConfig(
        trust_certs_file=pki.ca_file), bookie_auth_token_file=right_token)
    read, add = await _try_add_and_read(no_client_cert, bookie)
    assert "UNAVAILABLE" in read and add != "ok", (read, add)
    read, add = await _try_add_and_read(dataclasses.replace(with_tls, bookie_auth_token_file=right_token), bookie)
    assert "UNAUTHENTICATED" not in read and add == "ok", (read, add)


async def test_a_rotated_service_token_is_used_without_a_restart(tls_broker, monkeypatch):
    """A ledger client whose service token file holds a role the bookie does not allow
    is refused; the file is replaced with an allowed role's token and the same client
    (no restart) writes and reads: the pool notices the change and opens new channels."""
    from ledger import bookie_client as bookie_client_module

    monkeypatch.setattr(bookie_client_module, "CREDENTIALS_CHECK_S", 0.2)
    pki, signer, base = tls_broker["storage_pki"], tls_broker["signer"], tls_broker["base"]
    token_file = os.path.join(base, f"rotating-{unique('t')}.token")
    with open(token_file, "w") as handle:
        handle.write(signer.create("not-a-storage-role"))
    config = LedgerClientConfig(bookie_tls_enabled=True, bookie_tls=BookieTlsConfig(
        trust_certs_file=pki.ca_file, cert_file=pki.client_cert_file, key_file=pki.client_key_file),
        bookie_auth_token_file=token_file, add_timeout_s=5.0)
    async with _ledger_client(tls_broker, config) as client:
        refused = await client.create_ledger(1, 1, 1)
        with pytest.raises(AuthorizationDenied):
            async with asyncio.timeout(60):   # a guard against a hang, not a measure
                await refused.add(b"refused")
        replacement = token_file + ".new"
        with open(replacement, "w") as handle:
            handle.write(signer.create(BROKER_ROLE))
        os.replace(replacement, token_file)   # as a mounted Secret is updated: a new file
        await asyncio.sleep(0.3)
        handle = await client.create_ledger(1, 1, 1)
        async with asyncio.timeout(60):
            await handle.add(b"after the rotation")
        assert client.pool.credential_changes == 1
        async with asyncio.timeout(60):
            entries = await handle.read(0, 0)
        assert [bytes(e.payload) for e in entries] == [b"after the rotation"]


def _grant(tls_broker, role: str, topic: str, actions: list[str]) -> None:
    rest = topic.removeprefix("persistent://")
    request = urllib.request.Request(
        f"{tls_broker['web_url']}/admin/v2/persistent/{rest}/permissions/{role}", method="POST",
        data=json.dumps(actions).encode(), headers={"Content-Type": "application/json",
                                                    "Authorization": f"Bearer {tls_broker['signer'].create(SUPERUSER)}"})
    context = ssl.create_default_context(cafile=tls_broker["pki"].ca_file)
    with urllib.request.urlopen(request, timeout=15, context=context) as response:
        assert response.status == 204, response.status


def _produce_consume(client: pulsar.Client, topic: str, payload: bytes) -> None:
    consumer = client.subscribe(topic, unique("s"))
    client.create_producer(topic).send(payload)
    assert consumer.receive(timeout_millis=10_000).data() == payload


async def test_the_add_socket_takes_mutual_tls_and_the_token(tls_broker):
    """The bookie's add socket with TLS: the broker's adds arrive there; a ledger client
    on the socket with the client certificate and the service token writes; without a
    client certificate the handshake fails and the add is a failed bookie's
    (BookieUnavailable, and with no other bookie to take its place NotEnoughBookies), as
    on gRPC."""
    cluster, pki, signer, base = (tls_broker["cluster"], tls_broker["storage_pki"], tls_broker["signer"],
                                  tls_broker["base"])
    # A message through the broker (whatever ran before): its adds open the broker's socket.
    client = _client(tls_broker["service_url"], tls_broker["pki"].ca_file, signer.create(SUPERUSER))
    try:
        await asyncio.to_thread(_produce_consume, client, f"persistent://public/default/{unique('tls-socket')}",
                                b"through the broker")
    finally:
        client.close()
    bookie = cluster.bookies[0]
    right_token = os.path.join(base, "socket.token")
    with open(right_token, "w") as handle:
        handle.write(signer.create(BROKER_ROLE))
    tls = BookieTlsConfig(trust_certs_file=pki.ca_file, cert_file=pki.client_cert_file,
                          key_file=pki.client_key_file)
    for config, expected in (
            (LedgerClientConfig(bookie_tls_enabled=True, bookie_tls=tls, bookie_auth_token_file=right_token,
                                add_transport="socket", add_timeout_s=5.0), None),
            (LedgerClientConfig(bookie_tls_enabled=True, bookie_tls=BookieTlsConfig(trust_certs_file=pki.ca_file),
                                bookie_auth_token_file=right_token, add_transport="socket",
                                add_timeout_s=5.0), (BookieUnavailable, NotEnoughBookies))):
        async with _ledger_client(tls_broker, config) as writer:
            handle = await writer.create_ledger(1, 1, 1)
            if expected is None:
                async with asyncio.timeout(60):
                    assert await handle.add(b"over the socket") == 0
            else:
                with pytest.raises(expected):
                    async with asyncio.timeout(60):
                        await handle.add(b"refused")
    assert bookie.log_text(since_spawn=False).count("add socket writer connected") >= 2   # the broker and ours


def test_client_certificate_and_basic_authentication(tls_broker):
    """The official client's AuthenticationTLS (role = the certificate's CN) and
    AuthenticationBasic on the same TLS port as tokens; each role is authorized as
    itself: refused before a grant, served after it; a wrong password is an
    AuthenticationError."""
    pki, url = tls_broker["pki"], tls_broker["service_url"]
    topic = f"persistent://public/default/{unique('providers')}"
    clients = {
        CERT_ROLE: pulsar.Client(url, tls_trust_certs_file_path=pki.ca_file, operation_timeout_seconds=8,
                                 authentication=pulsar.AuthenticationTLS(pki.client_cert_file, pki.client_key_file)),
        BASIC_USER: pulsar.Client(url, tls_trust_certs_file_path=pki.ca_file, operation_timeout_seconds=8,
                                  authentication=pulsar.AuthenticationBasic(BASIC_USER, BASIC_PASSWORD)),
    }
    wrong = pulsar.Client(url, tls_trust_certs_file_path=pki.ca_file, operation_timeout_seconds=8,
                          authentication=pulsar.AuthenticationBasic(BASIC_USER, "wrong"))
    try:
        for role, client in clients.items():
            with pytest.raises(pulsar.AuthorizationError):
                client.create_producer(topic)
            _grant(tls_broker, role, topic, ["produce", "consume"])
            _produce_consume(client, topic, f"from {role}".encode())
        with pytest.raises(pulsar.AuthenticationError):
            wrong.create_producer(topic)
    finally:
        for client in (*clients.values(), wrong):
            client.close()


async def test_magnetar_client_over_tls_with_tokens_certificates_and_basic(tls_broker):
    """The public asyncio client (magnetar.client) on the TLS port: a token, a client
    certificate (mutual TLS, role = its CN) and Basic credentials, each authorized as
    its role; a wrong password is an AuthenticationError."""
    from magnetar.client import (TLS, AuthenticationBasic, AuthenticationError, AuthenticationTLS,
                                 AuthenticationToken, AuthorizationError, Client)

    pki, url = tls_broker["pki"], tls_broker["service_url"]
    topic = f"persistent://public/default/{unique('ours-tls')}"
    tls = TLS(trust_certs_file=pki.ca_file, validate_hostname=True)
    by_token = Client(url, auth=AuthenticationToken(tls_broker["signer"].create(SUPERUSER)), tls=tls,
                      operation_timeout_seconds=8)
    by_certificate = Client(url, auth=AuthenticationTLS(pki.client_cert_file, pki.client_key_file),
                            tls=TLS(trust_certs_file=pki.ca_file), operation_timeout_seconds=8)
    by_password = Client(url, auth=AuthenticationBasic(BASIC_USER, BASIC_PASSWORD), tls=tls,
                         operation_timeout_seconds=8)
    wrong = Client(url, auth=AuthenticationBasic(BASIC_USER, "wrong"), tls=tls, operation_timeout_seconds=8)
    try:
        consumer = await by_token.subscribe(topic, "s")
        await (await by_token.create_producer(topic)).send(b"token")
        with pytest.raises(AuthorizationError):
            await by_certificate.create_producer(topic)
        await asyncio.to_thread(_grant, tls_broker, CERT_ROLE, topic, ["produce"])
        await asyncio.to_thread(_grant, tls_broker, BASIC_USER, topic, ["produce"])
        await (await by_certificate.create_producer(topic)).send(b"certificate")
        await (await by_password.create_producer(topic)).send(b"basic")
        assert [(await consumer.receive(10_000)).data() for _ in range(3)] == [b"token", b"certificate", b"basic"]
        with pytest.raises(AuthenticationError):
            await wrong.create_producer(topic)
    finally:
        for client in (by_token, by_certificate, by_password, wrong):
            await client.close()


def _https_as(url: str, pki, *, headers: dict | None = None, client_cert: bool = False) -> int:
    context = ssl.create_default_context(cafile=pki.ca_file)
    if client_cert:
        context.load_cert_chain(pki.client_cert_file, pki.client_key_file)
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_admin_over_https_with_client_certificates_and_basic(tls_broker):
    """HTTPS with a client certificate and no header is the CN's role; Basic is the
    user's; both are authenticated (not 401) and authorized as themselves (403 where
    only a superuser may; 204 on a topic they were granted). Only a proxy role may ask
    for another role."""
    pki, web_url = tls_broker["pki"], tls_broker["web_url"]
    basic = {"Authorization": "Basic " + base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode()}
    wrong = {"Authorization": "Basic " + base64.b64encode(f"{BASIC_USER}:nope".encode()).decode()}
    assert _https_as(f"{web_url}/admin/v2/tenants", pki, client_cert=True) == 403
    assert _https_as(f"{web_url}/admin/v2/tenants", pki, headers=basic) == 403
    assert _https_as(f"{web_url}/admin/v2/tenants", pki, headers=wrong) == 401
    topic = unique("https-providers")
    check = f"{web_url}/admin/v2/persistent/public/default/{topic}/permission-check?action=consume"
    assert _https_as(check, pki, client_cert=True) == 403
    _grant(tls_broker, CERT_ROLE, f"persistent://public/default/{topic}", ["consume"])
    assert _https_as(check, pki, client_cert=True) == 204
    assert _https_as(check, pki, headers=basic) == 403
    # X-Original-Principal: honoured for a proxy role (the superuser here), refused otherwise.
    proxy = {"Authorization": f"Bearer {tls_broker['signer'].create(SUPERUSER)}"}
    assert _https_as(check, pki, headers={**proxy, "X-Original-Principal": CERT_ROLE}) == 204
    assert _https_as(check, pki, headers={**proxy, "X-Original-Principal": BASIC_USER}) == 403
    assert _https_as(check, pki, headers={**basic, "X-Original-Principal": CERT_ROLE}) == 403


async def test_gateway_with_client_certificates_and_basic(tls_broker):
    """The gateway takes a client certificate (asking the broker for its CN as a proxy)
    and Basic credentials (passed on); each caller is authorized as itself."""
    pki = tls_broker["pki"]
    gateway = tls_broker["cluster"].gateways[0]
    topic = f"persistent://public/default/{unique('gw-providers')}"
    topic_url = f"{gateway.url}/v1/topics/{topic.replace('://', '/')}"
    with_cert = ssl.create_default_context(cafile=pki.ca_file)
    with_cert.load_cert_chain(pki.client_cert_file, pki.client_key_file)
    basic = {"Authorization": aiohttp.encode_basic_auth(BASIC_USER, BASIC_PASSWORD)}
    denied_url = f"{gateway.url}/v1/topics/persistent/public/default/{unique('gw-denied')}"
    _grant(tls_broker, CERT_ROLE, topic, ["produce"])
    _grant(tls_broker, BASIC_USER, topic, ["produce"])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=with_cert)) as session:
        async with session.post(f"{denied_url}/message", json={"payload": "x"}) as response:
            assert response.status == 403, await response.text()
        async with session.post(f"{topic_url}/message", json={"payload": "by certificate"}) as response:
            assert response.status == 200, await response.text()
    plain = ssl.create_default_context(cafile=pki.ca_file)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=plain)) as session:
        async with session.post(f"{topic_url}/message", json={"payload": "by password"}, headers=basic) as response:
            assert response.status == 200, await response.text()
        async with session.post(f"{topic_url}/message", json={"payload": "x"},
                                headers={"Authorization": aiohttp.encode_basic_auth(BASIC_USER, "nope")}) as response:
            assert response.status == 401, await response.text()
        async with session.post(f"{topic_url}/message", json={"payload": "x"}) as response:
            assert response.status == 401, await response.text()   # no certificate, no header


def _store(etcd: TlsEtcd, tls: EtcdTlsConfig, root: str) -> EtcdStore:
    return EtcdStore(EtcdStoreConfig(endpoints=(("127.0.0.1", etcd.client_port),), root=root, call_timeout_s=2.0,
                                     tls=tls))


async def test_metadata_store_over_tls_and_refusals(tls_broker, tmp_path):
    """The store with etcd's CA and a client certificate writes, reads and watches;
    without a client certificate, trusting another CA, or in plain text it gets
    MetadataUnavailable (no hang); a missing file fails at once naming its flag."""
    etcd = tls_broker["etcd"]
    pki = etcd.pki
    root = f"/{unique('tls-store')}"
    good = _store(etcd, EtcdTlsConfig(pki.ca_file, pki.client_cert_file, pki.client_key_file), root)
    try:
        version = await good.put("/a", b"over tls")
        assert (await good.get("/a")).value == b"over tls"
        async with good.watch_prefix("/w/", start_version=version) as watch:
            await good.put("/w/x", b"1")
            async with asyncio.timeout(10):
                event = await anext(aiter(watch))
        assert (event.kind, event.value) == ("put", b"1") and event.key.endswith("/w/x")
    finally:
        await good.close()
    other = make_pki(str(tmp_path / "other"), "other")
    for tls in (EtcdTlsConfig(trust_certs_file=pki.ca_file),                              # no client certificate
                EtcdTlsConfig(other.ca_file, pki.client_cert_file, pki.client_key_file),  # another CA
                EtcdTlsConfig()):                                                         # plain text
        store = _store(etcd, tls, root)
        try:
            with pytest.raises(MetadataUnavailable):
                async with asyncio.timeout(15):
                    await store.get("/a")
        finally:
            await store.close()
    with pytest.raises(ConfigError, match="--etcd-tls-cert-file"):
        _store(etcd, EtcdTlsConfig(pki.ca_file, str(tmp_path / "missing.pem"), pki.client_key_file), root)


async def test_shell_and_autorecovery_reach_etcd_over_tls(tls_broker, tmp_path):
    """The bookie and the broker of this module reached etcd over TLS (they started and
    serve); so do `magnetar shell` (it lists the bookie) and `magnetar autorecovery`
    (it reads the bookies and serves)."""
    cluster, pki = tls_broker["cluster"], tls_broker["etcd"].pki
    code, out, err = await run_cli("shell", "--metadata", cluster.metadata_url, *etcd_tls_flags(pki), "listbookies")
    assert code == 0 and cluster.bookies[0].bookie_id in out, (out, err)
    autorecovery = ManagedProcess("autorecovery", python_command(
        "autorecovery", "--metadata", cluster.metadata_url, "--http-port", "0", *etcd_tls_flags(pki)),
        str(tmp_path / "autorecovery.log"))
    autorecovery.spawn()
    try:
        await autorecovery.wait_for_log(re.compile(r"autorecovery listening: id=\S+"))
    finally:
        autorecovery.kill9()


def test_no_password_hash_token_or_key_in_any_log(tls_broker):
    """After the providers above ran (and failed: wrong passwords), no log of the
    cluster holds the basic password, its hash, a token or a private key."""
    with open(os.path.join(tls_broker["base"], "users.htpasswd"), "rb") as handle:
        stored_hash = handle.read().split(b":", 1)[1].strip()
    with open(tls_broker["pki"].client_key_file, "rb") as handle:
        client_key_body = handle.read().splitlines()[1]
    secrets = [BASIC_PASSWORD.encode(), base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()), stored_hash,
               client_key_body, tls_broker["signer"].create(SUPERUSER).encode(),
               b"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"]   # the header of every HS256 token
    logs = glob.glob(os.path.join(tls_broker["base"], "**", "*.log"), recursive=True)
    assert len(logs) >= 3, logs
    for path in logs:
        with open(path, "rb") as handle:
            content = handle.read()
        for secret in secrets:
            assert secret not in content, (path, secret[:6])


def test_certificate_files_reload_without_restart(tls_broker):
    """Run last: replaces the broker's certificate with one from a new CA."""
    pki = tls_broker["pki"]
    host, port = tls_broker["service_url"].removeprefix("pulsar+ssl://").rsplit(":", 1)
    reissue_server(pki, os.path.join(tls_broker["base"], "next"), "next", server_cn="localhost")
    next_ca = os.path.join(tls_broker["base"], "next", "next-ca.pem")

    def handshake(ca_file: str) -> bool:
        context = ssl.create_default_context(cafile=ca_file)
        try:
            with socket.create_connection((host, int(port)), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="localhost"):
                    return True
        except ssl.SSLError:
            return False

    deadline = time.monotonic() + 30
    while not handshake(next_ca) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert handshake(next_ca)
    assert not handshake(pki.ca_file)
    client = _client(tls_broker["service_url"], next_ca, tls_broker["signer"].create(SUPERUSER))
    try:
        client.create_producer(f"persistent://public/default/{unique('reloaded')}").send(b"x")
    finally:
        client.close()
