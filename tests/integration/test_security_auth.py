"""Token authentication and authorization on a real broker (etcd, 1 bookie, 1 broker
with ``--authentication-enabled --authorization-enabled``), driven by the official
pulsar-client and plain HTTP.

Proves: a valid token produces and consumes; no token, a token signed with another
key and an expired token are AuthenticationError (never a hang); a role without
``produce`` gets AuthorizationError on create_producer, and a grant through Pulsar's
permission endpoint lets it in without a restart; revoking closes its producer; the
admin REST answers 401 without a token, 403 for a role that is not a superuser or
tenant admin; `magnetar admin namespaces grant-permission|permissions|revoke-permission`
drive the same endpoints; the limits against abuse hold (a connection without CONNECT,
and one stalling inside a frame, are closed after their deadlines while one that keeps
completing frames is not; connections from one address past the limit are closed at
once and the room comes back; producers per topic past the limit get ProducerBusy; an
admin body over the limit gets 413); and no log of the run holds a token or the key.
"""

from __future__ import annotations

import asyncio
import base64
import glob
import json
import os
import re
import struct
import time
import urllib.error
import urllib.request

import pulsar
import pytest

from runtime.tokens import TokenSigner, create_secret_key
from protocol import commands
from protocol.codec import encode_command
from protocol.proto import pulsar_api_pb2 as pb
from tests.cluster import Cluster, run_cli, unique

SUPERUSER = "admin-role"
# The bookie refuses adds and reads without a service token of one of these roles.
BROKER_ROLE = "broker-service"
RECOVERY_ROLE = "autorecovery-service"
# The broker's limit in this module: above what the tests' clients and the gateway
# hold (a few connections), small enough to reach.
CONNECTIONS_PER_ADDRESS_MAX = 16


@pytest.fixture(scope="module")
def secured(etcd_process, tmp_path_factory):
    """A cluster with token auth on; yields (cluster, signer, key path)."""
    base = tmp_path_factory.mktemp("secured")
    key = create_secret_key()
    key_path = os.path.join(str(base), "secret.key")
    with open(key_path, "wb") as handle:
        handle.write(key)
    cluster = Cluster(etcd_process, str(base))
    signer = TokenSigner.with_secret_key(key)
    broker_token_path = os.path.join(str(base), "broker.token")
    with open(broker_token_path, "w") as handle:
        handle.write(signer.create(BROKER_ROLE))
    try:
        asyncio.run(cluster.start_bookies(1, extra_args=[
            "--authentication-enabled", "--token-secret-key", f"file://{key_path}",
            "--allowed-roles", f"{BROKER_ROLE},{RECOVERY_ROLE}"]))
        asyncio.run(cluster.start_brokers(1, extra_args=[
            "--bookie-auth-token-file", broker_token_path, "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--authentication-enabled", "--authorization-enabled", "--superuser-roles", SUPERUSER,
            "--token-secret-key", f"file://{key_path}", "--permission-check-interval-s", "1",
            # Small limits, for the limit tests at the end of this module.
            "--connect-timeout-s", "2", "--frame-timeout-s", "2", "--connections-per-address-max",
            str(CONNECTIONS_PER_ADDRESS_MAX), "--producers-per-topic-max", "2"]))
        # The gateway: callers' tokens checked by the broker; its own (superuser) token
        # from a file, as in production.
        token_path = os.path.join(str(base), "gateway.token")
        with open(token_path, "w") as handle:
            handle.write(signer.create(SUPERUSER))
        asyncio.run(cluster.start_gateways(1, extra_args=["--authentication-enabled",
                                                          "--service-token-file", token_path]))
        yield cluster, signer, key
    finally:
        asyncio.run(cluster.stop())


def http(method: str, url: str, token: str | None, body: object = None) -> tuple[int, object]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        return error.code, json.loads(text) if text else None


def client_with(service_url: str, token: str | None) -> pulsar.Client:
    auth = pulsar.AuthenticationToken(token) if token is not None else None
    return pulsar.Client(service_url, authentication=auth, operation_timeout_seconds=10,
                         connection_timeout_ms=5000)


