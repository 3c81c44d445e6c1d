"""The context a server calls its peers with (runtime/tls.py ``peer_client_context``:
a broker reaching another broker's HTTPS for an admin call on its partitions), against
a real TLS server on loopback that checks client certificates when offered (what a
broker's HTTPS does with ``--tls-trust-certs-file``).

Proves that: a certificate made for servers only (no clientAuth usage) is not
presented — presented, the server refuses the handshake, which is what the plain client
context does with it —; a dual-use certificate is presented and the server sees its CN;
the peer's certificate is checked against the CA but not against the host name the
peer is reached at (an address its certificate does not name); a peer whose certificate
another CA signed is refused; the context is built once and again only when its
certificate files change.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time

import pytest

from common.errors import ConfigError
from runtime.tls import (PeerClientContexts, TlsConfig, certificate_common_name, client_context,
                        peer_client_context, server_context, usable_as_client_certificate)
from tests.tls_certs import make_pki


async def _exchange(server: TlsConfig, client: ssl.SSLContext) -> tuple[bytes, str | None]:
    """(what the client read back, the CN the server saw or None); b"" when the server
    refused the handshake (TLS 1.3 tells the client only when it reads)."""
    seen: list[str | None] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(certificate_common_name(writer.get_extra_info("peercert")))
        await reader.read(1)
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_context(server))
    port = listener.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="127.0.0.1")
        writer.write(b"x")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(2), 10)
        writer.close()
        return answer, (seen[0] if seen else None)
    except (ssl.SSLError, ConnectionError):
        return b"", None
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_server_only_certificate_is_not_presented_to_a_peer(tmp_path):
    pki = make_pki(str(tmp_path), "peers")       # serverAuth only
    broker = TlsConfig(cert_file=pki.cert_file, key_file=pki.key_file, trust_certs_file=pki.ca_file)
    assert not usable_as_client_certificate(pki.cert_file)
    assert usable_as_client_certificate(pki.client_cert_file)
    # Presented as the plain client context does, the peer refuses the handshake.
    assert (await _exchange(broker, client_context(broker, verify_hostname=False)))[0] == b""
    assert await _exchange(broker, peer_client_context(broker)) == (b"ok", None)


async def test_a_dual_use_certificate_is_presented_and_names_the_caller(tmp_path):
    pki = make_pki(str(tmp_path), "dual", server_cn="broker-a", dual_use=True)
    broker = TlsConfig(cert_file=pki.cert_file, key_file=pki.key_file, trust_certs_file=pki.ca_file)
    assert usable_as_client_certificate(pki.cert_file)
    assert await _exchange(broker, peer_client_context(broker)) == (b"ok", "broker-a")


async def test_the_peer_is_checked_against_the_ca_not_the_address_it_is_reached_at(tmp_path):
    pki = make_pki(str(tmp_path / "a"), "named", server_names=("broker-0.example",))
    peer = TlsConfig(cert_file=pki.cert_file, key_file=pki.key_file, trust_certs_file=pki.ca_file)
    # Reached at 127.0.0.1, which the certificate does not name: accepted (CA checked).
    assert (await _exchange(peer, peer_client_context(peer)))[0] == b"ok"
    # A peer whose certificate another CA signed: refused.
    other = make_pki(str(tmp_path / "b"), "other")
    stranger = TlsConfig(cert_file=other.cert_file, key_file=other.key_file)
    assert (await _exchange(stranger, peer_client_context(peer)))[0] == b""


def test_an_unreadable_certificate_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read TLS certificate"):
        usable_as_client_certificate(str(tmp_path / "absent.pem"))


async def test_the_peer_context_is_built_once_and_again_when_its_files_change(tmp_path):
    pki = make_pki(str(tmp_path / "first"), "kept", dual_use=True, server_cn="broker-a")
    broker = TlsConfig(cert_file=pki.cert_file, key_file=pki.key_file, trust_certs_file=pki.ca_file)
    contexts = PeerClientContexts(broker)
    first = contexts.current()
    assert contexts.current() is first and contexts.builds == 1
    # A rotated certificate (new files in place, as a mounted Secret is replaced): the
    # next call builds a context that presents it.
    rotated = make_pki(str(tmp_path / "second"), "kept", dual_use=True, server_cn="broker-b")
    for source, target in ((rotated.cert_file, pki.cert_file), (rotated.key_file, pki.key_file),
                           (rotated.ca_file, pki.ca_file)):
        with open(source, "rb") as handle:
            data = handle.read()
        with open(target, "wb") as handle:
            handle.write(data)
        os.utime(target, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    second = contexts.current()
    assert second is not first and contexts.builds == 2
    server = TlsConfig(cert_file=rotated.cert_file, key_file=rotated.key_file, trust_certs_file=rotated.ca_file)
    assert await _exchange(server, second) == (b"ok", "broker-b")
    assert contexts.current() is second and contexts.builds == 2
