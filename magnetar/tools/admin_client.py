"""A small synchronous HTTP client for Pulsar's admin REST API (``/admin/v2/...``), on
urllib so that the tool needs no event loop.

It follows redirects itself, for every method: a Pulsar broker answers a request about
a topic it does not own with ``307 Temporary Redirect`` to the owner, and urllib only
follows redirects for GET and HEAD. Errors come back as :class:`AdminError` carrying
the status and the server's ``reason`` (Pulsar's error body is ``{"reason": ...}``;
Magnetar adds ``code`` and ``error``).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

# Pulsar's own admin client follows a handful of redirects (one hop to the owner is the
# norm; more means brokers disagree about ownership).
REDIRECTS_MAX = 5
REQUEST_TIMEOUT_S = 30.0


class AdminError(Exception):
    """A refused or failed request: the status, the server's reason and, when the server
    is a Magnetar broker, the catalogue code and class name of the error
    (common/errors.py). ``str()`` is one line naming all of them."""

    def __init__(self, method: str, url: str, status: int | None, reason: str, *,
                 code: int | None = None, error: str | None = None) -> None:
        self.method = method
        self.url = url
        self.status = status
        self.reason = reason
        self.code = code
        self.error = error
        where = f"HTTP {status}" if status is not None else "no response"
        catalogue = f" [{error} {code}]" if code is not None else ""
        super().__init__(f"{method} {url}: {where}: {reason}{catalogue}")


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    # What was asked (the first request's path; a redirect's target is not shown).
    method: str = ""
    path: str = ""

    def document(self):
        """The body as JSON when it is JSON, else as text; None when empty."""
        if not self.body:
            return None
        text = self.body.decode("utf-8", errors="replace")
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # surfaces as HTTPError; AdminClient.request follows it itself


def path(*segments: str) -> str:
    """``/admin/v2/...`` with every segment percent-encoded (topic names may hold ``:``,
    ``%`` or spaces)."""
    return "/" + "/".join(urllib.parse.quote(str(segment), safe="") for segment in segments)


def _reason(status: int, phrase: str, body: bytes) -> tuple[str, int | None, str | None]:
    """(reason, catalogue code, error class name) of an error body; the code and name are
    None when the body has none (a Pulsar broker, a proxy's error page)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        # aiohttp's own error pages read "404: Not Found": drop the repeated status.
        return text.removeprefix(f"{status}: ") or phrase, None, None
    if isinstance(document, dict):
        reason = document.get("reason") or document.get("message") or document.get("error")
        code = document.get("code")
        name = document.get("error")
        if reason:
            return (str(reason), code if isinstance(code, int) and not isinstance(code, bool) else None,
                    str(name) if isinstance(name, str) else None)
    return text or phrase, None, None


class AdminClient:
    def __init__(self, base_url: str, *, timeout_s: float = REQUEST_TIMEOUT_S, token: str | None = None,
                 tls_trust_certs_file: str = "", tls_hostname_verification: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        # Sent as Authorization: Bearer (brokers with authentication on); never printed.
        self._token = token
        self.timeout_s = timeout_s
        handlers: list = [_NoRedirects]
        if tls_trust_certs_file or not tls_hostname_verification:
            # https:// against the brokers' own CA. The certificate must name the host of
            # the URL (https://localhost:8443 from a broker's pod) unless hostname
            # verification is off: a redirect to a topic's owner names its pod IP.
            context = ssl.create_default_context(cafile=tls_trust_certs_file or None)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.check_hostname = tls_hostname_verification
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def request(self, method: str, request_path: str, *, body=None, query: dict | None = None) -> Response:
        url = self.base_url + request_path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        for _ in range(REDIRECTS_MAX + 1):
            request = urllib.request.Request(url, data=data, method=method)
            request.add_header("Accept", "application/json")
            if self._token:
                request.add_header("Authorization", f"Bearer {self._token}")
            if data is not None:
                request.add_header("Content-Type", "application/json")
            try:
                with self._opener.open(request, timeout=self.timeout_s) as reply:
                    return Response(reply.status, reply.headers.get("Content-Type", ""), reply.read(),
                                    dict(reply.headers.items()), method=method, path=request_path)
            except urllib.error.HTTPError as error:
                location = error.headers.get("Location") if error.headers else None
                if error.code in (301, 302, 303, 307, 308) and location:
                    target = urllib.parse.urljoin(url, location)
                    if self._token and url.startswith("https://") and not target.startswith("https://"):
                        raise AdminError(method, url, error.code, f"not following a redirect from https to "
                                         f"{target}: the token would travel in the clear") from None
                    url = target
                    continue
                reason, code, name = _reason(error.code, error.reason, error.read())
                raise AdminError(method, url, error.code, reason, code=code, error=name) from None
            except (urllib.error.URLError, OSError) as error:
                reason = getattr(error, "reason", error)
                raise AdminError(method, url, None, f"cannot reach the server: {reason}") from None
        raise AdminError(method, url, None, f"more than {REDIRECTS_MAX} redirects")

    def get(self, request_path: str, **kwargs) -> Response:
        return self.request("GET", request_path, **kwargs)