def new_namespace(admin_url: str, superuser_token: str) -> str:
    tenant = unique("sec")
    assert http("PUT", f"{admin_url}/admin/v2/tenants/{tenant}", superuser_token,
                {"adminRoles": [], "allowedClusters": ["standalone"]})[0] == 204
    assert http("PUT", f"{admin_url}/admin/v2/namespaces/{tenant}/ns", superuser_token)[0] == 204
    return f"{tenant}/ns"


def test_valid_token_produces_and_consumes_and_bad_ones_fail(secured):
    """The superuser's token produces and consumes; no token, a wrong signature and an
    expired token all fail with AuthenticationError."""
    cluster, signer, _ = secured
    broker = cluster.brokers[0]
    token = signer.create(SUPERUSER)
    topic = f"persistent://public/default/{unique('auth')}"
    client = client_with(broker.service_url, token)
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        producer.send(b"hello")
        assert consumer.receive(timeout_millis=10_000).data() == b"hello"
    finally:
        client.close()

    other_key = TokenSigner.with_secret_key(create_secret_key())
    expired = signer.create(SUPERUSER, expiry_s=-60)
    for bad in (None, other_key.create(SUPERUSER), expired):
        client = client_with(broker.service_url, bad)
        try:
            with pytest.raises(pulsar.AuthenticationError):
                client.create_producer(topic)
        finally:
            client.close()


