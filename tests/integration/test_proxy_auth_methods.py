"""Basic and TLS (client certificate) authentication through the proxy, with the official
client (real etcd, bookie, broker and proxy processes).

Broker: token authentication and authorization on, ``--proxy-roles proxy-role`` (a role
with no permission of its own). Proxy: ``--authentication-providers basic,tls,token``
with an htpasswd file (bcrypt) and the client CA (``--tls-trust-certs-file``) on its TLS
port; its own token of ``proxy-role`` toward the broker. The client presents its basic
password or certificate to the proxy only; the broker sees the proxy's token naming the
client (``original_principal``) and authorizes the client's role.

Proves:
- ``AuthenticationBasic`` of a granted user produces and consumes through the proxy; a
  user without the grant gets AuthorizationError (so the broker decided on the user, not
  on the proxy's role, which may do nothing); a granted user's name with a wrong password
  is refused (AuthenticationError);
- ``AuthenticationTLS`` with a certificate of the proxy's client CA whose CN is granted
  produces and consumes through the proxy's TLS port; the same CN in a certificate of
  another CA (a forged identity) is cut off at the TLS handshake and never reaches a
  broker; the tls method without a certificate is refused;
- a client can never claim another identity through the proxy: bob (basic, and a
  certificate CN not granted) sending ``original_principal`` naming the granted role on
  a piped CONNECT is named as himself by the proxy (AuthorizationError on the producer),
  while the granted role's own credentials get PRODUCER_SUCCESS on the same frames;
- the admin REST through the proxy's HTTPS port with a client certificate alone: the
  granted CN's lookups succeed, a path only a superuser may use is refused also when
  the caller names the superuser in X-Original-Principal, a CN not granted gets 403, no
  certificate 401, a forged one fails the handshake.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import ssl
import urllib.error
import urllib.request
import uuid

import bcrypt
import pulsar
import pytest

from protocol.codec import encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from runtime.tokens import TokenSigner, create_secret_key
from tests.cluster import Cluster
from tests.frame_exchange import exchange
from tests.tls_certs import make_pki

SUPERUSER = "admin-role"
PROXY_ROLE = "proxy-role"
ALICE, BOB = "alice", "bob"
PASSWORDS = {ALICE: "alice-secret", BOB: "bob-secret"}
T = pb.BaseCommand

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def proxied(etcd_process, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("proxy-auth-methods"))
    key = create_secret_key()
    key_path = os.path.join(base, "secret.key")
    with open(key_path, "wb") as handle:
        handle.write(key)
    signer = TokenSigner.with_secret_key(key)
    proxy_token = os.path.join(base, "proxy.token")
    with open(proxy_token, "w") as handle:
        handle.write(signer.create(PROXY_ROLE))
    users = os.path.join(base, "users.htpasswd")
    with open(users, "wb") as handle:
        for user, password in PASSWORDS.items():
            handle.write(user.encode() + b":" + bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)) + b"\n")
    # The proxy's client CA issues "granted-client" (granted below) ...
    pki = make_pki(os.path.join(base, "pki"), "granted")
    # ... and another CA, the same CN: what a client forging that identity would present.
    forged = make_pki(os.path.join(base, "forged"), "granted")
    # A certificate of the right CA whose CN is not granted.
    stranger = make_pki(os.path.join(base, "pki-stranger"), "stranger")
    cluster = Cluster(etcd_process, base)
    try:
        asyncio.run(cluster.start_bookies(1))
        asyncio.run(cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--authentication-enabled", "--authorization-enabled", "--superuser-roles", SUPERUSER,
            "--proxy-roles", PROXY_ROLE, "--token-secret-key", f"file://{key_path}"]))
        # The client CA file holds the granted CA and the stranger's (both trusted: the
        # stranger is authenticated, then not authorized), not the forger's.
        client_cas = os.path.join(base, "client-cas.pem")
        with open(client_cas, "wb") as target:
            for source in (pki.ca_file, stranger.ca_file):
                with open(source, "rb") as handle:
                    target.write(handle.read())
        asyncio.run(cluster.proxy(extra_args=[
            "--authentication-enabled", "--authentication-providers", "basic,tls,token",
            "--basic-auth-file", users, "--token-secret-key", f"file://{key_path}",
            "--broker-token-file", proxy_token,
            "--tls-port", "0", "--http-tls-port", "0", "--tls-cert-file", pki.cert_file,
            "--tls-key-file", pki.key_file, "--tls-trust-certs-file", client_cas]).start())
        namespace = f"public/methods-{uuid.uuid4().hex[:6]}"
        admin(cluster, signer, "PUT", f"/admin/v2/namespaces/{namespace}", b"{}")
        for role in (ALICE, "granted-client"):
            admin(cluster, signer, "POST", f"/admin/v2/namespaces/{namespace}/permissions/{role}",
                  b'["produce", "consume"]')
        yield {"cluster": cluster, "namespace": namespace, "pki": pki, "forged": forged, "stranger": stranger}
    finally:
        asyncio.run(cluster.stop())


def admin(cluster: Cluster, signer: TokenSigner, method: str, path: str, body: bytes) -> None:
    request = urllib.request.Request(f"{cluster.brokers[0].web_service_url}{path}", data=body, method=method,
                                     headers={"Authorization": f"Bearer {signer.create(SUPERUSER)}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 204), (path, response.status)


def round_trip(client: pulsar.Client, topic: str, count: int = 20) -> None:
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = {f"m{index}".encode() for index in range(count)}
    for payload in sorted(sent):
        producer.send(payload)
    got = {consumer.receive(timeout_millis=20_000).data() for _ in range(count)}
    assert got == sent


def refused(url: str, topic: str, error, **options) -> None:
    client = pulsar.Client(url, operation_timeout_seconds=10, connection_timeout_ms=5_000, **options)
    try:
        with pytest.raises(error):
            client.create_producer(topic)
    finally:
        client.close()


def tls_options(pki, cert_file: str, key_file: str) -> dict:
    return {"tls_trust_certs_file_path": pki.ca_file, "tls_validate_hostname": True,
            "authentication": pulsar.AuthenticationTLS(cert_file, key_file)}


def test_basic_authentication_through_the_proxy(proxied):
    cluster, namespace = proxied["cluster"], proxied["namespace"]
    url = cluster.proxies[0].service_url
    topic = f"persistent://{namespace}/basic-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client(url, authentication=pulsar.AuthenticationBasic(ALICE, PASSWORDS[ALICE]),
                           operation_timeout_seconds=30)
    try:
        round_trip(client, topic)
    finally:
        client.close()
    # bob is who he says (his password), but not granted: the broker decided on bob.
    refused(url, topic, pulsar.AuthorizationError, authentication=pulsar.AuthenticationBasic(BOB, PASSWORDS[BOB]))
    # alice's name with bob's password: the proxy refuses it before any broker.
    refused(url, topic, pulsar.AuthenticationError, authentication=pulsar.AuthenticationBasic(ALICE, PASSWORDS[BOB]))
    assert "Traceback" not in cluster.proxies[0].log_text()
    assert PASSWORDS[ALICE] not in cluster.proxies[0].log_text()


def test_tls_client_certificate_through_the_proxy(proxied):
    cluster, namespace, pki = proxied["cluster"], proxied["namespace"], proxied["pki"]
    proxy = cluster.proxies[0]
    url = proxy.service_url_tls.replace("127.0.0.1", "localhost")
    topic = f"persistent://{namespace}/tls-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client(url, operation_timeout_seconds=30, **tls_options(pki, pki.client_cert_file,
                                                                            pki.client_key_file))
    try:
        round_trip(client, topic)
    finally:
        client.close()
    # A certificate of a trusted CA whose CN is not granted: authenticated, not authorized.
    stranger = proxied["stranger"]
    refused(url, topic, pulsar.AuthorizationError,
            **tls_options(pki, stranger.client_cert_file, stranger.client_key_file))
    # The granted CN in a certificate of another CA: the handshake fails, nothing reaches
    # the broker (the client gives up connecting).
    forged = proxied["forged"]
    refused(url, topic, (pulsar.ConnectError, pulsar.Timeout),
            **tls_options(pki, forged.client_cert_file, forged.client_key_file))
    port = int(proxy.service_url_tls.rsplit(":", 1)[1])

    def first_answer(cert_file: str, key_file: str) -> bytes | None:
        """The proxy's first bytes to a CONNECT over TLS with this certificate (None: the
        handshake failed; b"": closed with no answer)."""
        context = ssl.create_default_context(cafile=pki.ca_file)
        context.load_cert_chain(cert_file, key_file)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                with context.wrap_socket(raw, server_hostname="localhost") as stream:
                    stream.sendall(connect_frame("tls", b""))     # TLS 1.3: the alert comes on a read
                    return stream.recv(1024)
        except (ssl.SSLError, ConnectionError):
            return None

    assert not first_answer(forged.client_cert_file, forged.client_key_file)
    assert first_answer(pki.client_cert_file, pki.client_key_file)        # the control: CONNECTED
    # The tls method without a certificate (TLS, but no client certificate).
    refused(url, topic, pulsar.AuthenticationError, tls_trust_certs_file_path=pki.ca_file,
            tls_validate_hostname=True, authentication=pulsar.AuthenticationTLS("", ""))
    assert "Traceback" not in proxy.log_text()


def https_status(url: str, pki, cert=None, headers: dict | None = None) -> int | None:
    """The status of a GET over HTTPS, presenting ``cert`` (a pki: its client
    certificate) or none; None when the TLS handshake fails."""
    context = ssl.create_default_context(cafile=pki.ca_file)
    if cert is not None:
        context.load_cert_chain(cert.client_cert_file, cert.client_key_file)
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (ssl.SSLError, urllib.error.URLError, ConnectionError):
        return None


def test_a_client_certificate_reaches_the_admin_rest_through_the_proxy(proxied):
    """The proxy's HTTPS port: a caller proven by its certificate alone is forwarded as
    its CN (the proxy's token and X-Original-Principal); the broker authorizes the CN."""
    cluster, namespace, pki = proxied["cluster"], proxied["namespace"], proxied["pki"]
    proxy = cluster.proxies[0]
    base = proxy.https_url.replace("127.0.0.1", "localhost")
    local = f"rest-{uuid.uuid4().hex[:6]}"
    lookup = f"{base}/lookup/v2/topic/persistent/{namespace}/{local}"
    partitions = f"{base}/admin/v2/persistent/{namespace}/{local}/partitions"
    # The granted CN: its lookup and partition count (produce/consume's HTTP paths).
    assert https_status(lookup, pki, pki) == 200
    assert https_status(partitions, pki, pki) == 200
    # Authenticated as itself, not as the proxy (whose role may do nothing) nor as whom
    # it names: a superuser's path is refused, also when the caller names the superuser.
    assert https_status(f"{base}/admin/v2/clusters", pki, pki) == 403
    assert https_status(f"{base}/admin/v2/clusters", pki, pki, {"X-Original-Principal": SUPERUSER}) == 403
    # A trusted CA's certificate whose CN is not granted: authenticated, not authorized.
    assert https_status(lookup, pki, proxied["stranger"]) == 403
    # No certificate and no credentials: the broker asks for them.
    assert https_status(lookup, pki) == 401
    # The granted CN in a certificate of another CA: the handshake fails.
    assert https_status(lookup, pki, proxied["forged"]) is None
    # Credentials sent win over the certificate: a wrong password is refused.
    wrong = base64.b64encode(f"{ALICE}:{PASSWORDS[BOB]}".encode()).decode()
    assert https_status(lookup, pki, pki, {"Authorization": f"Basic {wrong}"}) == 401
    text = proxy.log_text()
    assert "Traceback" not in text and PASSWORDS[BOB] not in text


# --- raw frames: a client naming someone else -----------------------------------------------


def connect_frame(method: str, data: bytes, **fields) -> bytes:
    return encode_command(wrap(pb.CommandConnect(client_version="methods-test", protocol_version=20,
                                                 auth_method_name=method, auth_data=data, **fields)))


def test_no_client_claims_another_identity_with_basic_or_tls(proxied):
    cluster, namespace, pki = proxied["cluster"], proxied["namespace"], proxied["pki"]
    proxy, broker = cluster.proxies[0], cluster.brokers[0]
    topic = f"persistent://{namespace}/claimed-{uuid.uuid4().hex[:6]}"
    producer = encode_command(wrap(pb.CommandProducer(topic=topic, producer_id=1, request_id=1)))
    plain_port = int(proxy.service_url.rsplit(":", 1)[1])
    tls_port = int(proxy.service_url_tls.rsplit(":", 1)[1])

    def over_plain(connect: bytes) -> list:
        with socket.create_connection(("127.0.0.1", plain_port), timeout=10) as stream:
            return exchange(stream, [connect, producer])

    def over_tls(connect: bytes, cert_file: str, key_file: str) -> list:
        context = ssl.create_default_context(cafile=pki.ca_file)
        context.load_cert_chain(cert_file, key_file)
        with socket.create_connection(("127.0.0.1", tls_port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as stream:
                return exchange(stream, [connect, producer])

    def types(frames: list) -> list:
        return [f.command.type for f in frames]

    # Basic: bob naming alice, piped to the broker: the proxy names bob.
    bob_basic = f"{BOB}:{PASSWORDS[BOB]}".encode()
    frames = over_plain(connect_frame("basic", bob_basic, original_principal=ALICE, original_auth_method="basic",
                                      proxy_to_broker_url=broker.service_url))
    assert types(frames) == [T.CONNECTED, T.ERROR], frames
    assert frames[1].command.error.error == pb.AuthorizationError, frames[1].command
    # alice's own password on the same frames is let in (the refusal was about bob).
    frames = over_plain(connect_frame("basic", f"{ALICE}:{PASSWORDS[ALICE]}".encode(),
                                      proxy_to_broker_url=broker.service_url))
    assert types(frames) == [T.CONNECTED, T.PRODUCER_SUCCESS], frames

    # TLS: a stranger's certificate naming the granted CN in original_principal and in
    # the auth data; the role is the certificate's CN, nothing the client writes.
    stranger = proxied["stranger"]
    frames = over_tls(connect_frame("tls", b"granted-client", original_principal="granted-client",
                                    proxy_to_broker_url=broker.service_url),
                      stranger.client_cert_file, stranger.client_key_file)
    assert types(frames) == [T.CONNECTED, T.ERROR], frames
    assert frames[1].command.error.error == pb.AuthorizationError, frames[1].command
    frames = over_tls(connect_frame("tls", b"", proxy_to_broker_url=broker.service_url),
                      pki.client_cert_file, pki.client_key_file)
    assert types(frames) == [T.CONNECTED, T.PRODUCER_SUCCESS], frames

    # The tls method on the plain port (no certificate at all) is no identity.
    frames = over_plain(connect_frame("tls", b"granted-client", proxy_to_broker_url=broker.service_url))
    assert types(frames)[:1] == [T.CONNECTED] and len(frames) == 2, frames
    assert frames[1].command.type == T.ERROR and frames[1].command.error.error == pb.AuthenticationError
