"""A producer attached to a topic through one client connection."""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass, field

# Generated producer names must be unique across the cluster and across broker
# restarts: a client keeps the name it was given and presents it again when it
# reconnects — possibly to another broker after an ownership move — so two brokers
# (or one broker before and after a restart) must never hand out the same name.
_PROCESS_NONCE = secrets.token_hex(4)
_NAME_COUNTER = itertools.count()


def generated_producer_name(cluster: str, broker: str) -> str:
    """``<cluster>-<broker>-<process nonce>-<n>``, unique per process and, through
    the random nonce, across processes."""
    label = "".join(c if c.isalnum() else "_" for c in broker) or "broker"
    return f"{cluster}-{label}-{_PROCESS_NONCE}-{next(_NAME_COUNTER)}"


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
    # The broker is closing it (a backlog quota): its SENDs from now on are dropped
    # unanswered, and CLOSE_PRODUCER follows the receipts of the earlier ones.
    closing: bool = False
    # The future of this producer's last SEND (deduplication answers a duplicate only
    # after it, so receipts keep the order of the sends).
    last_send: object = None

    @property
    def address(self) -> str:
        return getattr(self.connection, "peer", "")