def test_produce_permission_granted_and_revoked_live(secured):
    """A role without produce gets AuthorizationError; a grant works at once; a revoke
    closes its producer (the next send fails)."""
    cluster, signer, _ = secured
    broker = cluster.brokers[0]
    admin_url = broker.web_service_url
    superuser = signer.create(SUPERUSER)
    namespace = new_namespace(admin_url, superuser)
    topic = f"persistent://{namespace}/{unique('t')}"
    role = unique("app")
    client = client_with(broker.service_url, signer.create(role))
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(topic)
        path = f"{admin_url}/admin/v2/namespaces/{namespace}/permissions/{role}"
        assert http("POST", path, superuser, ["produce"])[0] == 204
        assert http("GET", f"{admin_url}/admin/v2/namespaces/{namespace}/permissions", superuser) == \
            (200, {role: ["produce"]})
        # A short send timeout: after the revoke the client cannot attach the producer
        # again, and its sends fail when this runs out.
        producer = client.create_producer(topic, send_timeout_millis=2000)
        producer.send(b"allowed")
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(topic, "no-consume")
        assert http("DELETE", path, superuser)[0] == 204
        stats_path = f"{admin_url}/admin/v2/persistent/{topic.removeprefix('persistent://')}/stats"
        deadline = time.monotonic() + 30
        while http("GET", stats_path, superuser)[1]["publishers"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert http("GET", stats_path, superuser)[1]["publishers"] == []   # the broker closed it
        deadline = time.monotonic() + 30
        failed = False
        while time.monotonic() < deadline and not failed:
            try:
                producer.send(b"after revoke")
                time.sleep(0.2)
            except pulsar.PulsarException:
                failed = True
        assert failed, "the producer kept sending after its permission was revoked"
    finally:
        client.close()


def test_expired_token_refreshed_by_auth_challenge(secured):
    """Tokens of 2 s and a permission check every 1 s: a client whose token supplier
    gives fresh tokens answers the broker's AUTH_CHALLENGE and its connection stays
    open while it produces and consumes past its first token's expiry; a client whose
    supplier keeps giving the expired token is closed after its answer."""
    cluster, signer, _ = secured
    broker = cluster.brokers[0]
    admin_url = broker.web_service_url
    superuser = signer.create(SUPERUSER)
    namespace = new_namespace(admin_url, superuser)
    fresh_role, stale_role = unique("fresh"), unique("stale")
    for role in (fresh_role, stale_role):
        assert http("POST", f"{admin_url}/admin/v2/namespaces/{namespace}/permissions/{role}", superuser,
                    ["produce", "consume"])[0] == 204
    supplied = []

    def fresh_token() -> str:
        supplied.append(time.monotonic())
        return signer.create(fresh_role, expiry_s=2)

    stale_tokens: list[str] = []

    def stale_token() -> str:
        # Made at the first CONNECT (valid then however slow the steps before it were),
        # and the same one ever after.
        if not stale_tokens:
            stale_tokens.append(signer.create(stale_role, expiry_s=2))
        return stale_tokens[0]

    fresh = pulsar.Client(broker.service_url, authentication=pulsar.AuthenticationToken(fresh_token),
                          operation_timeout_seconds=10)
    stale = pulsar.Client(broker.service_url, authentication=pulsar.AuthenticationToken(stale_token),
                          operation_timeout_seconds=10)
    try:
        topic = f"persistent://{namespace}/{unique('refresh')}"
        consumer = fresh.subscribe(topic, "s")
        producer = fresh.create_producer(topic)
        stale.create_producer(f"persistent://{namespace}/{unique('stale')}")
        sent = []
        deadline = time.monotonic() + 5   # past the first token's expiry and the check after it
        while time.monotonic() < deadline:
            payload = f"m{len(sent)}".encode()
            producer.send(payload)
            sent.append(payload)
            time.sleep(0.25)
        assert [consumer.receive(timeout_millis=10_000).data() for _ in sent] == sent
        log = broker.log_text()
        assert len(re.findall(rf"credential refreshed: peer=\S+ role={fresh_role} method=token", log)) >= 1, \
            supplied
        assert not re.search(rf"closing connection: peer=\S+ role={fresh_role}\b", log)
        assert re.search(rf"credential refresh failed, closing connection: peer=\S+ role={stale_role} "
                         rf"method=token error=the token has expired", log)
    finally:
        fresh.close()
        stale.close()


def test_admin_rest_needs_a_token_and_the_right_role(secured):
    """401 without a token or with a bad one, 403 for a role that is neither superuser
    nor tenant admin, 2xx for the superuser and for the tenant's admin on its tenant."""
    cluster, signer, _ = secured
    admin_url = cluster.brokers[0].web_service_url
    superuser = signer.create(SUPERUSER)
    namespace = new_namespace(admin_url, superuser)
    tenant = namespace.split("/")[0]
    status, doc = http("GET", f"{admin_url}/admin/v2/tenants", None)
    assert status == 401 and doc["error"] == "AuthenticationFailed", doc
    assert http("GET", f"{admin_url}/admin/v2/tenants", "not-a-token")[0] == 401
    nobody = signer.create(unique("nobody"))
    status, doc = http("GET", f"{admin_url}/admin/v2/namespaces/{namespace}", nobody)
    assert status == 403 and doc["error"] == "AuthorizationDenied", doc
    assert http("PUT", f"{admin_url}/admin/v2/tenants/{unique('x')}", nobody,
                {"allowedClusters": ["standalone"]})[0] == 403
    assert http("GET", f"{admin_url}/admin/v2/tenants", superuser)[0] == 200
    tenant_admin = unique("owner")
    assert http("POST", f"{admin_url}/admin/v2/tenants/{tenant}", superuser,
                {"adminRoles": [tenant_admin], "allowedClusters": ["standalone"]})[0] == 204
    owner = signer.create(tenant_admin)
    assert http("GET", f"{admin_url}/admin/v2/namespaces/{namespace}", owner)[0] == 200
    assert http("GET", f"{admin_url}/admin/v2/clusters", owner)[0] == 403
    # The HTTP lookup checks produce/consume like the binary one; /health stays open.
    assert http("GET", f"{admin_url}/lookup/v2/topic/persistent/{namespace}/t", nobody)[0] == 403
    assert http("GET", f"{admin_url}/lookup/v2/topic/persistent/{namespace}/t", owner)[0] == 200
    assert http("GET", f"{admin_url}/health", None)[0] == 200


async def test_admin_cli_grants_lists_and_revokes(secured):
    """`magnetar admin --token ... namespaces grant-permission|permissions|revoke-permission`
    (401 without a token is shown by the REST test)."""
    cluster, signer, _ = secured
    admin_url = cluster.brokers[0].web_service_url
    superuser = signer.create(SUPERUSER)
    namespace = new_namespace(admin_url, superuser)
    role = unique("cli")
    env_args = ["admin", "--admin-url", admin_url, "--token", superuser, "namespaces"]
    code, out, err = await run_cli(*env_args, "grant-permission", namespace, "--role", role,
                                   "--actions", "produce,consume")
    assert code == 0, err
    code, out, err = await run_cli(*env_args, "permissions", namespace)
    assert code == 0, err
    assert json.loads(out) == {role: ["consume", "produce"]}
    code, out, err = await run_cli(*env_args, "revoke-permission", namespace, "--role", role)
    assert code == 0, err
    assert http("GET", f"{admin_url}/admin/v2/namespaces/{namespace}/permissions", superuser) == (200, {})


async def test_gateway_uses_its_renewed_service_token_without_a_restart(secured, tmp_path):
    """The gateway's token file replaced twice while it runs (as a mounted Secret is):
    first by a token expiring in 5 s, which its first broker connection then presents;
    then by a renewed token. Past the first one's expiry the broker challenges the
    connection and the gateway answers with the renewed token (the connection stays and
    produces), and its admin requests (topic stats) carry the renewed token too.
    Without reading the file again, the broker would close the connection at expiry
    and refuse every reconnection with the expired token."""
    import aiohttp

    cluster, signer, _ = secured
    admin_url = cluster.brokers[0].web_service_url
    superuser = signer.create(SUPERUSER)
    namespace = new_namespace(admin_url, superuser)
    token_path = tmp_path / "gateway.token"
    token_path.write_text(signer.create(SUPERUSER, expiry_s=600))
    (gateway,) = await cluster.start_gateways(1, extra_args=["--authentication-enabled",
                                                             "--service-token-file", str(token_path)])

    # The file is looked at when the token is needed, at most every 2 s
    # (common/tokens.KEY_RECHECK_S): the first connection, after this wait, reads it.
    expiring_at = time.monotonic() + 5
    token_path.write_text(signer.create(SUPERUSER, expiry_s=5))
    os.utime(token_path, ns=(time.time_ns() + 10_000_000,) * 2)
    await asyncio.sleep(2.3)
    topic_url = f"{gateway.url}/v1/topics/persistent/{namespace}/{unique('renewed')}"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {superuser}"}) as session:
        # The first connection to the broker: CONNECT with the token that expires.
        async with session.post(f"{topic_url}/message", json={"payload": "before"}) as response:
            assert response.status == 200, await response.text()
        assert gateway.log_text().count("token file read again") == 1
        token_path.write_text(signer.create(SUPERUSER, expiry_s=600))
        os.utime(token_path, ns=(time.time_ns() + 20_000_000,) * 2)
        # Past the expiry and the broker's next check (every second) after it.
        await asyncio.sleep(max(0.0, expiring_at + 2.5 - time.monotonic()))
        for index in range(3):
            async with session.post(f"{topic_url}/message", json={"payload": f"after-{index}"}) as response:
                assert response.status == 200, await response.text()
        async with session.get(f"{topic_url}/stats") as response:
            assert response.status == 200, await response.text()
    log = gateway.log_text()
    assert "credentials refreshed on the broker's challenge" in log
    assert log.count("token file read again") == 2


async def test_gateway_forwards_the_callers_token_for_authorization(secured):
    """The gateway answers 401 without a bearer token or with a bad one, 403 for a role
    without the permission the request needs (produce to produce, consume for a
    subscription), and serves the request once the broker says the role may."""
    import aiohttp

    cluster, signer, _ = secured
    admin_url = cluster.brokers[0].web_service_url
    superuser = signer.create(SUPERUSER)
    namespace = new_namespace(admin_url, superuser)
    topic_url = f"{cluster.gateways[0].url}/v1/topics/persistent/{namespace}/{unique('g')}"
    role = unique("http")
    token = signer.create(role)
    message = {"payload": "hello"}
    async with aiohttp.ClientSession() as session:
        async def call(method, url, bearer, body):
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            async with session.request(method, url, json=body, headers=headers) as response:
                return response.status, await response.json(content_type=None)

        assert (await call("POST", f"{topic_url}/message", None, message))[0] == 401
        status, doc = await call("POST", f"{topic_url}/message", "bad.token.here", message)
        assert status == 401 and doc["error"] == "AuthenticationFailed", doc
        status, doc = await call("POST", f"{topic_url}/message", token, message)
        assert status == 403 and doc["error"] == "AuthorizationDenied", doc
        assert http("POST", f"{admin_url}/admin/v2/namespaces/{namespace}/permissions/{role}", superuser,
                    ["produce"])[0] == 204
        # The refusal may be cached for the permission cache's time (2 s).
        deadline = time.monotonic() + 20
        while True:
            status, doc = await call("POST", f"{topic_url}/message", token, message)
            if status == 200 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        assert status == 200, doc
        sub_url = f"{topic_url}/subscriptions/s"
        assert (await call("PUT", sub_url, token, {"initial_position": "earliest"}))[0] == 403
        assert (await call("PUT", sub_url, superuser, {"initial_position": "earliest"}))[0] in (200, 201)
        status, doc = await call("POST", f"{sub_url}/pull", superuser, {"max_messages": 1, "wait_ms": 5000})
        assert status == 200 and [m["payload"] for m in doc["messages"]] == ["hello"], doc


def _address(secured) -> tuple[str, int]:
    host, port = secured[0].brokers[0].service_url.removeprefix("pulsar://").rsplit(":", 1)
    return host, int(port)


def _connect_frame() -> bytes:
    return encode_command(commands.wrap(pb.CommandConnect(client_version="limits-test", protocol_version=20)))


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True if the peer closes before ``timeout_s`` (whatever it sent before)."""
    try:
        async with asyncio.timeout(timeout_s):
            while await reader.read(65536):
                pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True   # refused with a reset (the broker aborts connections past a limit)
    except TimeoutError:
        return False


async def test_connect_and_frame_deadlines(secured):
    host, port = _address(secured)
    # No CONNECT at all.
    reader, writer = await asyncio.open_connection(host, port)
    assert await _closed_within(reader, 20)
    writer.close()
    # CONNECT, then half a frame (its size prefix and a few bytes) and nothing more.
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(_connect_frame())
    writer.write(struct.pack(">II", 100, 96) + b"\x08")
    await writer.drain()
    assert await _closed_within(reader, 20)
    writer.close()
    # A connection that keeps completing PINGs, each sent in two halves, lives on.
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(_connect_frame())
    ping = encode_command(commands.ping())
    started = time.monotonic()
    while time.monotonic() - started < 3:
        writer.write(ping[:3])
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(ping[3:])
        await writer.drain()
        await asyncio.sleep(0.05)
    assert not await _closed_within(reader, 0.5)
    writer.close()


async def test_connections_per_address(secured):
    """Two more connections than the limit are opened: the broker closes those past it
    at once (the module's gateway holds some too), never keeps more than the limit
    open, and once the held ones are closed there is room again."""
    host, port = _address(secured)
    opened = []
    for _ in range(CONNECTIONS_PER_ADDRESS_MAX + 2):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(_connect_frame())
            await writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            pass   # refused already
        opened.append((reader, writer))
        await asyncio.sleep(0.02)
    closed = await asyncio.gather(*(_closed_within(reader, 1.5) for reader, _ in opened))
    assert sum(closed) >= 2, closed
    assert len(closed) - sum(closed) <= CONNECTIONS_PER_ADDRESS_MAX, closed
    for _, writer in opened:
        writer.close()
    await asyncio.sleep(1.0)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(_connect_frame())
    await writer.drain()
    assert not await _closed_within(reader, 1.0)   # room again
    writer.close()


def test_producers_per_topic_and_http_body_limit(secured):
    cluster, signer, _ = secured
    token = signer.create(SUPERUSER)
    client = client_with(cluster.brokers[0].service_url, token)
    try:
        topic = f"persistent://public/default/{unique('limit')}"
        producers = [client.create_producer(topic) for _ in range(2)]
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        producers[0].close()
        client.create_producer(topic).send(b"room again")
    finally:
        client.close()
    body = json.dumps({"adminRoles": ["x" * 2_000_000], "allowedClusters": ["standalone"]}).encode()
    request = urllib.request.Request(f"{cluster.brokers[0].web_service_url}/admin/v2/tenants/{unique('big')}",
                                     data=body, method="PUT", headers={"Content-Type": "application/json",
                                                                       "Authorization": f"Bearer {token}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 413


def test_probes_and_metrics_answer_without_a_token(secured):
    """What the kubelet and Prometheus call carries no token: with auth on everywhere,
    the probes and /metrics of the broker, the gateway and the bookie still answer,
    while the broker's admin REST does not."""
    cluster, _, _ = secured
    broker = cluster.brokers[0].web_service_url
    bookie = "http://" + cluster.bookies[0].http_address
    gateway = cluster.gateways[0].url
    urls = [f"{broker}{path}" for path in ("/health", "/live", "/ready", "/metrics")]
    urls += [f"{bookie}{path}" for path in ("/health", "/live", "/ready", "/metrics")]
    urls += [f"{gateway}{path}" for path in ("/health", "/live", "/metrics")]
    for url in urls:
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200, url
    assert http("GET", f"{broker}/admin/v2/clusters", None)[0] == 401


async def test_shell_reaches_token_requiring_bookies_with_a_token_file(secured, tmp_path):
    """`magnetar shell simpletest` (a ledger written through the bookie) and `readledger`
    work with --bookie-auth-token-file of an allowed role; without a token, and with a
    token of a role the bookie does not allow, the bookie refuses the reads."""
    cluster, signer, _ = secured
    metadata = cluster.metadata_url
    allowed = tmp_path / "recovery.token"
    allowed.write_text(signer.create(RECOVERY_ROLE))
    other = tmp_path / "other.token"
    other.write_text(signer.create("someone-else"))
    code, out, err = await run_cli("shell", "--metadata", metadata, "--bookie-auth-token-file", str(allowed),
                                   "simpletest", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
                                   "--entries", "20", "--size", "64")
    assert code == 0, (out, err)
    ledger = str(json.loads(out.strip().splitlines()[-1])["ledger_id"])
    read = ["readledger", "--ledger", ledger, "--check-pattern"]
    code, out, err = await run_cli("shell", "--metadata", metadata, "--bookie-auth-token-file", str(allowed), *read)
    assert code == 0, (out, err)
    for refused, status in (([], "UNAUTHENTICATED"), (["--bookie-auth-token-file", str(other)], "PERMISSION_DENIED")):
        code, out, err = await run_cli("shell", "--metadata", metadata, *refused, *read, timeout_s=60)
        assert code != 0 and status in out + err, (refused, out, err)


def test_no_token_or_key_in_any_log(secured):
    """Runs last in this module: every log file of the cluster is free of every token
    used above (the superuser's is deterministic for its claims) and of the key, raw
    or in base64."""
    cluster, signer, key = secured
    secrets = [signer.create(SUPERUSER), base64.b64encode(key).decode()]
    logs = glob.glob(os.path.join(cluster.base_dir, "**", "*.log"), recursive=True)
    assert logs
    for path in logs:
        with open(path, "rb") as handle:
            content = handle.read()
        assert key not in content, path
        for secret in secrets:
            assert secret.encode() not in content, path
        # No JWT at all (header of every token: {"alg":"HS256","typ":"JWT"} in base64url).
        assert b"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9" not in content, path
