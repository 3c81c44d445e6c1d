"""Subscription modes. Pure.

The values are Pulsar's ``CommandSubscribe.SubType`` numbers, so the broker turns the
wire value into a mode with ``SubscriptionMode(value)`` and back with ``int(mode)``;
nothing in this package reads protobuf. Broadcast is not a mode of its own: it is a
set of member subscriptions, one per consumer name, each in the mode its consumers
ask for (see broker/topic.py), so it does not appear here.
"""

from __future__ import annotations

import enum

from common.errors import NotAllowed


class SubscriptionMode(enum.IntEnum):
    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3

    @property
    def pulsar_name(self) -> str:
        """The name Pulsar's admin API and stats use ("Exclusive", "Key_Shared"...)."""
        return _PULSAR_NAMES[self]

    @property
    def shares_messages(self) -> bool:
        """Shared and key-shared spread messages over consumers (per-message acks only)."""
        return self in (SubscriptionMode.SHARED, SubscriptionMode.KEY_SHARED)

    @classmethod
    def from_wire(cls, value: int) -> "SubscriptionMode":
        """The mode a client asked for; NotAllowed for a value Pulsar does not define."""
        try:
            return cls(value)
        except ValueError:
            raise NotAllowed(f"unknown subscription mode {value}") from None


_PULSAR_NAMES = {
    SubscriptionMode.EXCLUSIVE: "Exclusive",
    SubscriptionMode.SHARED: "Shared",
    SubscriptionMode.FAILOVER: "Failover",
    SubscriptionMode.KEY_SHARED: "Key_Shared",
}
