"""The add stream over a WebSocket on the bookie's HTTP port: the same requests and
replies as gRPC's ``AddEntries`` (``AddRequest`` / ``AddResponse`` of bookie.proto, one
binary message each), served by the same code (``BookieServicer.add_stream``), so a
reply still goes out only once every accepted add of its request is fsynced in the
journal.

Why a second carrier: measured with bench/latency.py (docs/performance.md), gRPC's
asyncio binding hands every message between the event loop, its poller thread and the
core's IO threads, on both sides and both ways; on a loaded machine each hand-over waits
for a CPU, and the transport took about as long as the journal's fdatasync. A WebSocket
served by the bookie's own event loop reads and writes in that loop: no thread between
the socket and the journal queue. gRPC stays the bookie's API (reads, fences, info,
and adds for clients that ask for it or need TLS, which the HTTP port does not serve).

Rules, as on the gRPC port:
- With authentication on, the upgrade request must carry ``Authorization: Bearer
  <service token>`` of an allowed role (the check of bookie/security.py); otherwise it
  is answered 401 / 403 before any add is read.
- A message is at most ``message_bytes_max`` (the gRPC message limit); at most
  ``streams_max`` streams at once (503 past it); a non-binary message ends the stream.
- Before the bookie serves (journal replayed, registered) the path answers 503.
"""

from __future__ import annotations

import logging
from typing import AsyncIterator, Callable

from aiohttp import WSMsgType, web
from prometheus_client import CollectorRegistry, Counter

from bookie.server import BookieServicer
from protocol.proto import bookie_pb2

log = logging.getLogger(__name__)

ADD_STREAM_PATH = "/v1/add-stream"

# (HTTP status, reason) refusing a request, or None: the token check's answer.
TokenCheck = Callable[[str], "tuple[int, str] | None"]


def add_socket_route(app: web.Application, servicer_of: Callable[[], BookieServicer | None],
                     check_token: TokenCheck | None, *, message_bytes_max: int, streams_max: int,
                     registry: CollectorRegistry | None = None) -> None:
    """Adds the add-stream path to the bookie's HTTP app. ``servicer_of`` gives the
    servicer once the bookie serves (None before)."""
    assert message_bytes_max > 0 and streams_max > 0, (message_bytes_max, streams_max)
    active = [0]
    opened = Counter("magnetar_bookie_add_socket_streams", "Add streams opened on the add socket",
                     registry=registry) if registry is not None else None

    async def handler(request: web.Request) -> web.StreamResponse:
        servicer = servicer_of()
        if servicer is None:
            return web.Response(status=503, text="the bookie is starting")
        if check_token is not None:
            refusal = check_token(request.headers.get("Authorization", ""))
            if refusal is not None:
                return web.Response(status=refusal[0], text=refusal[1])
        if active[0] >= streams_max:
            return web.Response(status=503, text=f"more than {streams_max} add streams")
        socket = web.WebSocketResponse(max_msg_size=message_bytes_max, autoping=True)
        await socket.prepare(request)
        active[0] += 1
        if opened is not None:
            opened.inc()
        peer = str(request.remote)
        try:
            async def requests() -> AsyncIterator[bookie_pb2.AddRequest]:
                async for message in socket:
                    if message.type != WSMsgType.BINARY:
                        log.info("add socket: not a binary message, ending the stream: peer=%s type=%s",
                                 peer, message.type)
                        return
                    yield bookie_pb2.AddRequest.FromString(message.data)

            stream = servicer.add_stream(requests(), lambda: peer)
            try:
                async for response in stream:
                    await socket.send_bytes(response.SerializeToString())
            finally:
                await stream.aclose()
        except ConnectionResetError:
            pass   # the writer went away: what it did not get a reply for, it sends again elsewhere
        finally:
            active[0] -= 1
            await socket.close()
        return socket

    app.router.add_get(ADD_STREAM_PATH, handler)
