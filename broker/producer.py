"""A producer attached to a topic through one client connection."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class Producer:
    producer_id: int
    name: str
    topic_name: str
    connection: object                 # broker.connection.ServerConnection
    user_provided_name: bool = False
    access_mode: int = 0               # ProducerAccessMode (0: Shared)
    metadata: dict[str, str] = field(default_factory=dict)
    connected_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    messages_in: int = 0
    bytes_in: int = 0
    closed: bool = False

    @property
    def address(self) -> str:
        return getattr(self.connection, "peer", "")
