"""One client connection speaking Pulsar's binary protocol (the shell around the
sans-IO codec).

Theory of operation:
- Bytes go into the ``CommandDecoder``; every complete frame is handled in arrival
  order. Commands that must keep their order and need no IO (SEND, FLOW, ACK,
  REDELIVER) are handled inline; commands that wait on metadata or storage (LOOKUP,
  PRODUCER, SUBSCRIBE, SEEK...) run as tasks owned by the connection, and the client
  waits for their answers before depending on them.
- Requests that run as tasks are bounded per connection
  (``pending_requests_per_connection_max``); past it a request is refused at once
  with TooManyRequests (retriable: the client retries after its back-off).
- CLOSE_PRODUCER / CLOSE_CONSUMER for one still being created cancel the creation:
  its task registers the producer or consumer with no await after adding it to the
  topic, so a cancelled creation leaves nothing attached (no zombie that nobody will
  ever close).
- Once the connection is closing (``close``, or the peer went away) no further frame
  of the data already received is handled.
- Until CONNECT only CONNECT is accepted. A malformed frame closes this connection
  only; a SEND whose payload checksum is wrong gets SEND_ERROR(ChecksumError) and the
  connection goes on (Pulsar's behaviour).
- Back-pressure: each SEND is counted, until it is answered, against this connection,
  its topic and the broker (``broker/publish_limits.py``); when it fills one of them
  (``pending_sends_per_connection_max``, ``pending_sends_per_topic_max`` and bytes,
  ``pending_sends_per_broker_max`` and bytes) the broker stops reading this socket
  until every bound it hit has drained to ``pending_sends_resume_ratio`` of itself. A
  send is never refused for a bound. Toward consumers, when the socket's write buffer
  passes its high-water mark the connection is not writable and dispatchers hold off
  until it drains.
- Authentication (broker/authentication.py), when on: CONNECT must carry a role's
  credentials for one of the configured providers (auth method ``token`` or ``basic``
  with its data, or ``tls`` with the client certificate of the TLS handshake); it is
  checked in a task, and CONNECTED written after. A CONNECT whose credentials fail is still
  answered CONNECTED, and the first request after it is answered with
  AuthenticationError and the connection closed: the official C++-based clients treat
  an ERROR in place of CONNECTED as a connect error and retry until their timeout
  (pulsar-client-cpp issue 227), while an AuthenticationError answer to a request fails
  the operation at once. Nothing but PING/PONG is served to such a connection. Authorization: lookups and
  partition metadata need produce or consume on the topic, PRODUCER produce, SUBSCRIBE
  consume. ``recheck_permissions`` (the service calls it periodically and after a
  revoke) closes producers and consumers whose role lost its permission. A connection
  whose token has expired is sent AUTH_CHALLENGE when its client announced auth refresh
  (CONNECT's ``supports_auth_refresh``); an AUTH_RESPONSE with a valid token of the same
  role keeps it open, and anything else (an invalid answer, another role, or no answer
  by the next check) closes it, as does expiry for a client without refresh.
- Limits against abuse (BrokerConfig): past ``connections_max`` in total or
  ``connections_per_address_max`` from one IP address a new connection is closed at
  once (a warning per episode); CONNECT must arrive within ``connect_timeout_s``; a
  frame once begun must be whole within ``frame_timeout_s`` (a slow-loris sender is
  closed; a connection whose frames keep completing never is); a topic takes at most
  ``producers_per_topic_max`` producers and ``consumers_per_topic_max`` consumers
  (ProducerBusy / ConsumerBusy, which the official clients do not retry). Requests in
  progress and unanswered sends per connection are bounded as said above.
- Keep-alive: a PING after ``keepalive_interval_s`` of silence; no traffic for twice
  that closes the connection. When the connection goes, its producers and consumers
  are removed from their topics.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from typing import TYPE_CHECKING, Callable

from protocol import commands
from protocol.batch import message_count
from protocol.codec import NEED_DATA, CommandDecoder, Frame, PayloadChecksumMismatch, command_name, encode_command
from broker import policy_enforcement, schemas, topic_list
from broker.authentication import TOKEN_METHOD, Identity
from broker.authorization import CONSUME, PRODUCE
from broker.consumer import Consumer
from broker.deduplication import Verdict
from common.position import Position
from broker.producer import Producer
from broker.publish_limits import PendingSends, ReadGate
from broker.topic_list_watchers import TopicListWatcher
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import server_error_for
from common.topic_name import NamespaceName, TopicName
from common.errors import (
    AuthenticationFailed,
    ChecksumError,
    ConsumerBusy,
    ProducerBusy,
    InvalidArgument,
    MagnetarError,
    MalformedFrame,
    NotAllowed,
    SubscriptionNotFound,
    TooManyRequests,
)
from common import write_batch
from common.eager_future import call_when_done
from common.tasks import log_failure
from common.version import __version__

from subscriptions.mode import SubscriptionMode
from subscriptions.ports import AckedMessage

if TYPE_CHECKING:
    from broker.service import BrokerService
    from broker.topic import PersistentTopic
    from subscriptions.subscription import Subscription

log = logging.getLogger(__name__)

SERVER_VERSION = f"Magnetar {__version__}"
# Producers closed by the broker whose late SENDs a connection drops silently (a client
# has at most a few producers per connection; older ones get NotAllowed errors again).
CLOSED_PRODUCERS_REMEMBERED = 1000
# A listener name longer than this is kept cut (it then matches no listener).
LISTENER_NAME_BYTES_MAX = 256
T = pb.BaseCommand


class _AttachedConsumer:
    __slots__ = ("consumer", "topic", "subscription", "durable")

    def __init__(self, consumer: Consumer, topic: "PersistentTopic", subscription: "Subscription",
                 durable: bool) -> None:
        self.consumer = consumer
        self.topic = topic
        self.subscription = subscription
        self.durable = durable


class ServerConnection(asyncio.Protocol):
    def __init__(self, service: "BrokerService") -> None:
        self.service = service
        self.config = service.config
        self.decoder = CommandDecoder(frame_bytes_max=self.config.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.connected = False
        self.closed = False
        self.protocol_version = 0
        self.client_version = ""
        # The authenticated role (None while authentication is off, or before CONNECT).
        self.identity: Identity | None = None
        # Set when CONNECT's credentials failed: every request is refused with it.
        self._authentication_failure: AuthenticationFailed | None = None
        # CONNECT is being authenticated (a task); CONNECTED is not written yet.
        self._connecting = False
        # The client announced AUTH_CHALLENGE support (CONNECT feature flags).
        self.supports_auth_refresh = False
        # An AUTH_CHALLENGE was sent and not yet answered with valid credentials.
        self._challenged = False
        self.auth_refreshes = 0
        self.writable = True
        # The advertised listener the client names in its lookups on this connection
        # ("" until it names one): a hand-over sends its clients to that listener's URL
        # of the new owner (broker/redirect.py).
        self.listener_name = ""
        self.producers: dict[int, Producer] = {}
        self._producer_topics: dict[int, "PersistentTopic"] = {}
        # Producers the broker closed (CLOSE_PRODUCER sent) until the client creates
        # them again: SENDs already on their way for them are dropped unanswered (the
        # client resends them after reconnecting) instead of answered with an error.
        self._closed_by_broker: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._pending_producers: dict[int, asyncio.Task[None]] = {}
        self.consumers: dict[int, _AttachedConsumer] = {}
        self.topic_list_watchers: dict[int, TopicListWatcher] = {}
        self._pending_consumers: dict[int, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusing = False   # an episode of TooManyRequests was logged
        # Created with the transport (connection_made): this connection's pending sends
        # and its reading switch.
        self._read_gate: ReadGate | None = None
        self._last_received = time.monotonic()
        # time.perf_counter() of the latest read, and the broker's stage histograms
        # (None: not timed) for the "send_decode" stage.
        self._received_at = time.perf_counter()
        self._stages = getattr(getattr(service, "ledger_client", None), "stages", None)
        # Run at the end of each read: the entries its SENDs made leave for the bookies
        # in that turn, not the next (LedgerClient.flush_adds); None without a client.
        self._flush_adds = getattr(getattr(service, "ledger_client", None), "flush_adds", None)
        self._keepalive: asyncio.Task[None] | None = None
        # The CONNECT deadline, and the deadline of a frame begun and not yet whole
        # (with the count of frames handled when it was armed: progress re-arms it).
        self._connect_deadline: asyncio.TimerHandle | None = None
        self._frame_deadline: asyncio.TimerHandle | None = None
        self._frames_handled = 0
        self._frames_at_arming = 0
        self._address = ""
        self._handlers: dict[int, Callable[[Frame], None]] = {
            T.CONNECT: self._on_connect,
            T.PING: self._on_ping,
            T.PONG: self._on_pong,
            T.AUTH_RESPONSE: self._on_auth_response,
            T.PARTITIONED_METADATA: self._spawn(self._on_partitioned_metadata),
            T.LOOKUP: self._spawn(self._on_lookup),
            T.PRODUCER: self._on_producer,
            T.SEND: self._on_send,
            T.CLOSE_PRODUCER: self._on_close_producer,
            T.SUBSCRIBE: self._on_subscribe,
            T.FLOW: self._on_flow,
            T.ACK: self._on_ack,
            T.REDELIVER_UNACKNOWLEDGED_MESSAGES: self._on_redeliver,
            T.UNSUBSCRIBE: self._spawn(self._on_unsubscribe),
            T.CLOSE_CONSUMER: self._on_close_consumer,
            T.SEEK: self._spawn(self._on_seek),
            T.GET_LAST_MESSAGE_ID: self._spawn(self._on_get_last_message_id),
            T.GET_TOPICS_OF_NAMESPACE: self._spawn(self._on_get_topics_of_namespace),
            T.GET_SCHEMA: self._spawn(self._on_get_schema),
            T.WATCH_TOPIC_LIST: self._spawn(self._on_watch_topic_list),
            T.WATCH_TOPIC_LIST_CLOSE: self._on_watch_topic_list_close,
            T.GET_OR_CREATE_SCHEMA: self._spawn(self._on_get_or_create_schema),
            T.CONSUMER_STATS: self._on_consumer_stats,
        }

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: asyncio's own, or uvloop's (common/event_loop.py), which
        # is not a subclass of asyncio.Transport.
        assert callable(getattr(transport, "write", None)), transport
        assert callable(getattr(transport, "pause_reading", None)), transport
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._address = str(peer[0]) if peer else "?"
        transport.set_write_buffer_limits(high=self.config.write_buffer_high_bytes,
                                          low=self.config.write_buffer_low_bytes)
        if self.service.admit_connection(self._address) is not None:
            self.closed = True   # not counted, not registered: connection_lost has nothing to undo
            transport.abort()
            return
        self.service.connections.add(self)
        self._connect_deadline = asyncio.get_running_loop().call_later(self.config.connect_timeout_s,
                                                                       self._on_connect_deadline)
        self._read_gate = self.service.publish_limits.gate(self.peer, self._pause_reading, self._resume_reading)
        # Owned by the connection: cancelled in connection_lost, its failure logged.
        self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())
        self._keepalive.add_done_callback(functools.partial(log_failure, owner=f"connection {self.peer}"))
        log.debug("connection opened: peer=%s", self.peer)

    def data_received(self, data: bytes) -> None:
        opened = write_batch.begin()
        try:
            self._on_data(data)
        finally:
            if opened:
                write_batch.end()

    def _on_data(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        self._received_at = time.perf_counter()
        try:
            self.decoder.feed(data)
            while not self.is_closing:
                try:
                    frame = self.decoder.next_command()
                except PayloadChecksumMismatch as error:
                    self._frames_handled += 1
                    self._on_checksum_mismatch(error)
                    continue
                if frame is NEED_DATA:
                    break
                self._frames_handled += 1
                self._handle(frame)
        except MalformedFrame as error:
            log.info("malformed frame, closing connection: peer=%s error=%s", self.peer, error)
            self.close()
            return
        if self.decoder.buffered_bytes == 0:
            if self._frame_deadline is not None:
                self._frame_deadline.cancel()
                self._frame_deadline = None
        elif self._frame_deadline is None and not self.is_closing:
            self._arm_frame_deadline()
        if self._flush_adds is not None:
            self._flush_adds()

    def _arm_frame_deadline(self) -> None:
        self._frames_at_arming = self._frames_handled
        self._frame_deadline = asyncio.get_running_loop().call_later(self.config.frame_timeout_s,
                                                                     self._on_frame_deadline)

    def _on_frame_deadline(self) -> None:
        self._frame_deadline = None
        if self.is_closing or self.decoder.buffered_bytes == 0:
            return
        if self._frames_handled != self._frames_at_arming:
            self._arm_frame_deadline()   # frames keep completing: a busy peer, not a slow one
            return
        log.info("frame not completed in time, closing: peer=%s frame_timeout_s=%s buffered_bytes=%d", self.peer,
                 self.config.frame_timeout_s, self.decoder.buffered_bytes)
        self.close()

    def _on_connect_deadline(self) -> None:
        self._connect_deadline = None
        if not self.connected and not self.is_closing:
            log.info("no CONNECT in time, closing: peer=%s connect_timeout_s=%s", self.peer,
                     self.config.connect_timeout_s)
            self.close()

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for attached in self.consumers.values():
            attached.subscription.dispatcher.wake()

    @property
    def is_closing(self) -> bool:
        """True once close() was called or the peer went away: frames still buffered
        are not handled (a frame that closed the connection ends the conversation)."""
        return self.closed or (self.transport is not None and self.transport.is_closing())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self in self.service.connections:
            self.service.connections.discard(self)
            self.service.release_connection(self._address)
        for timer in (self._connect_deadline, self._frame_deadline):
            if timer is not None:
                timer.cancel()
        if self._read_gate is not None:
            self.service.publish_limits.forget(self._read_gate)
        if self._keepalive is not None:
            self._keepalive.cancel()
        for task in list(self._tasks):
            task.cancel()
        for producer_id in list(self.producers):
            self._detach_producer(producer_id)
        for consumer_id in list(self.consumers):
            self._detach_consumer(consumer_id)
        for watcher in self.topic_list_watchers.values():
            self.service.topic_list_watchers.unwatch(watcher)
        self.topic_list_watchers.clear()
        log.debug("connection closed: peer=%s error=%s", self.peer, exc)

    # --- writing -------------------------------------------------------------------------------

    # Through common/write_batch: inside a socket read's scope, what this connection is
    # sent leaves in one write when the read has been handled.

    def write_command(self, command: pb.BaseCommand) -> None:
        if self.transport is not None and not self.transport.is_closing():
            write_batch.write(self.transport, [encode_command(command)])

    def write_buffers(self, buffers: list) -> None:
        if self.transport is not None and not self.transport.is_closing():
            write_batch.write(self.transport, buffers)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            write_batch.release(self.transport)
            self.transport.close()

    def _write_error(self, request_id: int, error: BaseException) -> None:
        message = error.message if isinstance(error, MagnetarError) else str(error)
        self.write_command(commands.error(request_id, server_error_for(error), message))

    # --- dispatch ----------------------------------------------------------------------------------

    def _spawn(self, handler) -> Callable[[Frame], None]:
        def start(frame: Frame) -> None:
            if self._refuse_if_too_many(frame):
                return
            self._start_task(handler(frame))
        return start

    def _refuse_if_too_many(self, frame: Frame) -> bool:
        """Answers a request that would run as a task with TooManyRequests when the
        connection has ``pending_requests_per_connection_max`` tasks already."""
        if len(self._tasks) < self.config.pending_requests_per_connection_max:
            return False
        error = TooManyRequests(f"more than {self.config.pending_requests_per_connection_max} requests "
                                "in progress on this connection")
        self._refuse(frame, error)
        if not self._refusing:
            self._refusing = True
            log.warning("too many requests in progress, refusing: peer=%s requests=%d", self.peer, len(self._tasks))
        return True

    def _refuse(self, frame: Frame, error: MagnetarError) -> None:
        """Answers a request with ``error`` in the answer its command expects."""
        command = frame.command
        code = server_error_for(error)
        if command.type == T.LOOKUP:
            self.write_command(commands.lookup_failure(command.lookupTopic.request_id, code, error.message))
        elif command.type == T.PARTITIONED_METADATA:
            self.write_command(commands.partitioned_metadata_failure(command.partitionMetadata.request_id, code,
                                                                     error.message))
        elif command.type == T.SEND:
            self.write_command(commands.send_error(command.send.producer_id, command.send.sequence_id, code,
                                                   error.message))
        else:
            request_id = _request_id_of(command)
            if request_id is not None:
                self.write_command(commands.error(request_id, code, error.message))

    def _start_task(self, coroutine) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if len(self._tasks) < self.config.pending_requests_per_connection_max // 2:
            self._refusing = False   # the episode is over: warn again at the next one
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            log.error("connection handler failed: peer=%s error=%r", self.peer, error,
                      exc_info=(type(error), error, error.__traceback__))

    def _handle(self, frame: Frame) -> None:
        command_type = frame.command.type
        if not self.connected and command_type != T.CONNECT:
            log.info("command before CONNECT, closing: peer=%s command=%s", self.peer, command_name(command_type))
            self.write_command(commands.error(0, pb.NotAllowedError, "the first command must be CONNECT"))
            self.close()
            return
        if self._authentication_failure is not None and command_type not in (T.CONNECT, T.PING, T.PONG):
            self._refuse(frame, self._authentication_failure)
            self.close()
            return
        handler = self._handlers.get(command_type)
        if handler is None:
            request_id = _request_id_of(frame.command)
            log.info("unsupported command: peer=%s command=%s", self.peer, command_name(command_type))
            if request_id is None:
                self.close()
            else:
                self.write_command(commands.error(request_id, pb.NotAllowedError,
                                                  f"command {command_name(command_type)} is not supported"))
            return
        handler(frame)

    # --- connection-level commands ---------------------------------------------------------------

    def _on_connect(self, frame: Frame) -> None:
        if self.connected or self._connecting:
            self.write_command(commands.error(0, pb.NotAllowedError, "already connected"))
            return
        connect = frame.command.connect
        if not self.service.authenticator.enabled:
            self._finish_connect(connect)
            return
        # Providers may take a while (bcrypt runs in a thread): CONNECTED is written when
        # the check is done; the client sends nothing else before it.
        self._connecting = True
        self._start_task(self._authenticate_connect(connect))

    def _peer_certificate(self) -> dict | None:
        """The client certificate the TLS handshake verified (None on a plain port or
        when the client sent none)."""
        return self.transport.get_extra_info("peercert") if self.transport is not None else None

    async def _authenticate_connect(self, connect: pb.CommandConnect) -> None:
        method = connect.auth_method_name if connect.HasField("auth_method_name") else ""
        data = connect.auth_data if connect.HasField("auth_data") else None
        try:
            self.identity = await self.service.authenticator.authenticate(method, data, self._peer_certificate())
            if connect.HasField("original_principal"):
                # A proxy connecting for its client (proxy roles only).
                self.identity = self.service.authenticator.on_behalf_of(
                    self.identity, connect.original_principal, connect.original_auth_method)
        except AuthenticationFailed as error:
            # The reason, never the credential. The first request gets the error and
            # the connection ends (see the module's docstring).
            log.info("authentication failed: peer=%s method=%s error=%s", self.peer, method[:32], error.message)
            self._authentication_failure = error
        if not self.is_closing:
            self._finish_connect(connect)

    def _finish_connect(self, connect: pb.CommandConnect) -> None:
        self.client_version = connect.client_version
        self.protocol_version = commands.negotiated_protocol_version(connect.protocol_version)
        self.supports_partial_producer = connect.feature_flags.supports_partial_producer
        self.supports_auth_refresh = connect.feature_flags.supports_auth_refresh
        self.connected = True
        # Announced because this broker serves WATCH_TOPIC_LIST: a client that knows the
        # flag (the Java one) watches instead of polling for its pattern consumers.
        self.write_command(commands.connected(SERVER_VERSION, self.protocol_version, self.config.max_message_size,
                                              pb.FeatureFlags(supports_topic_watchers=True)))
        log.debug("client connected: peer=%s client=%s protocol=%d role=%s method=%s", self.peer,
                  self.client_version, self.protocol_version, self.role,
                  self.identity.method if self.identity is not None else "-")

    def _on_auth_response(self, frame: Frame) -> None:
        if self.identity is None:
            return   # authentication is off (or failed, and then this never arrives here)
        if self._refuse_if_too_many(frame):
            return   # bounded like any request that runs as a task (it has no answer to refuse with)
        self._start_task(self._refresh_identity(frame.command.authResponse))

    async def _refresh_identity(self, response: pb.CommandAuthResponse) -> None:
        """Takes a client's fresh credentials (the answer to AUTH_CHALLENGE): the same
        role must come back, verified, or the connection ends."""
        assert self.identity is not None
        method = response.response.auth_method_name or self.identity.method
        data = response.response.auth_data if response.response.HasField("auth_data") else None
        try:
            identity = await self.service.authenticator.authenticate(method, data, self._peer_certificate())
        except AuthenticationFailed as error:
            log.info("credential refresh failed, closing connection: peer=%s role=%s method=%s error=%s",
                     self.peer, self.role, method[:32], error.message)
            self.close()
            return
        if identity.role != self.identity.role:
            log.info("credential refresh names another role, closing connection: peer=%s role=%s new_role=%s",
                     self.peer, self.role, identity.role)
            self.close()
            return
        self.identity = identity
        self._challenged = False
        self.auth_refreshes += 1
        log.info("credential refreshed: peer=%s role=%s method=%s expires_at_s=%s", self.peer, self.role,
                 identity.method, identity.expires_at_s)

    @property
    def role(self) -> str | None:
        return self.identity.role if self.identity is not None else None

    def _requesting_role(self, request) -> str | None:
        """The role a lookup is checked for: the ``original_principal`` a proxy role
        names for its client (AuthenticationFailed from any other role), else this
        connection's."""
        if self.identity is None or not request.HasField("original_principal"):
            return self.role
        return self.service.authenticator.on_behalf_of(self.identity, request.original_principal).role

    async def recheck_permissions(self) -> None:
        """Closes the connection if its credential expired, and each producer or
        consumer whose role may no longer produce or consume on its topic (CLOSE_*: the
        client looks the topic up again and is refused)."""
        if self.closed or self.identity is None:
            return
        if not self.service.authenticator.still_valid(self.identity):
            if self._challenged or not self.supports_auth_refresh or self.identity.method != TOKEN_METHOD:
                log.info("credential expired, closing connection: peer=%s role=%s challenged=%s", self.peer,
                         self.role, self._challenged)
                self.close()
                return
            # Pulsar's refresh: the client answers with fresh credentials (its token
            # supplier's) before the next check, or the connection ends then.
            self._challenged = True
            self.write_command(commands.auth_challenge(SERVER_VERSION, self.protocol_version, TOKEN_METHOD))
            log.info("credential expired, challenging the client: peer=%s role=%s", self.peer, self.role)
        authorizer = self.service.authorizer
        if not authorizer.enabled:
            return
        for producer_id, topic in list(self._producer_topics.items()):
            if not await authorizer.allowed(self.role, topic.name, PRODUCE):
                producer = self.producers.get(producer_id)
                if producer is not None and self._producer_topics.get(producer_id) is topic:
                    log.info("producer closed, permission revoked: peer=%s role=%s topic=%s", self.peer,
                             self.role, topic.full_name)
                    self._detach_producer(producer_id)
                    self.write_command(commands.close_producer(producer_id))
        for consumer_id, attached in list(self.consumers.items()):
            if not await authorizer.allowed(self.role, attached.topic.name, CONSUME):
                if self.consumers.get(consumer_id) is attached:
                    log.info("consumer closed, permission revoked: peer=%s role=%s topic=%s", self.peer,
                             self.role, attached.topic.full_name)
                    self._detach_consumer(consumer_id)
                    self.write_command(commands.close_consumer(consumer_id))

    def _on_ping(self, frame: Frame) -> None:
        self.write_command(commands.pong())

    def _on_pong(self, frame: Frame) -> None:
        pass  # _last_received was updated when it arrived

    async def _keep_alive(self) -> None:
        interval = self.config.keepalive_interval_s
        while not self.closed:
            await asyncio.sleep(interval / 2)
            silent = time.monotonic() - self._last_received
            if silent > 2 * interval:
                log.info("connection idle past keep-alive, closing: peer=%s silent_s=%.1f", self.peer, silent)
                self.close()
                return
            if silent > interval and self.connected:
                self.write_command(commands.ping())

    # --- lookups ----------------------------------------------------------------------------------

    async def _on_partitioned_metadata(self, frame: Frame) -> None:
        request = frame.command.partitionMetadata
        try:
            name = TopicName.parse(request.topic)
            await self.service.authorizer.check_lookup(self._requesting_role(request), name)
            partitions = await self.service.partitioned_metadata(name)
        except MagnetarError as error:
            self.write_command(commands.partitioned_metadata_failure(request.request_id, server_error_for(error),
                                                                     error.message))
            return
        self.write_command(commands.partitioned_metadata_response(request.request_id, partitions))

    async def _on_lookup(self, frame: Frame) -> None:
        request = frame.command.lookupTopic
        try:
            name = TopicName.parse(request.topic)
            await self.service.authorizer.check_lookup(self._requesting_role(request), name)
            if request.advertised_listener_name:
                self.listener_name = request.advertised_listener_name[:LISTENER_NAME_BYTES_MAX]
            owner = await self.service.lookup(name, request.advertised_listener_name)
        except MagnetarError as error:
            self.write_command(commands.lookup_failure(request.request_id, server_error_for(error), error.message))
            return
        # authoritative: the answer comes from the owner's record, so a client that is
        # redirected connects straight to the owner.
        self.write_command(commands.lookup_response(request.request_id, owner.service_url, authoritative=True,
                                                    redirect=not owner.is_self,
                                                    broker_service_url_tls=owner.service_url_tls))

    async def _on_get_topics_of_namespace(self, frame: Frame) -> None:
        request = frame.command.getTopicsOfNamespace
        try:
            namespace = NamespaceName.parse(request.namespace)
            await self.service.authorizer.check_namespace_access(self.role, namespace)
            topics = await self.service.topics_of_namespace(namespace)
        except MagnetarError as error:
            self._write_error(request.request_id, error)
            return
        result = topic_list.answer(topics, request.topics_pattern if request.HasField("topics_pattern") else None,
                                   request.topics_hash if request.HasField("topics_hash") else None)
        self.write_command(commands.topics_of_namespace_response(
            request.request_id, result.topics, filtered=result.filtered, topics_hash=result.topics_hash,
            changed=result.changed))

    async def _on_watch_topic_list(self, frame: Frame) -> None:
        request = frame.command.watchTopicList
        watcher_id = request.watcher_id
        if watcher_id in self.topic_list_watchers:
            self.write_command(commands.error(request.request_id, pb.NotAllowedError,
                                              f"topic-list watcher {watcher_id} exists already"))
            return

        def on_update(new_topics: list[str], deleted_topics: list[str], digest: str) -> None:
            self.write_command(commands.watch_topic_update(watcher_id, new_topics, deleted_topics, digest))

        try:
            namespace = NamespaceName.parse(request.namespace)
            await self.service.authorizer.check_namespace_access(self.role, namespace)
            await self.service.resources.policies(namespace)   # TopicNotFound-like error if it does not exist
            watcher = await self.service.topic_list_watchers.watch(
                namespace, request.topics_pattern, on_update, len(self.topic_list_watchers))
        except MagnetarError as error:
            self._write_error(request.request_id, error)
            return
        if self.is_closing or watcher_id in self.topic_list_watchers:
            self.service.topic_list_watchers.unwatch(watcher)   # the connection went, or a twin won the race
            if not self.is_closing:
                self.write_command(commands.error(request.request_id, pb.NotAllowedError,
                                                  f"topic-list watcher {watcher_id} exists already"))
            return
        self.topic_list_watchers[watcher_id] = watcher
        self.write_command(commands.watch_topic_list_success(request.request_id, watcher_id,
                                                             sorted(watcher.topics), watcher.topics_hash))
        log.debug("topic-list watcher opened: peer=%s watcher_id=%d namespace=%s", self.peer, watcher_id, namespace)

    def _on_watch_topic_list_close(self, frame: Frame) -> None:
        request = frame.command.watchTopicListClose
        watcher = self.topic_list_watchers.pop(request.watcher_id, None)
        if watcher is not None:
            self.service.topic_list_watchers.unwatch(watcher)
        self.write_command(commands.success(request.request_id))

    async def _on_get_schema(self, frame: Frame) -> None:
        request = frame.command.getSchema
        try:
            name = TopicName.parse(request.topic)
            version = schemas.decode_version(request.schema_version) if request.HasField("schema_version") \
                and request.schema_version else None
            found = await self.service.schemas.get(name, version)
        except MagnetarError as error:
            self.write_command(commands.wrap(pb.CommandGetSchemaResponse(
                request_id=request.request_id, error_code=server_error_for(error), error_message=error.message)))
            return
        if found is None:
            self.write_command(commands.wrap(pb.CommandGetSchemaResponse(
                request_id=request.request_id, error_code=pb.TopicNotFound,
                error_message=f"no schema for {request.topic}")))
            return
        self.write_command(commands.wrap(pb.CommandGetSchemaResponse(
            request_id=request.request_id, schema=found.to_wire(request.topic),
            schema_version=schemas.encode_version(found.version))))

    async def _on_get_or_create_schema(self, frame: Frame) -> None:
        request = frame.command.getOrCreateSchema
        try:
            version = await self._register_schema(TopicName.parse(request.topic), request.schema, consumer=False)
        except MagnetarError as error:
            self.write_command(commands.wrap(pb.CommandGetOrCreateSchemaResponse(
                request_id=request.request_id, error_code=server_error_for(error), error_message=error.message)))
            return
        self.write_command(commands.wrap(pb.CommandGetOrCreateSchemaResponse(
            request_id=request.request_id, schema_version=schemas.encode_version(version))))

    async def _register_schema(self, name: TopicName, schema: pb.Schema, *, consumer: bool) -> int:
        """The version of ``schema`` for the topic (registered if new and compatible;
        a consumer's only when the topic has none). IncompatibleSchema otherwise."""
        schema_type = schemas.TYPE_NAMES.get(schema.type)
        if schema_type is None:
            raise InvalidArgument(f"unknown schema type {schema.type}")
        return await self.service.schemas.put(
            name, schema_type, bytes(schema.schema_data), {kv.key: kv.value for kv in schema.properties},
            await self.service.schema_strategy(name), only_if_empty_or_compatible=consumer)

    # --- producers ----------------------------------------------------------------------------------

    def _on_producer(self, frame: Frame) -> None:
        request = frame.command.producer
        if request.producer_id in self.producers:
            # A retry of a request that succeeded: answer it again.
            producer = self.producers[request.producer_id]
            self.write_command(commands.producer_success(request.request_id, producer.name))
            return
        if request.producer_id in self._pending_producers:
            return  # still being created; its answer will come
        if self._refuse_if_too_many(frame):
            return
        task = self._start_task(self._create_producer(request))
        self._pending_producers[request.producer_id] = task
        task.add_done_callback(lambda t, pid=request.producer_id: _forget_pending(self._pending_producers, pid, t))

    async def _create_producer(self, request: pb.CommandProducer) -> None:
        schema_version = None
        try:
            topic_name = TopicName.parse(request.topic)
            await self.service.authorizer.check(self.role, topic_name, PRODUCE)
            topic = await self.service.get_topic(topic_name, create=True)
            if len(topic.producers) >= self.config.producers_per_topic_max:
                raise ProducerBusy(f"topic {topic.full_name} has {len(topic.producers)} producers, the most allowed "
                                   "(producers_per_topic_max)")
            if request.HasField("schema"):
                schema_version = schemas.encode_version(
                    await self._register_schema(topic.name, request.schema, consumer=False))
            name = request.producer_name or topic.generate_producer_name()
            producer = Producer(request.producer_id, name, topic.full_name, self,
                                user_provided_name=bool(request.producer_name),
                                access_mode=request.producer_access_mode,
                                metadata={kv.key: kv.value for kv in request.metadata})

            def on_queued() -> None:
                # WaitForExclusive: the client learns it is queued, and waits.
                self.write_command(commands.producer_success(request.request_id, name, producer_ready=False,
                                                             schema_version=schema_version))

            await topic.set_deduplication(await self.service.deduplication_enabled(topic.name))
            await self.service.check_producer_quota(topic)
            epoch = await topic.acquire_access(
                producer, request.topic_epoch if request.HasField("topic_epoch") else None, on_queued)
            # No await from here to the registration below: CLOSE_PRODUCER cancels
            # this task, and a cancellation must find the producer either not added
            # or registered (then detached), never added alone.
            try:
                topic.add_producer(producer)
            except MagnetarError:
                topic.release_access(producer)
                raise
        except MagnetarError as error:
            log.info("producer refused: peer=%s topic=%s error=%s", self.peer, request.topic, error)
            self._write_error(request.request_id, error)
            return
        if self.closed:
            topic.remove_producer(producer)
            return
        self.producers[request.producer_id] = producer
        self._producer_topics[request.producer_id] = topic
        self._closed_by_broker.pop(request.producer_id, None)
        last_sequence_id = -1
        if topic.dedup is not None:
            last_sequence_id = topic.dedup.last_sequence_id(name)
        self.write_command(commands.producer_success(request.request_id, name, schema_version=schema_version,
                                                     topic_epoch=epoch, last_sequence_id=last_sequence_id))
        log.info("producer created: peer=%s topic=%s producer=%s", self.peer, topic.full_name, name)

    def _on_send(self, frame: Frame) -> None:
        send = frame.command.send
        producer = self.producers.get(send.producer_id)
        topic = self._producer_topics.get(send.producer_id)
        if producer is None or topic is None:
            if send.producer_id in self._closed_by_broker:
                log.debug("send for a producer the broker closed, dropped: peer=%s producer_id=%d", self.peer,
                          send.producer_id)
                return
            self.write_command(commands.send_error(send.producer_id, send.sequence_id, pb.NotAllowedError,
                                                   "no such producer on this connection"))
            return
        assert frame.payload is not None
        if producer.closing:
            return   # the broker is closing it: the client resends this after reconnecting
        try:
            message_count(frame.payload.metadata)
        except MalformedFrame as error:
            # Refused before it is stored: an entry no consumer could be sent.
            log.info("send refused, invalid message metadata: peer=%s producer_id=%d sequence_id=%d error=%s",
                     self.peer, send.producer_id, send.sequence_id, error.message)
            self.write_command(commands.send_error(send.producer_id, send.sequence_id, pb.MetadataError,
                                                   f"invalid message metadata: {error.message}"))
            return
        if topic.backlog_size_quota is not None:
            refusal = policy_enforcement.send_refusal(topic, len(frame.payload.stored))
            if refusal is not None:
                # Before deduplication counts it: the SEND is neither stored nor seen.
                self.service.policy_counters.sends_refused += 1
                policy_enforcement.close_producer(topic, producer, refusal, self.service.policy_counters)
                return
        if topic.dedup is not None:
            verdict = topic.dedup.check(producer.name, send.sequence_id, send.highest_sequence_id)
            if verdict is not Verdict.NEW:
                self._answer_duplicate(producer, topic, send.sequence_id, send.highest_sequence_id)
                return
        # Copy out of the socket buffer once: this bytes object is the entry stored,
        # cached and dispatched from then on.
        payload = bytes(frame.payload.stored)
        future = topic.publish(producer, payload, send.num_messages)
        stages = self._stages
        if stages is not None:
            # From the bytes' arrival to the append: decoding, checks, and the frames
            # of the same read handled before this one.
            stages.observe("send_decode", time.perf_counter() - self._received_at)
        producer.last_send = future
        assert self._read_gate is not None, "a SEND before connection_made"
        size_bytes = len(payload)
        # Counted until answered; may stop reading this connection (never refuses it).
        scopes = self.service.publish_limits.on_send(self._read_gate, topic.full_name, size_bytes)
        sequence_id = send.sequence_id
        highest = send.highest_sequence_id
        producer_id = send.producer_id
        arrived = time.perf_counter()
        name = producer.name
        # Inside the managed ledger's settling of the append (common/eager_future.py):
        # the receipt leaves in the turn the bookie's reply was read.
        call_when_done(future, lambda f: self._on_send_done(producer_id, sequence_id, highest, f, arrived, scopes,
                                                            size_bytes, topic=topic, producer_name=name))

    def _answer_duplicate(self, producer: Producer, topic: "PersistentTopic", sequence_id: int,
                          highest: int) -> None:
        """Deduplication: a SEND already stored gets a receipt with message id (-1, -1)
        and is not stored again. The answer waits for the producer's earlier sends, so
        receipts keep their order; a duplicate of a send whose outcome was unknown
        (still being written when it came) is answered by that outcome."""
        producer_id = producer.producer_id

        def answer(_previous: object = None) -> None:
            if producer_id not in self.producers:
                return
            dedup = topic.dedup
            if dedup is not None and sequence_id <= dedup.last_sequence_id(producer.name):
                self.write_command(commands.send_receipt(producer_id, sequence_id, 2**64 - 1, 2**64 - 1,
                                                         highest_sequence_id=highest))
            else:
                # The original failed: the client reconnects and sends it again.
                self.write_command(commands.send_error(producer_id, sequence_id, pb.PersistenceError,
                                                       "the earlier copy of this message was not stored"))

        previous = producer.last_send
        if isinstance(previous, asyncio.Future) and not previous.done():
            previous.add_done_callback(answer)
        else:
            answer()

    def _pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None and not self.closed and not self.transport.is_closing():
            self.transport.resume_reading()

    @property
    def reading_paused(self) -> bool:
        """True while publish back-pressure keeps this connection from being read."""
        return self._read_gate is not None and self._read_gate.paused

    def _on_send_done(self, producer_id: int, sequence_id: int, highest: int, future: asyncio.Future[Position],
                      arrived: float, scopes: tuple[PendingSends, ...], size_bytes: int, *,
                      topic: "PersistentTopic | None" = None, producer_name: str = "") -> None:
        observe = self.service.on_publish_latency
        if observe is not None:
            observe(time.perf_counter() - arrived)
        self.service.publish_limits.on_send_done(scopes, size_bytes)
        if topic is not None and topic.dedup is not None:
            if not future.cancelled() and future.exception() is None:
                topic.on_stored(producer_name, sequence_id, highest, future.result())
            else:
                topic.dedup.on_store_failed(producer_name)
        if producer_id not in self.producers:
            return  # closed meanwhile (the client resends what it did not get receipts for)
        error = future.exception()
        if error is None:
            position = future.result()
            self.write_command(commands.send_receipt(producer_id, sequence_id, position.ledger_id,
                                                     position.entry_id, highest_sequence_id=highest))
        else:
            message = error.message if isinstance(error, MagnetarError) else str(error)
            self.write_command(commands.send_error(producer_id, sequence_id, server_error_for(error), message))

    def _on_checksum_mismatch(self, error: PayloadChecksumMismatch) -> None:
        command = error.command
        if command is None or command.type != T.SEND:
            raise MalformedFrame(str(error))
        send = command.send
        log.info("payload checksum mismatch on send: peer=%s producer_id=%d sequence_id=%d",
                 self.peer, send.producer_id, send.sequence_id)
        self.write_command(commands.send_error(send.producer_id, send.sequence_id, server_error_for(
            ChecksumError("")), "payload checksum mismatch"))

    def _on_close_producer(self, frame: Frame) -> None:
        request = frame.command.close_producer
        pending = self._pending_producers.pop(request.producer_id, None)
        if pending is not None:
            # Still being created: stop that (as Pulsar fails the producer's future);
            # the PRODUCER request is not answered, the client gave up on it.
            pending.cancel()
        self._detach_producer(request.producer_id)
        self.write_command(commands.success(request.request_id))

    def _detach_producer(self, producer_id: int) -> None:
        producer = self.producers.pop(producer_id, None)
        topic = self._producer_topics.pop(producer_id, None)
        if producer is not None and topic is not None:
            producer.closed = True
            topic.remove_producer(producer)

    def close_producer_after_sends(self, producer: Producer, on_closed: Callable[[], None]) -> None:
        """Closes ``producer`` from the broker's side once its earlier SENDs are
        answered, so their receipts reach the client before CLOSE_PRODUCER; SENDs that
        arrive meanwhile are dropped unanswered (the client resends them after it
        reconnects). ``on_closed`` runs when CLOSE_PRODUCER is written."""
        producer.closing = True

        def close(_previous: object = None) -> None:
            if self.producers.get(producer.producer_id) is not producer:
                return   # closed by the client or the connection meanwhile
            self.write_command(commands.close_producer(producer.producer_id))
            self.forget_producer(producer)
            on_closed()

        previous = producer.last_send
        if isinstance(previous, asyncio.Future) and not previous.done():
            previous.add_done_callback(close)   # after _on_send_done, which wrote the receipt
        else:
            close()

    def forget_producer(self, producer: Producer) -> None:
        """The broker closed this producer (CLOSE_PRODUCER was sent)."""
        self.producers.pop(producer.producer_id, None)
        self._producer_topics.pop(producer.producer_id, None)
        self._closed_by_broker[producer.producer_id] = None
        while len(self._closed_by_broker) > CLOSED_PRODUCERS_REMEMBERED:
            self._closed_by_broker.popitem(last=False)

    # --- consumers ----------------------------------------------------------------------------------

    def _on_subscribe(self, frame: Frame) -> None:
        request = frame.command.subscribe
        if request.consumer_id in self.consumers:
            self.write_command(commands.success(request.request_id))
            return
        if request.consumer_id in self._pending_consumers:
            return
        if self._refuse_if_too_many(frame):
            return
        task = self._start_task(self._subscribe(request))
        self._pending_consumers[request.consumer_id] = task
        task.add_done_callback(lambda t, cid=request.consumer_id: _forget_pending(self._pending_consumers, cid, t))

    async def _subscribe(self, request: pb.CommandSubscribe) -> None:
        durable = request.durable
        try:
            if not request.subscription:
                raise InvalidArgument("subscription name must not be empty")
            topic_name = TopicName.parse(request.topic)
            await self.service.authorizer.check(self.role, topic_name, CONSUME)
            topic = await self.service.get_topic(topic_name, create=request.force_topic_creation)
            consumers = sum(len(s.consumers) for s in topic.subscriptions.values())
            if consumers >= self.config.consumers_per_topic_max:
                raise ConsumerBusy(f"topic {topic.full_name} has {consumers} consumers, the most allowed "
                                   "(consumers_per_topic_max)")
            if request.HasField("schema"):
                await self._register_schema(topic.name, request.schema, consumer=True)
            consumer = Consumer(request.consumer_id, request.consumer_name or f"consumer-{request.consumer_id}",
                                request.subscription, topic.full_name, SubscriptionMode.from_wire(request.subType),
                                self,
                                priority_level=request.priority_level,
                                partition_index=topic.name.partition_index,
                                metadata={kv.key: kv.value for kv in request.metadata})
            start = request.start_message_id if request.HasField("start_message_id") else None
            broadcast = await self.service.is_broadcast(topic.name, request.subscription, consumer.metadata)
            # No await from the consumer's addition (inside subscribe) to the
            # registration below: CLOSE_CONSUMER cancels this task (see _create_producer).
            subscription = await topic.subscribe(
                consumer, durable=durable, initial_position=request.initialPosition,
                start_message_id=start, rollback_duration_s=request.start_message_rollback_duration_sec,
                broadcast=broadcast, read_compacted=request.read_compacted)
        except MagnetarError as error:
            log.info("subscribe refused: peer=%s topic=%s subscription=%s error=%s", self.peer, request.topic,
                     request.subscription, error)
            self._write_error(request.request_id, error)
            return
        if self.closed:
            subscription.remove_consumer(consumer)
            return
        self.consumers[request.consumer_id] = _AttachedConsumer(consumer, topic, subscription, durable)
        self.write_command(commands.success(request.request_id))
        log.info("consumer subscribed: peer=%s topic=%s subscription=%s mode=%s consumer=%s", self.peer,
                 topic.full_name, subscription.name, subscription.type_name, consumer.name)

    def _attached(self, consumer_id: int) -> _AttachedConsumer | None:
        return self.consumers.get(consumer_id)

    def _on_flow(self, frame: Frame) -> None:
        flow = frame.command.flow
        attached = self._attached(flow.consumer_id)
        if attached is None:
            return
        attached.consumer.permits += flow.messagePermits
        attached.subscription.dispatcher.on_flow(attached.consumer)

    def _on_ack(self, frame: Frame) -> None:
        ack = frame.command.ack
        attached = self._attached(ack.consumer_id)
        if attached is None:
            if ack.HasField("request_id"):
                self.write_command(commands.error(ack.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        if any(_out_of_range(m) for m in ack.message_id):
            # No entry has such an id (positions are Java longs): an ack of one is a
            # client's bug or hostile, and the cursor could not persist it.
            if ack.HasField("request_id"):
                self._write_error(ack.request_id, InvalidArgument("acknowledged message id out of range"))
            return
        try:
            attached.subscription.acknowledge(attached.consumer, [_acked_message(m) for m in ack.message_id],
                                              cumulative=ack.ack_type == pb.CommandAck.Cumulative)
        except MagnetarError as error:
            if ack.HasField("request_id"):
                self._write_error(ack.request_id, error)
            return
        if ack.HasField("request_id"):
            self.write_command(commands.ack_response(ack.consumer_id, ack.request_id))

    def _on_redeliver(self, frame: Frame) -> None:
        request = frame.command.redeliverUnacknowledgedMessages
        attached = self._attached(request.consumer_id)
        if attached is not None:
            attached.subscription.redeliver(attached.consumer,
                                            [Position(m.ledgerId, m.entryId) for m in request.message_ids])

    async def _on_unsubscribe(self, frame: Frame) -> None:
        request = frame.command.unsubscribe
        attached = self._attached(request.consumer_id)
        if attached is None:
            self.write_command(commands.error(request.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        try:
            await attached.topic.unsubscribe(attached.subscription.name, attached.consumer)
        except MagnetarError as error:
            self._write_error(request.request_id, error)
            return
        self.consumers.pop(request.consumer_id, None)
        attached.consumer.closed = True
        self.write_command(commands.success(request.request_id))

    def _on_close_consumer(self, frame: Frame) -> None:
        request = frame.command.close_consumer
        pending = self._pending_consumers.pop(request.consumer_id, None)
        if pending is not None:
            pending.cancel()   # still subscribing: stop that (see _on_close_producer)
        self._detach_consumer(request.consumer_id)
        self.write_command(commands.success(request.request_id))

    def _detach_consumer(self, consumer_id: int) -> None:
        attached = self.consumers.pop(consumer_id, None)
        if attached is None:
            return
        attached.consumer.closed = True
        attached.subscription.remove_consumer(attached.consumer)
        if not attached.durable and not attached.subscription.consumers:
            # A reader's subscription lives only as long as its consumer.
            self._start_task(self._drop_subscription(attached))

    async def _drop_subscription(self, attached: _AttachedConsumer) -> None:
        try:
            await attached.topic.unsubscribe(attached.subscription.name, None)
        except (MagnetarError, SubscriptionNotFound):
            pass

    def forget_consumer(self, consumer: Consumer) -> None:
        """The broker closed this consumer (CLOSE_CONSUMER was sent)."""
        self.consumers.pop(consumer.consumer_id, None)

    async def _on_seek(self, frame: Frame) -> None:
        request = frame.command.seek
        attached = self._attached(request.consumer_id)
        if attached is None:
            self.write_command(commands.error(request.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        if request.HasField("message_id") and _out_of_range(request.message_id) and not _is_earliest(
                request.message_id):
            self._write_error(request.request_id, InvalidArgument("seek message id out of range"))
            return
        subscription = attached.subscription
        try:
            if request.HasField("message_id"):
                target = attached.topic.seek_position(request.message_id, read_compacted=subscription.read_compacted)
            elif request.HasField("message_publish_time"):
                target = await attached.topic.find_position_by_time(request.message_publish_time)
            else:
                raise NotAllowed("seek needs a message id or a publish time")
        except MagnetarError as error:
            self._write_error(request.request_id, error)
            return
        # As Pulsar does: disconnect the subscription's consumers (each client drops what
        # it had queued and subscribes again), move the cursor, and only then answer.
        # The order matters to the official clients: a seek answered while the consumer
        # is still connected makes the C++ client skip the sought message itself.
        subscription.disconnect_consumers()
        subscription.reset_cursor(target)
        self.write_command(commands.success(request.request_id))
        log.info("subscription seek: topic=%s subscription=%s position=%s", attached.topic.full_name,
                 subscription.name, target)

    async def _on_get_last_message_id(self, frame: Frame) -> None:
        request = frame.command.getLastMessageId
        attached = self._attached(request.consumer_id)
        if attached is None:
            self.write_command(commands.error(request.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        try:
            position, batch_index = await attached.topic.last_message_id(
                read_compacted=attached.subscription.read_compacted)
        except MagnetarError as error:
            self._write_error(request.request_id, error)
            return
        command = commands.get_last_message_id_response(
            request.request_id, position.ledger_id, position.entry_id,
            mark_delete=tuple(attached.subscription.cursor.mark_delete_position))
        if batch_index >= 0:
            command.getLastMessageIdResponse.last_message_id.batch_index = batch_index
        self.write_command(command)

    def _on_consumer_stats(self, frame: Frame) -> None:
        request = frame.command.consumerStats
        attached = self._attached(request.consumer_id)
        if attached is None:
            self.write_command(commands.wrap(pb.CommandConsumerStatsResponse(
                request_id=request.request_id, error_code=pb.ConsumerNotFound, error_message="no such consumer")))
            return
        consumer = attached.consumer
        self.write_command(commands.wrap(pb.CommandConsumerStatsResponse(
            request_id=request.request_id, consumerName=consumer.name, availablePermits=max(consumer.permits, 0),
            unackedMessages=attached.subscription.dispatcher.unacked_messages(consumer), address=self.peer,
            type=attached.subscription.type_name)))


# The largest ledger or entry id a position can have: ids are Java longs on the wire
# (sent as uint64), and the cursor's records store them as signed 64-bit integers.
_POSITION_ID_MAX = 2**63 - 1


def _out_of_range(message_id: pb.MessageIdData) -> bool:
    return message_id.ledgerId > _POSITION_ID_MAX or message_id.entryId > _POSITION_ID_MAX


def _is_earliest(message_id: pb.MessageIdData) -> bool:
    """The clients' MessageId.earliest: (-1, -1) as uint64s."""
    return message_id.ledgerId == 2**64 - 1 and message_id.entryId == 2**64 - 1


def _acked_message(message_id: pb.MessageIdData) -> AckedMessage:
    return AckedMessage(Position(message_id.ledgerId, message_id.entryId),
                        tuple(message_id.ack_set) or None,
                        message_id.batch_size if message_id.HasField("batch_size") else 0)


def _forget_pending(pending: dict[int, asyncio.Task[None]], key: int, task: asyncio.Task[None]) -> None:
    """Drops a finished creation task, unless a newer one took its id meanwhile (a
    close cancelled it and the client asked again with the same id)."""
    if pending.get(key) is task:
        del pending[key]


def _request_id_of(command: pb.BaseCommand) -> int | None:
    """The request id of a command this broker does not serve, to answer it with ERROR.
    Bodies our .proto models are read directly; others (transactions, topic-list
    watchers...) arrive as unknown fields, and in every such Pulsar command the request
    id is field 1 of the body, a varint."""
    for field, value in command.ListFields():
        if field.name != "type" and hasattr(value, "request_id"):
            return int(value.request_id)
    from google.protobuf.unknown_fields import UnknownFieldSet

    for unknown in UnknownFieldSet(command):
        if unknown.wire_type == 2 and isinstance(unknown.data, bytes):  # a length-delimited body
            return _varint_field_1(unknown.data)
    return None


def _varint_field_1(body: bytes) -> int | None:
    if len(body) < 2 or body[0] != 0x08:  # field 1, wire type varint
        return None
    value = 0
    for index, byte in enumerate(body[1:11]):
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value
    return None
