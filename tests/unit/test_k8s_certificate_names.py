"""The certificate k8s/README.md ("Security") tells the operator to make fits the names the
prod pods dial.

What it proves: a certificate with exactly the README's subjectAltName line (and both
extended key usages) passes gRPC's host-name check (the bookie client's and the etcd
client's) for every bookie address and every etcd endpoint the rendered prod overlay
dials, and names the broker, gateway and proxy Service names and ``localhost`` (the preStop
drain); while gRPC refuses a two-label pod name
(``magnetar-bookie-0.magnetar-bookie``, which the security component moved away from);
and the bookies' add socket, dialled at the host of the same advertised address with
Python's ssl (ledger/bookie_client.py's ``_SocketCall``: ``runtime.tls.client_context``,
the host name checked), passes with that certificate too, the short name failing there
as well.
How: the README's openssl extension text parsed; the certificate issued with
``cryptography``; a local gRPC server with it, dialled with
``grpc.ssl_target_name_override`` set to each name; a local TLS socket server with it
(``runtime.tls.server_context``, as the add socket's), handshaken with each name as
``server_hostname``.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import socket
import ssl
import threading
from concurrent import futures

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests import k8s_render as k8s


def _readme_names() -> list[str]:
    text = (k8s.K8S / "README.md").read_text()
    line = re.search(r"^subjectAltName=(.+)$", text, re.M).group(1)
    usages = re.search(r"^extendedKeyUsage=(.+)$", text, re.M).group(1)
    assert set(usages.split(",")) == {"serverAuth", "clientAuth"}
    return [entry.split(":", 1)[1] for entry in line.split(",")]


def _certificate(names: list[str]) -> tuple[bytes, bytes, bytes]:
    """(CA PEM, certificate PEM, key PEM) with the given SANs."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "magnetar-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    sans = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "magnetar")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False).sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _prod_add_socket_hosts() -> list[str]:
    """The hosts of the add addresses prod's bookies register (bookie/main.py's rule)."""
    from bookie.main import add_address_for

    objects = k8s.render("prod")
    bookies = k8s.named(objects, "StatefulSet", "magnetar-bookie")
    hosts = []
    for pod in k8s.pods(bookies):
        env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
        address = add_address_for(env["MAGNETAR_ADVERTISED_ADDRESS"], int(env["MAGNETAR_ADD_SOCKET_PORT"]))
        hosts.append(address.rsplit(":", 1)[0])
    return hosts


def _prod_dialled_names() -> dict[str, list[str]]:
    objects = k8s.render("prod")
    bookies = k8s.named(objects, "StatefulSet", "magnetar-bookie")
    names = []
    for pod in k8s.pods(bookies):
        env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
        names.append(env["MAGNETAR_ADVERTISED_ADDRESS"].rsplit(":", 1)[0])
    metadata = k8s.by_kind(objects, "ConfigMap")[0]["data"]["metadata"]
    etcd = [e.rsplit(":", 1)[0] for e in metadata.removeprefix("etcd://").split("/", 1)[0].split(",")]
    return {"bookie": names, "etcd": etcd}


def test_readme_certificate_names_pass_grpc_for_every_dialled_name():
    ca, cert, key = _certificate(_readme_names())
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    server.start()
    credentials = grpc.ssl_channel_credentials(root_certificates=ca)

    def handshakes(name: str, timeout_s: float = 10.0) -> bool:
        channel = grpc.secure_channel(f"127.0.0.1:{port}", credentials,
                                      options=[("grpc.ssl_target_name_override", name)])
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
            return True
        except grpc.FutureTimeoutError:
            return False
        finally:
            channel.close()

    try:
        dialled = _prod_dialled_names()
        assert len(dialled["bookie"]) == 4 and len(dialled["etcd"]) == 3
        for name in dialled["bookie"] + dialled["etcd"]:
            assert handshakes(name), name
        # The control: a pod's short name is not covered (gRPC wildcards need a dot after
        # the first label's domain), which is why prod dials the .<namespace>.svc names.
        assert not handshakes("magnetar-bookie-0.magnetar-bookie", timeout_s=2.0)
    finally:
        server.stop(0)


def test_readme_certificate_names_the_services_and_localhost():
    names = set(_readme_names())
    # The names clients and the preStop drain use, each named exactly (no wildcard needed).
    for name in ("magnetar-broker.magnetar", "magnetar-broker.magnetar.svc", "magnetar-gateway.magnetar",
                 "magnetar-gateway.magnetar.svc", "magnetar-proxy.magnetar", "magnetar-proxy.magnetar.svc",
                 "proxy.example.com",     # the proxies' load balancer as clients outside dial it
                 "localhost"):
        assert name in names, name
    # etcd checks a peer's address by reverse lookup, which answers the cluster.local name.
    assert "*.magnetar-etcd.magnetar.svc.cluster.local" in names


def test_readme_certificate_names_pass_the_add_sockets_host_name_check(tmp_path):
    from runtime.tls import TlsConfig, client_context, server_context
    from ledger.config import BookieTlsConfig

    ca, cert, key = _certificate(_readme_names())
    for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
        (tmp_path / name).write_bytes(data)
    server = server_context(TlsConfig(cert_file=str(tmp_path / "tls.crt"), key_file=str(tmp_path / "tls.key")))
    client = client_context(BookieTlsConfig(trust_certs_file=str(tmp_path / "ca.crt")))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:    # handshakes until stopped; a refused one is the client's to see
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            raw.settimeout(10)
            try:
                with server.wrap_socket(raw, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    def handshakes(name: str) -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            try:
                with client.wrap_socket(raw, server_hostname=name):
                    return True
            except ssl.SSLCertVerificationError:
                return False

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        hosts = _prod_add_socket_hosts()
        # The same hosts as gRPC's (checked above): only the port differs.
        assert hosts == _prod_dialled_names()["bookie"] and len(hosts) == 4
        for host in hosts:
            assert handshakes(host), host
        assert not handshakes("magnetar-bookie-0.magnetar-bookie")
    finally:
        stop.set()
        thread.join(10)
        listener.close()
