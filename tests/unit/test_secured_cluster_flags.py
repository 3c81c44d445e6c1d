"""The client-side flags a secured Kubernetes cluster needs (k8s/README.md, "Security").

What it proves: `magnetar autorecovery` and `magnetar shell` take the same bookie TLS flags
as brokers (mutual TLS toward bookies that serve only TLS) and they reach the ledger
client's config, from flags and from MAGNETAR_* variables; `magnetar admin` takes the
brokers' CA for an https:// admin URL and completes a request against a TLS server whose
certificate only that CA signs; the gateway's --no-broker-tls-hostname-verification reaches
its client config; and the Pulsar-protocol client with hostname verification off accepts a
broker certificate signed by the trusted CA that does not name the host dialled (a broker
pod's IP in Kubernetes), while with it on (the default) the same certificate is refused,
and a certificate from another CA is refused either way.
How: the CLI's own parser; a local asyncio TLS server answering CONNECTED; the test PKI of
tests/tls_certs.py.
"""

from __future__ import annotations

import asyncio
import json
import ssl

import pytest
from aiohttp import web

from common.errors import ServiceNotReady
from magnetar import cli
from protocol.codec import encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from tests.tls_certs import make_pki

FILES = {"MAGNETAR_BOOKIE_TLS": "true", "MAGNETAR_BOOKIE_TLS_TRUST_CERTS_FILE": "/tls/ca.pem",
         "MAGNETAR_BOOKIE_TLS_CERT_FILE": "/tls/tls.crt", "MAGNETAR_BOOKIE_TLS_KEY_FILE": "/tls/tls.key",
         "MAGNETAR_BOOKIE_AUTH_TOKEN_FILE": "/auth/x.token"}


def _check_ledger_config(config) -> None:
    assert config.bookie_tls_enabled is True
    assert (config.bookie_tls.trust_certs_file, config.bookie_tls.cert_file, config.bookie_tls.key_file) == (
        "/tls/ca.pem", "/tls/tls.crt", "/tls/tls.key")
    assert config.bookie_auth_token_file == "/auth/x.token"


def test_every_ledger_client_process_takes_the_bookie_tls_flags():
    from broker.main import ledger_config_from_args as broker_ledger
    from ledger.config import bookie_client_security, LedgerClientConfig
    from magnetar.autorecovery import ledger_config_from_args as recovery_ledger

    _check_ledger_config(broker_ledger(cli.parse_command_line(["broker", "--metadata", "etcd://e:2379/m"], FILES)))
    _check_ledger_config(recovery_ledger(cli.parse_command_line(["autorecovery", "--metadata", "etcd://e:2379/m"],
                                                                FILES)))
    shell = cli.parse_command_line(["shell", "listbookies"], FILES)
    _check_ledger_config(LedgerClientConfig(**bookie_client_security(shell)))
    # The same as flags on the command line, and nothing set without them.
    flags = ["--bookie-tls", "--bookie-tls-trust-certs-file", "/tls/ca.pem", "--bookie-tls-cert-file", "/tls/tls.crt",
             "--bookie-tls-key-file", "/tls/tls.key", "--bookie-auth-token-file", "/auth/x.token"]
    _check_ledger_config(recovery_ledger(cli.parse_command_line(
        ["autorecovery", "--metadata", "etcd://e:2379/m", *flags], {})))
    _check_ledger_config(LedgerClientConfig(**bookie_client_security(cli.parse_command_line(
        ["shell", *flags, "listbookies"], {}))))
    plain = recovery_ledger(cli.parse_command_line(["autorecovery", "--metadata", "etcd://e:2379/m"], {}))
    assert plain.bookie_tls_enabled is False and plain.bookie_auth_token_file == ""


def test_gateway_hostname_verification_switch():
    from gateway.main import config_from_args

    base = ["gateway", "--service-url", "pulsar+ssl://b:6651", "--admin-url", "https://b:8443"]
    assert config_from_args(cli.parse_command_line(base, {})).broker_tls_hostname_verification is True
    off = cli.parse_command_line(base, {"MAGNETAR_NO_BROKER_TLS_HOSTNAME_VERIFICATION": "true"})
    assert config_from_args(off).broker_tls_hostname_verification is False


