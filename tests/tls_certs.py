"""Test certificates, made with ``cryptography``: a CA, a server certificate for
127.0.0.1 and localhost signed by it, and a client certificate (mutual TLS). Written as
PEM files; ``make_pki(dir, name)`` returns their paths."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_file: str
    cert_file: str
    key_file: str
    client_cert_file: str
    client_key_file: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: str, key) -> None:
    with open(path, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _write_cert(path: str, cert: x509.Certificate) -> None:
    with open(path, "wb") as handle:
        handle.write(cert.public_bytes(serialization.Encoding.PEM))


def _issue(subject: str, key, issuer_name: x509.Name, issuer_key, *, ca: bool, server: bool,
           days: int = 30, dual_use: bool = False, names: tuple[str, ...] = ("localhost", "127.0.0.1")
           ) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer_name)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if dual_use else [usage]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def make_pki(directory: str, name: str = "test", *, server_cn: str = "localhost", dual_use: bool = False,
             server_names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Pki:
    """``dual_use``: the server certificate is also a client certificate (serverAuth and
    clientAuth), as one certificate per component is when it both serves and dials
    (etcd peers, a Kubernetes Secret shared by the cluster); ``server_names``: its SANs."""
    os.makedirs(directory, exist_ok=True)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = _issue(f"{name} CA", ca_key, ca_name, ca_key, ca=True, server=False)
    server_key, client_key = _key(), _key()
    server = _issue(server_cn, server_key, ca_name, ca_key, ca=False, server=True, dual_use=dual_use,
                    names=server_names)
    client = _issue(f"{name}-client", client_key, ca_name, ca_key, ca=False, server=False)
    pki = Pki(*(os.path.join(directory, f"{name}-{part}.pem")
                for part in ("ca", "cert", "key", "client-cert", "client-key")))
    _write_cert(pki.ca_file, ca)
    _write_cert(pki.cert_file, server)
    _write_key(pki.key_file, server_key)
    _write_cert(pki.client_cert_file, client)
    _write_key(pki.client_key_file, client_key)
    return pki


def reissue_server(pki: Pki, directory: str, name: str, *, server_cn: str) -> None:
    """Replaces the server certificate with one from a new CA under ``name`` (for the
    reload test: the new one verifies only with the new CA)."""
    fresh = make_pki(directory, name, server_cn=server_cn)
    with open(fresh.cert_file, "rb") as source, open(pki.cert_file + ".tmp", "wb") as target:
        target.write(source.read())
    with open(fresh.key_file, "rb") as source, open(pki.key_file + ".tmp", "wb") as target:
        target.write(source.read())
    os.replace(pki.key_file + ".tmp", pki.key_file)
    os.replace(pki.cert_file + ".tmp", pki.cert_file)
