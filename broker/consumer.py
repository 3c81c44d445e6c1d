"""A consumer attached to a subscription through one client connection: the broker's
implementation of ``subscriptions.ports.ConsumerPort``.

It owns the flow-control permits the client granted (in messages, as Pulsar counts
them: a batch entry of N messages takes N) and turns what the dispatcher decides into
frames on its connection: MESSAGE (a command in front of the stored payload, with no
re-encoding of the payload), ACTIVE_CONSUMER_CHANGE, REACHED_END_OF_TOPIC and
CLOSE_CONSUMER. What the consumer holds unacknowledged is the dispatcher's to know.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from common.position import ManagedEntry
from protocol import commands
from protocol.codec import message_frame_buffers
from protocol.proto import pulsar_api_pb2 as pb
from subscriptions.mode import SubscriptionMode


class ConsumerConnection(Protocol):
    """What a consumer needs of its client connection (broker/connection.py)."""

    peer: str
    writable: bool

    def write_buffers(self, buffers: list[bytes | memoryview]) -> None: ...

    def write_command(self, command: pb.BaseCommand) -> None: ...

    def forget_consumer(self, consumer: "Consumer") -> None: ...


@dataclass(eq=False)
class Consumer:
    consumer_id: int
    name: str
    subscription_name: str
    topic_name: str
    mode: SubscriptionMode
    connection: ConsumerConnection
    priority_level: int = 0
    partition_index: int = -1
    metadata: dict[str, str] = field(default_factory=dict)
    permits: int = 0
    connected_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    messages_out: int = 0
    bytes_out: int = 0
    closed: bool = False

    @property
    def writable(self) -> bool:
        return not self.closed and self.connection.writable

    @property
    def address(self) -> str:
        return self.connection.peer

    def send_entry(self, entry: ManagedEntry, message_count: int, *, redelivery_count: int,
                   ack_set: Sequence[int] | None) -> None:
        """Writes one MESSAGE frame and takes its messages from the permits."""
        assert not self.closed, "an entry was dispatched to a closed consumer"
        command = commands.message(self.consumer_id, entry.position.ledger_id, entry.position.entry_id,
                                   redelivery_count=redelivery_count, ack_set=ack_set or (),
                                   partition=self.partition_index)
        self.connection.write_buffers(message_frame_buffers(command, entry.data))
        self.permits -= message_count
        self.messages_out += message_count
        self.bytes_out += len(entry.data)

    def notify_active(self, is_active: bool) -> None:
        if not self.closed:
            self.connection.write_command(commands.active_consumer_change(self.consumer_id, is_active=is_active))

    def notify_end_of_topic(self) -> None:
        if not self.closed:
            self.connection.write_command(commands.reached_end_of_topic(self.consumer_id))

    def disconnect(self, assigned: tuple[str, str] | None = None) -> None:
        """Sends CLOSE_CONSUMER (the client looks the topic up and subscribes again, or
        goes straight to ``assigned``, (URL, TLS URL), if named) and detaches from the
        connection; once closed, nothing more is sent."""
        if self.closed:
            return
        self.closed = True
        url, url_tls = assigned or ("", "")
        self.connection.write_command(commands.close_consumer(self.consumer_id, assigned_url=url,
                                                              assigned_url_tls=url_tls))
        self.connection.forget_consumer(self)
