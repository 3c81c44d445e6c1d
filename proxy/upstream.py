"""The proxy's own connections to brokers for lookup-phase requests (LOOKUP,
PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE, GET_SCHEMA), with request ids of the
proxy's own (each answer is given back to its client under the client's id), and the
pools that hold them (``LinkPool``): one pool shared by every client when the proxy
authenticates nobody, and one per authenticated client connection, whose links' CONNECT
names that client (``original_principal``) so that brokers authorize the client's own
role for every request, not the proxy's."""

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
                   frame_bytes_max: int, pending_max: int, connect_fields: dict | None = None) -> "BrokerLink":
        """A connection to a broker, CONNECTED; ``connect_fields`` are set on its CONNECT
        (the proxy's credentials, and the client it speaks for)."""
        loop = asyncio.get_running_loop()
        link = None
        try:
            async with asyncio.timeout(timeout_s):
                _, link = await loop.create_connection(lambda: cls(name, frame_bytes_max, pending_max), host, port,
                                                       ssl=context, server_hostname=host if context else None)
                connect = pb.CommandConnect(client_version=PROXY_VERSION,
                                            protocol_version=commands.PROTOCOL_VERSION_MAX)
                for field, value in (connect_fields or {}).items():
                    setattr(connect, field, value)
                link.transport.write(encode_command(wrap(connect)))
                await link._connected
        except (OSError, TimeoutError) as error:
            if link is not None:
                link.close()
            raise UpstreamGone(f"cannot connect to broker {name}: {error or 'timed out'}") from None
        except BaseException:
            if link is not None:
                link.close()
            raise
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

    @property
    def busy(self) -> bool:
        """Requests are waiting on this link's answers."""
        return bool(self._pending)

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


class LinkPool:
    """Links to brokers, at most one per broker and ``links_max`` in all (the least
    recently used one closed past it), each closed after ``idle_s`` without a request
    (None: kept). ``connect_fields()`` gives the fields of a new link's CONNECT: read at
    each opening, so a renewed token is used by the next link."""

    def __init__(self, *, connect_fields, tls_context: ssl.SSLContext | None, timeout_s: float,
                 frame_bytes_max: int, pending_max: int, links_max: int, idle_s: float | None = None,
                 on_count=None) -> None:
        self._connect_fields = connect_fields
        self._tls_context = tls_context
        self._timeout_s = timeout_s
        self._frame_bytes_max = frame_bytes_max
        self._pending_max = pending_max
        self._links_max = links_max
        self._idle_s = idle_s
        # Called with +1 / -1 as links open and close (a gauge).
        self._on_count = on_count
        # Insertion order = use order: the first is the least recently used.
        self._links: dict[str, BrokerLink] = {}
        self._idle: dict[str, asyncio.TimerHandle] = {}
        self._opening: dict[str, asyncio.Future[BrokerLink]] = {}
        self.closed = False

    def live(self) -> list[str]:
        """The brokers (``host:port``) this pool has a live link to, most recently used first."""
        return [key for key, link in reversed(self._links.items()) if not link.closed]

    async def get(self, key: str, host: str, port: int, tls: bool) -> BrokerLink:
        if self.closed:
            raise UpstreamGone("the client connection is closed")
        link = self._links.get(key)
        if link is not None and not link.closed:
            self._used(key, link)
            return link
        self._drop(key)
        opening = self._opening.get(key)
        if opening is None:
            opening = asyncio.ensure_future(BrokerLink.open(
                key, host, port, context=self._tls_context if tls else None, timeout_s=self._timeout_s,
                frame_bytes_max=self._frame_bytes_max, pending_max=self._pending_max,
                connect_fields=self._connect_fields()))
            self._opening[key] = opening
            opening.add_done_callback(lambda _f: self._opening.pop(key, None))
        link = await asyncio.shield(opening)
        if self.closed:
            link.close()
            raise UpstreamGone("the client connection is closed")
        if self._links.get(key) is not link:
            self._drop(key)
            self._links[key] = link
            if self._on_count is not None:
                self._on_count(1)
            # Past the bound, the least recently used idle links go (one an answer is
            # awaited on stays: at worst a link per broker, while the answers come).
            for old in [k for k, other in self._links.items() if other is not link and not other.busy]:
                if len(self._links) <= self._links_max:
                    break
                self._drop(old)
        self._used(key, link)
        return link

    def _used(self, key: str, link: BrokerLink) -> None:
        self._links.pop(key, None)
        self._links[key] = link
        if self._idle_s is None:
            return
        timer = self._idle.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._idle[key] = asyncio.get_running_loop().call_later(self._idle_s, self._idle_expired, key)

    def _idle_expired(self, key: str) -> None:
        link = self._links.get(key)
        if link is not None and link.busy:   # an answer is still awaited: look again later
            self._idle[key] = asyncio.get_running_loop().call_later(self._idle_s, self._idle_expired, key)
            return
        self._drop(key)

    def _drop(self, key: str) -> None:
        timer = self._idle.pop(key, None)
        if timer is not None:
            timer.cancel()
        link = self._links.pop(key, None)
        if link is not None:
            link.close()
            if self._on_count is not None:
                self._on_count(-1)

    def drop_idle(self) -> None:
        """Closes the links no answer is awaited on (their CONNECT's credentials are
        stale): the next request opens a new one."""
        for key, link in list(self._links.items()):
            if not link.busy:
                self._drop(key)

    def close(self) -> None:
        self.closed = True
        for key in list(self._links):
            self._drop(key)
        for opening in self._opening.values():
            opening.cancel()
