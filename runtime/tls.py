"""TLS for every listener (broker binary protocol and HTTP, gateway, bookie gRPC) and
for the clients of them: one config shape, one way to build contexts, one reload rule.

Certificates and keys come from PEM files. A server's context is built once and kept:
``CertificateReloader.check`` loads the files again into the same ``ssl.SSLContext``
when one of them changed (modification time or size), so new handshakes use the new
certificate while established connections keep theirs: rotation without a restart. A
file caught half-written fails to load; the old certificate stays in force and the
next check tries again.

Protocol floor: TLS 1.2 (what Pulsar's brokers accept by default).
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass

from common.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsConfig:
    # The server's (or a client's own, for mutual TLS) certificate chain and key, PEM.
    cert_file: str = ""
    key_file: str = ""
    # CA certificates to verify the peer: clients' certificates on a server (mutual
    # TLS), the server's on a client. Empty on a client: the system's trust store.
    trust_certs_file: str = ""
    # A server refuses clients without a certificate signed by trust_certs_file.
    require_client_cert: bool = False
    # How often a server looks at its files for a new certificate.
    reload_check_s: float = 5.0

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("tls cert_file and key_file go together")
        if self.require_client_cert and not self.trust_certs_file:
            raise ConfigError("require_client_cert needs trust_certs_file (the CA that signs client certificates)")
        if not 0.1 <= self.reload_check_s <= 3600:
            raise ConfigError("tls reload_check_s must be in [0.1, 3600]")

    @property
    def enabled(self) -> bool:
        """A server has TLS when it has a certificate."""
        return bool(self.cert_file)

    def files(self) -> list[str]:
        return [path for path in (self.cert_file, self.key_file, self.trust_certs_file) if path]


def file_stamp(paths: list[str]) -> tuple:
    """What the files look like now (modification time and size, None when unreadable):
    a different stamp means one of them changed."""
    stamps = []
    for path in paths:
        try:
            status = os.stat(path)
            stamps.append((path, status.st_mtime_ns, status.st_size))
        except OSError:
            stamps.append((path, None, None))
    return tuple(stamps)


def _load_server(context: ssl.SSLContext, config: TlsConfig) -> None:
    context.load_cert_chain(config.cert_file, config.key_file)
    if config.trust_certs_file:
        context.load_verify_locations(cafile=config.trust_certs_file)


def server_context(config: TlsConfig) -> ssl.SSLContext:
    """A server context with the configured certificate; ConfigError naming the file
    when one does not load."""
    assert config.enabled
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        _load_server(context, config)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"cannot load TLS certificate {config.cert_file} / key {config.key_file}: "
                          f"{getattr(error, 'strerror', None) or error}") from None
    if config.require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
    elif config.trust_certs_file:
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def client_context(config: TlsConfig, *, verify_hostname: bool = True) -> ssl.SSLContext:
    """A client context trusting ``trust_certs_file`` (or the system's CAs), presenting
    ``cert_file`` when one is given (mutual TLS)."""
    context = ssl.create_default_context(cafile=config.trust_certs_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = verify_hostname
    if config.cert_file:
        try:
            context.load_cert_chain(config.cert_file, config.key_file)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(f"cannot load TLS client certificate {config.cert_file}: {error}") from None
    return context


def usable_as_client_certificate(cert_file: str) -> bool:
    """Whether the first certificate of ``cert_file`` may authenticate a TLS client: it
    names no extended key usage, or one that includes clientAuth. A server that checks
    client certificates refuses the handshake of one made for servers only."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    try:
        with open(cert_file, "rb") as handle:
            certificate = x509.load_pem_x509_certificate(handle.read())
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read TLS certificate {cert_file}: {error}") from None
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return ExtendedKeyUsageOID.CLIENT_AUTH in usages or ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usages


def peer_client_context(config: TlsConfig) -> ssl.SSLContext:
    """A server's context for calling its peers (a broker another broker's HTTPS):
    the peers' certificates checked against ``trust_certs_file`` (or the system's CAs),
    not against the host name (peers are reached at the addresses they advertise, pod IPs
    in Kubernetes, which their certificates do not name — as the gateway reaches
    brokers); its own certificate presented only when it may serve as a client's."""
    present = bool(config.cert_file) and usable_as_client_certificate(config.cert_file)
    own = config if present else TlsConfig(trust_certs_file=config.trust_certs_file)
    return client_context(own, verify_hostname=False)


class PeerClientContexts:
    """``peer_client_context(config)`` built once and kept: built again only when one of
    its files changed (a stat per file each time it is asked for, as the token files are
    looked at), so a server's calls to its peers neither parse certificates on every
    request nor keep using a rotated one."""

    def __init__(self, config: TlsConfig) -> None:
        self.config = config
        self._stamp: tuple | None = None
        self._context: ssl.SSLContext | None = None
        self.builds = 0

    def current(self) -> ssl.SSLContext:
        stamp = file_stamp(self.config.files())
        if self._context is None or stamp != self._stamp:
            self._context = peer_client_context(self.config)
            self._stamp = stamp
            self.builds += 1
        return self._context


class CertificateReloader:
    """Keeps a server context's certificate in step with its files."""

    def __init__(self, config: TlsConfig, context: ssl.SSLContext) -> None:
        self.config = config
        self.context = context
        self._stamp = file_stamp(config.files())
        self.reloads = 0

    def check(self) -> bool:
        """Reloads when a file changed; True if it did. A file that does not load now
        leaves the old certificate in force (logged, tried again next time)."""
        stamp = file_stamp(self.config.files())
        if stamp == self._stamp:
            return False
        try:
            _load_server(self.context, self.config)
        except (OSError, ssl.SSLError) as error:
            log.warning("TLS certificate did not reload, keeping the old one: cert_file=%s error=%s",
                        self.config.cert_file, error)
            return False
        self._stamp = stamp
        self.reloads += 1
        log.info("TLS certificate reloaded: cert_file=%s reloads=%d", self.config.cert_file, self.reloads)
        return True

    async def run(self) -> None:
        """Checks every ``reload_check_s`` until cancelled (owned by the server)."""
        import asyncio

        while True:
            await asyncio.sleep(self.config.reload_check_s)
            self.check()


def certificate_common_name(certificate: dict | None) -> str | None:
    """The subject CN of a verified peer certificate, as ``getpeercert()`` gives it (the
    role of TLS client-certificate authentication); None without one."""
    if not certificate:
        return None
    for relative_name in certificate.get("subject", ()):
        for key, value in relative_name:
            if key == "commonName" and value:
                return str(value)
    return None
