"""Admin calls on a partitioned topic split between two secured brokers (token and
client-certificate authentication, authorization on): what the broker that was asked
presents to the other one.

Proves that:
- a broker given ``--broker-client-token-file`` (a token of a role the other brokers
  list as superuser, as Pulsar's brokerClientAuthentication) reaches the partitions the
  other broker serves for a caller known only by its client certificate — over plain
  HTTP, where that certificate cannot go along: the subscription is created on every
  partition and the list comes back whole;
- a request that came over HTTPS is redirected to the owner's HTTPS URL (before, to
  its plain one: the caller's token followed in the clear), a plain one to plain;
- a broker without one passes the caller's credentials on: a token caller is served,
  and a certificate-only caller is refused with 401 naming the partition and the owner
  (the limit the option removes), and nothing is half done by the refused list;
- the request itself is still authorized as the caller: a role that is no superuser and
  has no grant is refused (403) by the broker that was asked, before any partition is
  touched, although that broker holds a superuser token for the others;
- brokers without plain ports reach each other over HTTPS with certificates made for
  servers only (no clientAuth usage) that do not name the address the brokers advertise:
  the owner's certificate is checked against the CA, not the host name (pod IPs in
  Kubernetes), and a broker does not present a server-only certificate as a client's
  (the other broker, which checks client certificates, refused that handshake before).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import urllib.error
import urllib.request

import pulsar

from runtime.tokens import TokenSigner, create_secret_key
from tests.cluster import Cluster, unique, wait_until
from tests.tls_certs import make_pki

PARTITIONS = 8
CERT_ROLE = "split-client"        # the CN make_pki gives the client certificate of CA "split"
BROKER_ROLE = "magnetar-broker"
_TLS_URLS = re.compile(r"service_url_tls=(\S+) web_service_url_tls=(\S+)")


def _call(method: str, url: str, *, pki=None, token: str | None = None, body: object = None,
          certificate: bool = False) -> tuple[int, object]:
    """(status, JSON answer or None); over HTTPS with the test CA (and the client
    certificate when asked), a GET following redirects with the same credentials."""
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=pki.ca_file)
        context.check_hostname = False     # brokers advertise 127.0.0.1; some test certificates do not name it
        if certificate:
            context.load_cert_chain(pki.client_cert_file, pki.client_key_file)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            text = response.read()
            return response.status, (json.loads(text) if text.strip() else None)
    except urllib.error.HTTPError as error:
        text = error.read()
        try:
            return error.code, (json.loads(text) if text.strip() else None)
        except ValueError:
            return error.code, text.decode(errors="replace")     # e.g. a PUT's 307 (not followed)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args, **_kwargs):
        return None      # the 307 comes back as an HTTPError to look at


def _redirect_location(url: str, token: str, pki) -> str:
    """Where a broker redirects a GET of ``url`` (asserting it does)."""
    handlers: list = [_NoRedirect()]
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=pki.ca_file)
        context.check_hostname = False
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        opener.open(urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}), timeout=30).close()
    except urllib.error.HTTPError as redirect:
        assert redirect.code == 307, redirect.code
        return redirect.headers["Location"]
    raise AssertionError(f"{url} was not redirected")


def _owner(broker_url: str, namespace: str, index: int, token: str, pki=None) -> str:
    context = None
    if broker_url.startswith("https://"):
        context = ssl.create_default_context(cafile=pki.ca_file)
        context.check_hostname = False
    request = urllib.request.Request(f"{broker_url}/admin/v2/persistent/{namespace}/orders-partition-{index}/stats",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        return response.geturl().split("/admin/")[0]


def _keys(base: str) -> tuple[str, TokenSigner, str]:
    """(the token secret key's file, a signer with it, a file holding a token of
    BROKER_ROLE) under ``base``."""
    key = create_secret_key()
    key_path = os.path.join(base, "secret.key")
    with open(key_path, "wb") as handle:
        handle.write(key)
    signer = TokenSigner.with_secret_key(key)
    broker_token_path = os.path.join(base, "broker.token")
    with open(broker_token_path, "w") as handle:
        handle.write(signer.create(BROKER_ROLE))
    return key_path, signer, broker_token_path


def _split_topic(admin_url: str, lookup_url: str, service_url: str, namespace: str, client_token: str, pki,
                 **credentials) -> list[str]:
    """Creates ``namespace`` (8 bundles) and its partitioned topic ``orders`` through
    ``admin_url`` (with ``credentials`` as ``_call`` takes them), has every partition
    written with ``client_token`` (so each is owned), and returns each partition's owner
    URL as ``lookup_url``'s redirects say, asserting the test's premise: the partitions
    are split between the two brokers."""
    token = client_token
    assert _call("PUT", f"{admin_url}/admin/v2/namespaces/{namespace}", pki=pki,
                 body={"bundles": {"numBundles": 8}}, **credentials)[0] in (200, 204)
    assert _call("PUT", f"{admin_url}/admin/v2/persistent/{namespace}/orders/partitions", pki=pki,
                 body=PARTITIONS, **credentials)[0] in (200, 204)
    client = pulsar.Client(service_url, operation_timeout_seconds=30, tls_trust_certs_file_path=pki.ca_file,
                           authentication=pulsar.AuthenticationToken(token))
    try:
        producer = client.create_producer(f"persistent://{namespace}/orders", batching_enabled=False,
                                          message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
        for i in range(2 * PARTITIONS):
            producer.send(f"m{i}".encode())
    finally:
        client.close()
    owners = [_owner(lookup_url, namespace, i, token, pki) for i in range(PARTITIONS)]
    # The leader gives each new bundle to the broker with the fewest bundles of all
    # namespaces (and the least traffic), so all 8 may land on one broker. The premise is
    # then made by hand: the bundles holding them (all that broker's, then) are unloaded
    # one at a time (each goes to the other broker) until the partitions are split.
    owned = _call("GET", f"{lookup_url}/admin/v2/namespaces/{namespace}/bundleOwners", pki=pki, token=token)[1]
    for bundle in sorted(b for b, owner in owned.items() if owner is not None):   # the partitions' bundles
        if len(set(owners)) == 2:
            break
        status, answer = _call("PUT", f"{owners[0]}/admin/v2/namespaces/{namespace}/{bundle}/unload", pki=pki,
                               token=token)
        if status == 307:
            continue          # another broker's bundle: not one to move
        assert status == 204, (status, answer)

        def settled() -> bool:
            try:
                owners[:] = [_owner(lookup_url, namespace, i, token, pki) for i in range(PARTITIONS)]
            except (urllib.error.URLError, OSError):
                return False      # the bundle in hand-over: not served for a moment
            return True

        wait_until(settled, 30, f"the partitions looked up again after unloading {bundle}")
    assert len(set(owners)) == 2, owners      # the test's premise: the partitions are split
    return owners


async def test_a_broker_reaches_the_other_brokers_partitions_with_its_own_token(etcd_process, tmp_path):
    base = str(tmp_path)
    pki = make_pki(os.path.join(base, "pki"), "split")
    key_path, signer, broker_token_path = _keys(base)
    caller_token = signer.create(CERT_ROLE)
    secured = ["--tls-cert-file", pki.cert_file, "--tls-key-file", pki.key_file, "--tls-port", "0",
               "--http-tls-port", "0", "--tls-trust-certs-file", pki.ca_file,
               "--authentication-enabled", "--authentication-providers", "token,tls", "--authorization-enabled",
               "--superuser-roles", f"{CERT_ROLE},{BROKER_ROLE}", "--token-secret-key", f"file://{key_path}"]
    cluster = Cluster(etcd_process, base)
    try:
        await cluster.start_bookies(2)
        with_token = cluster.broker(extra_args=[*secured, "--broker-client-token-file", broker_token_path])
        without = cluster.broker(extra_args=secured)
        await with_token.start()
        await without.start()
        https = {broker: _TLS_URLS.search(broker.log_text()).group(2) for broker in (with_token, without)}
        # The premise (the partitions split between the two) needs each broker to see the
        # other's load report before the bundles are assigned: the leader gives an
        # unowned bundle to the least loaded broker it knows of.
        await asyncio.to_thread(wait_until, lambda: all(
            len(_call("GET", f"{broker.web_service_url}/admin/v2/brokers/standalone", token=caller_token)[1]) == 2
            for broker in (with_token, without)), 30, "both brokers' load reports seen by both")
        namespace = f"public/{unique('secured-split')}"
        owners = _split_topic(https[with_token], with_token.web_service_url, with_token.service_url, namespace,
                              caller_token, pki, certificate=True)

        # A partition the other broker serves: a request that came over HTTPS is sent to
        # the owner's HTTPS (its token must not follow in the clear), a plain one to plain.
        served_there = owners.index(with_token.web_service_url)
        partition_path = f"/admin/v2/persistent/{namespace}/orders-partition-{served_there}/stats"
        location = _redirect_location(f"{https[without]}{partition_path}", caller_token, pki)
        assert location == f"{https[with_token]}{partition_path}", location
        location = _redirect_location(f"{without.web_service_url}{partition_path}", caller_token, pki)
        assert location == f"{with_token.web_service_url}{partition_path}", location

        # A certificate-only caller, asking the broker that has a token of its own.
        asked = f"{https[with_token]}/admin/v2/persistent/{namespace}/orders"
        status, answer = _call("PUT", f"{asked}/subscription/audit", pki=pki, certificate=True,
                               body={"ledgerId": -1, "entryId": -1})
        assert status in (200, 204), (status, answer)
        for index, owner in enumerate(owners):
            assert _call("GET", f"{owner}/admin/v2/persistent/{namespace}/orders-partition-{index}/subscriptions",
                         token=caller_token) == (200, ["audit"]), (index, owner)
        assert _call("GET", f"{asked}/subscriptions", pki=pki, certificate=True) == (200, ["audit"])

        # The same caller asking the broker without one: its certificate cannot go along.
        other = f"{https[without]}/admin/v2/persistent/{namespace}/orders"
        status, answer = _call("GET", f"{other}/subscriptions", pki=pki, certificate=True)
        assert status == 401, (status, answer)
        assert "partition" in answer["reason"] and with_token.web_service_url in answer["reason"], answer
        # A token caller is passed on as itself.
        assert _call("GET", f"{other}/subscriptions", pki=pki, token=caller_token) == (200, ["audit"])

        # The request is authorized as its caller, whatever the broker presents onwards.
        nobody = signer.create("nobody-granted")
        status, answer = _call("DELETE", f"{asked}/subscription/audit", pki=pki, token=nobody)
        assert status == 403, (status, answer)
        for index, owner in enumerate(owners):
            assert _call("GET", f"{owner}/admin/v2/persistent/{namespace}/orders-partition-{index}/subscriptions",
                         token=caller_token) == (200, ["audit"]), (index, owner)
        assert _call("DELETE", f"{asked}/subscription/audit", pki=pki, certificate=True)[0] in (200, 204)
        assert _call("GET", f"{other}/subscriptions", pki=pki, token=caller_token) == (200, [])
    finally:
        await cluster.stop()


async def test_brokers_without_plain_ports_reach_each_other_over_https(etcd_process, tmp_path):
    base = str(tmp_path)
    # Server certificates only (serverAuth), naming a host the brokers are not reached at.
    pki = make_pki(os.path.join(base, "pki"), "https", server_names=("broker.example",))
    key_path, signer, broker_token_path = _keys(base)
    caller_token = signer.create("https-admin")
    cluster = Cluster(etcd_process, base)
    try:
        await cluster.start_bookies(2)
        brokers = await cluster.start_brokers(2, extra_args=[
            "--tls-cert-file", pki.cert_file, "--tls-key-file", pki.key_file, "--tls-port", "0",
            "--http-tls-port", "0", "--no-plain-ports", "--tls-trust-certs-file", pki.ca_file,
            "--authentication-enabled", "--authentication-providers", "token,tls", "--authorization-enabled",
            "--superuser-roles", f"https-admin,{BROKER_ROLE}", "--token-secret-key", f"file://{key_path}",
            "--broker-client-token-file", broker_token_path])
        first, second = brokers
        assert first.web_service_url.startswith("https://"), first.web_service_url
        namespace = f"public/{unique('https-split')}"
        owners = _split_topic(first.web_service_url, first.web_service_url, first.service_url, namespace,
                              caller_token, pki, token=caller_token)
        for asked, other in ((first, second), (second, first)):
            base_url = f"{asked.web_service_url}/admin/v2/persistent/{namespace}/orders"
            status, answer = _call("PUT", f"{base_url}/subscription/from-{asked.name}", pki=pki, token=caller_token,
                                   body={"ledgerId": -1, "entryId": -1})
            assert status in (200, 204), (asked.name, status, answer)
            listed = _call("GET", f"{other.web_service_url}/admin/v2/persistent/{namespace}/orders/subscriptions",
                           pki=pki, token=caller_token)
            assert listed[0] == 200 and f"from-{asked.name}" in listed[1], listed
        for index, owner in enumerate(owners):
            assert _call("GET", f"{owner}/admin/v2/persistent/{namespace}/orders-partition-{index}/subscriptions",
                         pki=pki, token=caller_token) == (200, sorted(f"from-{b.name}" for b in brokers)), index
    finally:
        await cluster.stop()
