"""TLS on a real broker (etcd, 1 bookie, 1 broker with a test CA's certificate, the
plain ports turned off, token authentication on), driven by the official client, raw
sockets and HTTPS.

Proves: the official client connects with ``pulsar+ssl://`` and a trust file and
produces and consumes; a client trusting another CA, and plain text sent to the TLS
port (raw bytes, and the official client with ``pulsar://``), fail cleanly (an error,
the connection closed, the broker still serving); the plain port is not listening;
the admin API over HTTPS answers 200 with a superuser token, 401 without, 403 for
another role; the bookie (mutual TLS, service tokens) stores what the broker sends
with its client certificate and token, and refuses a ledger client without a token,
with another role's, or without a certificate; and a new certificate written over the
files is served to new handshakes without a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request

import pulsar
import pytest

from common.entry import encode_entry
from common.errors import MagnetarError
from common.tokens import TokenSigner, create_secret_key
from ledger.bookie_client import BookieClient
from ledger.config import BookieTlsConfig, LedgerClientConfig
from tests.cluster import Cluster, free_port, unique
from tests.tls_certs import make_pki, reissue_server

SUPERUSER = "tls-admin"
BROKER_ROLE = "broker-service"
_TLS_URLS = re.compile(r"service_url_tls=(\S+) web_service_url_tls=(\S+)")


@pytest.fixture(scope="module")
def tls_broker(etcd_process, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("tls"))
    pki = make_pki(os.path.join(base, "pki"), "good")
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
    cluster = Cluster(etcd_process, base)
    try:
        asyncio.run(cluster.start_bookies(1, extra_args=[
            "--tls-cert-file", storage_pki.cert_file, "--tls-key-file", storage_pki.key_file,
            "--tls-trust-certs-file", storage_pki.ca_file, "--tls-require-client-cert",
            "--authentication-enabled", "--token-secret-key", f"file://{key_path}", "--allowed-roles", BROKER_ROLE]))
        asyncio.run(cluster.start_brokers(1, port=plain_port, http_port=plain_http_port, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--bookie-tls", "--bookie-tls-trust-certs-file", storage_pki.ca_file,
            "--bookie-tls-cert-file", storage_pki.client_cert_file, "--bookie-tls-key-file",
            storage_pki.client_key_file, "--bookie-auth-token-file", broker_token_path,
            "--tls-cert-file", pki.cert_file, "--tls-key-file", pki.key_file, "--tls-port", "0",
            "--http-tls-port", "0", "--no-plain-ports", "--tls-reload-check-s", "0.2",
            "--authentication-enabled", "--authorization-enabled", "--superuser-roles", SUPERUSER,
            "--token-secret-key", f"file://{key_path}"]))
        broker = cluster.brokers[0]
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
            "--service-token-file", token_path]))
        yield {"cluster": cluster, "pki": pki, "storage_pki": storage_pki, "signer": signer, "base": base,
               "service_url": service_url_tls, "web_url": web_url_tls, "plain_ports": (plain_port, plain_http_port)}
    finally:
        asyncio.run(cluster.stop())


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
    import aiohttp

    gateway = tls_broker["cluster"].gateways[0]
    assert gateway.url.startswith("https://"), gateway.url
    token = tls_broker["signer"].create(SUPERUSER)
    context = ssl.create_default_context(cafile=tls_broker["pki"].ca_file)
    topic_url = f"{gateway.url}/v1/topics/persistent/public/default/{unique('gw-tls')}"
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context), headers=headers) as session:
        async with session.put(f"{topic_url}/subscriptions/s", json={"initial_position": "earliest"}) as response:
            assert response.status in (200, 201), await response.text()
        async with session.post(f"{topic_url}/message", json={"payload": "via https"}) as response:
            assert response.status == 200, await response.text()
        async with session.post(f"{topic_url}/subscriptions/s/pull", json={"max_messages": 1, "wait_ms": 5000}) \
                as response:
            document = await response.json()
            assert [m["payload"] for m in document["messages"]] == ["via https"], document
        async with session.post(f"{topic_url}/message", json={"payload": "x"}, headers={"Authorization": ""}) \
                as response:
            assert response.status == 401


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
    other_token = os.path.join(base, "other.token")
    with open(other_token, "w") as handle:
        handle.write(signer.create("someone-else"))
    read, add = await _try_add_and_read(dataclasses.replace(with_tls, bookie_auth_token_file=other_token), bookie)
    assert "PERMISSION_DENIED" in read and add != "ok", (read, add)
    right_token = os.path.join(base, "right.token")
    with open(right_token, "w") as handle:
        handle.write(signer.create(BROKER_ROLE))
    no_client_cert = LedgerClientConfig(bookie_tls_enabled=True, bookie_tls=BookieTlsConfig(
        trust_certs_file=pki.ca_file), bookie_auth_token_file=right_token)
    read, add = await _try_add_and_read(no_client_cert, bookie)
    assert "UNAVAILABLE" in read and add != "ok", (read, add)
    read, add = await _try_add_and_read(dataclasses.replace(with_tls, bookie_auth_token_file=right_token), bookie)
    assert "UNAUTHENTICATED" not in read and add == "ok", (read, add)


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
