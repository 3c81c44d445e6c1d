"""Clients without credentials on a broker with authentication, authorization and an
anonymous role (Pulsar's ``anonymousUserRole``): etcd, 1 bookie, 1 broker with token
authentication, authorization on and ``--anonymous-role anonymous``, driven by the
official pulsar-client configured with no authentication (it presents the auth method
``none``) and by plain HTTP without an Authorization header.

Proves: such a client is the anonymous role. Where that role has ``produce`` and
``consume`` granted it produces and consumes, over the binary lookup (``pulsar://``) and
over the HTTP lookup (``http://``); where it has only ``consume`` it subscribes but its
producer is refused with AuthorizationError; where it has nothing both are refused with
AuthorizationError (never AuthenticationError: it is authenticated, as anonymous; over
the HTTP lookup the client reports the lookup's 403 as ConnectError); a
token still names its own role beside it. The admin REST gives a request without
credentials the same role: 200 on a tenant that has ``anonymous`` among its admins, 403
(not 401) on one that has not and on superuser paths.
(A broker without an anonymous role refuses the same client with AuthenticationError:
tests/integration/test_security_auth.py.)
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request

import pulsar
import pytest

from runtime.tokens import TokenSigner, create_secret_key
from tests.cluster import Cluster, unique

SUPERUSER = "admin-role"
ANONYMOUS = "anonymous"


@pytest.fixture(scope="module")
def anonymous_broker(etcd_process, tmp_path_factory):
    """Yields (broker, superuser token, token signer)."""
    base = tmp_path_factory.mktemp("anonymous")
    key = create_secret_key()
    key_path = os.path.join(str(base), "secret.key")
    with open(key_path, "wb") as handle:
        handle.write(key)
    cluster = Cluster(etcd_process, str(base))
    try:
        asyncio.run(cluster.start_bookies(1))
        asyncio.run(cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--authentication-enabled", "--authorization-enabled", "--superuser-roles", SUPERUSER,
            "--token-secret-key", f"file://{key_path}", "--anonymous-role", ANONYMOUS]))
        signer = TokenSigner.with_secret_key(key)
        yield cluster.brokers[0], signer.create(SUPERUSER), signer
    finally:
        asyncio.run(cluster.stop())


def http(method: str, url: str, token: str | None = None, body: object = None) -> tuple[int, object]:
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


def _namespaces(admin_url: str, superuser: str, tenant_admins: list[str]) -> str:
    """A new tenant with namespaces ``open`` (anonymous may produce and consume),
    ``read`` (consume only) and ``closed`` (nothing granted)."""
    tenant = unique("anon")
    assert http("PUT", f"{admin_url}/admin/v2/tenants/{tenant}", superuser,
                {"adminRoles": tenant_admins, "allowedClusters": ["standalone"]})[0] == 204
    for namespace, actions in (("open", ["produce", "consume"]), ("read", ["consume"]), ("closed", None)):
        assert http("PUT", f"{admin_url}/admin/v2/namespaces/{tenant}/{namespace}", superuser)[0] == 204
        if actions is not None:
            assert http("POST", f"{admin_url}/admin/v2/namespaces/{tenant}/{namespace}/permissions/{ANONYMOUS}",
                        superuser, actions)[0] == 204
    return tenant


def test_a_client_without_credentials_is_the_anonymous_role(anonymous_broker):
    """The official client with no authentication produces and consumes where the
    anonymous role is granted (binary and HTTP lookups) and gets AuthorizationError
    where it is not."""
    broker, superuser, _ = anonymous_broker
    tenant = _namespaces(broker.web_service_url, superuser, tenant_admins=[])
    for service_url in (broker.service_url, broker.web_service_url):
        client = pulsar.Client(service_url, operation_timeout_seconds=10, connection_timeout_ms=5000)
        try:
            topic = f"persistent://{tenant}/open/{unique('t')}"
            consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            producer = client.create_producer(topic)
            producer.send(b"anonymous hello")
            message = consumer.receive(timeout_millis=10_000)
            assert message.data() == b"anonymous hello"
            consumer.acknowledge(message)

            read_topic = f"persistent://{tenant}/read/{unique('t')}"
            client.subscribe(read_topic, "s").close()
            with pytest.raises(pulsar.AuthorizationError):
                client.create_producer(read_topic)

            # Refused at the lookup: over the binary protocol an AuthorizationError; over
            # HTTP the client reports the 403 of its partitions request as ConnectError.
            refused = pulsar.AuthorizationError if service_url.startswith("pulsar") else pulsar.ConnectError
            closed_topic = f"persistent://{tenant}/closed/{unique('t')}"
            with pytest.raises(refused):
                client.create_producer(closed_topic)
            with pytest.raises(refused):
                client.subscribe(closed_topic, "s")
        finally:
            client.close()
    # What the anonymous role produced, the superuser reads too: one topic, one role each.
    stats = http("GET", f"{broker.web_service_url}/admin/v2/persistent/{tenant}/open/"
                        f"{topic.rsplit('/', 1)[1]}/stats", superuser)
    assert stats[0] == 200 and stats[1]["msgInCounter"] == 1, stats


def test_a_token_beside_the_anonymous_role_is_its_own_role(anonymous_broker):
    """A valid token is not anonymous: a role with no grant is refused where anonymous
    would be let in; a bad token is an AuthenticationError, never anonymous."""
    broker, superuser, signer = anonymous_broker
    tenant = _namespaces(broker.web_service_url, superuser, tenant_admins=[])
    topic = f"persistent://{tenant}/open/{unique('t')}"
    client = pulsar.Client(broker.service_url, authentication=pulsar.AuthenticationToken(signer.create("nobody")),
                           operation_timeout_seconds=10, connection_timeout_ms=5000)
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(topic)
    finally:
        client.close()
    client = pulsar.Client(broker.service_url, authentication=pulsar.AuthenticationToken("not.a.token"),
                           operation_timeout_seconds=10, connection_timeout_ms=5000)
    try:
        with pytest.raises(pulsar.AuthenticationError):
            client.create_producer(topic)
    finally:
        client.close()


def test_admin_requests_without_credentials_are_the_anonymous_role(anonymous_broker):
    """No Authorization header: the anonymous role, authorized like any other (200 where
    it is a tenant admin, 403 elsewhere; never 401)."""
    broker, superuser, _ = anonymous_broker
    admin_url = broker.web_service_url
    administered = _namespaces(admin_url, superuser, tenant_admins=[ANONYMOUS])
    other = _namespaces(admin_url, superuser, tenant_admins=["someone-else"])
    status, namespaces = http("GET", f"{admin_url}/admin/v2/namespaces/{administered}")
    assert status == 200 and sorted(namespaces) == [f"{administered}/closed", f"{administered}/open",
                                                    f"{administered}/read"], namespaces
    assert http("PUT", f"{admin_url}/admin/v2/namespaces/{administered}/made-anonymously")[0] == 204
    assert http("GET", f"{admin_url}/admin/v2/namespaces/{other}")[0] == 403
    assert http("GET", f"{admin_url}/admin/v2/tenants")[0] == 403
    assert http("GET", f"{admin_url}/admin/v2/clusters")[0] == 403
    # A lookup over HTTP: allowed where a grant is, refused where none is.
    assert http("GET", f"{admin_url}/lookup/v2/topic/persistent/{other}/open/{unique('t')}")[0] == 200
    assert http("GET", f"{admin_url}/lookup/v2/topic/persistent/{other}/closed/{unique('t')}")[0] == 403
