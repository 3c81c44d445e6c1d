"""How a client finds topics over its connection: PARTITIONED_METADATA, LOOKUP (where a
topic is served: here, or a redirect to its owner), GET_TOPICS_OF_NAMESPACE and the
topic-list watchers of pattern consumers (WATCH_TOPIC_LIST, WATCH_TOPIC_LIST_CLOSE).

Mixed into ``ServerConnection`` (broker/connection.py, the router), whose state
these methods use: ``service``, ``config``, ``peer``, ``role``, the per-connection
maps, ``write_command``, ``_write_error``, ``_start_task``, ``_refuse_if_too_many``.
"""

from __future__ import annotations

import logging

from protocol import commands
from protocol.codec import Frame
from broker import topic_list
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import server_error_for
from common.topic_name import NamespaceName, TopicName
from common.errors import MagnetarError

log = logging.getLogger(__name__)

# A listener name longer than this is kept cut (it then matches no listener).
LISTENER_NAME_BYTES_MAX = 256
T = pb.BaseCommand


class LookupHandlers:
    """Finding topics over the protocol (see the module)."""

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
        if request.mode == pb.CommandGetTopicsOfNamespace.NON_PERSISTENT:
            topics = []   # only persistent topics exist here (common/topic_name.py)
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
