"""Bounds on publishes accepted and not yet answered (pending sends), per connection, per
topic and for the whole broker, and the back-pressure that keeps them.

Theory of operation:
- A SEND is accepted as soon as it is read: it is counted (one send, its payload bytes)
  in three scopes: its connection, its topic and the broker. It stays counted until its
  receipt or error is written. Nothing is ever refused or failed because of these
  limits: they only decide when the broker reads from a connection again.
- When a send leaves a scope at or past one of its limits (sends or bytes), the
  connection that sent it becomes blocked on that scope and stops being read (the
  kernel's socket buffer and TCP flow control then hold the producer back, as in
  Pulsar at maxPendingPublishRequestsPerConnection and maxMessagePublishBufferSizeInMB).
  Other connections block on the same scope at their next send. Frames already read
  from a blocked connection are still handled, so a scope may overshoot its limit by
  what one socket read holds, per connection sending to it.
- A blocked connection is read again once every scope it is blocked on has drained to
  its resume level (``resume_ratio`` of each limit, half by default, as Pulsar resumes
  at half), so reading does not flap at the limit.
- Topic scopes exist while a topic has pending sends or blocked connections; a topic
  with none costs nothing.

Pure: no sockets, no clock, no logging of its own. A connection is a ``ReadGate`` with
two callbacks (pause and resume its reading); the connection logs the episodes.

Invariants: a scope's counts never go negative and return to zero when every accepted
send was answered; a gate is paused exactly while it is blocked on some scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Scope kinds, as metrics and logs name them.
CONNECTION = "connection"
TOPIC = "topic"
BROKER = "broker"
# A topic's publish rate limit in debt (broker/rate_limits.py): not a PendingSends, but
# it blocks gates the same way, through block() and unblock().
PUBLISH_RATE = "publish_rate"
KINDS = (CONNECTION, TOPIC, BROKER, PUBLISH_RATE)


@dataclass(frozen=True)
class Limit:
    """The bounds of one kind of scope."""

    sends_max: int
    bytes_max: int
    resume_ratio: float

    def __post_init__(self) -> None:
        assert self.sends_max >= 1, self.sends_max
        assert self.bytes_max >= 1, self.bytes_max
        assert 0.0 <= self.resume_ratio < 1.0, self.resume_ratio


class PendingSends:
    """Sends accepted and not yet answered in one scope, and the gates blocked on it."""

    __slots__ = ("kind", "name", "limit", "sends", "size_bytes", "blocked", "_resume_sends", "_resume_bytes")

    def __init__(self, kind: str, name: str, limit: Limit) -> None:
        assert kind in KINDS, kind
        self.kind = kind
        self.name = name
        self.limit = limit
        self.sends = 0
        self.size_bytes = 0
        self.blocked: set[ReadGate] = set()
        self._resume_sends = int(limit.sends_max * limit.resume_ratio)
        self._resume_bytes = int(limit.bytes_max * limit.resume_ratio)

    @property
    def full(self) -> bool:
        return self.sends >= self.limit.sends_max or self.size_bytes >= self.limit.bytes_max

    @property
    def drained(self) -> bool:
        return self.sends <= self._resume_sends and self.size_bytes <= self._resume_bytes

    def __repr__(self) -> str:
        return f"PendingSends({self.kind} {self.name}: sends={self.sends} bytes={self.size_bytes})"


class ReadGate:
    """One connection's reading switch: closed while it is blocked on any scope."""

    __slots__ = ("_pause", "_resume", "blocked_on", "scope")

    def __init__(self, scope: PendingSends, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        assert scope.kind == CONNECTION
        self.scope = scope           # the connection's own pending sends
        self._pause = pause
        self._resume = resume
        self.blocked_on: set[PendingSends] = set()

    @property
    def paused(self) -> bool:
        return bool(self.blocked_on)


@dataclass
class PublishLimitStats:
    # Times a connection stopped being read (a gate went from open to blocked).
    reading_pauses: int = 0
    # Times a connection was blocked by each kind of scope (one pause may have several).
    blocks_by_kind: dict[str, int] | None = None
    # Times a connection was read again.
    reading_resumes: int = 0

    def __post_init__(self) -> None:
        if self.blocks_by_kind is None:
            self.blocks_by_kind = {kind: 0 for kind in KINDS}


class PublishLimits:
    """The broker's pending-send scopes and the gates of its connections."""

    def __init__(self, connection: Limit, topic: Limit, broker: Limit,
                 on_blocked: Callable[[ReadGate, PendingSends], None] | None = None) -> None:
        self._connection_limit = connection
        self._topic_limit = topic
        self.broker = PendingSends(BROKER, "broker", broker)
        self._topics: dict[str, PendingSends] = {}
        self.stats = PublishLimitStats()
        # Told when a gate blocks on a scope that had no gate blocked on it (the first
        # of an episode): the connection logs it once per episode, not per send.
        self.on_blocked = on_blocked

    def gate(self, name: str, pause: Callable[[], None], resume: Callable[[], None]) -> ReadGate:
        """A new connection's gate (``name`` identifies it in logs)."""
        return ReadGate(PendingSends(CONNECTION, name, self._connection_limit), pause, resume)

    def topic(self, topic_name: str) -> PendingSends:
        scope = self._topics.get(topic_name)
        if scope is None:
            scope = self._topics[topic_name] = PendingSends(TOPIC, topic_name, self._topic_limit)
        return scope

    @property
    def topic_count(self) -> int:
        """Topics with pending sends or blocked connections (for tests and stats)."""
        return len(self._topics)

    def on_send(self, gate: ReadGate, topic_name: str, size_bytes: int) -> tuple[PendingSends, ...]:
        """Counts an accepted send; blocks (and pauses) the gate when it filled a scope.
        Returns the scopes it was counted in, to give back to ``on_send_done``."""
        assert size_bytes >= 0, size_bytes
        scopes = (gate.scope, self.topic(topic_name), self.broker)
        was_paused = gate.paused
        for scope in scopes:
            scope.sends += 1
            scope.size_bytes += size_bytes
            if scope.full and scope not in gate.blocked_on:
                first_of_episode = not scope.blocked
                scope.blocked.add(gate)
                gate.blocked_on.add(scope)
                self.stats.blocks_by_kind[scope.kind] += 1   # type: ignore[index]
                if first_of_episode and self.on_blocked is not None:
                    self.on_blocked(gate, scope)
        if gate.paused and not was_paused:
            self.stats.reading_pauses += 1
            gate._pause()
        return scopes

    def on_send_done(self, scopes: tuple[PendingSends, ...], size_bytes: int) -> None:
        """A send counted by ``on_send`` was answered (receipt or error)."""
        for scope in scopes:
            scope.sends -= 1
            scope.size_bytes -= size_bytes
            assert scope.sends >= 0, scope
            assert scope.size_bytes >= 0, scope
            if scope.blocked and scope.drained:
                self._unblock(scope)
        topic = scopes[1]
        if topic.sends == 0 and not topic.blocked and self._topics.get(topic.name) is topic:
            del self._topics[topic.name]

    def block(self, gate: ReadGate, scope) -> None:
        """Blocks (and pauses) ``gate`` on ``scope``, something other than pending sends
        that holds the connection back (a publish rate in debt) until ``unblock``."""
        if scope in gate.blocked_on:
            return
        was_paused = gate.paused
        scope.blocked.add(gate)
        gate.blocked_on.add(scope)
        self.stats.blocks_by_kind[scope.kind] += 1   # type: ignore[index]
        if not was_paused:
            self.stats.reading_pauses += 1
            gate._pause()

    def unblock(self, scope) -> None:
        """Every gate blocked on ``scope`` stops being so (read again if nothing else
        blocks it)."""
        self._unblock(scope)

    def _unblock(self, scope: PendingSends) -> None:
        blocked, scope.blocked = scope.blocked, set()
        for gate in blocked:
            gate.blocked_on.discard(scope)
            if not gate.paused:
                self.stats.reading_resumes += 1
                gate._resume()

    def forget(self, gate: ReadGate) -> None:
        """The connection is gone: it blocks nothing any more (its pending sends are
        still answered, or failed, and counted down by ``on_send_done``)."""
        for scope in gate.blocked_on:
            scope.blocked.discard(gate)
            if scope.kind == TOPIC and scope.sends == 0 and not scope.blocked \
                    and self._topics.get(scope.name) is scope:
                del self._topics[scope.name]
        gate.blocked_on.clear()
