"""HTTP through the proxy: ``/admin/v2/...``, ``/admin/...`` and ``/lookup/...`` on the
proxy's HTTP port are forwarded to a registered broker's web service, so admin tools
work from where only the proxy is reachable.

A broker's redirect (307 to the owner of a topic or bundle) is followed by the proxy
itself, at most ``REDIRECTS_MAX`` times and only to a registered broker's web address:
the caller never gets a broker address it cannot reach, and the proxy never fetches an
address that is no broker. A redirect elsewhere is answered 502.

Headers passed on: Authorization, Content-Type, Accept (the broker authenticates the
caller). ``X-Original-Principal`` from a caller is always dropped. A caller on the
proxy's HTTPS port that sends no ``Authorization`` but presents a client certificate
the TLS handshake verified (``--tls-trust-certs-file``), to a proxy that accepts the
``tls`` method and has a token of its own (``--broker-token-file``), is forwarded as
the proxy on its behalf: the proxy's token, and ``X-Original-Principal`` naming the
certificate's CN, which brokers honour only from their ``--proxy-roles`` and authorize
as that role (broker/admin/permissions.py) — as a piped binary connection's
``original_principal``. Credentials a caller sends win over its certificate. A request's
body is read whole (bounded by the app's body limit: it may be sent again after a
redirect); the broker's answer is streamed to the caller (``_stream_answer``)."""

from __future__ import annotations

import logging
import random
import ssl
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp import web

from proxy.auth import TLS_METHOD, ProxyAuthenticator
from proxy.brokers import BrokerDirectory
from proxy.metrics import ProxyMetrics
from runtime.tls import certificate_common_name

log = logging.getLogger(__name__)

REDIRECTS_MAX = 5
PASSED_HEADERS = ("Authorization", "Content-Type", "Accept")
# The header brokers read the role a proxy acts for from (Pulsar's proxies send it too).
ORIGINAL_PRINCIPAL_HEADER = "X-Original-Principal"
ANSWER_HEADERS = ("Content-Type",)
# The whole exchange with a broker (connect, request, answer read to its end).
TIMEOUT_S = 60.0
STREAM_CHUNK_BYTES = 64 * 1024


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def acting_for_certificate(request: web.Request, auth: ProxyAuthenticator | None) -> dict[str, str]:
    """The headers that forward a caller proven by its client certificate alone (the CN
    of a certificate the handshake verified) as that role: the proxy's token and
    X-Original-Principal. Empty when the caller sent credentials, showed no such
    certificate, or the proxy may not act for it (no tls method, no token of its own)."""
    if auth is None or not auth.enabled or TLS_METHOD not in auth.providers or "Authorization" in request.headers:
        return {}
    transport = request.transport
    principal = certificate_common_name(transport.get_extra_info("peercert") if transport is not None else None)
    credentials = auth.own_credentials() if principal is not None else None
    if credentials is None:
        return {}
    return {"Authorization": f"Bearer {credentials[1].decode('ascii')}", ORIGINAL_PRINCIPAL_HEADER: principal}


async def _stream_answer(request: web.Request, answer: aiohttp.ClientResponse,
                         metrics: ProxyMetrics) -> web.StreamResponse:
    """The broker's answer passed on as it arrives, ``STREAM_CHUNK_BYTES`` at a time: the
    proxy holds at most about one chunk per request (plus the transports' buffers), and a
    slow caller slows the read from the broker (each write waits for the caller's
    transport to drain). Once the status is sent a broken upstream cannot be reported
    with another: the caller's connection is then closed before the announced length or
    the last chunk, which it sees as a truncated answer, never as a complete one."""
    response = web.StreamResponse(status=answer.status,
                                  headers={name: answer.headers[name] for name in ANSWER_HEADERS
                                           if name in answer.headers})
    if answer.content_length is not None:
        response.content_length = answer.content_length
    await response.prepare(request)
    try:
        async for chunk in answer.content.iter_chunked(STREAM_CHUNK_BYTES):
            await response.write(chunk)
    except (aiohttp.ClientError, TimeoutError) as error:
        metrics.http.labels("unavailable").inc()
        log.warning("broker answer broken off while passed on: status=%d error=%s", answer.status,
                    type(error).__name__)
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write_eof()
    metrics.http.labels("ok" if answer.status < 500 else "error").inc()
    return response


def add_forward_routes(app: web.Application, brokers: BrokerDirectory, metrics: ProxyMetrics, *,
                       tls_context: ssl.SSLContext | None = None, auth: ProxyAuthenticator | None = None) -> None:
    """``tls_context``: how brokers' https:// web addresses are checked (the CA of
    --broker-tls-trust-certs-file); None: the system's CAs. ``auth``: the proxy's
    authenticator (for callers proven by a client certificate, see the module's doc)."""
    session: dict[str, aiohttp.ClientSession] = {}

    async def on_cleanup(_app: web.Application) -> None:
        if "s" in session:
            await session["s"].close()

    app.on_cleanup.append(on_cleanup)

    async def forward(request: web.Request) -> web.StreamResponse:
        urls = brokers.web_urls()
        if not urls:
            return web.json_response({"reason": "no broker is registered"}, status=503)
        if "s" not in session:
            session["s"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        allowed = {_origin(url) for url in urls}
        body = await request.read()
        headers = {name: request.headers[name] for name in PASSED_HEADERS if name in request.headers}
        headers.update(acting_for_certificate(request, auth))
        url = random.choice(urls).rstrip("/") + request.rel_url.raw_path_qs
        for _ in range(REDIRECTS_MAX + 1):
            try:
                async with session["s"].request(request.method, url, data=body or None, headers=headers,
                                                allow_redirects=False,
                                                ssl=tls_context if tls_context is not None else True) as answer:
                    if answer.status in (301, 302, 303, 307, 308) and "Location" in answer.headers:
                        url = urljoin(url, answer.headers["Location"])
                        if _origin(url) not in allowed:
                            metrics.http.labels("bad_redirect").inc()
                            log.warning("broker redirect to an address that is no broker, refused: location=%s",
                                        url[:200])
                            return web.json_response({"reason": "redirect to an address that is not a broker"},
                                                     status=502)
                        continue
                    return await _stream_answer(request, answer, metrics)
            except (aiohttp.ClientError, TimeoutError) as error:
                metrics.http.labels("unavailable").inc()
                return web.json_response({"reason": f"broker unreachable: {type(error).__name__}"}, status=503)
        return web.json_response({"reason": f"more than {REDIRECTS_MAX} redirects"}, status=502)

    for prefix in ("/admin/", "/lookup/"):
        app.router.add_route("*", prefix + "{tail:.*}", forward)
