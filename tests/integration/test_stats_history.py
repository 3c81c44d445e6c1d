"""The console's history route (GET .../{topic}/statsHistory, broker/admin/stats_history.py)
on two real brokers with token authentication and authorization on:

- who may read it is who may read the topic's stats: no token 401; a role with no rights
  on the tenant 403; the tenant's admin 200 on its own tenant's topic and 403 on another
  tenant's; a superuser 200;
- the broker that does not serve the topic answers 307 to the one that does, which
  answers the history it sampled (every 0.3 s here); asked as the console asks
  (``X-Magnetar-Forward: true``), it answers the owner's answer itself, after
  authorizing the caller (broker/admin/forward.py);
- /metrics says how many topics have a history and how many the bound left out;
- the history goes with the topic: unloaded, the topic has none (the route does not load
  it); loaded again, a new one begins after the unload; deleted, the route answers 404.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from runtime.tokens import TokenSigner, create_secret_key
from tests.cluster import unique, wait_until

SUPERUSER = "ops-admin"
TENANT_ADMIN = "alice"


def _call(method: str, url: str, token: str | None, body: object = None, *, follow: bool = True,
          forward: bool = False) -> tuple[int, object, str | None]:
    """(status, JSON answer or None, Location) of one request; a 307 is followed once
    with the same method, body and token when ``follow``; ``forward`` asks the broker
    to answer through itself, as the console does."""
    headers = {"Content-Type": "application/json"}
    if forward:
        headers["X-Magnetar-Forward"] = "true"
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(urllib.request.Request(url, data=data, method=method, headers=headers),
                         timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text.strip() else None, None
    except urllib.error.HTTPError as error:
        text = error.read()
        location = error.headers.get("Location")
        if error.code == 307 and follow and location:
            return _call(method, location, token, body, follow=False)
        try:
            doc = json.loads(text) if text.strip() else None
        except ValueError:
            doc = text.decode(errors="replace")
        return error.code, doc, location


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args, **_kwargs):
        return None      # the 307 comes back as an HTTPError to look at


async def test_history_route_is_authorized_redirected_and_dropped_with_the_topic(cluster, tmp_path):
    key = create_secret_key()
    key_path = tmp_path / "secret.key"
    key_path.write_bytes(key)
    signer = TokenSigner.with_secret_key(key)
    superuser, tenant_admin, nobody = (signer.create(role) for role in (SUPERUSER, TENANT_ADMIN, "nobody"))
    await cluster.start_bookies(2)
    brokers = await cluster.start_brokers(2, extra_args=[
        "--authentication-enabled", "--authorization-enabled", "--superuser-roles", SUPERUSER,
        "--token-secret-key", f"file://{key_path}", "--stats-history-interval-s", "0.3"])
    urls = [b.web_service_url for b in brokers]
    tenant = unique("hist")
    assert _call("PUT", f"{urls[0]}/admin/v2/tenants/{tenant}", superuser,
                 {"adminRoles": [TENANT_ADMIN], "allowedClusters": ["standalone"]})[0] == 204
    assert _call("PUT", f"{urls[0]}/admin/v2/namespaces/{tenant}/ns", superuser)[0] == 204
    path = f"persistent/{tenant}/ns/{unique('t')}"
    other_path = f"persistent/public/default/{unique('t')}"
    for topic_path in (path, other_path):
        assert _call("PUT", f"{urls[0]}/admin/v2/{topic_path}", superuser)[0] == 204
        assert _call("PUT", f"{urls[0]}/admin/v2/{topic_path}/subscription/s", superuser)[0] == 204

    # The owner answers; the other broker redirects there.
    answers = [_call("GET", f"{url}/admin/v2/{path}/statsHistory", superuser, follow=False) for url in urls]
    owners = [index for index, (status, _, _) in enumerate(answers) if status == 200]
    assert len(owners) == 1, [a[:1] for a in answers]
    owner, other = urls[owners[0]], urls[1 - owners[0]]
    status, _, location = answers[1 - owners[0]]
    assert status == 307 and location == f"{owner}/admin/v2/{path}/statsHistory", (status, location)

    history_url = f"{owner}/admin/v2/{path}/statsHistory"

    def sampled() -> dict | None:
        status, doc, _ = _call("GET", history_url, superuser)
        assert status == 200, (status, doc)
        return doc if len(doc["timestamps"]) >= 3 and "s" in doc["subscriptions"] else None

    doc = wait_until(sampled, 20, "three samples of the topic")
    assert doc["tracked"] and doc["intervalSeconds"] == 0.3
    with urllib.request.urlopen(f"{owner}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert "\nmagnetar_broker_stats_history_topics " in metrics
    assert "\nmagnetar_broker_stats_history_topics_untracked 0.0\n" in metrics
    sample_s = float(metrics.split("\nmagnetar_broker_stats_history_sample_seconds ", 1)[1].split("\n", 1)[0])
    assert 0 < sample_s < 5, sample_s     # samples were taken: the last one's pass was timed
    assert doc["subscriptions"]["s"]["msgBacklog"][-1] == 0 and doc["behindSince"] is None

    # Authorization: as for the topic's stats.
    assert _call("GET", history_url, None)[0] == 401
    assert _call("GET", history_url, nobody)[0] == 403
    status, doc, _ = _call("GET", f"{other}/admin/v2/{path}/statsHistory?samples=false", tenant_admin)
    assert status == 200 and "timestamps" not in doc and doc["tracked"], (status, doc)   # the redirect followed
    assert _call("GET", f"{urls[0]}/admin/v2/{other_path}/statsHistory", tenant_admin)[0] == 403
    assert _call("GET", f"{urls[0]}/admin/v2/{other_path}/statsHistory", superuser)[0] == 200

    # Asked as the console asks (X-Magnetar-Forward), the other broker answers itself,
    # with the owner's history, after authorizing the caller as for any request.
    other_url = f"{other}/admin/v2/{path}/statsHistory"
    status, doc, location = _call("GET", other_url, tenant_admin, follow=False, forward=True)
    assert status == 200 and location is None and doc["tracked"] and doc["timestamps"], (status, doc)
    assert _call("GET", other_url, None, follow=False, forward=True)[0] == 401
    assert _call("GET", other_url, nobody, follow=False, forward=True)[0] == 403
    # A change too (the console's skip all), and an error of the owner's comes back as such.
    assert _call("POST", f"{other}/admin/v2/{path}/subscription/s/skip_all", superuser, follow=False,
                 forward=True)[0] == 204
    status, doc, _ = _call("POST", f"{other}/admin/v2/{path}/subscription/missing/skip_all", superuser,
                           follow=False, forward=True)
    assert status == 404 and doc["error"] == "SubscriptionNotFound", (status, doc)

    # Unloaded: no history, and the route does not load the topic again.
    assert _call("PUT", f"{owner}/admin/v2/{path}/unload", superuser)[0] == 204
    unloaded_ms = time.time() * 1000
    time.sleep(1.0)
    status, doc, _ = _call("GET", history_url, superuser)
    assert status == 200 and doc["tracked"] is False and doc["timestamps"] == [], doc
    # Loaded again (by its stats): a new history, from after the unload.
    assert _call("GET", f"{owner}/admin/v2/{path}/stats", superuser)[0] == 200
    doc = wait_until(sampled, 20, "the reloaded topic's samples")
    assert doc["historyStart"] > unloaded_ms and min(doc["timestamps"]) > unloaded_ms

    # Deleted: 404.
    assert _call("DELETE", f"{owner}/admin/v2/{path}", superuser)[0] == 204
    status, doc, _ = _call("GET", history_url, superuser)
    assert status == 404, (status, doc)
