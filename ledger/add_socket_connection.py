"""The writer's side of a bookie's add socket (bookie/add_socket.py): one connection,
driven by the event loop's callbacks (issue 16, docs/performance.md step 9).

The bookie client (ledger/bookie_client.py) hands it whole ``AddRequest``s and is told
of each ``AddResponse`` in the callback that read its bytes, so a reply resolves its
adds' futures with no reader task, stream reader or queue between (the bookie's side
works the same way). The connection:

- connects (TLS as toward the bookie's gRPC port, checked against its host) and sends
  an ``AddSocketHello`` with the service token; requests handed to it meanwhile are
  kept, in order, and written after the hello (the bookie reads the hello first, so
  they need not wait for the welcome: a refused hello fails them with the refusal);
- expects an ``AddSocketWelcome`` within ``welcome_timeout_s`` of being created; a
  welcome carrying an error is that error (AuthenticationFailed, AuthorizationDenied:
  a refused writer, not a failed bookie);
- reports every other ending once, as a MagnetarError through ``on_failure``: the
  connection refused or lost, the bookie's end of stream, a reply that does not parse
  or announces a length past ``message_bytes_max`` (BookieUnavailable);
- says when its transport's buffer went over the high-water mark (``writable``) and
  calls ``on_writable`` when it drained, so the client stops packing requests for a
  bookie that does not read them.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Callable, cast

from runtime import write_batch
from common.errors import BookieUnavailable, MagnetarError, MalformedFrame, error_for_code
from protocol.add_socket import MessageDecoder, encode_message, parse
from protocol.proto import bookie_pb2

log = logging.getLogger(__name__)


class AddSocketConnection(asyncio.Protocol):
    def __init__(self, bookie_id: str, address: str, *, token: str, message_bytes_max: int,
                 welcome_timeout_s: float, ssl_context: ssl.SSLContext | None,
                 on_reply: Callable[[bookie_pb2.AddResponse], None],
                 on_failure: Callable[[MagnetarError], None],
                 on_writable: Callable[[], None]) -> None:
        self.bookie_id = bookie_id
        self.address = address
        self._token = token
        self._ssl_context = ssl_context
        self._decoder = MessageDecoder(message_bytes_max)
        self._on_reply = on_reply
        self._on_failure = on_failure
        self._on_writable = on_writable
        self._transport: asyncio.Transport | None = None
        # Requests handed over before the connection was made, written at once after it.
        self._unsent: list[bytes] = []
        self._welcomed = False
        self._ended = False
        self.writable = True
        self._welcome_timeout_s = welcome_timeout_s
        self._welcome_timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            welcome_timeout_s, self._on_welcome_timeout)

    async def connect(self) -> None:
        """Makes the connection (the welcome timer bounds it); a failure is reported
        through ``on_failure``. Owned by the client's task set."""
        host, _, port = self.address.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._welcome_timeout_s):
                await loop.create_connection(lambda: self, host, int(port), ssl=self._ssl_context,
                                             server_hostname=host if self._ssl_context else None)
        except TimeoutError:
            self._fail(BookieUnavailable(self.bookie_id, "add socket: not connected in time"))
        except (OSError, ValueError) as error:   # ssl.SSLError is an OSError
            self._fail(BookieUnavailable(self.bookie_id, f"add socket: {error}"))

    def send(self, request: bookie_pb2.AddRequest) -> None:
        """Writes one request (kept until the connection is made); nothing after the end."""
        if self._ended:
            return
        frame = encode_message(request)
        if self._transport is None:
            self._unsent.append(frame)
        else:
            self._transport.write(frame)

    def close(self) -> None:
        """Ends the connection without reporting it (the client already knows why)."""
        self._ended = True
        self._cancel_welcome_timer()
        self._unsent.clear()
        if self._transport is not None:
            self._transport.abort()

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: asyncio's, or uvloop's (runtime/event_loop.py), which is not a
        # subclass of asyncio.Transport (an isinstance check here refused every connection).
        transport = cast(asyncio.Transport, transport)
        if self._ended:                     # closed while connecting
            transport.abort()
            return
        self._transport = transport
        unsent, self._unsent = self._unsent, []
        transport.writelines([encode_message(bookie_pb2.AddSocketHello(token=self._token)), *unsent])

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return
        self._decoder.feed(data)
        # What the confirmed entries cause (dispatch, receipts) leaves once per client
        # connection when this read's replies have been handled (runtime/write_batch.py).
        opened = write_batch.begin()
        try:
            self._on_replies()
        finally:
            if opened:
                write_batch.end()

    def _on_replies(self) -> None:
        try:
            while not self._ended:
                body = self._decoder.next_body()
                if body is None:
                    return
                if self._welcomed:
                    self._on_reply(parse(bookie_pb2.AddResponse, body))
                else:
                    self._on_welcome(parse(bookie_pb2.AddSocketWelcome, body))
        except MalformedFrame as error:
            self._fail(BookieUnavailable(self.bookie_id, f"add socket: {error}"))

    def eof_received(self) -> bool:
        inside = " inside a message" if self._decoder.buffered_bytes else ""
        self._fail(BookieUnavailable(self.bookie_id, f"add socket closed by the bookie{inside}"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"add socket connection lost: {exc!r}" if exc is not None else "add socket closed"
        self._fail(BookieUnavailable(self.bookie_id, reason))

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        if not self._ended:
            self._on_writable()

    # --- inside ---------------------------------------------------------------------------

    def _on_welcome(self, welcome: bookie_pb2.AddSocketWelcome) -> None:
        self._cancel_welcome_timer()
        if welcome.error_code:
            self._fail(error_for_code(welcome.error_code, welcome.error_message))
            return
        self._welcomed = True

    def _on_welcome_timeout(self) -> None:
        self._welcome_timer = None
        if not self._welcomed:
            self._fail(BookieUnavailable(self.bookie_id, "add socket: no welcome in time"))

    def _cancel_welcome_timer(self) -> None:
        if self._welcome_timer is not None:
            self._welcome_timer.cancel()
            self._welcome_timer = None

    def _fail(self, error: MagnetarError) -> None:
        if self._ended:
            return
        self.close()
        self._on_failure(error)
