"""What a connection serves besides lookups, producing and consuming — administration
over the protocol: credentials refreshed on the broker's challenge (AUTH_RESPONSE) and
the periodic recheck of the role's permissions (``recheck_permissions``), schemas
(GET_SCHEMA, GET_OR_CREATE_SCHEMA, and the registration a PRODUCER or SUBSCRIBE with
a schema asks for), a consumer's stats (CONSUMER_STATS).

Mixed into ``ServerConnection`` (broker/connection.py, the router), whose state
these methods use: ``service``, ``config``, ``peer``, ``role``, the per-connection
maps, ``write_command``, ``_write_error``, ``_start_task``, ``_refuse_if_too_many``.
"""

from __future__ import annotations

import logging

from protocol import commands
from protocol.codec import Frame
from broker import schemas
from broker.authentication import TOKEN_METHOD
from broker.authorization import CONSUME, PRODUCE
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import server_error_for
from common.topic_name import TopicName
from common.version import __version__
from common.errors import (
    AuthenticationFailed,
    InvalidArgument,
    MagnetarError,
)

log = logging.getLogger(__name__)

# What this broker calls itself in CONNECTED and AUTH_CHALLENGE.
SERVER_VERSION = f"Magnetar {__version__}"
T = pb.BaseCommand


class AdminHandlers:
    """Credentials, permissions, schemas and stats over the protocol (see the module)."""

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

    async def _on_get_schema(self, frame: Frame) -> None:
        request = frame.command.getSchema
        try:
            name = TopicName.parse(request.topic)
            # A topic's schema is for those who may produce or consume on it (as a lookup).
            await self.service.authorizer.check_lookup(self.role, name)
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
