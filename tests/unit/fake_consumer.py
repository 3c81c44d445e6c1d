"""A recording stand-in for the broker's consumer, at the subscriptions package's port
(``subscriptions.ports.ConsumerPort``): it keeps every call the dispatcher makes
instead of encoding frames, so dispatcher tests read what was decided directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from common.position import ManagedEntry, Position
from protocol.codec import stored_metadata


@dataclass(frozen=True)
class Sent:
    position: Position
    redelivery_count: int
    key: str


@dataclass(eq=False)
class FakeConsumer:
    consumer_id: int
    name: str
    priority_level: int = 0
    permits: int = 1_000
    writable: bool = True
    sent: list[Sent] = field(default_factory=list)
    ack_sets: list[tuple[int, ...] | None] = field(default_factory=list)
    # ("active", True/False), ("end_of_topic",), ("disconnect",) in call order.
    notifications: list[tuple] = field(default_factory=list)

    def send_entry(self, entry: ManagedEntry, message_count: int, *, redelivery_count: int,
                   ack_set: Sequence[int] | None) -> None:
        assert self.writable, "sent to a consumer that is not writable"
        key = stored_metadata(entry.data).partition_key
        self.sent.append(Sent(entry.position, redelivery_count, key))
        self.ack_sets.append(tuple(ack_set) if ack_set is not None else None)
        self.permits -= message_count

    def notify_active(self, is_active: bool) -> None:
        self.notifications.append(("active", is_active))

    def notify_end_of_topic(self) -> None:
        self.notifications.append(("end_of_topic",))

    def disconnect(self) -> None:
        self.notifications.append(("disconnect",))
        self.writable = False

    def last_active_flag(self) -> bool | None:
        flags = [n[1] for n in self.notifications if n[0] == "active"]
        return flags[-1] if flags else None

    @property
    def positions(self) -> list[Position]:
        return [sent.position for sent in self.sent]
