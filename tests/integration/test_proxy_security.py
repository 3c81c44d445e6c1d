"""Security through the proxy (real etcd, bookie, broker and proxy processes; the
official client and raw frames).

Broker: token authentication and authorization on, ``--proxy-roles proxy-role`` (a role
with no permission of its own). Proxy: ``--authentication-enabled`` with the same key,
its own token of ``proxy-role``.

Proves:
- a client with a token of a role granted produce/consume produces and consumes
  through the proxy: the broker authorized the client's role (``original_principal``),
  not the proxy's, which may do nothing itself;
- a client of a role without permission is refused (AuthorizationError) through it;
  one without a token is refused by the proxy (AuthenticationError);
- a client can never claim another's identity: talking to the broker directly with
  ``original_principal`` set (CONNECT or LOOKUP) is refused because its role is not a
  proxy role; sending ``original_principal`` to the proxy gets it replaced by the
  role the proxy authenticated.
"""

from __future__ import annotations

import asyncio
import socket
import uuid

import pulsar
import pytest

from runtime.tokens import TokenSigner
from protocol.codec import encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from tests import frame_exchange, token_files
from tests.cluster import Cluster

SUPERUSER = "admin-role"
PROXY_ROLE = "proxy-role"
T = pb.BaseCommand


@pytest.fixture(scope="module")
def secured(etcd_process, tmp_path_factory):
    base = tmp_path_factory.mktemp("proxy-secured")
    key_path, signer = token_files.secret_key_file(str(base))
    proxy_token = token_files.token_file(str(base), "proxy.token", signer, PROXY_ROLE)
    cluster = Cluster(etcd_process, str(base))
    try:
        asyncio.run(cluster.start_bookies(1))
        asyncio.run(cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--authentication-enabled", "--authorization-enabled", "--superuser-roles", SUPERUSER,
            "--proxy-roles", PROXY_ROLE, "--token-secret-key", f"file://{key_path}"]))
        asyncio.run(cluster.proxy(extra_args=["--authentication-enabled", "--token-secret-key", f"file://{key_path}",
                                              "--broker-token-file", proxy_token]).start())
        yield cluster, signer
    finally:
        asyncio.run(cluster.stop())