async def _https_site(cert_file: str, key_file: str, handler=None) -> tuple[web.AppRunner, str]:
    """An HTTPS server answering GET /admin/v2/clusters (with ``handler``, or the list of
    clusters); (runner, its https://127.0.0.1 URL)."""
    async def clusters(request: web.Request) -> web.Response:
        return web.json_response(["magnetar"])

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    app = web.Application()
    app.router.add_get("/admin/v2/clusters", handler or clusters)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return runner, f"https://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def test_admin_over_https_with_the_brokers_ca(tmp_path):
    """`magnetar admin --tls-trust-certs-file` (the preStop drain of a broker without
    plain ports) reaches an HTTPS server whose CA only that file holds; with
    --no-tls-hostname-verification also one whose certificate does not name the host (a
    redirect to a topic's owner at its pod IP), still only with the right CA."""
    from magnetar.tools.admin_client import AdminClient, AdminError

    def get(url: str, args) -> object:
        client = AdminClient(url, tls_trust_certs_file=args.tls_trust_certs_file,
                             tls_hostname_verification=args.tls_hostname_verification)
        return json.loads(client.get("/admin/v2/clusters").body)

    def parse(url: str, ca_file: str, *flags: str):
        return cli.parse_command_line(["admin", "--admin-url", url, "--tls-trust-certs-file", ca_file, *flags,
                                       "clusters", "list"], {})

    pki = make_pki(str(tmp_path), "admin")     # names localhost and 127.0.0.1
    runner, url = await _https_site(pki.cert_file, pki.key_file)
    try:
        assert await asyncio.to_thread(get, url, parse(url, pki.ca_file)) == ["magnetar"]
        with pytest.raises(AdminError):     # the system's CAs do not know this one
            await asyncio.to_thread(AdminClient(url).get, "/admin/v2/clusters")
    finally:
        await runner.cleanup()
    unnamed = make_pki(str(tmp_path / "unnamed"), "unnamed", server_names=("magnetar-broker.magnetar",))
    runner, url = await _https_site(unnamed.cert_file, unnamed.key_file)
    try:
        with pytest.raises(AdminError):
            await asyncio.to_thread(get, url, parse(url, unnamed.ca_file))
        off = parse(url, unnamed.ca_file, "--no-tls-hostname-verification")
        assert await asyncio.to_thread(get, url, off) == ["magnetar"]
        with pytest.raises(AdminError):     # another CA: refused with verification off too
            await asyncio.to_thread(get, url, parse(url, pki.ca_file, "--no-tls-hostname-verification"))
    finally:
        await runner.cleanup()


async def test_admin_does_not_follow_an_https_redirect_to_plain_http_with_its_token(tmp_path):
    """A server answering an HTTPS request with a redirect to plain HTTP (an older
    broker did for a topic another broker owns): with a token the client stops there
    and says why; the plain server never sees the token."""
    from magnetar.tools.admin_client import AdminClient, AdminError

    seen: list[str | None] = []

    async def plain(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response(["magnetar"])

    plain_app = web.Application()
    plain_app.router.add_get("/admin/v2/clusters", plain)
    plain_runner = web.AppRunner(plain_app)
    await plain_runner.setup()
    plain_site = web.TCPSite(plain_runner, "127.0.0.1", 0)
    await plain_site.start()
    plain_url = f"http://127.0.0.1:{plain_site._server.sockets[0].getsockname()[1]}"

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(location=f"{plain_url}{request.path_qs}")

    pki = make_pki(str(tmp_path), "redirect")
    runner, url = await _https_site(pki.cert_file, pki.key_file, handler=redirect)
    try:
        client = AdminClient(url, token="s3cret", tls_trust_certs_file=pki.ca_file)
        with pytest.raises(AdminError, match="in the clear") as refused:
            await asyncio.to_thread(client.get, "/admin/v2/clusters")
        assert "s3cret" not in str(refused.value)
        assert seen == []
        # Without a token there is nothing to protect: followed.
        answer = await asyncio.to_thread(AdminClient(url, tls_trust_certs_file=pki.ca_file).get, "/admin/v2/clusters")
        assert json.loads(answer.body) == ["magnetar"] and seen == [None]
    finally:
        await runner.cleanup()
        await plain_runner.cleanup()


async def _connected_server(cert_file: str, key_file: str) -> asyncio.Server:
    """A TLS server that answers any bytes with CONNECTED (all the client's open needs)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(1024)
            writer.write(encode_command(wrap(pb.CommandConnected(server_version="test", protocol_version=19))))
            await writer.drain()
            await reader.read(1024)
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)


async def test_client_hostname_verification_off_still_checks_the_ca(tmp_path):
    from client.config import ClientConfig
    from client.connection import ClientConnection

    # The broker's certificate names only a Service name, not 127.0.0.1 (as a pod IP is not).
    pki = make_pki(str(tmp_path / "a"), "broker", server_names=("magnetar-broker.magnetar",))
    other = make_pki(str(tmp_path / "b"), "other")
    server = await _connected_server(pki.cert_file, pki.key_file)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        off = ClientConfig(tls_enabled=True, tls_trust_certs_file=pki.ca_file, tls_hostname_verification=False,
                           connect_timeout_ms=5_000)
        connection = await ClientConnection.open(address, off)
        assert connection.server_version == "test"
        connection.close()
        with pytest.raises(ServiceNotReady):     # the default: the name must match
            await ClientConnection.open(address, ClientConfig(tls_enabled=True, tls_trust_certs_file=pki.ca_file,
                                                              connect_timeout_ms=5_000))
        with pytest.raises(ServiceNotReady):     # another CA: refused with verification off too
            await ClientConnection.open(address, ClientConfig(tls_enabled=True, tls_trust_certs_file=other.ca_file,
                                                              tls_hostname_verification=False,
                                                              connect_timeout_ms=5_000))
    finally:
        server.close()
        await server.wait_closed()
