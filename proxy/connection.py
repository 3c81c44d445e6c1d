"""One client connection to the proxy.

A client's first frame must be CONNECT (within ``handshake_timeout_s``):

- **without** ``proxy_to_broker_url`` it is a lookup connection: the proxy answers
  CONNECTED itself and forwards LOOKUP, PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE and
  GET_SCHEMA to a broker it picks (the brokers registered in etcd), giving each answer
  back under the client's request id. An authenticated client's requests go over links
  of its own whose CONNECT names it (``ProxyServer.client_links``), so brokers
  authorize its role; its token's expiry is checked here (AUTH_CHALLENGE, then close).
  LOOKUP answers become ``Connect`` with
  ``proxy_through_service_url = true``: the client keeps the owner's URL as the
  logical address, connects physically to its service URL (this proxy, or another one
  behind the same name) and names the owner in ``proxy_to_broker_url``.
- **with** ``proxy_to_broker_url`` naming a registered broker, the proxy connects to
  that broker, sends it the client's CONNECT (without the field, so the client's own
  credentials reach the broker) and from then on pipes bytes both ways unread. Each
  side's write buffer is bounded (``buffer_bytes_max``): when one fills, reading from
  the other side pauses until it drains. A name that is not a live broker is refused
  (no open relay).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import TYPE_CHECKING

from common.errors import AuthenticationFailed, MalformedFrame
from protocol import commands
from protocol.codec import Frame, command_body, command_name, encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from proxy.auth import TOKEN_METHOD
from proxy.framing import take_frame
from proxy.upstream import PROXY_VERSION, UpstreamGone

if TYPE_CHECKING:
    from proxy.server import ProxyServer

log = logging.getLogger(__name__)

T = pb.BaseCommand
FORWARDED = {T.LOOKUP: "lookup", T.PARTITIONED_METADATA: "partitioned_metadata",
             T.GET_TOPICS_OF_NAMESPACE: "get_topics_of_namespace", T.GET_SCHEMA: "get_schema"}


class Phase(enum.Enum):
    HANDSHAKE = "handshake"
    LOOKUP = "lookup"
    PIPED = "piped"
    CLOSED = "closed"


class _Side(asyncio.Protocol):
    """What both ends of a pipe do with their transport: nothing once it is closing."""

    transport: asyncio.Transport | None = None

    def write_bytes(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ClientSide(_Side):
    def __init__(self, server: "ProxyServer") -> None:
        self.server = server
        self.config = server.config
        self.transport: asyncio.Transport | None = None
        self.peer = "-"
        self.phase = Phase.HANDSHAKE
        self._buffer = bytearray()
        self._broker: BrokerSide | None = None
        self._tasks: set[asyncio.Task] = set()
        self._deadline: asyncio.TimerHandle | None = None
        self.broker_name = ""
        # The client the proxy authenticated (None with authentication off).
        self.client = None
        # Its links to brokers for lookup-phase requests, naming it (opened at its first
        # request; closed with this connection). None: the proxy's shared links.
        self._links = None
        # The lookup connection's credential check: due at the client's token expiry,
        # then an AUTH_CHALLENGE, then closing if no valid answer came in time.
        self._expiry: asyncio.TimerHandle | None = None
        self._challenged = False
        self._refreshing = False
        self._refresh_supported = False
        self._protocol_version = 0
        # CONNECT named a broker: nothing more is read as frames (the rest is piped).
        self._piping = False
        # The client's credentials are being checked (reading paused until then).
        self._authenticating = False
        # Why the client's CONNECT failed authentication: answered CONNECTED all the same,
        # its first request gets this error (AuthenticationError) and the connection ends,
        # as a broker does (broker/connection.py: the official clients retry an ERROR in
        # place of CONNECTED until their timeout, but fail at once on a refused request).
        self._authentication_failure: AuthenticationFailed | None = None

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport   # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "-"
        metrics = self.server.metrics
        if len(self.server.connections) >= self.config.connections_max:
            metrics.refused.labels("connections_max").inc()
            log.warning("connection refused, too many open: peer=%s connections_max=%d", self.peer,
                        self.config.connections_max)
            self.phase = Phase.CLOSED
            transport.abort()
            return
        self.server.connections.add(self)
        metrics.connections_total.inc()
        metrics.connections.labels(self.phase.value).inc()
        self.transport.set_write_buffer_limits(high=self.config.buffer_bytes_max,
                                               low=self.config.buffer_bytes_max // 4)
        self._deadline = asyncio.get_running_loop().call_later(self.config.handshake_timeout_s,
                                                               self._handshake_expired)

    def data_received(self, data: bytes) -> None:
        if self.phase is Phase.PIPED:
            assert self._broker is not None
            self.server.metrics.bytes_client_to_broker.inc(len(data))
            self._broker.write(data)
            return
        if self.phase is Phase.CLOSED:
            return
        self._buffer += data
        self._read_frames()

    def _read_frames(self) -> None:
        """Handles the buffered frames, until the pipe starts or a check is under way."""
        try:
            while self.phase in (Phase.HANDSHAKE, Phase.LOOKUP) and not self._piping and not self._authenticating:
                frame = take_frame(self._buffer, self.config.frame_bytes_max)
                if frame is None:
                    break
                self._on_frame(frame)
        except MalformedFrame as error:
            self.server.metrics.refused.labels("malformed").inc()
            log.info("malformed frame, closing: peer=%s phase=%s error=%s", self.peer, self.phase.value, error)
            self.close()
            return
        if not self._piping and len(self._buffer) > self.config.frame_bytes_max + 4:
            self.close()

    def pause_writing(self) -> None:
        # This client's write buffer is full: stop reading what the broker sends.
        if self._broker is not None:
            self.server.metrics.paused.labels("broker").inc()
            self._broker.pause_reading()

    def resume_writing(self) -> None:
        if self._broker is not None:
            self._broker.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_phase(Phase.CLOSED)
        self.server.connections.discard(self)
        if self._deadline is not None:
            self._deadline.cancel()
        for task in self._tasks:
            task.cancel()
        if self._links is not None:
            self._links.close()
        if self._expiry is not None:
            self._expiry.cancel()
        if self._broker is not None:
            self._broker.close()

    # --- the phases -------------------------------------------------------------------

    def _set_phase(self, phase: Phase) -> None:
        if phase is self.phase:
            return
        gauge = self.server.metrics.connections
        if self.phase is not Phase.CLOSED:
            gauge.labels(self.phase.value).dec()
        if phase is not Phase.CLOSED:
            gauge.labels(phase.value).inc()
        self.phase = phase

    def _handshake_expired(self) -> None:
        if self.phase is Phase.HANDSHAKE:
            self.server.metrics.refused.labels("handshake_timeout").inc()
            log.info("no handshake in time, closing: peer=%s handshake_timeout_s=%s broker=%s", self.peer,
                     self.config.handshake_timeout_s, self.broker_name or "-")
            self.close()

    def _on_frame(self, frame: Frame) -> None:
        kind = frame.command.type
        if self.phase is Phase.HANDSHAKE:
            if kind != T.CONNECT:
                self.server.metrics.refused.labels("no_connect").inc()
                self.write(commands.error(0, pb.NotAllowedError, "the first command must be CONNECT"))
                self.close()
                return
            self._on_connect(frame.command.connect)
            return
        if kind == T.PING:
            self.write(commands.pong())
        elif kind == T.PONG:
            pass
        elif self._authentication_failure is not None:
            self._refuse(frame.command, self._authentication_failure)
            self.close()
        elif kind == T.AUTH_RESPONSE:
            # Taken only as the answer to our challenge, one at a time (a client cannot
            # make the proxy verify credentials at will).
            if self._challenged and not self._refreshing:
                self._refreshing = True
                self._spawn(self._refresh_credential(frame.command.authResponse))
        elif kind in FORWARDED:
            self._forward(frame.command)
        else:
            body = command_body(frame.command)
            request_id = getattr(body, "request_id", 0) if body is not None else 0
            self.write(commands.error(request_id, pb.NotAllowedError,
                                      f"{command_name(kind)} through the proxy needs a connection that names its "
                                      "broker (CONNECT.proxy_to_broker_url, from a lookup's answer)"))

    def _on_connect(self, connect: pb.CommandConnect) -> None:
        if not self.server.auth.enabled:
            self._after_authentication(connect)
            return
        # Providers may take a while (bcrypt runs in a thread): nothing more is read from
        # the client until the check is done (it sends nothing before CONNECTED anyway).
        self._authenticating = True
        self.transport.pause_reading()
        self._spawn(self._authenticate(connect))

    async def _authenticate(self, connect: pb.CommandConnect) -> None:
        certificate = self.transport.get_extra_info("peercert") if self.transport is not None else None
        try:
            self.client = await self.server.auth.authenticate(connect, certificate)
        except AuthenticationFailed as error:
            # The reason, never the credential.
            self.server.metrics.refused.labels("authentication").inc()
            log.info("authentication failed: peer=%s error=%s", self.peer, error.message)
            self._authentication_failure = error
        self._authenticating = False
        if self.phase is Phase.CLOSED:
            return
        if self._authentication_failure is not None:
            self._answer_connected(connect)
        else:
            self._after_authentication(connect)
        if not self._piping:
            self.transport.resume_reading()
            self._read_frames()

    def _answer_connected(self, connect: pb.CommandConnect) -> None:
        """The proxy answers CONNECTED itself: a lookup connection (or a refused one)."""
        self._set_phase(Phase.LOOKUP)
        if self._deadline is not None:
            self._deadline.cancel()
        self._protocol_version = commands.negotiated_protocol_version(connect.protocol_version)
        self.write(commands.connected(PROXY_VERSION, self._protocol_version, self.config.frame_bytes_max - 10 * 1024))
        if self.client is not None:
            self._refresh_supported = connect.feature_flags.supports_auth_refresh
            self._watch_expiry()

    # --- a lookup connection's credential (Pulsar's proxy refreshes it like a broker) ----

    def _watch_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self.client is None or self.client.expires_at_s is None:
            return
        delay = max(0.0, self.client.expires_at_s - time.time())
        self._expiry = asyncio.get_running_loop().call_later(delay, self._credential_expired)

    def _credential_expired(self) -> None:
        """The client's credential expired. On its lookup connection it is asked for a
        fresh one (AUTH_CHALLENGE, if it announced support and uses tokens) and has
        ``handshake_timeout_s`` to answer; otherwise the connection ends, as a broker's
        would. A piped connection is the broker's to check when the proxy forwards the
        client's token (the broker challenges it through the pipe); otherwise the broker
        sees only the proxy's credential, and the proxy closes the connection."""
        self._expiry = None
        if self.client is None or self.phase is Phase.CLOSED:
            return
        if self.phase is Phase.PIPED:
            self.server.metrics.refused.labels("credential_expired").inc()
            log.info("client credential expired on a piped connection the broker cannot renew, closing: peer=%s "
                     "role=%s broker=%s", self.peer, self.client.role, self.broker_name)
            self.close()
            return
        if self._challenged or not self._refresh_supported or self.client.method != TOKEN_METHOD:
            self.server.metrics.refused.labels("credential_expired").inc()
            log.info("client credential expired, closing: peer=%s role=%s challenged=%s", self.peer,
                     self.client.role, self._challenged)
            self.close()
            return
        self._challenged = True
        self.write(commands.auth_challenge(PROXY_VERSION, self._protocol_version, TOKEN_METHOD))
        log.info("client credential expired, challenging: peer=%s role=%s", self.peer, self.client.role)
        self._expiry = asyncio.get_running_loop().call_later(self.config.handshake_timeout_s,
                                                             self._credential_expired)

    async def _refresh_credential(self, response: pb.CommandAuthResponse) -> None:
        """The client's fresh credential: the same role must come back, verified, or the
        connection ends. Links opened from now on carry it; idle ones are closed."""
        assert self.client is not None
        connect = pb.CommandConnect(auth_method_name=TOKEN_METHOD, auth_data=response.response.auth_data)
        try:
            fresh = await self.server.auth.authenticate(connect, None)
        except AuthenticationFailed as error:
            log.info("client credential refresh failed, closing: peer=%s role=%s error=%s", self.peer,
                     self.client.role, error.message)
            self.close()
            return
        finally:
            self._refreshing = False
        if self.phase is Phase.CLOSED:
            return
        if fresh is None or fresh.role != self.client.role:
            log.info("client credential refresh names another role, closing: peer=%s role=%s", self.peer,
                     self.client.role)
            self.close()
            return
        self.client = fresh
        self._challenged = False
        if self._links is not None:
            self._links.drop_idle()
        log.info("client credential refreshed: peer=%s role=%s expires_at_s=%s", self.peer, fresh.role,
                 fresh.expires_at_s)
        self._watch_expiry()

    def _refuse(self, command: pb.BaseCommand, error: AuthenticationFailed) -> None:
        """Answers a request with ``error`` in the answer its command expects (the broker's shapes)."""
        body = command_body(command)
        request_id = getattr(body, "request_id", 0) if body is not None else 0
        if command.type == T.LOOKUP:
            self.write(commands.lookup_failure(request_id, pb.AuthenticationError, error.message))
        elif command.type == T.PARTITIONED_METADATA:
            self.write(commands.partitioned_metadata_failure(request_id, pb.AuthenticationError, error.message))
        else:
            self.write(commands.error(request_id, pb.AuthenticationError, error.message))

    def _after_authentication(self, connect: pb.CommandConnect) -> None:
        if not connect.proxy_to_broker_url:
            self._answer_connected(connect)
            return
        address = self.server.brokers.resolve(connect.proxy_to_broker_url)
        if address is None:
            self.server.metrics.refused.labels("unknown_broker").inc()
            log.warning("CONNECT names no registered broker, refused: peer=%s proxy_to_broker_url=%s", self.peer,
                        connect.proxy_to_broker_url[:200])
            self.write(commands.error(0, pb.ServiceNotReady,
                                      f"{connect.proxy_to_broker_url[:200]} is not a broker of this cluster"))
            self.close()
            return
        self.broker_name = f"{address.host}:{address.port}"
        self._piping = True
        forwarded = self.server.auth.for_broker(connect, self.client)
        # Nothing more is read from the client until the broker is there (pausing twice,
        # after an authenticating proxy's check, is harmless).
        self.transport.pause_reading()
        self._spawn(self._open_broker(address, forwarded))

    async def _open_broker(self, address, connect: pb.CommandConnect) -> None:
        loop = asyncio.get_running_loop()
        context = self.server.broker_tls_context if address.tls else None
        try:
            async with asyncio.timeout(self.config.handshake_timeout_s):
                _, broker = await loop.create_connection(lambda: BrokerSide(self), address.host, address.port,
                                                         ssl=context,
                                                         server_hostname=address.host if context else None)
        except (OSError, TimeoutError) as error:
            self.server.metrics.refused.labels("broker_unreachable").inc()
            log.info("broker unreachable, closing client: peer=%s broker=%s error=%s", self.peer, self.broker_name,
                     error or "timed out")
            self.write(commands.error(0, pb.ServiceNotReady, f"broker {self.broker_name} unreachable"))
            self.close()
            return
        if self.phase is Phase.CLOSED:
            broker.close()
            return
        self._broker = broker
        if self._deadline is not None:
            self._deadline.cancel()
        self._set_phase(Phase.PIPED)
        broker.write(encode_command(wrap(connect)))
        if self._buffer:
            rest, self._buffer = bytes(self._buffer), bytearray()
            self.server.metrics.bytes_client_to_broker.inc(len(rest))
            broker.write(rest)
        log.debug("piping: peer=%s broker=%s", self.peer, self.broker_name)
        if self.client is not None and not self.server.auth.forwards_refreshable(self.client):
            # The broker knows only the proxy's credential here: the client's expiry is
            # enforced by the proxy (the client reconnects with a fresh one).
            self._watch_expiry()
        self.transport.resume_reading()

    def _forward(self, command: pb.BaseCommand) -> None:
        if len(self._tasks) >= self.config.pending_lookups_max:
            body = command_body(command)
            self.write(commands.error(body.request_id, pb.TooManyRequests,
                                      f"more than {self.config.pending_lookups_max} lookups waiting"))
            return
        self._spawn(self._forward_one(command))

    async def _forward_one(self, command: pb.BaseCommand) -> None:
        kind = command.type
        name = FORWARDED[kind]
        client_request_id = command_body(command).request_id
        self.server.auth.strip_original(command_body(command))
        if self.client is not None and self._links is None:
            self._links = self.server.client_links(lambda: self.client)
        try:
            frame = await self.server.forward(command, self._links)
        except (UpstreamGone, TimeoutError) as error:
            self.server.metrics.lookups.labels(name, "unavailable").inc()
            message = str(error) or "no broker answered in time"
            if kind == T.LOOKUP:
                answer = commands.lookup_failure(client_request_id, pb.ServiceNotReady, message)
            elif kind == T.PARTITIONED_METADATA:
                answer = commands.partitioned_metadata_failure(client_request_id, pb.ServiceNotReady, message)
            else:
                answer = commands.error(client_request_id, pb.ServiceNotReady, message)
            self.write(answer)
            return
        answer = frame.command
        body = command_body(answer)
        body.request_id = client_request_id
        if answer.type == T.LOOKUP_RESPONSE and body.response in (pb.CommandLookupTopicResponse.Connect,
                                                                  pb.CommandLookupTopicResponse.Redirect):
            # The owner stays the logical address; the client comes back through us.
            body.response = pb.CommandLookupTopicResponse.Connect
            body.authoritative = True
            body.proxy_through_service_url = True
            # A client takes the URL of its own scheme (pulsar+ssl:// to us: the TLS one)
            # and only names it back to us in proxy_to_broker_url. An owner without that
            # listener is still piped to by its other address (over TLS or not as that
            # address is): without this, a TLS client of a plain broker got an empty URL.
            if not body.brokerServiceUrlTls:
                body.brokerServiceUrlTls = body.brokerServiceUrl
            elif not body.brokerServiceUrl:
                body.brokerServiceUrl = body.brokerServiceUrlTls
        failed = (answer.type == T.ERROR
                  or (answer.type == T.LOOKUP_RESPONSE and body.response == pb.CommandLookupTopicResponse.Failed)
                  or (answer.type == T.PARTITIONED_METADATA_RESPONSE
                      and body.response == pb.CommandPartitionedTopicMetadataResponse.Failed))
        self.server.metrics.lookups.labels(name, "error" if failed else "ok").inc()
        self.write(answer)

    # --- helpers ----------------------------------------------------------------------

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def write(self, command: pb.BaseCommand) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode_command(command))



class BrokerSide(_Side):
    """The proxy's connection to the broker a piped client named."""

    def __init__(self, client: ClientSide) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport   # type: ignore[assignment]
        limit = self.client.config.buffer_bytes_max
        self.transport.set_write_buffer_limits(high=limit, low=limit // 4)

    def data_received(self, data: bytes) -> None:
        self.client.server.metrics.bytes_broker_to_client.inc(len(data))
        self.client.write_bytes(data)

    def pause_writing(self) -> None:
        # The broker's side is full: stop reading from the client.
        self.client.server.metrics.paused.labels("client").inc()
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()

    def write(self, data: bytes) -> None:
        self.write_bytes(data)
