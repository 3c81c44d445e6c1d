"""The ports of the subscriptions package: what a subscription needs of the world
around it, as ``typing.Protocol``s that the broker implements. This package never
imports ``broker/``; it is driven through plain values and talks back through these.

- ``ConsumerPort``: one consumer attached through a client connection. It owns the
  flow-control permits its client granted (in messages, as Pulsar counts them) and
  turns what the dispatcher decides into frames. Dispatch state (what a consumer holds
  unacknowledged, whether it was told of the end of the topic) lives in the
  dispatcher, not here. Ports are dictionary keys of the dispatcher's per-consumer
  state, so an implementation must hash and compare by identity (the default for a
  class, or a dataclass with ``eq=False``).
- ``PositionSource`` / ``EntrySource``: the managed ledger a cursor moves over and a
  dispatcher reads from.
- ``AckedMessage``: one message id of an acknowledgement, decoded by the broker.
- ``HeldAcks``: messages acknowledged where the subscription cannot see it yet (the
  broker's transactions: Pulsar's pending-ack state), held back from delivery.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol, Sequence

from common.position import ManagedEntry, Position


class ConsumerPort(Protocol):
    consumer_id: int
    name: str
    priority_level: int

    @property
    def permits(self) -> int:
        """Messages the client may still receive (negative after a batch overshot)."""
        ...

    @property
    def writable(self) -> bool:
        """False while the client's connection cannot take more bytes, or once closed."""
        ...

    def send_entry(self, entry: ManagedEntry, message_count: int, *, redelivery_count: int,
                   ack_set: Sequence[int] | None) -> None:
        """Sends one entry (``message_count`` messages) and takes that many permits.
        ``ack_set``: the batch messages still to deliver, as Pulsar's ack-set words
        (None: all of them)."""
        ...

    def notify_active(self, is_active: bool) -> None:
        """Failover: tells the client whether this consumer is the active one now."""
        ...

    def notify_end_of_topic(self) -> None:
        """The topic is terminated and this consumer has received all of it."""
        ...

    def disconnect(self) -> None:
        """Tells the client to close this consumer (it subscribes again and drops what it
        had queued) and stops sending to it. Safe to call more than once."""
        ...


class PositionSource(Protocol):
    """What a cursor needs of its managed ledger."""

    last_confirmed: Position

    def next_position(self, position: Position) -> Position: ...

    def normalize(self, position: Position) -> Position: ...

    def last_entry_of(self, ledger_id: int) -> int:
        """The last confirmed entry id of one of the topic's ledgers (-1: none)."""
        ...

    @property
    def first_position(self) -> Position: ...

    def number_of_entries(self) -> int: ...


class EntrySource(PositionSource, Protocol):
    """What a subscription and its dispatcher need of their managed ledger."""

    terminated: bool

    async def read(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry]:
        """Confirmed entries from ``start`` on (at most ``count_max``, about ``bytes_max``)."""
        ...

    def read_cached(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry] | None:
        """What ``read`` would return, without awaiting, when it is all in memory; None
        when it is not (then ``read``)."""
        ...

    def wait_for_entries(self) -> asyncio.Future[None]:
        """Resolves when entries past the current ``last_confirmed`` are confirmed."""
        ...


@dataclass(frozen=True, slots=True)
class AckedMessage:
    """One message id of an ACK: the entry, and for a batch entry the messages it
    leaves unacknowledged (``ack_set`` words, None: the whole entry) and its size."""

    position: Position
    ack_set: tuple[int, ...] | None = None
    batch_size: int = 0


class HeldAcks(Protocol):
    """Acknowledgements a subscription holds pending outside its cursor (the broker's
    open transactions, broker/topic_transactions.py). A held entry is treated as
    acknowledged by the dispatcher — not delivered, not redelivered, whatever asks
    (a consumer leaving, a redelivery request, a rewind, a new owner reading from the
    mark-delete position) — until the holder applies it (the cursor acknowledges it)
    or releases it (``Subscription.release_held``: delivered again)."""

    def holds(self, position: Position) -> bool: ...

    def unheld_bits(self, position: Position) -> int | None:
        """For a batch entry held in part: its messages not held, as ack-set bits (bit
        i set: message i may be sent); None when no part of it is held."""
        ...


class DispatchThrottle(Protocol):
    """A dispatch rate limit a subscription's dispatcher obeys (the broker's
    broker/rate_limits.py): it reads at most ``allowance()`` messages, none while that
    is 0 (then it tries again ``retry_after_s()`` later), and reports what it sent."""

    def allowance(self) -> int: ...

    def consume(self, messages: int, size_bytes: int) -> None: ...

    def retry_after_s(self) -> float: ...

