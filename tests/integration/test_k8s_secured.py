"""The prod overlay's security, run: ``kubectl kustomize k8s/overlays/prod`` (which includes
k8s/components/security) started as local processes, each with exactly its pod's command,
arguments and environment.

What it proves, with a throwaway PKI and token key standing in for the operator's Secrets
``magnetar-tls`` and ``magnetar-auth`` (files written into each pod's mount directories, as
the kubelet writes a Secret volume's items): 3 etcd members (client and peer TLS, client
certificates required), 3 bookies (gRPC mutual TLS, service tokens), 1 broker (6651 and
8443 only; tokens and authorization), 1 gateway (HTTPS; pulsar+ssl:// and https:// to
the broker with its own token) and 1 proxy (pulsar+ssl:// 6651 and HTTPS 8443 only; the
clients' tokens checked, its own token of the proxy role toward the broker) start from the
rendered specs and every probe of each
answers 200, HTTPS ones included, without a token; the official pulsar-client over
``pulsar+ssl://`` (the rendered broker Service) with a token of a role granted
produce/consume (granted over HTTPS by the superuser token) produces and consumes; a
client with no token is refused (AuthenticationError) and a role without the grant gets
AuthorizationError; the same through the proxies' load balancer Service (the proxy's
own token, a role with no grant, is refused too), and the admin REST through its HTTPS
port; HTTPS produce and pull through the rendered gateway work with a token,
and are refused (401) without one; a plain Pulsar connection and plain HTTP to the
broker's ports fail, and the broker advertises only TLS URLs; `magnetar shell simpletest`
run in the broker pod (its environment: bookie mutual TLS and service token, etcd client
certificate) writes 20 entries to a ledger on all 3 bookies with no ensemble change, and
every add of the run reached the bookies on their add sockets (3182), which, like gRPC,
refuse clients without a certificate and answer a hello without a token, or with a role
they do not allow, with a refusal; the preStop drain (HTTPS to
localhost with the superuser token and the CA) exits 0.
How: tests/k8s_local.py (the dev test's machinery) with ``secrets=``; tests/tls_certs.py
for the PKI (one dual-use certificate, as the Secret holds). One cluster for the module.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import ssl
import tempfile
import urllib.error
import urllib.request

import pulsar
import pytest

from common.errors import AuthenticationFailed, AuthorizationDenied
from runtime.tokens import TokenSigner, create_secret_key
from tests import k8s_render as k8s
from protocol.add_socket import LENGTH_BYTES, encode_message
from protocol.codec import encode_command, wrap
from protocol.proto import bookie_pb2
from protocol.proto import pulsar_api_pb2 as pb
from tests.integration.gateway_helpers import round_trip_over_https
from tests.cluster import receive_in_order, unique, unique_topic
from tests.k8s_local import LocalCluster
from tests.tls_certs import make_pki

pytestmark = pytest.mark.timeout(240)

# What starts: enough for prod's quorums (3 etcd members, ensemble 3), one of the rest.
COUNTS = {"magnetar-etcd": 3, "magnetar-bookie": 3, "magnetar-autorecovery": 1, "magnetar-broker": 1,
          "magnetar-gateway": 1, "magnetar-proxy": 1}
SUPERUSER = "admin"


def _secrets(directory: str) -> tuple[dict[str, dict[str, bytes]], TokenSigner, str]:
    """The operator's Secrets of k8s/README.md ("Security"), made here: (secrets, signer, CA file)."""
    pki = make_pki(os.path.join(directory, "pki"), "k8s", dual_use=True)
    key = create_secret_key()
    signer = TokenSigner.with_secret_key(key)

    def read(path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    tls = {"ca.crt": read(pki.ca_file), "tls.crt": read(pki.cert_file), "tls.key": read(pki.key_file)}
    auth = {"secret.key": key,
            "superuser.token": signer.create(SUPERUSER).encode(),
            "broker.token": signer.create("magnetar-broker").encode(),
            "gateway.token": signer.create("magnetar-gateway").encode(),
            "autorecovery.token": signer.create("magnetar-autorecovery").encode(),
            "proxy.token": signer.create("magnetar-proxy").encode()}
    gateway = {"secret": b"k1:" + os.urandom(32).hex().encode()}
    return {"magnetar-tls": tls, "magnetar-auth": auth, "magnetar-gateway": gateway}, signer, pki.ca_file


@pytest.fixture(scope="module")
def secured():
    with tempfile.TemporaryDirectory(prefix="k8s-secured-") as base_dir:
        secrets, signer, ca_file = _secrets(base_dir)
        local = LocalCluster(k8s.render("prod"), base_dir, secrets=secrets)

        async def start() -> None:
            # In dependency order; auto-recovery waits for nothing after it, so it is
            # checked for readiness last.
            for name in ("magnetar-etcd", "magnetar-bookie"):
                await local.start_workload(name, COUNTS[name])
            recovery = await local.start("magnetar-autorecovery-00000", wait_ready=False)
            for name in ("magnetar-broker", "magnetar-gateway", "magnetar-proxy"):
                await local.start_workload(name, COUNTS[name])
            await local.wait_ready(recovery.name)

        try:
            asyncio.run(start())
            yield {"cluster": local, "signer": signer, "ca": ca_file}
        finally:
            asyncio.run(local.stop_all())


def _service(cluster: LocalCluster, service: str, port: int) -> str:
    return cluster.rewrite(cluster.pod(sorted(cluster.pods)[0]), f"{service}:{port}")


def _https(url: str, ca_file: str, *, token: str | None = None, method: str = "GET", body=None) -> int:
    context = ssl.create_default_context(cafile=ca_file)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _client(secured, token: str | None) -> pulsar.Client:
    url = f"pulsar+ssl://{_service(secured['cluster'], 'magnetar-broker', 6651)}"
    return pulsar.Client(url, tls_trust_certs_file_path=secured["ca"], operation_timeout_seconds=15,
                         connection_timeout_ms=5_000,
                         authentication=pulsar.AuthenticationToken(token) if token else None)


def test_every_probe_answers_over_its_scheme_without_a_token(secured):
    cluster = secured["cluster"]
    assert len(cluster.pods) == sum(COUNTS.values())
    schemes = set()
    for pod in cluster.pods.values():
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert pod.probe(kind) == 200, (pod.name, kind, pod.probe_url(kind))
            schemes.add(pod.probe_url(kind).split(":")[0])
    assert schemes == {"http", "https"}


async def test_token_client_over_tls_produces_and_consumes(secured):
    cluster, signer = secured["cluster"], secured["signer"]
    broker = cluster.pods["magnetar-broker-00000"]
    web = f"https://127.0.0.1:{broker.local_port('https')}"
    namespace = "public/default"
    # The superuser grants the application's role; a role without the grant is refused.
    assert _https(f"{web}/admin/v2/namespaces/{namespace}/permissions/app", secured["ca"],
                  token=signer.create(SUPERUSER), method="POST", body=["produce", "consume"]) in (200, 204)
    topic = unique_topic("k8s-secured")
    client = _client(secured, signer.create("app"))
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        sent = [f"secured-{i}".encode() for i in range(20)]
        for payload in sent:
            producer.send(payload)
        await receive_in_order(consumer, sent, 10_000)   # at least once, in order
    finally:
        client.close()
    for token, error in ((None, pulsar.AuthenticationError), (signer.create("stranger"), pulsar.AuthorizationError)):
        refused = _client(secured, token)
        try:
            with pytest.raises(error):
                refused.create_producer(topic)
        finally:
            refused.close()


def _proxy_client(secured, token: str | None) -> pulsar.Client:
    """A client outside the cluster: its service URL names the proxies' load balancer
    (the rendered magnetar-proxy Service's 6651), the certificate's names checked."""
    url = f"pulsar+ssl://{_service(secured['cluster'], 'magnetar-proxy', 6651)}"
    return pulsar.Client(url, tls_trust_certs_file_path=secured["ca"], tls_validate_hostname=True,
                         operation_timeout_seconds=15, connection_timeout_ms=5_000,
                         authentication=pulsar.AuthenticationToken(token) if token else None)


async def test_clients_outside_through_the_proxy_over_tls_with_a_token(secured):
    """The proxy pod serves pulsar+ssl:// and HTTPS only; a client with a token of a
    granted role produces and consumes through it (the broker authorized that role, named
    by the proxy: the proxy's own role magnetar-proxy has no permission); no token, a role
    without the grant, and the proxy's own token are refused; the admin REST answers
    through the proxy's HTTPS port with a token (401 without)."""
    cluster, signer, ca_file = secured["cluster"], secured["signer"], secured["ca"]
    proxy = cluster.pods["magnetar-proxy-00000"]
    assert {p["containerPort"] for p in proxy.pod.container["ports"]} == {6651, 8443}
    broker = cluster.pods["magnetar-broker-00000"]
    web = f"https://127.0.0.1:{broker.local_port('https')}"
    assert _https(f"{web}/admin/v2/namespaces/public/default/permissions/app", ca_file,
                  token=signer.create(SUPERUSER), method="POST", body=["produce", "consume"]) in (200, 204)
    topic = unique_topic("k8s-proxy")
    client = _proxy_client(secured, signer.create("app"))
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        sent = [f"outside-{i}".encode() for i in range(20)]
        for payload in sent:
            producer.send(payload)
        await receive_in_order(consumer, sent, 10_000)
    finally:
        client.close()
    with open(os.path.join(proxy.mounts["/etc/magnetar/auth"], "proxy.token")) as handle:
        proxy_token = handle.read().strip()
    for token, error in ((None, pulsar.AuthenticationError), (signer.create("stranger"), pulsar.AuthorizationError),
                         (proxy_token, pulsar.AuthorizationError)):
        refused = _proxy_client(secured, token)
        try:
            with pytest.raises(error):
                refused.create_producer(topic)
        finally:
            refused.close()
    # The admin REST on the proxy's HTTPS port (the Service's 8443), the broker deciding.
    base = f"https://{_service(cluster, 'magnetar-proxy', 8443)}"
    listing = f"{base}/admin/v2/persistent/public/default"
    assert _https(listing, ca_file, token=signer.create(SUPERUSER)) == 200
    assert _https(listing, ca_file) == 401
    # Plain HTTP to the HTTPS port fails; nothing is served in clear text.
    with pytest.raises((urllib.error.URLError, ConnectionError)) as raised:
        urllib.request.urlopen(f"http://127.0.0.1:{proxy.local_port('https')}/health", timeout=5).read()
    assert not isinstance(raised.value, urllib.error.HTTPError)


# An HTTP/2 preface and an empty SETTINGS frame: gRPC's first bytes.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _answer(port: int, context: ssl.SSLContext | None, first: bytes = _H2_PREFACE) -> bytes | None:
    """What a server sends back to ``first``, over TLS with ``context`` or in clear text:
    its first bytes; b"" when it closes the connection; None when it resets it."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            stream = context.wrap_socket(raw, server_hostname="localhost") if context is not None else raw
            stream.sendall(first)
            return stream.recv(1024)
    except ConnectionResetError:
        return None


def test_bookies_and_etcd_refuse_clients_without_a_certificate(secured):
    """Mutual TLS is required: a TLS client of the right CA without a certificate is cut
    off at the handshake, a clear-text one gets nothing; with the Secret's certificate the
    same server answers (gRPC's SETTINGS frame)."""
    cluster, ca_file = secured["cluster"], secured["ca"]
    tls_dir = cluster.pods["magnetar-broker-00000"].mounts["/etc/magnetar/tls"]
    without = ssl.create_default_context(cafile=ca_file)
    with_certificate = ssl.create_default_context(cafile=ca_file)
    with_certificate.load_cert_chain(os.path.join(tls_dir, "tls.crt"), os.path.join(tls_dir, "tls.key"))
    with_certificate.set_alpn_protocols(["h2"])
    for pod, port in (("magnetar-bookie-0", 3181), ("magnetar-etcd-0", 2379)):
        local = cluster.pods[pod].local_port(port)
        assert _answer(local, with_certificate)[3:4] == b"\x04", pod      # a SETTINGS frame
        try:
            refused = _answer(local, without)
        except ssl.SSLError as alert:      # TLS 1.3: the server's alert arrives on the first read
            refused = alert.reason
        # Closed, or the alert (certificate required; Go's etcd says bad certificate).
        assert refused in (b"", None) or "ALERT" in refused and "CERTIFICATE" in refused, (pod, refused)
        assert _answer(local, None) in (b"", None), pod          # clear text: closed


def test_the_add_socket_takes_mutual_tls_and_a_token(secured):
    """The bookies' add socket (3182) is secured as their gRPC port: a TLS client without a
    certificate is cut off at the handshake and a clear-text one gets nothing; with the
    Secret's certificate the hello is answered, a refusal without a token
    (AuthenticationFailed) or with a role the bookies do not allow (AuthorizationDenied),
    a welcome with the brokers' service token."""
    cluster, ca_file, signer = secured["cluster"], secured["ca"], secured["signer"]
    broker = cluster.pods["magnetar-broker-00000"]
    tls_dir, auth_dir = broker.mounts["/etc/magnetar/tls"], broker.mounts["/etc/magnetar/auth"]
    with open(os.path.join(auth_dir, "broker.token")) as handle:
        broker_token = handle.read().strip()
    without = ssl.create_default_context(cafile=ca_file)
    with_certificate = ssl.create_default_context(cafile=ca_file)
    with_certificate.load_cert_chain(os.path.join(tls_dir, "tls.crt"), os.path.join(tls_dir, "tls.key"))

    def hello(token: str) -> bytes:
        return encode_message(bookie_pb2.AddSocketHello(token=token))

    def welcome(answer: bytes | None) -> bookie_pb2.AddSocketWelcome:
        assert answer and len(answer) >= LENGTH_BYTES, answer
        length = int.from_bytes(answer[:LENGTH_BYTES], "big")
        assert len(answer) == LENGTH_BYTES + length, answer
        return bookie_pb2.AddSocketWelcome.FromString(answer[LENGTH_BYTES:])

    for pod in ("magnetar-bookie-0", "magnetar-bookie-1", "magnetar-bookie-2"):
        local = cluster.pods[pod].local_port(3182)
        assert welcome(_answer(local, with_certificate, hello(""))).error_code == AuthenticationFailed.code, pod
        assert welcome(_answer(local, with_certificate, hello(signer.create("stranger")))).error_code == \
            AuthorizationDenied.code, pod
        accepted = welcome(_answer(local, with_certificate, hello(broker_token)))
        assert (accepted.error_code, accepted.error_message) == (0, ""), pod
        try:
            refused = _answer(local, without, hello(broker_token))
        except ssl.SSLError as alert:      # TLS 1.3: the server's alert arrives on the first read
            refused = alert.reason
        assert refused in (b"", None) or "ALERT" in refused and "CERTIFICATE" in refused, (pod, refused)
        assert _answer(local, None, hello(broker_token)) in (b"", None), pod      # clear text: closed


def test_plain_text_to_the_broker_fails(secured):
    cluster = secured["cluster"]
    broker = cluster.pods["magnetar-broker-00000"]
    tls_port, https_port = broker.local_port("pulsar-tls"), broker.local_port("https")
    # Lookups answer TLS URLs only (no plain listener to send anyone to).
    log = broker.log_text()
    assert f"service_url=pulsar+ssl://127.0.0.1:{tls_port} web_service_url=https://127.0.0.1:{https_port}" in log
    # The Pulsar protocol in clear text to the TLS port: a CONNECT frame gets no CONNECTED,
    # the connection is closed (over TLS the same frame is answered: the test's control).
    connect = encode_command(wrap(pb.CommandConnect(client_version="k8s-test", protocol_version=19)))
    assert _answer(tls_port, None, connect) in (b"", None)
    answered = _answer(tls_port, ssl.create_default_context(cafile=secured["ca"]), connect)
    assert answered, answered      # a frame back (CONNECTED, or an error: no token)
    # Plain HTTP to the HTTPS port: the connection fails, nothing is served.
    with pytest.raises((urllib.error.URLError, ConnectionError)) as raised:
        urllib.request.urlopen(f"http://127.0.0.1:{https_port}/health", timeout=5).read()
    assert not isinstance(raised.value, urllib.error.HTTPError)
    # Nothing listens on the plain ports the pod spec dropped: the broker's container
    # declares only 6651 and 8443.
    assert {p["containerPort"] for p in broker.pod.container["ports"]} == {6651, 8443}


async def test_gateway_over_https_with_a_token(secured):
    cluster, signer = secured["cluster"], secured["signer"]
    gateway_url = f"https://{_service(cluster, 'magnetar-gateway', 8081)}"
    await round_trip_over_https(gateway_url, secured["ca"], signer.create(SUPERUSER), unique("k8s-gw"),
                                "through the gateway")


async def test_shell_in_the_broker_pod_reaches_the_bookies_with_mutual_tls(secured):
    cluster = secured["cluster"]
    output = await cluster.run_kubectl("kubectl -n magnetar exec deploy/magnetar-broker -- magnetar shell simpletest "
                                       "--ensemble 3 --write-quorum 2 --ack-quorum 2 --entries 20 --delete")
    report = json.loads(output.strip().splitlines()[-1])
    assert (report["acked"], report["ensemble_changes"], report["closed"], report["deleted"]) == (20, 0, True, True)
    assert len(report["fragments"][0]["bookies"]) == 3, report
    # Those adds, and the brokers' of the test above, came on the bookies' add sockets
    # (mutual TLS and the service token there too), none over gRPC.
    for name in ("magnetar-bookie-0", "magnetar-bookie-1", "magnetar-bookie-2"):
        pod = cluster.pods[name]
        with urllib.request.urlopen(f"http://127.0.0.1:{pod.local_port('http')}/metrics", timeout=5) as response:
            text = response.read().decode()
        adds, on_socket = (float(re.search(rf"^{metric} (\S+)$", text, re.M).group(1))
                           for metric in ("magnetar_bookie_adds_total", "magnetar_bookie_add_socket_adds_total"))
        assert adds > 0 and on_socket == adds, (name, adds, on_socket)


async def test_pre_stop_drain_over_https(secured):
    """Last: the broker's termination, preStop first (HTTPS to localhost, CA and token)."""
    cluster = secured["cluster"]
    outcome = await cluster.stop("magnetar-broker-00000")
    assert outcome["pre_stop_exit"] == 0, outcome
    assert outcome["exit_code"] == 0, outcome
