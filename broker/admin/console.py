"""The operator console: static pages (broker/console/) served on the broker's HTTP port
at ``/console/``. They hold no data and need no authentication; everything they show
comes from the admin REST, called from the browser with the user's token, so the
console can show and do exactly what the role may through the API (RabbitMQ's
management UI is built the same way). Served by every broker: whichever one the
operator reaches answers the admin calls for the whole cluster (lookups and partition
calls go to owners as for the CLI). Plain HTML, CSS and JavaScript with no build step
and nothing fetched from the network: docs/console.md says why.
"""

from __future__ import annotations

import os

from aiohttp import web


CONSOLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "console")
_FILES = {"": ("index.html", "text/html"), "index.html": ("index.html", "text/html"),
          "console.js": ("console.js", "application/javascript"), "console.css": ("console.css", "text/css")}
# The pages may only talk to this origin and load nothing from elsewhere.
_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                       "frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def _load() -> dict[str, tuple[bytes, str]]:
    """The files, read once at start (a few KiB; no file IO on the event loop later)."""
    loaded = {}
    for route_name, (name, content_type) in _FILES.items():
        with open(os.path.join(CONSOLE_DIR, name), "rb") as handle:
            loaded[route_name] = (handle.read(), content_type)
    return loaded


_PAGES = _load()

# Module-level handlers, registered in this order.
routes = web.RouteTableDef()


@routes.get("/console")
async def redirect(_request: web.Request) -> web.Response:
    raise web.HTTPFound("/console/")


@routes.get("/console/{name}")
@routes.get("/console/")
async def asset(request: web.Request) -> web.Response:
    found = _PAGES.get(request.match_info.get("name", ""))
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    return web.Response(body=body, content_type=content_type, headers=_HEADERS)
