"""TLS toward etcd: the client options every process that talks to etcd takes
(brokers, bookies, ``magnetar autorecovery``, ``magnetar shell``).

    --etcd-tls-trust-certs-file ca.pem     the CA of etcd's server certificate (turns TLS on)
    --etcd-tls-cert-file client.pem        this process's certificate, for an etcd started
    --etcd-tls-key-file client-key.pem     with --client-cert-auth (mutual TLS)

Any of them turns TLS on (without a trust file: the system's CAs). The endpoints stay
``etcd://host:port`` and etcd's certificate must name the host used there (an IP
address SAN for ``127.0.0.1``).

The files are read when a connection to etcd is made (each new connection after a
failure reads them again, so a rotated certificate is picked up without a restart); a
file that cannot be read then keeps the last good contents. Reading them at start is
checked once, so a wrong path fails the process at once with ConfigError naming the
flag. The key's contents are never logged.

aetcd opens only plain channels, so ``SecureClient`` opens the same stubs over a gRPC
channel with TLS credentials.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import aetcd
import grpc
from aetcd import rpc, watcher

from runtime.config_options import ConfigOption, add_config_options, config_overrides
from common.errors import ConfigError


@dataclass(frozen=True)
class EtcdTlsConfig:
    # PEM: etcd's CA, this client's certificate chain and its key ("": not given).
    trust_certs_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("--etcd-tls-cert-file and --etcd-tls-key-file go together")

    @property
    def enabled(self) -> bool:
        return bool(self.trust_certs_file or self.cert_file)


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise ConfigError(f"{flag}: cannot read {path}: {error.strerror}") from None


class CredentialFiles:
    """The PEM files of an EtcdTlsConfig, read again for every new connection."""

    def __init__(self, config: EtcdTlsConfig) -> None:
        assert config.enabled
        self.config = config
        self._last = self._load()   # ConfigError here: a wrong path fails the process at start

    def _load(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        config = self.config
        return (_read(config.trust_certs_file, "--etcd-tls-trust-certs-file") if config.trust_certs_file else None,
                _read(config.key_file, "--etcd-tls-key-file") if config.key_file else None,
                _read(config.cert_file, "--etcd-tls-cert-file") if config.cert_file else None)

    def credentials(self) -> grpc.ChannelCredentials:
        try:
            self._last = self._load()
        except ConfigError:
            pass   # a file being replaced: the last good contents until it is whole
        root_certificates, private_key, certificate_chain = self._last
        return grpc.ssl_channel_credentials(root_certificates=root_certificates, private_key=private_key,
                                            certificate_chain=certificate_chain)


class SecureClient(aetcd.Client):
    """An aetcd client whose channel is TLS (aetcd itself opens plain channels only).
    Username and password authentication is not used by Magnetar and not offered."""

    def __init__(self, *, credentials: grpc.ChannelCredentials, **kwargs) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        # Creating a channel and stubs does no IO (gRPC connects on the first call), so
        # there is no await between the check above and the event set below.
        self.channel = rpc.secure_channel(f"{self._host}:{self._port}", self._credentials,
                                          options=list(self._options.items()))
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
        self._connected.set()


# The flags, as rows of a server's options table (runtime/config_options.py).
ETCD_TLS_OPTIONS = [
    ConfigOption("--etcd-tls-trust-certs-file", EtcdTlsConfig, "trust_certs_file",
                 "PEM CA of etcd's server certificate: talk to etcd over TLS"),
    ConfigOption("--etcd-tls-cert-file", EtcdTlsConfig, "cert_file",
                 "PEM client certificate, for an etcd requiring client certificates"),
    ConfigOption("--etcd-tls-key-file", EtcdTlsConfig, "key_file", "PEM key of --etcd-tls-cert-file"),
]


def add_etcd_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags, for a command without an options table of its own (shell)."""
    add_config_options(parser, ETCD_TLS_OPTIONS)


def etcd_tls_from_args(args: argparse.Namespace) -> EtcdTlsConfig:
    return EtcdTlsConfig(**config_overrides(args, ETCD_TLS_OPTIONS, EtcdTlsConfig))
