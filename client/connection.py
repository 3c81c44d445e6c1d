"""One client connection to a broker: the asyncio shell around the sans-IO codec.

Theory of operation:
- ``open`` connects within ``connect_timeout_ms`` and completes the CONNECT/CONNECTED
  handshake within the same bound. The CONNECTED answer may lower the frame limit
  (``max_message_size``); frames in are bounded by ``frame_bytes_max`` from the first
  byte (the decoder refuses an oversized length before buffering the body).
- Requests (LOOKUP, PRODUCER, SUBSCRIBE, SEEK, CLOSE_*, ACK with a receipt...) carry a
  request id; ``request`` registers a future under it, writes the command and waits at
  most ``operation_timeout_ms``. At most ``pending_requests_max`` wait at once; past it
  a request fails at once with TooManyRequests. ERROR answers, and the Failed variants
  of LOOKUP and PARTITIONED_METADATA answers, raise the catalogue error for the
  broker's ServerError (protocol/server_errors.py).
- Frames for one producer or consumer (SEND_RECEIPT, SEND_ERROR, MESSAGE,
  CLOSE_PRODUCER, CLOSE_CONSUMER, ...) go to the handler registered under its id, in
  arrival order, synchronously: a handler must not block.
- Keep-alive: the broker's PINGs are answered; once connected, after
  ``keepalive_interval_s`` without traffic this side pings, and after twice that it
  closes the connection. The task doing it belongs to the connection and ends with it.
  These rules, and what may come before CONNECTED, are the session's
  (``protocol/session.py``), shared with the broker's connection.
- When the connection goes (either side), every waiting request fails with
  ServiceNotReady (retriable) and every handler is told, so producers and consumers can
  reconnect. A malformed frame from the broker closes the connection the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from common.errors import MagnetarError, MalformedFrame, OperationTimeout, ServiceNotReady, TooManyRequests
from common.version import __version__
from runtime.tasks import every
from runtime.tls import TlsConfig, client_context
from protocol.codec import NEED_DATA, CommandDecoder, Frame, command_name, encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import error_for_server_error
from protocol.session import Due, Role, Session, Verdict

from client.config import ClientConfig
from client.split_cache import SplitCache

log = logging.getLogger(__name__)

T = pb.BaseCommand
CLIENT_VERSION = f"magnetar-client {__version__}"
# What the official clients of 2024 announce; the broker answers with the smaller of
# this and its own.
PROTOCOL_VERSION = pb.v20


class FrameHandler(Protocol):
    """A producer or consumer on a connection."""

    def on_frame(self, frame: Frame) -> None: ...

    def on_connection_lost(self) -> None: ...


# Answers that carry the request id of what they answer, by command type: the body
# field name holding it.
_RESPONSES: dict[int, str] = {
    T.SUCCESS: "success",
    T.ERROR: "error",
    T.PRODUCER_SUCCESS: "producer_success",
    T.LOOKUP_RESPONSE: "lookupTopicResponse",
    T.PARTITIONED_METADATA_RESPONSE: "partitionMetadataResponse",
    T.GET_LAST_MESSAGE_ID_RESPONSE: "getLastMessageIdResponse",
    T.ACK_RESPONSE: "ackResponse",
    T.CONSUMER_STATS_RESPONSE: "consumerStatsResponse",
    T.GET_TOPICS_OF_NAMESPACE_RESPONSE: "getTopicsOfNamespaceResponse",
}
_PRODUCER_FRAMES: dict[int, str] = {
    T.SEND_RECEIPT: "send_receipt",
    T.SEND_ERROR: "send_error",
    T.CLOSE_PRODUCER: "close_producer",
}
_CONSUMER_FRAMES: dict[int, str] = {
    T.MESSAGE: "message",
    T.CLOSE_CONSUMER: "close_consumer",
    T.ACTIVE_CONSUMER_CHANGE: "active_consumer_change",
    T.REACHED_END_OF_TOPIC: "reachedEndOfTopic",
}


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (or a ``pulsar://host:port`` URL) → (host, port)."""
    text = address.removeprefix("pulsar+ssl://").removeprefix("pulsar://").rstrip("/")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {address!r} is not host:port")
    return host, int(port)


