"""The add socket: the bookie's add stream on a plain asyncio connection (issue 16).

Why: measured per durable add (docs/performance.md, step 5), gRPC aio's per-message
completion callbacks were more than half of the bookie's event-loop CPU and the largest
item of the broker's; a length-prefixed stream read and written by the event loop
itself (protocol/add_socket.py) answers the same AddRequests with the same code
(``BookieServicer.answer_adds``: admit, journal, reply after the fdatasync, replies
merged) without them. gRPC stays the bookie's API: reads, fences, LAC and info, and
adds for writers that do not use this.

Theory of operation: one connection per writer process (the ledger client's add
stream). The writer's first message is an ``AddSocketHello`` with its service token;
with authentication on, the token is checked as gRPC's interceptor checks it
(``TokenInterceptor.check_token``: the same key, rotated the same way, the same roles)
and a refusal is an ``AddSocketWelcome`` with AuthenticationFailed or
AuthorizationDenied, then the close. The hello must come within ``hello_timeout_s``.
Then requests are read (each at most ``message_bytes_max``: a longer announced length,
or bytes that do not parse, end that connection only) and the replies written in order;
writing waits while the connection's buffer is over its high-water mark, and reading
stops while ``STREAM_BATCHES_IN_FLIGHT_MAX`` batches are unanswered (as on gRPC), so a
slow writer bounds what the bookie holds for it. With TLS configured the socket serves
TLS with the bookie's certificate (and requires client certificates when the gRPC port
does).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import AsyncIterator, Callable

import grpc

from bookie.server import BookieServicer
from common.errors import AuthenticationFailed, AuthorizationDenied, MagnetarError, MalformedFrame
from common.tasks import TaskSet
from protocol.add_socket import LENGTH_BYTES, encode_message, parse, read_message_body
from protocol.proto import bookie_pb2

log = logging.getLogger(__name__)

# A writer that connects must say who it is within this long.
HELLO_TIMEOUT_S = 10.0
# Writers are brokers and auto-recovery workers (one connection each): far fewer than
# this; past it a new connection is closed at once.
CONNECTIONS_MAX = 1024

TokenCheck = Callable[[str], "tuple[grpc.StatusCode, str] | None"]


class AddSocketServer:
    def __init__(self, servicer: BookieServicer, *, message_bytes_max: int, token_check: TokenCheck | None = None,
                 ssl_context: ssl.SSLContext | None = None, hello_timeout_s: float = HELLO_TIMEOUT_S) -> None:
        self._servicer = servicer
        self._message_bytes_max = message_bytes_max
        self._token_check = token_check
        self._ssl_context = ssl_context
        self._hello_timeout_s = hello_timeout_s
        self._server: asyncio.Server | None = None
        # One task per connection, owned here: cancelled and awaited by close().
        self._connections = TaskSet("add socket connections")
        self.connections_total = 0
        self.refused_total = 0

    async def start(self, host: str, port: int) -> int:
        """Listens; returns the port (``port`` 0: a free one)."""
        self._server = await asyncio.start_server(self._accept, host, port, ssl=self._ssl_context,
                                                  limit=self._message_bytes_max + LENGTH_BYTES)
        return self._server.sockets[0].getsockname()[1]

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= CONNECTIONS_MAX:
            self.refused_total += 1
            log.warning("add socket connection refused: connections=%d (the limit)", len(self._connections))
            writer.close()
            return
        self.connections_total += 1
        self._connections.spawn(self._serve(reader, writer), name="add socket connection")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        describe = lambda: f"addsocket:{peer}"  # noqa: E731 - the servicer's log callback
        try:
            async with asyncio.timeout(self._hello_timeout_s):
                body = await read_message_body(reader, self._message_bytes_max)
            if body is None:
                return
            refusal = self._refusal(parse(bookie_pb2.AddSocketHello, body).token)
            writer.write(encode_message(refusal or bookie_pb2.AddSocketWelcome()))
            if refusal is None:
                log.info("add socket writer connected: peer=%s", peer)
            else:
                self.refused_total += 1
                log.info("add socket refused: peer=%s error_code=%d reason=%s", peer, refusal.error_code,
                         refusal.error_message)
                await writer.drain()
                return
            async for response in self._servicer.answer_adds(self._requests(reader), describe, on_add_socket=True):
                writer.write(encode_message(response))
                await writer.drain()
        except TimeoutError:
            log.info("add socket closed: peer=%s reason=no hello within %ss", peer, self._hello_timeout_s)
        except MalformedFrame as error:
            log.info("add socket closed: peer=%s reason=%s", peer, error)
        except (ConnectionError, ssl.SSLError) as error:
            log.info("add socket connection lost: peer=%s error=%r", peer, error)
        finally:
            writer.close()

    async def _requests(self, reader: asyncio.StreamReader) -> AsyncIterator[bookie_pb2.AddRequest]:
        while True:
            body = await read_message_body(reader, self._message_bytes_max)
            if body is None:
                return
            yield parse(bookie_pb2.AddRequest, body)

    def _refusal(self, token: str) -> bookie_pb2.AddSocketWelcome | None:
        if self._token_check is None:
            return None
        refused = self._token_check(token)
        if refused is None:
            return None
        status, reason = refused
        error: MagnetarError = AuthorizationDenied(reason) if status == grpc.StatusCode.PERMISSION_DENIED \
            else AuthenticationFailed(reason)
        return bookie_pb2.AddSocketWelcome(error_code=error.code, error_message=error.message)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._connections.close()
        if self._server is not None:
            await self._server.wait_closed()
