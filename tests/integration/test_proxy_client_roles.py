"""Through an authenticating proxy, brokers authorize the CLIENT's role for everything,
and a client's short-lived tokens are renewed through it (real etcd, bookie, broker
and proxy processes; the official client and raw frames).

Broker: token authentication and authorization, ``--proxy-roles proxy-role``, a
permission check every second. Two proxies with the brokers' key and a token of
``proxy-role``: one that names its clients only (``original_principal``), one that also
forwards their tokens (``--forward-auth-data``).

Proves:
- the lookup-phase requests (LOOKUP, PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE,
  GET_SCHEMA) of a client without permission on a namespace are refused through the
  proxy, although the proxy's own role is granted there (and is let in when it asks
  itself); a granted client gets them; a pattern subscription of the official client
  goes through for the granted role only;
- a client whose token supplier gives 2-second tokens keeps producing and consuming
  through the forwarding proxy past many expiries: the broker's AUTH_CHALLENGE on the
  piped connection is answered with the client's fresh token, which the broker
  verifies; the proxy challenges the client's lookup connection itself and takes its
  fresh token; a client whose supplier keeps giving the expired token is closed by both;
  through a proxy that does not forward tokens, the proxy closes the piped connection
  at the client's expiry (the broker sees only the proxy's credential) and the client
  reconnects with a fresh token, losing nothing.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
import urllib.request
import uuid

import pulsar
import pytest

from runtime.tokens import TokenSigner
from protocol.codec import encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from tests import frame_exchange, token_files
from tests.cluster import Cluster

SUPERUSER = "admin-role"
PROXY_ROLE = "proxy-role"
T = pb.BaseCommand


@pytest.fixture(scope="module")
def secured(etcd_process, tmp_path_factory):
    base = tmp_path_factory.mktemp("proxy-client-roles")
    key_path, signer = token_files.secret_key_file(str(base))
    proxy_token = token_files.token_file(str(base), "proxy.token", signer, PROXY_ROLE)
    cluster = Cluster(etcd_process, str(base))
    proxy_args = ["--authentication-enabled", "--token-secret-key", f"file://{key_path}",
                  "--broker-token-file", proxy_token]

    async def start() -> None:
        await cluster.start_bookies(1)
        await cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--authentication-enabled", "--authorization-enabled", "--superuser-roles", SUPERUSER,
            "--proxy-roles", PROXY_ROLE, "--token-secret-key", f"file://{key_path}",
            "--permission-check-interval-s", "1"])
        await asyncio.gather(cluster.proxy(extra_args=proxy_args).start(),
                             cluster.proxy(extra_args=[*proxy_args, "--forward-auth-data"]).start())

    try:
        asyncio.run(start())
        yield cluster, signer
    finally:
        asyncio.run(cluster.stop())


def admin(cluster: Cluster, signer: TokenSigner, method: str, path: str, body: bytes) -> None:
    request = urllib.request.Request(f"{cluster.brokers[0].web_service_url}/admin/v2/{path}", data=body,
                                     method=method,
                                     headers={"Authorization": f"Bearer {signer.create(SUPERUSER)}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 204)


def namespace_granted_to(cluster: Cluster, signer: TokenSigner, *roles: str) -> str:
    namespace = f"public/roles-{uuid.uuid4().hex[:6]}"
    admin(cluster, signer, "PUT", f"namespaces/{namespace}", b"{}")
    for role in roles:
        admin(cluster, signer, "POST", f"namespaces/{namespace}/permissions/{role}", b'["produce", "consume"]')
    return namespace


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def connect_frame(token: str) -> bytes:
    return encode_command(wrap(pb.CommandConnect(client_version="roles-test", protocol_version=20,
                                                 auth_method_name="token", auth_data=token.encode())))


def ask(port: int, token: str, request: pb.BaseCommand) -> pb.BaseCommand:
    """CONNECT with ``token`` on a new connection to ``port``, then ``request``: its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        frames = frame_exchange.exchange(sock, [connect_frame(token), encode_command(request)], 10.0, count=2)
    assert [f.command.type for f in frames][:1] == [T.CONNECTED], frames
    assert len(frames) == 2, f"no answer to {request.type}: {frames}"
    return frames[1].command


def lookup_phase_requests(namespace: str, topic: str) -> dict[str, pb.BaseCommand]:
    return {
        "topics": wrap(pb.CommandGetTopicsOfNamespace(request_id=11, namespace=namespace)),
        "lookup": wrap(pb.CommandLookupTopic(request_id=12, topic=topic)),
        "metadata": wrap(pb.CommandPartitionedTopicMetadata(request_id=13, topic=topic)),
        "schema": wrap(pb.CommandGetSchema(request_id=14, topic=topic)),
    }