def grant(cluster: Cluster, signer: TokenSigner, namespace: str, role: str) -> None:
    import urllib.request

    request = urllib.request.Request(
        f"{cluster.brokers[0].web_service_url}/admin/v2/namespaces/{namespace}/permissions/{role}",
        data=b'["produce", "consume"]', method="POST",
        headers={"Authorization": f"Bearer {signer.create(SUPERUSER)}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 204


def new_namespace(cluster: Cluster, signer: TokenSigner) -> str:
    import urllib.request

    namespace = f"public/sec-{uuid.uuid4().hex[:6]}"
    request = urllib.request.Request(f"{cluster.brokers[0].web_service_url}/admin/v2/namespaces/{namespace}",
                                     data=b"{}", method="PUT",
                                     headers={"Authorization": f"Bearer {signer.create(SUPERUSER)}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 204)
    return namespace


def exchange(port: int, frames: list[bytes], count: int, timeout_s: float = 10.0) -> list:
    """tests/frame_exchange.py's exchange on a new connection to ``port`` (the first
    frame is CONNECT); ``count`` frames at most."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        return frame_exchange.exchange(sock, frames, timeout_s, count=count)


def connect_frame(token: str, **fields) -> bytes:
    return encode_command(wrap(pb.CommandConnect(client_version="sec-test", protocol_version=20,
                                                 auth_method_name="token", auth_data=token.encode(), **fields)))


def test_roles_pass_through_the_proxy_and_are_authorized_by_the_broker(secured):
    cluster, signer = secured
    namespace = new_namespace(cluster, signer)
    alice, bob = f"alice-{uuid.uuid4().hex[:4]}", f"bob-{uuid.uuid4().hex[:4]}"
    grant(cluster, signer, namespace, alice)
    topic = f"persistent://{namespace}/t"
    url = cluster.proxies[0].service_url
    client = pulsar.Client(url, authentication=pulsar.AuthenticationToken(signer.create(alice)),
                           operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(20):
            producer.send(f"m{index}".encode())
        got = {consumer.receive(timeout_millis=20_000).data() for _ in range(20)}
        assert got == {f"m{index}".encode() for index in range(20)}
    finally:
        client.close()
    refused = pulsar.Client(url, authentication=pulsar.AuthenticationToken(signer.create(bob)),
                            operation_timeout_seconds=15)
    try:
        with pytest.raises(pulsar.AuthorizationError):
            refused.create_producer(topic)
    finally:
        refused.close()
    anonymous = pulsar.Client(url, operation_timeout_seconds=10)
    try:
        with pytest.raises((pulsar.AuthenticationError, pulsar.ConnectError, pulsar.Timeout)):
            anonymous.create_producer(topic)
    finally:
        anonymous.close()
    assert "Traceback" not in cluster.proxies[0].log_text()


def test_no_client_can_claim_another_identity(secured):
    cluster, signer = secured
    namespace = new_namespace(cluster, signer)
    alice, bob = f"alice-{uuid.uuid4().hex[:4]}", f"bob-{uuid.uuid4().hex[:4]}"
    grant(cluster, signer, namespace, alice)
    topic = f"persistent://{namespace}/claimed"
    bob_token = signer.create(bob)
    broker_port = cluster.brokers[0].port
    producer = encode_command(wrap(pb.CommandProducer(topic=topic, producer_id=1, request_id=1)))

    # Straight to the broker, CONNECT naming alice: bob's role is no proxy role.
    frames = exchange(broker_port, [connect_frame(bob_token, original_principal=alice), producer], 2)
    assert [f.command.type for f in frames][:1] == [T.CONNECTED], frames
    assert len(frames) == 2 and frames[1].command.type == T.ERROR, frames
    assert frames[1].command.error.error == pb.AuthenticationError, frames[1].command
    assert "not a proxy role" in frames[1].command.error.message

    # Straight to the broker, a LOOKUP naming alice.
    lookup = encode_command(wrap(pb.CommandLookupTopic(topic=topic, request_id=2, original_principal=alice)))
    frames = exchange(broker_port, [connect_frame(bob_token), lookup], 2)
    assert len(frames) == 2 and frames[1].command.type == T.LOOKUP_RESPONSE, frames
    answer = frames[1].command.lookupTopicResponse
    assert answer.response == pb.CommandLookupTopicResponse.Failed and answer.error == pb.AuthenticationError

    # Through the proxy, bob sending original_principal=alice: the proxy names bob.
    proxy_port = int(cluster.proxies[0].service_url.rsplit(":", 1)[1])
    frames = exchange(proxy_port, [connect_frame(bob_token, original_principal=alice,
                                                 proxy_to_broker_url=cluster.brokers[0].service_url), producer], 2)
    assert [f.command.type for f in frames] == [T.CONNECTED, T.ERROR], frames
    assert frames[1].command.error.error == pb.AuthorizationError, frames[1].command
    # And the same with alice's own token is let in (the refusal was about bob).
    frames = exchange(proxy_port, [connect_frame(signer.create(alice),
                                                 proxy_to_broker_url=cluster.brokers[0].service_url), producer], 2)
    assert [f.command.type for f in frames] == [T.CONNECTED, T.PRODUCER_SUCCESS], frames


def test_tls_from_the_client_to_the_proxy_and_from_the_proxy_to_the_broker(etcd_process, tmp_path):
    """The broker listens on TLS only (``--no-plain-ports``): the proxy can reach it
    only over TLS; the official client reaches the proxy over TLS, verifying its
    certificate and host name."""
    from tests.tls_certs import make_pki

    pki = make_pki(str(tmp_path / "pki"))
    cluster = Cluster(etcd_process, str(tmp_path))

    async def start() -> None:
        await cluster.start_bookies(1)
        await cluster.broker(extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--tls-cert-file", pki.cert_file, "--tls-key-file", pki.key_file, "--tls-port", "0",
            "--http-tls-port", "0", "--no-plain-ports"]).start()
        await cluster.proxy(extra_args=["--tls-port", "0", "--tls-cert-file", pki.cert_file,
                                        "--tls-key-file", pki.key_file, "--broker-tls",
                                        "--broker-tls-trust-certs-file", pki.ca_file]).start()

    try:
        asyncio.run(start())
        proxy = cluster.proxies[0]
        assert proxy.service_url_tls.startswith("pulsar+ssl://")
        url = proxy.service_url_tls.replace("127.0.0.1", "localhost")
        client = pulsar.Client(url, tls_trust_certs_file_path=pki.ca_file, tls_validate_hostname=True,
                               operation_timeout_seconds=30)
        try:
            topic = f"persistent://public/default/tls-{uuid.uuid4().hex[:6]}"
            consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            producer = client.create_producer(topic, batching_enabled=False)
            for index in range(20):
                producer.send(f"m{index}".encode())
            got = {consumer.receive(timeout_millis=20_000).data() for _ in range(20)}
            assert got == {f"m{index}".encode() for index in range(20)}
        finally:
            client.close()
        assert "Traceback" not in proxy.log_text(), proxy.log_text()[-3000:]
    finally:
        asyncio.run(cluster.stop())
