"""``magnetar standalone`` in the secured configuration Pulsar's own Python-client CI
runs its tests against, started as a user would (docs: README "A secured standalone as
Pulsar's client CI configures one"): TLS on the binary and HTTPS listeners beside the
plain ones, the tls, token and basic providers, authorization on, ``anonymous`` as the
anonymous role and ``localhost,superUser,admin`` as superusers; the tenants, namespaces
and grants put in through the admin REST over HTTPS.

Proves, with the official pulsar-client over ``pulsar+ssl://`` (hostname checked
against the test CA's certificate): a client certificate (role = its CN, granted on the
namespace), a token of ``superUser`` and the basic user ``admin`` each produce and
consume on ``private/auth``; a client configured without authentication (method
``none``) is the anonymous role, producing and consuming on ``public/default`` where that
role is granted, AuthorizationError on ``private/auth`` where it is not; the client over
``https://`` (its lookups over HTTPS) with its certificate produces and consumes; a wrong
password is an AuthenticationError. The admin REST over HTTPS answers each provider as
its role (certificate: 200 where its CN is tenant admin, 403 on superuser paths; token
and basic superusers: 200; no credentials: anonymous, 200 on ``public`` which it
administers — a partitioned topic made and read back — and 403 elsewhere, never 401; a
wrong password: 401). ``public/default-4`` (created with its grant and
``encryption_required`` in the body) refuses a plain producer with MetadataError (the
client retries it until its operation timeout, as against Pulsar) and
takes an encrypting one, whose message a consumer with the key reads.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import bcrypt
import pulsar
import pytest

from runtime.tokens import TokenSigner, create_secret_key
from tests.cluster import free_port, python_command, unique
from tests.raw_pulsar import RawConnection
from tests.tls_certs import make_pki

BASIC_PASSWORD = "123456"   # Pulsar's CI user 'admin' has this password too; a test value
CERT_ROLE = "ci-client"     # the CN make_pki gives the client certificate of CA "ci"
SUPERUSERS = "localhost,superUser,admin"
TOKEN_ROLE = "token-principal"   # the CI's token subject, granted on private/auth only


@pytest.fixture(scope="module")
def ci_standalone(tmp_path_factory):
    """The standalone, started with the CI's configuration; yields a dict of what the
    tests need. Stopped (SIGTERM, then waited for) at the end."""
    base = str(tmp_path_factory.mktemp("pulsar-ci"))
    pki = make_pki(os.path.join(base, "pki"), "ci")
    users = os.path.join(base, "users.htpasswd")
    with open(users, "wb") as handle:
        handle.write(b"admin:" + bcrypt.hashpw(BASIC_PASSWORD.encode(), bcrypt.gensalt(rounds=4)) + b"\n")
    key = create_secret_key()
    key_path = os.path.join(base, "secret.key")
    with open(key_path, "wb") as handle:
        handle.write(key)
    ports = {name: free_port() for name in ("etcd", "peer", "bookie", "http", "broker", "broker_http", "gateway",
                                             "autorecovery", "tls", "https")}
    command = python_command(
        "standalone", "--auth", "--token-secret-key", key_path, "--basic-auth-file", users,
        "--authentication-providers", "tls,token,basic", "--anonymous-role", "anonymous",
        "--superuser-roles", SUPERUSERS,
        "--tls-cert-file", pki.cert_file, "--tls-key-file", pki.key_file, "--tls-trust-certs-file", pki.ca_file,
        "--data-dir", os.path.join(base, "data"), "--bookies", "1", "--copies", "1",
        "--etcd-port", str(ports["etcd"]), "--etcd-peer-port", str(ports["peer"]),
        "--bookie-port-base", str(ports["bookie"]), "--bookie-http-port-base", str(ports["http"]),
        "--broker-port", str(ports["broker"]), "--broker-http-port", str(ports["broker_http"]),
        "--broker-tls-port", str(ports["tls"]), "--broker-https-port", str(ports["https"]),
        "--gateway-port", str(ports["gateway"]), "--autorecovery-http-port", str(ports["autorecovery"]))

    output_path = os.path.join(base, "standalone.out")
    with open(output_path, "wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    ready = None
    deadline = time.monotonic() + 120
    while ready is None:
        with open(output_path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        ready_lines = [line for line in text.splitlines() if "standalone ready" in line]
        if ready_lines:
            ready = json.loads(ready_lines[0])
        elif process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail("the standalone did not become ready:\n" + text)
        else:
            time.sleep(0.2)
    try:
        signer = TokenSigner.with_secret_key(key)
        assert ready["service_url_tls"] == f"pulsar+ssl://localhost:{ports['tls']}", ready
        assert ready["admin_url_tls"] == f"https://localhost:{ports['https']}", ready
        assert ready["authentication_providers"] == ["tls", "token", "basic"] and ready["anonymous_role"] == "anonymous"
        setup = {"pki": pki, "ready": ready, "superuser": signer.create("superUser"), "signer": signer}
        _ci_tenants(setup)
        yield setup
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _https(setup: dict, method: str, path: str, *, token: str | None = None, basic: tuple[str, str] | None = None,
           client_cert: bool = False, body: object = None) -> tuple[int, object]:
    pki = setup["pki"]
    context = ssl.create_default_context(cafile=pki.ca_file)
    if client_cert:
        context.load_cert_chain(pki.client_cert_file, pki.client_key_file)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if basic is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(setup["ready"]["admin_url_tls"] + path, data=data, method=method,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        return error.code, json.loads(text) if text else None


def _ci_tenants(setup: dict) -> None:
    """What the CI puts in before its tests (its setup script), through the admin REST
    over HTTPS as the token superuser: tenant ``public`` administered by ``anonymous``,
    ``public/default`` granted to ``anonymous``; ``public/default-4`` created with its
    grant and ``encryption_required`` in the creation body (the JSON form of the CI's
    setup); tenant ``private`` with ``private/auth`` granted to the token role
    ``token-principal`` — and, beyond the CI's, to the client certificate's role, which
    also administers ``private`` here (so its admin calls have something to be allowed)."""
    superuser = setup["superuser"]
    assert _https(setup, "POST", "/admin/v2/tenants/public", token=superuser,
                  body={"adminRoles": ["anonymous"], "allowedClusters": ["standalone"]})[0] == 204
    assert _https(setup, "POST", "/admin/v2/namespaces/public/default/permissions/anonymous", token=superuser,
                  body=["produce", "consume"])[0] == 204
    assert _https(setup, "PUT", "/admin/v2/namespaces/public/default-4", token=superuser, body={
        "auth_policies": {"namespace_auth": {"anonymous": ["produce", "consume"]}},
        "encryption_required": True, "replication_clusters": ["standalone"]})[0] == 204
    assert _https(setup, "GET", "/admin/v2/namespaces/public/default-4/encryptionRequired",
                  token=superuser) == (200, True)
    assert _https(setup, "PUT", "/admin/v2/tenants/private", token=superuser,
                  body={"adminRoles": [CERT_ROLE], "allowedClusters": ["standalone"]})[0] == 204
    assert _https(setup, "PUT", "/admin/v2/namespaces/private/auth", token=superuser)[0] == 204
    for role in (TOKEN_ROLE, CERT_ROLE):
        assert _https(setup, "POST", f"/admin/v2/namespaces/private/auth/permissions/{role}", token=superuser,
                      body=["produce", "consume"])[0] == 204


def _client(setup: dict, authentication, service_url: str | None = None) -> pulsar.Client:
    return pulsar.Client(service_url or setup["ready"]["service_url_tls"], authentication=authentication,
                         tls_trust_certs_file_path=setup["pki"].ca_file, tls_validate_hostname=True,
                         tls_allow_insecure_connection=False, operation_timeout_seconds=10,
                         connection_timeout_ms=5000)


def _round_trip(client: pulsar.Client, topic: str, payload: bytes) -> None:
    consumer = client.subscribe(topic, "ci-sub", initial_position=pulsar.InitialPosition.Earliest)
    client.create_producer(topic).send(payload)
    message = consumer.receive(timeout_millis=10_000)
    assert message.data() == payload
    consumer.acknowledge(message)


def test_each_provider_over_pulsar_ssl(ci_standalone):
    """tls (certificate), token (token-principal) and basic (the superuser admin) each
    produce and consume as their role on private/auth, over pulsar+ssl:// and, with the
    certificate, over https:// lookups; the token role, granted nothing on
    public/default-4, is refused there."""
    pki = ci_standalone["pki"]
    providers = {
        "tls": pulsar.AuthenticationTLS(pki.client_cert_file, pki.client_key_file),
        "token": pulsar.AuthenticationToken(ci_standalone["signer"].create(TOKEN_ROLE)),
        "basic": pulsar.AuthenticationBasic("admin", BASIC_PASSWORD),
    }
    for name, authentication in providers.items():
        client = _client(ci_standalone, authentication)
        try:
            _round_trip(client, f"persistent://private/auth/{unique('ci-' + name)}", f"via {name}".encode())
        finally:
            client.close()
    client = _client(ci_standalone, pulsar.AuthenticationTLS(pki.client_cert_file, pki.client_key_file),
                     service_url=ci_standalone["ready"]["admin_url_tls"])
    try:
        _round_trip(client, f"persistent://private/auth/{unique('ci-https-lookup')}", b"via https lookups")
    finally:
        client.close()
    client = _client(ci_standalone, pulsar.AuthenticationToken(ci_standalone["signer"].create(TOKEN_ROLE)))
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(f"persistent://public/default-4/{unique('ci-token')}")
    finally:
        client.close()
    client = _client(ci_standalone, pulsar.AuthenticationBasic("admin", "wrong"))
    try:
        with pytest.raises(pulsar.AuthenticationError):
            client.create_producer(f"persistent://private/auth/{unique('ci-wrong')}")
    finally:
        client.close()


def test_no_authentication_is_the_anonymous_role_over_pulsar_ssl(ci_standalone):
    """The official client with no authentication (method ``none``) produces and consumes
    on public/default (granted to ``anonymous``) and is refused on private/auth."""
    client = _client(ci_standalone, None)
    try:
        _round_trip(client, f"persistent://public/default/{unique('ci-anonymous')}", b"anonymous over tls")
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(f"persistent://private/auth/{unique('ci-anonymous')}")
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(f"persistent://private/auth/{unique('ci-anonymous')}", "s")
    finally:
        client.close()


def _rsa_key_files(directory) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_path, private_path = str(directory / "rsa-public.pem"), str(directory / "rsa-private.pem")
    with open(public_path, "wb") as handle:
        handle.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    with open(private_path, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    return public_path, private_path


def test_encryption_required_refuses_a_plain_producer(ci_standalone, tmp_path):
    """public/default-4 requires encryption: the anonymous client's plain producer is
    refused (MetadataError, as Pulsar answers, which the client retries until its
    operation timeout),
    one encrypting with an RSA key reader produces, and a consumer with the private key
    reads the message back."""
    topic = f"persistent://public/default-4/{unique('ci-encrypted')}"
    impatient = pulsar.Client(ci_standalone["ready"]["service_url_tls"],
                              tls_trust_certs_file_path=ci_standalone["pki"].ca_file, operation_timeout_seconds=3)
    try:
        # The client retries a MetadataError until its operation timeout (so it does
        # against Pulsar, which answers the same).
        with pytest.raises(pulsar.Timeout):
            impatient.create_producer(topic)
    finally:
        impatient.close()
    raw = RawConnection(ci_standalone["ready"]["service_url"])   # plain port, no credentials: anonymous
    try:
        raw.send(raw.pb.CommandProducer(topic=topic, producer_id=1, request_id=1))
        answer = raw.next_command()
        assert answer.error.error == raw.pb.MetadataError and "encryption is required" in answer.error.message, \
            answer
    finally:
        raw.close()
    client = _client(ci_standalone, None)
    try:
        keys = pulsar.CryptoKeyReader(*_rsa_key_files(tmp_path))
        consumer = client.subscribe(topic, "enc-sub", crypto_key_reader=keys,
                                    initial_position=pulsar.InitialPosition.Earliest)
        client.create_producer(topic, encryption_key="ci-key", crypto_key_reader=keys).send(b"sealed")
        assert consumer.receive(timeout_millis=10_000).data() == b"sealed"
    finally:
        client.close()


def test_admin_rest_over_https_with_each_provider(ci_standalone):
    """Each provider over HTTPS is its role: the certificate administers ``private``
    (its tenant) but not the cluster; the token and basic superusers list tenants; no
    credentials is anonymous (403); a wrong password is 401."""
    status, namespaces = _https(ci_standalone, "GET", "/admin/v2/namespaces/private", client_cert=True)
    assert (status, namespaces) == (200, ["private/auth"])
    assert _https(ci_standalone, "GET", "/admin/v2/tenants", client_cert=True)[0] == 403
    for credentials in ({"token": ci_standalone["superuser"]}, {"basic": ("admin", BASIC_PASSWORD)}):
        status, tenants = _https(ci_standalone, "GET", "/admin/v2/tenants", **credentials)
        assert status == 200 and {"public", "private"} <= set(tenants), (credentials.keys(), status, tenants)
    assert _https(ci_standalone, "GET", "/admin/v2/tenants")[0] == 403
    assert _https(ci_standalone, "GET", "/admin/v2/namespaces/private")[0] == 403
    # Anonymous administers public (as the CI sets it up): the suites' own admin calls
    # without credentials, such as making a partitioned topic, are allowed there.
    parted = unique("ci-parted")
    assert _https(ci_standalone, "PUT", f"/admin/v2/persistent/public/default/{parted}/partitions", body=3)[0] == 204
    assert _https(ci_standalone, "GET", f"/admin/v2/persistent/public/default/{parted}/partitions") == \
        (200, {"partitions": 3})
    assert _https(ci_standalone, "GET", "/admin/v2/tenants", basic=("admin", "wrong"))[0] == 401
    # A token of a role that is no superuser is authenticated, then refused.
    assert _https(ci_standalone, "GET", "/admin/v2/tenants",
                  token=ci_standalone["signer"].create("someone"))[0] == 403
