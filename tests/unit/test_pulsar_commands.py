"""Command builders (broker/commands.py), with no sockets.

Proves that every builder returns a command with all required fields set that survives
encode -> decode unchanged, and that the Pulsar conventions they encode hold: the
negotiated protocol version is the smaller one, unset partitions read -1, broker-
initiated closes carry Pulsar's -1 request id as a uint64, and a MESSAGE built here
frames a stored payload.
"""

from __future__ import annotations

import pytest

from protocol import commands
from protocol.codec import decode_frame, encode_command, encode_message_frame, encode_stored
from protocol.proto import pulsar_api_pb2 as pb

BUILT = [
    commands.connected("magnetar-0.1", 20, feature_flags=pb.FeatureFlags(supports_broker_entry_metadata=True)),
    commands.ping(),
    commands.pong(),
    commands.success(1),
    commands.error(2, pb.TopicNotFound, "no such topic"),
    commands.partitioned_metadata_response(3, commands.NOT_PARTITIONED),
    commands.partitioned_metadata_failure(4, pb.ServiceNotReady, "later"),
    commands.lookup_response(5, "pulsar://localhost:6650", authoritative=True),
    commands.lookup_response(6, "pulsar://other:6650", authoritative=False, redirect=True),
    commands.lookup_failure(7, pb.MetadataError, "etcd down"),
    commands.producer_success(8, "standalone-0-0", schema_version=b"\x00"),
    commands.send_receipt(1, 2, 10, 20, highest_sequence_id=2),
    commands.send_error(1, 3, pb.ChecksumError, "checksum failed on the broker"),
    commands.close_producer(1),
    commands.close_consumer(2, request_id=9),
    commands.active_consumer_change(2, is_active=True),
    commands.reached_end_of_topic(2),
    commands.ack_response(2, 11),
    commands.get_last_message_id_response(12, 10, 20, partition=3, mark_delete=(10, 19)),
    commands.topics_of_namespace_response(13, ["persistent://t/n/a"]),
]


@pytest.mark.parametrize("command", BUILT, ids=lambda command: pb.BaseCommand.Type.Name(command.type))
def test_built_commands_are_complete_and_round_trip(command):
    assert command.IsInitialized()
    assert decode_frame(encode_command(command)).command == command


def test_message_frames_a_stored_payload():
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    command = commands.message(5, 10, 20, redelivery_count=2, partition=1, ack_set=[-1])
    frame = decode_frame(encode_message_frame(command, encode_stored(metadata, b"body")))
    assert frame.command.message.message_id.partition == 1
    assert frame.command.message.redelivery_count == 2
    assert bytes(frame.payload.payload) == b"body"


def test_conventions():
    assert commands.negotiated_protocol_version(20) == 20
    assert commands.negotiated_protocol_version(99) == commands.PROTOCOL_VERSION_MAX
    assert commands.negotiated_protocol_version(-3) == 0
    assert commands.close_producer(1).close_producer.request_id == 2**64 - 1
    receipt = commands.send_receipt(1, 2, 10, 20).send_receipt.message_id
    assert not receipt.HasField("partition") and receipt.partition == -1
    assert commands.producer_success(1, "p").producer_success.last_sequence_id == -1
    connected = commands.connected("magnetar", 20).connected
    assert connected.max_message_size == 5 * 1024 * 1024
    with pytest.raises(AssertionError):
        commands.connected("", 20)
