"""Builders for the commands a broker sends, each returning a complete BaseCommand ready
for :func:`protocol.codec.encode_command` (or, for MESSAGE, ``message_frame_buffers``).
Pure. They exist so every required field is set in one place and the Pulsar conventions
that are easy to get wrong are written down once:

- CONNECTED must carry ``server_version`` (the C++ client, and so the Python one, drops
  the connection otherwise) and the negotiated ``protocol_version``: the smaller of the
  client's and ours. Clients add the payload checksum to SEND only when it is >= 6 and
  send keep-alive PINGs only when it is >= 1.
- ``partitions=0`` in PARTITIONED_METADATA_RESPONSE means "not partitioned".
- Commands the broker sends unprompted (CLOSE_PRODUCER, CLOSE_CONSUMER) have no request
  to answer; Pulsar writes -1 as their request id, which is 2**64 - 1 as a uint64.
  Clients ignore it.
"""

from __future__ import annotations

from typing import Iterable

from protocol.codec import MAX_MESSAGE_SIZE_DEFAULT, wrap
from protocol.proto import pulsar_api_pb2 as pb

# The newest protocol version this .proto models (see pulsar_api.proto).
PROTOCOL_VERSION_MAX = pb.v21
UNSOLICITED_REQUEST_ID = 2**64 - 1
NOT_PARTITIONED = 0
NO_PARTITION_INDEX = -1


def u64(value: int) -> int:
    """Pulsar's ids are Java longs sent as uint64: -1 (no entry yet) travels as 2**64 - 1."""
    return value & 0xFFFFFFFFFFFFFFFF


def negotiated_protocol_version(client_protocol_version: int) -> int:
    return max(0, min(client_protocol_version, PROTOCOL_VERSION_MAX))


def connected(server_version: str, protocol_version: int,
              max_message_size: int = MAX_MESSAGE_SIZE_DEFAULT,
              feature_flags: pb.FeatureFlags | None = None) -> pb.BaseCommand:
    assert server_version, "clients drop a CONNECTED without server_version"
    assert 0 <= protocol_version <= PROTOCOL_VERSION_MAX, protocol_version
    body = pb.CommandConnected(server_version=server_version, protocol_version=protocol_version,
                               max_message_size=max_message_size)
    if feature_flags is not None:
        body.feature_flags.CopyFrom(feature_flags)
    return wrap(body)


def auth_challenge(server_version: str, protocol_version: int, auth_method_name: str) -> pb.BaseCommand:
    """Asks a connected client for fresh credentials of ``auth_method_name`` (the data
    ``refresh``, as Pulsar's brokers send it when a credential expires)."""
    assert server_version
    return wrap(pb.CommandAuthChallenge(server_version=server_version, protocol_version=protocol_version,
                                        challenge=pb.AuthData(auth_method_name=auth_method_name,
                                                              auth_data=b"refresh")))


def ping() -> pb.BaseCommand:
    return wrap(pb.CommandPing())


def pong() -> pb.BaseCommand:
    return wrap(pb.CommandPong())


def success(request_id: int) -> pb.BaseCommand:
    return wrap(pb.CommandSuccess(request_id=request_id))


def error(request_id: int, server_error: int, message: str) -> pb.BaseCommand:
    return wrap(pb.CommandError(request_id=request_id, error=server_error, message=message))


def partitioned_metadata_response(request_id: int, partitions: int) -> pb.BaseCommand:
    return wrap(pb.CommandPartitionedTopicMetadataResponse(
        request_id=request_id, partitions=partitions,
        response=pb.CommandPartitionedTopicMetadataResponse.Success))


def partitioned_metadata_failure(request_id: int, server_error: int, message: str) -> pb.BaseCommand:
    return wrap(pb.CommandPartitionedTopicMetadataResponse(
        request_id=request_id, response=pb.CommandPartitionedTopicMetadataResponse.Failed,
        error=server_error, message=message))


def lookup_response(request_id: int, broker_service_url: str, *, authoritative: bool,
                    redirect: bool = False, proxy_through_service_url: bool = False,
                    broker_service_url_tls: str = "") -> pb.BaseCommand:
    """Connect (this broker owns the topic) or Redirect (ask ``broker_service_url``, or
    ``broker_service_url_tls`` for a client on TLS)."""
    lookup_type = (pb.CommandLookupTopicResponse.Redirect if redirect
                   else pb.CommandLookupTopicResponse.Connect)
    body = pb.CommandLookupTopicResponse(
        request_id=request_id, brokerServiceUrl=broker_service_url, response=lookup_type,
        authoritative=authoritative, proxy_through_service_url=proxy_through_service_url)
    if broker_service_url_tls:
        body.brokerServiceUrlTls = broker_service_url_tls
    return wrap(body)


def lookup_failure(request_id: int, server_error: int, message: str) -> pb.BaseCommand:
    return wrap(pb.CommandLookupTopicResponse(
        request_id=request_id, response=pb.CommandLookupTopicResponse.Failed,
        error=server_error, message=message))


