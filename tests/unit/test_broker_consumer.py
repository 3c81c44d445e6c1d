"""The broker's consumer at the subscriptions port (broker/consumer.py).

What it proves: ``Consumer`` has every member of ``subscriptions.ports.ConsumerPort``
(and so does the tests' FakeConsumer, so dispatcher tests drive the same interface);
each port call becomes the frame Pulsar's clients expect — ``send_entry`` a MESSAGE in
front of the unchanged stored payload, taking the entry's messages from the permits;
``notify_active`` ACTIVE_CONSUMER_CHANGE; ``notify_end_of_topic`` REACHED_END_OF_TOPIC;
``disconnect`` one CLOSE_CONSUMER however often it is called, after which nothing is
sent. How: a Consumer over a fake connection that decodes what is written to it.
"""

from __future__ import annotations

import pytest

from broker.consumer import Consumer
from common.position import ManagedEntry, Position
from protocol.codec import decode_frame, encode_stored
from protocol.proto import pulsar_api_pb2 as pb
from subscriptions.mode import SubscriptionMode
from subscriptions.ports import ConsumerPort
from tests.unit.fake_consumer import FakeConsumer


class RecordingConnection:
    def __init__(self) -> None:
        self.frames: list = []
        self.forgotten: list = []
        self.writable = True
        self.peer = "127.0.0.1:5555"

    def write_buffers(self, buffers) -> None:
        self.frames.append(decode_frame(b"".join(bytes(b) for b in buffers)))

    def write_command(self, command: pb.BaseCommand) -> None:
        self.frames.append(decode_frame(b"".join(bytes(b) for b in _encode(command))))

    def forget_consumer(self, consumer) -> None:
        self.forgotten.append(consumer)


def _encode(command: pb.BaseCommand) -> list[bytes]:
    from protocol.codec import encode_command
    return [encode_command(command)]


def port_members() -> set[str]:
    return {name for name in vars(ConsumerPort) if not name.startswith("_")} | set(ConsumerPort.__annotations__)


@pytest.mark.parametrize("implementation", [Consumer, FakeConsumer])
def test_implementations_have_every_port_member(implementation):
    fields = set(getattr(implementation, "__dataclass_fields__", {}))
    missing = {name for name in port_members() if name not in fields and not hasattr(implementation, name)}
    assert not missing, (implementation.__name__, missing)


def make_consumer(connection: RecordingConnection, permits: int = 10) -> Consumer:
    return Consumer(7, "c", "sub", "persistent://t/n/x", SubscriptionMode.FAILOVER, connection, permits=permits)


def test_send_entry_writes_message_before_the_unchanged_payload_and_takes_permits():
    connection = RecordingConnection()
    consumer = make_consumer(connection)
    stored = encode_stored(pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1,
                                              num_messages_in_batch=3), b"payload")
    consumer.send_entry(ManagedEntry(Position(4, 9), stored), 3, redelivery_count=2, ack_set=[5])
    [frame] = connection.frames
    assert frame.command.type == pb.BaseCommand.MESSAGE
    message = frame.command.message
    assert (message.consumer_id, message.message_id.ledgerId, message.message_id.entryId) == (7, 4, 9)
    assert message.redelivery_count == 2
    assert list(message.ack_set) == [5]
    assert bytes(frame.payload.payload) == b"payload"
    assert bytes(frame.payload.stored) == stored
    assert consumer.permits == 7
    assert (consumer.messages_out, consumer.bytes_out) == (3, len(stored))


def test_notifications_and_a_single_disconnect():
    connection = RecordingConnection()
    consumer = make_consumer(connection)
    consumer.notify_active(True)
    consumer.notify_end_of_topic()
    consumer.disconnect()
    consumer.disconnect()
    consumer.notify_active(False)      # closed: nothing more is written
    types = [frame.command.type for frame in connection.frames]
    assert types == [pb.BaseCommand.ACTIVE_CONSUMER_CHANGE, pb.BaseCommand.REACHED_END_OF_TOPIC,
                     pb.BaseCommand.CLOSE_CONSUMER]
    assert connection.frames[0].command.active_consumer_change.is_active is True
    assert connection.forgotten == [consumer]
    assert not consumer.writable
