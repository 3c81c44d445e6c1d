"""Brokers authenticate to bookies: a bookie with mutual TLS on its gRPC port and
service tokens required, a broker given the bookies' CA, its own client certificate
and a service token file.

Proves: the official client produces and consumes through that broker (its adds and
reads reach the bookie); a ledger client without a token is refused adds and reads
(UNAUTHENTICATED, before any servicer runs), one with a token of another role is
refused too, one without a client certificate does not get through the TLS handshake,
and one with a certificate and the right token adds and reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pulsar
import pytest

from common.entry import encode_entry
from common.errors import MagnetarError
from common.tokens import TokenSigner, create_secret_key
from ledger.bookie_client import BookieClient
from ledger.config import BookieTlsConfig, LedgerClientConfig
from tests.cluster import Cluster, unique
from tests.tls_certs import make_pki

BROKER_ROLE = "broker-service"


@pytest.fixture(scope="module")
def secured_storage(etcd_process, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("bookie-security"))
    pki = make_pki(os.path.join(base, "pki"), "storage")
    key = create_secret_key()
    key_path = os.path.join(base, "secret.key")
    with open(key_path, "wb") as handle:
        handle.write(key)
    signer = TokenSigner.with_secret_key(key)
    token_path = os.path.join(base, "broker.token")
    with open(token_path, "w") as handle:
        handle.write(signer.create(BROKER_ROLE))
    cluster = Cluster(etcd_process, base)
    try:
        asyncio.run(cluster.start_bookies(1, extra_args=[
            "--tls-cert-file", pki.cert_file, "--tls-key-file", pki.key_file,
            "--tls-trust-certs-file", pki.ca_file, "--tls-require-client-cert",
            "--authentication-enabled", "--token-secret-key", f"file://{key_path}", "--allowed-roles", BROKER_ROLE]))
        asyncio.run(cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--bookie-tls", "--bookie-tls-trust-certs-file", pki.ca_file,
            "--bookie-tls-cert-file", pki.client_cert_file, "--bookie-tls-key-file", pki.client_key_file,
            "--bookie-auth-token-file", token_path]))
        yield cluster, pki, signer, base
    finally:
        asyncio.run(cluster.stop())


def test_broker_stores_through_an_authenticated_bookie(secured_storage):
    cluster = secured_storage[0]
    client = pulsar.Client(cluster.brokers[0].service_url, operation_timeout_seconds=15)
    try:
        topic = f"persistent://public/default/{unique('stored')}"
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        for index in range(20):
            producer.send(f"m{index}".encode())
        assert [consumer.receive(timeout_millis=10_000).data() for _ in range(20)] == \
            [f"m{index}".encode() for index in range(20)]
    finally:
        client.close()


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


async def test_bookie_refuses_unauthenticated_adds_and_reads(secured_storage):
    cluster, pki, signer, base = secured_storage
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
