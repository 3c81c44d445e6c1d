"""The proxy's own connections to brokers for lookup-phase requests (LOOKUP,
PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE, GET_SCHEMA): one per broker, shared by
every client, with request ids of the proxy's own (each answer is given back to its
client under the client's id)."""

from __future__ import annotations

import asyncio
import logging
import ssl

from common.errors import MalformedFrame
from protocol import commands
from protocol.codec import CommandDecoder, Frame, NEED_DATA, command_body, encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from common.version import __version__

log = logging.getLogger(__name__)

T = pb.BaseCommand
PROXY_VERSION = f"magnetar-proxy-{__version__}"
# Answers to the requests the proxy forwards (the ERROR of any of them included).
RESPONSE_TYPES = frozenset((T.LOOKUP_RESPONSE, T.PARTITIONED_METADATA_RESPONSE, T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                            T.GET_SCHEMA_RESPONSE, T.GET_OR_CREATE_SCHEMA_RESPONSE, T.ERROR, T.SUCCESS))


class UpstreamGone(Exception):
    """The broker connection closed or could not be opened."""


class BrokerLink(asyncio.Protocol):
    def __init__(self, name: str, frame_bytes_max: int, pending_max: int) -> None:
        self.name = name
        self._decoder = CommandDecoder(frame_bytes_max=frame_bytes_max)
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._pending_max = pending_max
        self._next_id = 1
        self._connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    @classmethod
    async def open(cls, name: str, host: str, port: int, *, context: ssl.SSLContext | None, timeout_s: float,
                   frame_bytes_max: int, pending_max: int, auth: tuple[str, bytes] | None = None) -> "BrokerLink":
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, link = await loop.create_connection(lambda: cls(name, frame_bytes_max, pending_max), host, port,
                                                       ssl=context, server_hostname=host if context else None)
                connect = pb.CommandConnect(client_version=PROXY_VERSION,
                                            protocol_version=commands.PROTOCOL_VERSION_MAX)
                if auth is not None:
                    connect.auth_method_name, connect.auth_data = auth
                link.transport.write(encode_command(wrap(connect)))
                await link._connected
        except (OSError, TimeoutError) as error:
            raise UpstreamGone(f"cannot connect to broker {name}: {error or 'timed out'}") from None
        return link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport   # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._decoder.feed(data)
            while (frame := self._decoder.next_command()) is not NEED_DATA:
                self._on_frame(frame)
        except MalformedFrame as error:
            log.warning("malformed frame from broker, closing: broker=%s error=%s", self.name, error)
            self.close()

    def _on_frame(self, frame: Frame) -> None:
        kind = frame.command.type
        if kind == T.CONNECTED:
            if not self._connected.done():
                self._connected.set_result(None)
        elif kind == T.PING:
            self.transport.write(encode_command(commands.pong()))
        elif kind in RESPONSE_TYPES:
            body = command_body(frame.command)
            future = self._pending.pop(getattr(body, "request_id", -1), None)
            if future is not None and not future.done():
                future.set_result(frame)
            elif kind == T.ERROR and not self._connected.done():
                self._connected.set_exception(UpstreamGone(f"broker {self.name} refused CONNECT: "
                                                           f"{frame.command.error.message}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        gone = UpstreamGone(f"connection to broker {self.name} lost")
        if not self._connected.done():
            self._connected.set_exception(gone)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(gone)
        self._pending.clear()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def forward(self, command: pb.BaseCommand, timeout_s: float) -> Frame:
        """Sends ``command`` (a copy of the client's, its request_id replaced) and returns
        the broker's answer. UpstreamGone if the connection goes or is too busy;
        TimeoutError without an answer."""
        if self.closed:
            raise UpstreamGone(f"connection to broker {self.name} is closed")
        if len(self._pending) >= self._pending_max:
            raise UpstreamGone(f"more than {self._pending_max} requests waiting on broker {self.name}")
        request_id = self._next_id
        self._next_id = (self._next_id + 1) % commands.UNSOLICITED_REQUEST_ID or 1
        command_body(command).request_id = request_id
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self.transport.write(encode_command(command))
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self._pending.pop(request_id, None)
