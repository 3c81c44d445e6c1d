"""One client connection speaking Pulsar's binary protocol (the shell around the
sans-IO codec): the router. It owns the socket, the timers, the session's rules
(``protocol/session.py``) and the connection's state, and sends each command to its
handler; the handlers live in one module per concern, mixed into ``ServerConnection``:
``connection_lookups.py`` (lookups, partition metadata, topic lists and their watchers),
``connection_producing.py`` (producers and sends), ``connection_consuming.py``
(subscriptions, flow, acks, seeks) and ``connection_admin.py`` (credential refresh,
permission rechecks, schemas, consumer stats).

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
- Until CONNECT only CONNECT is accepted (the session's rules, the keep-alive's too,
  are ``protocol/session.py``'s, shared with the client's connection). A malformed
  frame closes this connection only; a SEND whose payload checksum is wrong gets
  SEND_ERROR(ChecksumError) and the connection goes on (Pulsar's behaviour).
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
from protocol.codec import NEED_DATA, CommandDecoder, Frame, PayloadChecksumMismatch, command_name, encode_command
from broker.authentication import Identity
from broker.connection_admin import SERVER_VERSION, AdminHandlers
from broker.connection_consuming import AttachedConsumer, ConsumingHandlers
from broker.connection_lookups import LookupHandlers
from broker.connection_producing import ProducingHandlers
from broker.connection_transactions import TransactionHandlers
from broker.producer import Producer
from broker.publish_limits import ReadGate
from broker.topic_list_watchers import TopicListWatcher
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import server_error_for
from protocol.session import Due, Role, Session
from protocol.session import Verdict as SessionVerdict
from common.errors import (
    AuthenticationFailed,
    MagnetarError,
    MalformedFrame,
    TooManyRequests,
)
from runtime import write_batch
from runtime.tasks import every, log_failure

if TYPE_CHECKING:
    from broker.service import BrokerService
    from broker.topic import PersistentTopic

log = logging.getLogger(__name__)

T = pb.BaseCommand


class ServerConnection(LookupHandlers, ProducingHandlers, ConsumingHandlers, AdminHandlers, TransactionHandlers,
                       asyncio.Protocol):
    """The router: the connection's state, its socket and timers, the session, the
    dispatch of each command to its handler; the handlers live in one module per
    concern (mixed in above)."""

    def __init__(self, service: "BrokerService") -> None:
        self.service = service
        self.config = service.config
        self.decoder = CommandDecoder(frame_bytes_max=self.config.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
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
        self.consumers: dict[int, AttachedConsumer] = {}
        self.topic_list_watchers: dict[int, TopicListWatcher] = {}
        self._pending_consumers: dict[int, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusing = False   # an episode of TooManyRequests was logged
        # Created with the transport (connection_made): this connection's pending sends
        # and its reading switch.
        self._read_gate: ReadGate | None = None
        # The session's rules (protocol/session.py): what may come first, the CONNECT
        # deadline, keep-alive and silence.
        self.session = Session(Role.SERVER, keepalive_interval_s=self.config.keepalive_interval_s,
                               handshake_timeout_s=self.config.connect_timeout_s, now_s=time.monotonic())
        # time.perf_counter() of the latest read, and the broker's stage histograms
        # (None: not timed) for the "send_decode" stage.
        self._received_at = time.perf_counter()
        self._stages = getattr(getattr(service, "ledger_client", None), "stages", None)
        # Run at the end of each read: the entries its SENDs made leave for the bookies
        # in that turn, not the next (LedgerClient.flush_adds); None without a client.
        # Held from the read's start (hold_flushes), so no add schedules a flush of its own.
        self._flush_adds = getattr(getattr(service, "ledger_client", None), "flush_adds", None)
        self._hold_flushes = getattr(getattr(service, "ledger_client", None), "hold_flushes", None)
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
            T.TC_CLIENT_CONNECT_REQUEST: self._spawn(self._on_tc_client_connect),
            T.NEW_TXN: self._spawn(self._on_new_txn),
            T.ADD_PARTITION_TO_TXN: self._spawn(self._on_add_partition_to_txn),
            T.ADD_SUBSCRIPTION_TO_TXN: self._spawn(self._on_add_subscription_to_txn),
            T.END_TXN: self._spawn(self._on_end_txn),
            T.END_TXN_ON_PARTITION: self._spawn(self._on_end_txn_on_partition),
            T.END_TXN_ON_SUBSCRIPTION: self._spawn(self._on_end_txn_on_subscription),
        }

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: asyncio's own, or uvloop's (runtime/event_loop.py), which
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
        self._connect_deadline = asyncio.get_running_loop().call_later(self.session.handshake_timeout_s,
                                                                       self._on_connect_deadline)
        self._read_gate = self.service.publish_limits.gate(self.peer, self._pause_reading, self._resume_reading)
        # Owned by the connection: cancelled in connection_lost, its failure logged.
        self._keepalive = asyncio.get_running_loop().create_task(every(self.session.check_interval_s,
                                                                       self._on_keepalive_check))
        self._keepalive.add_done_callback(functools.partial(log_failure, owner=f"connection {self.peer}"))
        log.debug("connection opened: peer=%s", self.peer)

    def data_received(self, data: bytes) -> None:
        opened = write_batch.begin()
        if self._hold_flushes is not None:
            self._hold_flushes()
        try:
            self._on_data(data)
        finally:
            try:
                if self._flush_adds is not None:
                    self._flush_adds()      # ends the hold, whatever the read did
            finally:
                if opened:
                    write_batch.end()

    def _on_data(self, data: bytes) -> None:
        self.session.traffic(time.monotonic())
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
        left_s = self.session.handshake_left_s(time.monotonic())
        if left_s is None or self.is_closing:
            return
        if left_s > 0:   # the timer's clock ran a little ahead of ours
            self._connect_deadline = asyncio.get_running_loop().call_later(left_s, self._on_connect_deadline)
            return
        log.info("no CONNECT in time, closing: peer=%s connect_timeout_s=%s", self.peer, self.config.connect_timeout_s)
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

    @property
    def connected(self) -> bool:
        """CONNECTED was written: the session is open."""
        return self.session.is_open

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.session.closed()
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

    def abort(self) -> None:
        """Drops the connection at once, unsent data and all (no close frames): the
        socket is gone, so the peer's next packet is answered with a reset."""
        if self.transport is not None:
            write_batch.release(self.transport)
            self.transport.abort()

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
        verdict = self.session.received(command_type)
        if verdict is SessionVerdict.REFUSE:
            log.info("command before CONNECT, closing: peer=%s command=%s", self.peer, command_name(command_type))
            self.write_command(commands.error(0, pb.NotAllowedError, "the first command must be CONNECT"))
            self.close()
            return
        if verdict is SessionVerdict.PONG:
            self.write_command(commands.pong())
            return
        if verdict is SessionVerdict.DROP:
            return   # a PONG: the session counted its bytes as traffic
        assert verdict is SessionVerdict.HANDLE, verdict   # a server ignores nothing: it refuses
        if self._authentication_failure is not None and command_type != T.CONNECT:
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
                self.identity = await self.service.authenticator.proxied_client(
                    self.identity, connect.original_principal, connect.original_auth_method,
                    connect.original_auth_data if connect.HasField("original_auth_data") else None)
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
        self.session.handshake_done()
        # Announced because this broker serves WATCH_TOPIC_LIST: a client that knows the
        # flag (the Java one) watches instead of polling for its pattern consumers.
        self.write_command(commands.connected(SERVER_VERSION, self.protocol_version, self.config.max_message_size,
                                              pb.FeatureFlags(supports_topic_watchers=True)))
        log.debug("client connected: peer=%s client=%s protocol=%d role=%s method=%s", self.peer,
                  self.client_version, self.protocol_version, self.role,
                  self.identity.method if self.identity is not None else "-")

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

    def _on_keepalive_check(self, now_s: float) -> bool:
        """What the session's keep-alive asks for now; False once it is over."""
        due = self.session.due(now_s)
        if due is Due.PING:
            self.write_command(commands.ping())
        elif due is Due.CLOSE_SILENT:
            log.info("connection idle past keep-alive, closing: peer=%s silent_s=%.1f", self.peer,
                     self.session.silent_s(now_s))
            self.close()
        return not self.closed and due is not Due.CLOSE_SILENT

    # --- reading switch (publish back-pressure) ---------------------------------------------------

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

    @staticmethod
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
