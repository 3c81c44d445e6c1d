"""A consumer attached to a subscription through one client connection.

It owns the flow-control permits the client granted (in messages, as Pulsar counts
them: a batch entry of N messages takes N) and writes MESSAGE frames to its connection:
a MESSAGE command in front of the stored payload, with no re-encoding of the payload.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocol import commands
from protocol.codec import message_frame_buffers

if TYPE_CHECKING:
    from broker.managed_ledger import ManagedEntry


@dataclass(eq=False)
class Consumer:
    consumer_id: int
    name: str
    subscription_name: str
    topic_name: str
    sub_type: int
    connection: object                 # broker.connection.ServerConnection
    priority_level: int = 0
    partition_index: int = -1
    metadata: dict[str, str] = field(default_factory=dict)
    permits: int = 0
    connected_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    messages_out: int = 0
    bytes_out: int = 0
    unacked_messages: int = 0
    closed: bool = False
    reached_end_sent: bool = False
    # Shared and key-shared: entries sent to this consumer and not acknowledged yet
    # (position -> message count), redelivered to others if it goes away.
    pending: dict = field(default_factory=dict)

    @property
    def writable(self) -> bool:
        return not self.closed and getattr(self.connection, "writable", True)

    @property
    def address(self) -> str:
        return getattr(self.connection, "peer", "")

    def send(self, entry: "ManagedEntry", message_count: int, *, redelivery_count: int = 0,
             ack_set: list[int] | None = None) -> None:
        """Writes one MESSAGE frame and takes its messages from the permits."""
        command = commands.message(self.consumer_id, entry.position.ledger_id, entry.position.entry_id,
                                   redelivery_count=redelivery_count, ack_set=ack_set or ())
        self.connection.write_buffers(message_frame_buffers(command, entry.data))
        self.permits -= message_count
        self.messages_out += message_count
        self.bytes_out += len(entry.data)