def producer_success(request_id: int, producer_name: str, *, last_sequence_id: int = -1,
                     schema_version: bytes | None = None, topic_epoch: int | None = None,
                     producer_ready: bool = True) -> pb.BaseCommand:
    """``producer_ready=False`` tells a WaitForExclusive producer it is queued; a second
    PRODUCER_SUCCESS with the default True follows when it gets the topic."""
    body = pb.CommandProducerSuccess(request_id=request_id, producer_name=producer_name,
                                     last_sequence_id=last_sequence_id)
    if schema_version is not None:
        body.schema_version = schema_version
    if topic_epoch is not None:
        body.topic_epoch = topic_epoch
    if not producer_ready:
        body.producer_ready = False
    return wrap(body)


def send_receipt(producer_id: int, sequence_id: int, ledger_id: int, entry_id: int, *,
                 highest_sequence_id: int = 0) -> pb.BaseCommand:
    return wrap(pb.CommandSendReceipt(
        producer_id=producer_id, sequence_id=sequence_id, highest_sequence_id=highest_sequence_id,
        message_id=pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id)))


def send_error(producer_id: int, sequence_id: int, server_error: int, message: str) -> pb.BaseCommand:
    return wrap(pb.CommandSendError(producer_id=producer_id, sequence_id=sequence_id,
                                    error=server_error, message=message))


def message(consumer_id: int, ledger_id: int, entry_id: int, *, redelivery_count: int = 0,
            partition: int = NO_PARTITION_INDEX, ack_set: Iterable[int] = ()) -> pb.BaseCommand:
    """The MESSAGE command to put in front of a stored payload."""
    message_id = pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id)
    if partition != NO_PARTITION_INDEX:
        message_id.partition = partition
    body = pb.CommandMessage(consumer_id=consumer_id, message_id=message_id, ack_set=ack_set)
    if redelivery_count:
        body.redelivery_count = redelivery_count
    return wrap(body)


def close_producer(producer_id: int, request_id: int = UNSOLICITED_REQUEST_ID, *, assigned_url: str = "",
                   assigned_url_tls: str = "") -> pb.BaseCommand:
    """``assigned_url(_tls)``: the broker the client should reconnect to (left out if "")."""
    return _naming_broker(pb.CommandCloseProducer(producer_id=producer_id, request_id=request_id),
                          assigned_url, assigned_url_tls)


def close_consumer(consumer_id: int, request_id: int = UNSOLICITED_REQUEST_ID, *, assigned_url: str = "",
                   assigned_url_tls: str = "") -> pb.BaseCommand:
    """``assigned_url(_tls)``: the broker the client should reconnect to (left out if "")."""
    return _naming_broker(pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=request_id),
                          assigned_url, assigned_url_tls)


def _naming_broker(body: pb.CommandCloseProducer | pb.CommandCloseConsumer, assigned_url: str,
                   assigned_url_tls: str) -> pb.BaseCommand:
    if assigned_url:
        body.assignedBrokerServiceUrl = assigned_url
    if assigned_url_tls:
        body.assignedBrokerServiceUrlTls = assigned_url_tls
    return wrap(body)


def active_consumer_change(consumer_id: int, *, is_active: bool) -> pb.BaseCommand:
    return wrap(pb.CommandActiveConsumerChange(consumer_id=consumer_id, is_active=is_active))


def reached_end_of_topic(consumer_id: int) -> pb.BaseCommand:
    return wrap(pb.CommandReachedEndOfTopic(consumer_id=consumer_id))


def ack_response(consumer_id: int, request_id: int) -> pb.BaseCommand:
    return wrap(pb.CommandAckResponse(consumer_id=consumer_id, request_id=request_id))


def get_last_message_id_response(request_id: int, ledger_id: int, entry_id: int, *,
                                 partition: int = NO_PARTITION_INDEX,
                                 mark_delete: tuple[int, int] | None = None) -> pb.BaseCommand:
    last = pb.MessageIdData(ledgerId=u64(ledger_id), entryId=u64(entry_id))
    if partition != NO_PARTITION_INDEX:
        last.partition = partition
    body = pb.CommandGetLastMessageIdResponse(request_id=request_id, last_message_id=last)
    if mark_delete is not None:
        body.consumer_mark_delete_position.CopyFrom(
            pb.MessageIdData(ledgerId=u64(mark_delete[0]), entryId=u64(mark_delete[1])))
    return wrap(body)


def topics_of_namespace_response(request_id: int, topics: Iterable[str], *, filtered: bool = False,
                                 topics_hash: str | None = None, changed: bool = True) -> pb.BaseCommand:
    body = pb.CommandGetTopicsOfNamespaceResponse(request_id=request_id, topics=topics, filtered=filtered,
                                                  changed=changed)
    if topics_hash is not None:
        body.topics_hash = topics_hash
    return wrap(body)


def watch_topic_list_success(request_id: int, watcher_id: int, topics: Iterable[str],
                             topics_hash: str) -> pb.BaseCommand:
    return wrap(pb.CommandWatchTopicListSuccess(request_id=request_id, watcher_id=watcher_id, topic=topics,
                                                topics_hash=topics_hash))


def watch_topic_update(watcher_id: int, new_topics: Iterable[str], deleted_topics: Iterable[str],
                       topics_hash: str) -> pb.BaseCommand:
    return wrap(pb.CommandWatchTopicUpdate(watcher_id=watcher_id, new_topics=new_topics,
                                           deleted_topics=deleted_topics, topics_hash=topics_hash))