def refused(name: str, answer: pb.BaseCommand) -> bool:
    """The answer to the request ``name`` is an AuthorizationError."""
    if name == "topics":
        return answer.type == T.ERROR and answer.error.error == pb.AuthorizationError
    if name == "lookup":
        body = answer.lookupTopicResponse
        return (answer.type == T.LOOKUP_RESPONSE and body.response == pb.CommandLookupTopicResponse.Failed
                and body.error == pb.AuthorizationError)
    if name == "metadata":
        body = answer.partitionMetadataResponse
        return (answer.type == T.PARTITIONED_METADATA_RESPONSE and body.error == pb.AuthorizationError
                and body.response == pb.CommandPartitionedTopicMetadataResponse.Failed)
    assert name == "schema"
    return answer.type == T.GET_SCHEMA_RESPONSE and answer.getSchemaResponse.error_code == pb.AuthorizationError


def failed_listings(cluster: Cluster) -> float:
    metrics = urllib.request.urlopen(f"{cluster.proxies[0].http_url}/metrics", timeout=10).read().decode()
    found = re.search(r'^magnetar_proxy_lookups_total\{command="get_topics_of_namespace",outcome="error"\} (\S+)$',
                      metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_lookups_topic_lists_and_schemas_are_authorized_as_the_client(secured):
    cluster, signer = secured
    alice, bob = f"alice-{uuid.uuid4().hex[:4]}", f"bob-{uuid.uuid4().hex[:4]}"
    # The proxy's own role is granted here: asked as the proxy, bob would get it all.
    namespace = namespace_granted_to(cluster, signer, alice, PROXY_ROLE)
    topic = f"persistent://{namespace}/with-schema"
    direct = pulsar.Client(cluster.brokers[0].service_url,
                           authentication=pulsar.AuthenticationToken(signer.create(SUPERUSER)),
                           operation_timeout_seconds=30)
    try:
        direct.create_producer(topic, schema=pulsar.schema.StringSchema()).send("hello")
    finally:
        direct.close()
    requests = lookup_phase_requests(namespace, topic)
    proxy_port = port_of(cluster.proxies[0].service_url)

    # The proxy's role itself may do all four (straight to the broker, no one named).
    for name, request in requests.items():
        answer = ask(cluster.brokers[0].port, signer.create(PROXY_ROLE), request)
        assert not refused(name, answer), (name, answer)
    # bob through the proxy: all four refused, by the broker, for bob.
    for name, request in requests.items():
        answer = ask(proxy_port, signer.create(bob), request)
        assert refused(name, answer), (name, answer)
        assert answer.type != T.ERROR or bob in answer.error.message, answer
    # alice through the proxy: all four answered.
    answers = {name: ask(proxy_port, signer.create(alice), request) for name, request in requests.items()}
    assert answers["topics"].type == T.GET_TOPICS_OF_NAMESPACE_RESPONSE, answers["topics"]
    assert topic in answers["topics"].getTopicsOfNamespaceResponse.topics
    assert answers["lookup"].lookupTopicResponse.response == pb.CommandLookupTopicResponse.Connect
    assert answers["lookup"].lookupTopicResponse.proxy_through_service_url
    assert answers["metadata"].type == T.PARTITIONED_METADATA_RESPONSE
    assert not answers["metadata"].partitionMetadataResponse.HasField("error"), answers["metadata"]
    schema = answers["schema"].getSchemaResponse
    assert not schema.HasField("error_code") and schema.schema.type == pb.Schema.String, answers["schema"]

    # The official client: a pattern subscription lists the namespace's topics through
    # the proxy (GET_TOPICS_OF_NAMESPACE): alice's goes through, bob's is refused (the
    # C++ client reports any failed listing as LookupError: the proxy's counter of
    # failed listings says it was the broker's answer).
    pattern = re.compile(f"persistent://{namespace}/with-.*")
    for role, allowed in ((alice, True), (bob, False)):
        client = pulsar.Client(cluster.proxies[0].service_url,
                               authentication=pulsar.AuthenticationToken(signer.create(role)),
                               operation_timeout_seconds=15)
        failed_before = failed_listings(cluster)
        try:
            if allowed:
                client.subscribe(pattern, "s").close()
                assert failed_listings(cluster) == failed_before
            else:
                with pytest.raises((pulsar.AuthorizationError, pulsar.LookupError)):
                    client.subscribe(pattern, "s")
                assert failed_listings(cluster) > failed_before
        finally:
            client.close()
    # Every client gone: the links that named them are closed with them.
    deadline = time.monotonic() + 10
    while True:
        metrics = urllib.request.urlopen(f"{cluster.proxies[0].http_url}/metrics", timeout=10).read().decode()
        if re.search(r"^magnetar_proxy_client_links_open 0\.0$", metrics, re.M) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert re.search(r"^magnetar_proxy_client_links_open 0\.0$", metrics, re.M), \
        [line for line in metrics.splitlines() if "client_links" in line]
    assert "Traceback" not in cluster.proxies[0].log_text()


def test_short_lived_tokens_are_renewed_through_the_proxy(secured):
    cluster, signer = secured
    fresh_role, stale_role = f"fresh-{uuid.uuid4().hex[:4]}", f"stale-{uuid.uuid4().hex[:4]}"
    plain_role = f"plain-{uuid.uuid4().hex[:4]}"
    namespace = namespace_granted_to(cluster, signer, fresh_role, stale_role, plain_role)
    proxy = cluster.proxies[1]   # --forward-auth-data
    plain_proxy = cluster.proxies[0]   # names its clients only
    stale_tokens: list[str] = []

    def fresh_token() -> str:
        return signer.create(fresh_role, expiry_s=2)

    def stale_token() -> str:
        if not stale_tokens:
            stale_tokens.append(signer.create(stale_role, expiry_s=2))
        return stale_tokens[0]

    fresh = pulsar.Client(proxy.service_url, authentication=pulsar.AuthenticationToken(fresh_token),
                          operation_timeout_seconds=10)
    stale = pulsar.Client(proxy.service_url, authentication=pulsar.AuthenticationToken(stale_token),
                          operation_timeout_seconds=10)
    # Through the proxy that does not forward tokens: the broker cannot renew the piped
    # connection, so the proxy closes it at the client's expiry and the client comes
    # back with a fresh token (reconnecting, as from a broker that closes).
    plain = pulsar.Client(plain_proxy.service_url,
                          authentication=pulsar.AuthenticationToken(lambda: signer.create(plain_role, expiry_s=2)),
                          operation_timeout_seconds=10)
    try:
        topic = f"persistent://{namespace}/refresh"
        consumer = fresh.subscribe(topic, "s")
        producer = fresh.create_producer(topic)
        stale.create_producer(f"persistent://{namespace}/stale")
        plain_topic = f"persistent://{namespace}/plain"
        plain_consumer = plain.subscribe(plain_topic, "s")
        plain_producer = plain.create_producer(plain_topic)
        sent = []
        started = time.monotonic()
        while time.monotonic() < started + 5:   # past two expiries and the checks after them
            payload = f"m{len(sent)}".encode()
            producer.send(payload)
            plain_producer.send(payload)
            sent.append(payload)
            time.sleep(0.25)
        # A lookup after the expiries, on the same lookup connection.
        assert fresh.get_topic_partitions(topic) == [topic]
        assert [consumer.receive(timeout_millis=10_000).data() for _ in sent] == sent
        # The plain proxy's client: every message, once its consumer is back (what was
        # not acknowledged before a close comes again).
        plain_got: set[bytes] = set()
        while plain_got != set(sent):
            message = plain_consumer.receive(timeout_millis=10_000)
            plain_consumer.acknowledge(message)
            plain_got.add(message.data())
        assert re.search(rf"client credential expired on a piped connection the broker cannot renew, closing: "
                         rf"peer=\S+ role={plain_role}\b", plain_proxy.log_text())
        broker_log, proxy_log = cluster.brokers[0].log_text(), proxy.log_text()
        # The piped connections: the broker challenged, the client's fresh token came back.
        assert len(re.findall(rf"credential refreshed: peer=\S+ role={fresh_role} method=token",
                              broker_log)) >= 2, broker_log[-3000:]
        assert not re.search(rf"closing connection: peer=\S+ role={fresh_role}\b", broker_log)
        # The lookup connection: the proxy challenged it itself.
        assert re.search(rf"client credential refreshed: peer=\S+ role={fresh_role}\b", proxy_log), proxy_log[-3000:]
        assert not re.search(rf"closing: peer=\S+ role={fresh_role}\b", proxy_log)
        # The stale client's expired token is refused on both.
        assert re.search(rf"credential refresh failed, closing connection: peer=\S+ role={stale_role} "
                         rf"method=token error=the token has expired", broker_log)
        assert re.search(rf"client credential refresh failed, closing: peer=\S+ role={stale_role} "
                         rf"error=the token has expired", proxy_log)
        assert "Traceback" not in proxy_log
    finally:
        fresh.close()
        stale.close()
        plain.close()