class ClientConnection(asyncio.Protocol):
    def __init__(self, address: str, config: ClientConfig) -> None:
        self.address = address
        self.config = config
        self.decoder = CommandDecoder(frame_bytes_max=config.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.max_message_size = 0
        self.server_version = ""
        self._connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._requests: dict[int, asyncio.Future[Frame]] = {}
        self._producers: dict[int, FrameHandler] = {}
        self._consumers: dict[int, FrameHandler] = {}
        # Batch splits shared by the subscriptions of a topic read here (fan-out):
        # consumer id -> (topic, subscription), and per topic its subscriptions with
        # how many consumers each; splits are kept only for a topic with two or more.
        self.splits: SplitCache | None = None
        if config.split_cache_entries_max:
            self.splits = SplitCache(config.split_cache_entries_max, config.split_cache_bytes_max,
                                     config.split_cache_age_max_s)
        self._reading: dict[int, tuple[str, str]] = {}
        self._subscriptions_of: dict[str, dict[str, int]] = {}
        self._next_request_id = 1
        self._next_handler_id = 1
        self._writable = asyncio.Event()
        self._writable.set()
        # The session's rules (protocol/session.py); the handshake's own deadline is
        # open()'s bound on the whole opening.
        self.session = Session(Role.CLIENT, keepalive_interval_s=config.keepalive_interval_s,
                               handshake_timeout_s=config.connect_timeout_s, now_s=time.monotonic())
        self._keepalive: asyncio.Task[None] | None = None
        self.closed = False

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    async def open(cls, address: str, config: ClientConfig, proxy_to_broker_url: str = "") -> "ClientConnection":
        """Connects and completes the handshake, both within ``connect_timeout_ms``.
        Raises ServiceNotReady (retriable) when the broker cannot be reached. With
        ``proxy_to_broker_url``, ``address`` is a proxy and the CONNECT names the broker
        it is to pipe this connection to."""
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(config.connect_timeout_s):
                context = client_context(TlsConfig(trust_certs_file=config.tls_trust_certs_file,
                                                   cert_file=config.tls_cert_file, key_file=config.tls_key_file),
                                         verify_hostname=config.tls_hostname_verification) \
                    if config.tls_enabled else None
                _, connection = await loop.create_connection(lambda: cls(address, config), host, port, ssl=context,
                                                             server_hostname=host if context else None)
                connect = pb.CommandConnect(client_version=CLIENT_VERSION, protocol_version=PROTOCOL_VERSION)
                if proxy_to_broker_url:
                    connect.proxy_to_broker_url = proxy_to_broker_url
                token = connection._token()
                if token:
                    connect.auth_method_name = "token"
                    connect.auth_data = token.encode()
                    # The broker may then ask for a fresh token when this one expires.
                    connect.feature_flags.supports_auth_refresh = True
                elif config.auth_basic:
                    connect.auth_method_name = "basic"
                    connect.auth_data = config.auth_basic.encode()
                elif config.tls_cert_file and context is not None:
                    connect.auth_method_name = "tls"   # the role is the certificate's
                connection._write(encode_command(wrap(connect)))
                await connection._connected
        except TimeoutError:
            raise ServiceNotReady(f"no connection to {address} within {config.connect_timeout_ms} ms") from None
        except OSError as error:   # ssl.SSLError included: a certificate that does not verify
            raise ServiceNotReady(f"cannot connect to {address}: {error}") from None
        return connection

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: asyncio's own, or uvloop's (runtime/event_loop.py), which
        # is not a subclass of asyncio.Transport.
        assert callable(getattr(transport, "write", None)), transport
        assert callable(getattr(transport, "pause_reading", None)), transport
        self.transport = transport
        self._keepalive = asyncio.get_running_loop().create_task(
            every(self.session.check_interval_s, self._on_keepalive_check), name=f"keepalive {self.address}")

    def data_received(self, data: bytes) -> None:
        self.session.traffic(time.monotonic())
        try:
            self.decoder.feed(data)
            while not self.closed:
                frame = self.decoder.next_command()
                if frame is NEED_DATA:
                    break
                self._on_frame(frame)
        except MalformedFrame as error:
            log.warning("malformed frame from broker, closing: address=%s error=%s", self.address, error)
            self.close()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.splits is not None:
            self.splits.clear()
        self.session.closed()
        self._writable.set()
        if self._keepalive is not None:
            self._keepalive.cancel()
        error = ServiceNotReady(f"connection to {self.address} lost")
        if not self._connected.done():
            self._connected.set_exception(error)
            self._connected.exception()   # retrieved: open() may have given up already
        requests, self._requests = self._requests, {}
        for future in requests.values():
            if not future.done():
                future.set_exception(error)
        handlers = [*self._producers.values(), *self._consumers.values()]
        self._producers.clear()
        self._consumers.clear()
        for handler in handlers:
            handler.on_connection_lost()
        log.debug("connection closed: address=%s error=%s", self.address, exc)

    # --- frames in -----------------------------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        command = frame.command
        kind = command.type
        verdict = self.session.received(kind)
        if verdict is Verdict.PONG:
            self._write(encode_command(wrap(pb.CommandPong())))
            return
        if verdict is Verdict.DROP:
            return   # a PONG: the session counted its bytes as traffic
        if verdict is Verdict.IGNORE:
            log.debug("command before CONNECTED ignored: address=%s command=%s", self.address, command_name(kind))
            return
        assert verdict is Verdict.HANDLE, verdict   # a client refuses nothing: it ignores
        if kind in _RESPONSES:
            request_id = getattr(command, _RESPONSES[kind]).request_id
            future = self._requests.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(frame)
            return
        if kind in _PRODUCER_FRAMES:
            handler = self._producers.get(getattr(command, _PRODUCER_FRAMES[kind]).producer_id)
            if handler is not None:
                handler.on_frame(frame)
            return
        if kind in _CONSUMER_FRAMES:
            handler = self._consumers.get(getattr(command, _CONSUMER_FRAMES[kind]).consumer_id)
            if handler is not None:
                handler.on_frame(frame)
            return
        if kind == T.CONNECTED:
            if not self._connected.done():
                self.server_version = command.connected.server_version
                self.max_message_size = command.connected.max_message_size
                self.session.handshake_done()
                self._connected.set_result(None)
            return
        if kind == T.AUTH_CHALLENGE:
            self._answer_auth_challenge(command.authChallenge)
            return
        log.debug("unexpected command from broker ignored: address=%s command=%s", self.address,
                  command_name(kind))

    # --- credentials -----------------------------------------------------------------------------

    def _token(self) -> str:
        source = self.config.auth_token_source
        return source() if source is not None else self.config.auth_token

    def _answer_auth_challenge(self, challenge: pb.CommandAuthChallenge) -> None:
        """The broker asks for fresh credentials (the token it holds expired): the
        current token (a renewed file's, with auth_token_source). Without a token, or
        for another method, nothing is sent and the broker closes the connection."""
        method = challenge.challenge.auth_method_name if challenge.HasField("challenge") else "token"
        token = self._token()
        if not token or method not in ("", "token"):
            log.warning("broker asked for credentials this client cannot give: address=%s method=%s",
                        self.address, method[:32])
            return
        self._write(encode_command(wrap(pb.CommandAuthResponse(
            client_version=CLIENT_VERSION, protocol_version=PROTOCOL_VERSION,
            response=pb.AuthData(auth_method_name="token", auth_data=token.encode())))))
        log.info("credentials refreshed on the broker's challenge: address=%s", self.address)

    # --- keep-alive ------------------------------------------------------------------------------

    def _on_keepalive_check(self, now_s: float) -> bool:
        """What the session's keep-alive asks for now; False once it is over."""
        if self.splits is not None:
            self.splits.expire(now_s)
        due = self.session.due(now_s)
        if due is Due.PING:
            self._write(encode_command(wrap(pb.CommandPing())))
        elif due is Due.CLOSE_SILENT:
            log.warning("broker silent past keep-alive, closing: address=%s silent_s=%.1f", self.address,
                        self.session.silent_s(now_s))
            self.close()
        return not self.closed and due is not Due.CLOSE_SILENT

    # --- frames out ------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def write_command(self, command: pb.BaseCommand) -> None:
        self._write(encode_command(command))

    def write_frame(self, frame: bytes) -> None:
        self._write(frame)

    async def drain(self) -> None:
        """Waits while the socket's write buffer is above its high-water mark."""
        await self._writable.wait()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # --- ids and handlers ---------------------------------------------------------------------------

    def new_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    def register_producer(self, handler: FrameHandler) -> int:
        producer_id = self._next_handler_id
        self._next_handler_id += 1
        self._producers[producer_id] = handler
        return producer_id

    def register_consumer(self, handler: FrameHandler, topic: str = "", subscription: str = "") -> int:
        """The handler's consumer id. ``topic`` and ``subscription`` (when given) say
        what it reads, so that subscriptions of one topic share batch splits."""
        consumer_id = self._next_handler_id
        self._next_handler_id += 1
        self._consumers[consumer_id] = handler
        if topic:
            self._reading[consumer_id] = (topic, subscription)
            subscriptions = self._subscriptions_of.setdefault(topic, {})
            subscriptions[subscription] = subscriptions.get(subscription, 0) + 1
        return consumer_id

    def unregister_producer(self, producer_id: int) -> None:
        self._producers.pop(producer_id, None)

    def unregister_consumer(self, consumer_id: int) -> None:
        self._consumers.pop(consumer_id, None)
        reading = self._reading.pop(consumer_id, None)
        if reading is None:
            return
        topic, subscription = reading
        subscriptions = self._subscriptions_of[topic]
        subscriptions[subscription] -= 1
        if not subscriptions[subscription]:
            del subscriptions[subscription]
        if len(subscriptions) < 2:
            if self.splits is not None:
                self.splits.drop_topic(topic)
            if not subscriptions:
                del self._subscriptions_of[topic]

    def splits_for(self, topic: str) -> SplitCache | None:
        """The batch splits to share for ``topic``: only while two or more of its
        subscriptions are read through this connection (one subscription, or the
        consumers of one shared subscription, get each entry once: nothing to share)."""
        subscriptions = self._subscriptions_of.get(topic)
        return self.splits if subscriptions is not None and len(subscriptions) > 1 else None

    # --- requests ----------------------------------------------------------------------------------

    async def request(self, command: pb.BaseCommand, request_id: int) -> Frame:
        """Writes ``command`` (which carries ``request_id``) and returns its answer.
        Raises the catalogue error of an ERROR or Failed answer, OperationTimeout, or
        ServiceNotReady when the connection is gone."""
        if self.closed:
            raise ServiceNotReady(f"connection to {self.address} is closed")
        if len(self._requests) >= self.config.pending_requests_max:
            raise TooManyRequests(f"more than {self.config.pending_requests_max} requests waiting on "
                                  f"{self.address}")
        assert request_id not in self._requests, request_id
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        self.write_command(command)
        try:
            async with asyncio.timeout(self.config.operation_timeout_s):
                frame = await future
        except TimeoutError:
            raise OperationTimeout(f"{command_name(command.type)} got no answer from {self.address} within "
                                   f"{self.config.operation_timeout_ms} ms") from None
        finally:
            if self._requests.get(request_id) is future:
                del self._requests[request_id]
        _raise_if_failed(frame)
        return frame


def _raise_if_failed(frame: Frame) -> None:
    command = frame.command
    kind = command.type
    if kind == T.ERROR:
        raise error_for_server_error(command.error.error, command.error.message)
    if kind == T.LOOKUP_RESPONSE and command.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed:
        answer = command.lookupTopicResponse
        raise error_for_server_error(answer.error, answer.message)
    if kind == T.PARTITIONED_METADATA_RESPONSE and \
            command.partitionMetadataResponse.response == pb.CommandPartitionedTopicMetadataResponse.Failed:
        answer = command.partitionMetadataResponse
        raise error_for_server_error(answer.error, answer.message)
    if kind == T.ACK_RESPONSE and command.ackResponse.HasField("error"):
        raise error_for_server_error(command.ackResponse.error, command.ackResponse.message)


def is_retriable(error: BaseException) -> bool:
    return isinstance(error, MagnetarError) and error.retriable
