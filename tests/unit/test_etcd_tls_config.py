"""etcd client TLS options (metadata/etcd_tls.py), without an etcd.

Proves: the three flags parse into EtcdTlsConfig (any of them turns TLS on; a
certificate needs its key); the files are read at start, a missing one is a
ConfigError naming its flag, and a file that goes missing later keeps the last good
contents; MAGNETAR_ETCD_TLS_* set the flags of the processes that talk to etcd.
"""

from __future__ import annotations

import argparse

import pytest

from common.errors import ConfigError
from magnetar.env_flags import mapped_flags
from metadata.etcd_tls import CredentialFiles, EtcdTlsConfig, add_etcd_tls_arguments, etcd_tls_from_args
from tests.tls_certs import make_pki

FLAGS = ("MAGNETAR_ETCD_TLS_TRUST_CERTS_FILE", "MAGNETAR_ETCD_TLS_CERT_FILE", "MAGNETAR_ETCD_TLS_KEY_FILE")


def test_flags_and_config():
    parser = argparse.ArgumentParser()
    add_etcd_tls_arguments(parser)
    assert not etcd_tls_from_args(parser.parse_args([])).enabled
    config = etcd_tls_from_args(parser.parse_args(["--etcd-tls-trust-certs-file", "ca.pem"]))
    assert config.enabled and config == EtcdTlsConfig(trust_certs_file="ca.pem")
    assert EtcdTlsConfig(cert_file="c", key_file="k").enabled
    with pytest.raises(ConfigError, match="go together"):
        EtcdTlsConfig(cert_file="c")
    assert set(FLAGS) <= set(mapped_flags(parser))


def test_files_read_at_start_and_kept_when_they_go(tmp_path):
    pki = make_pki(str(tmp_path), "etcd")
    with pytest.raises(ConfigError, match="--etcd-tls-trust-certs-file"):
        CredentialFiles(EtcdTlsConfig(trust_certs_file=str(tmp_path / "missing.pem")))
    files = CredentialFiles(EtcdTlsConfig(pki.ca_file, pki.client_cert_file, pki.client_key_file))
    assert files.credentials() is not None
    (tmp_path / "etcd-client-key.pem").unlink()
    assert files.credentials() is not None   # the last good contents


def test_every_process_that_talks_to_etcd_takes_them_from_the_environment():
    from magnetar.cli import parse_command_line

    environ = dict(zip(FLAGS, ("ca.pem", "client.pem", "client-key.pem")))
    expected = EtcdTlsConfig("ca.pem", "client.pem", "client-key.pem")
    for argv in (["broker", "--metadata", "etcd://127.0.0.1:2379"],
                 ["bookie", "--metadata", "etcd://127.0.0.1:2379", "--journal-dir", "j", "--ledger-dir", "l"],
                 ["autorecovery", "--metadata", "etcd://127.0.0.1:2379"],
                 ["shell", "--metadata", "etcd://127.0.0.1:2379", "listbookies"]):
        assert etcd_tls_from_args(parse_command_line(argv, environ)) == expected, argv[0]
