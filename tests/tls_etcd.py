"""A real etcd serving only TLS on loopback and requiring client certificates
(``--client-cert-auth``), for the tests of etcd client TLS (metadata/etcd_tls.py)."""

from __future__ import annotations

import os
import ssl
import time
import urllib.request

from magnetar.etcd_server import etcd_command, etcd_is_healthy
from tests.cluster import ManagedProcess, free_port


class TlsEtcd(ManagedProcess):
    """etcd with TLS on its client port, client certificates required."""

    def __init__(self, base_dir: str, pki) -> None:
        self.client_port, peer_port = free_port(), free_port()
        self.pki = pki
        argv = etcd_command(os.path.join(base_dir, "etcd"), self.client_port, peer_port, name="tls")
        plain = f"http://127.0.0.1:{self.client_port}"
        argv = [f"https://127.0.0.1:{self.client_port}" if arg == plain else arg for arg in argv]
        argv += ["--cert-file", pki.cert_file, "--key-file", pki.key_file, "--client-cert-auth",
                 "--trusted-ca-file", pki.ca_file]
        super().__init__("etcd-tls", argv, os.path.join(base_dir, "etcd.log"))

    def url(self, root: str) -> str:
        return f"etcd://127.0.0.1:{self.client_port}{root}"

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        context = ssl.create_default_context(cafile=self.pki.ca_file)
        context.load_cert_chain(self.pki.client_cert_file, self.pki.client_key_file)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.running, self.log_text()[-2000:]
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.client_port}/health", timeout=1,
                                            context=context) as response:
                    if etcd_is_healthy(response.read()):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"TLS etcd not healthy:\n{self.log_text()[-2000:]}")


def etcd_tls_flags(pki) -> list[str]:
    """The --etcd-tls-* flags of a process trusting ``pki``'s CA with its client certificate."""
    return ["--etcd-tls-trust-certs-file", pki.ca_file, "--etcd-tls-cert-file", pki.client_cert_file,
            "--etcd-tls-key-file", pki.client_key_file]


def etcd_tls_environment(pki) -> dict[str, str]:
    """The same options as MAGNETAR_ETCD_TLS_* variables (magnetar/env_flags.py)."""
    return {"MAGNETAR_ETCD_TLS_TRUST_CERTS_FILE": pki.ca_file, "MAGNETAR_ETCD_TLS_CERT_FILE": pki.client_cert_file,
            "MAGNETAR_ETCD_TLS_KEY_FILE": pki.client_key_file}
