"""The rules of a Pulsar protocol session, for either end of a connection: a pure,
role-blind state machine (h11's shape, as ``codec.py`` follows it: the rules written
once, what differs between the two ends kept in tables by role; no sockets, no clock
reads, no logging — the shell passes the time in and does what the answer says).

Both shells use it: ``broker/connection.py`` (the server end) and
``client/connection.py`` (the client end). Pulsar keeps the same rules once, in the
``PulsarHandler`` that both its ``ServerCnx`` and ``ClientCnx`` extend.

Theory of operation:
- **The opening.** The client speaks first: CONNECT; the server answers CONNECTED (after
  checking credentials, which may take a while: the server's shell calls
  ``handshake_done`` when it writes CONNECTED, the client's when it reads it). Until
  then each end takes only its opening command from the peer (``OPENING``):
  the server refuses anything else and closes the connection (Pulsar: "the first
  command must be CONNECT"); the client also takes AUTH_CHALLENGE (a multi-stage
  authentication asks before CONNECTED) and ignores anything else.
- **PING and PONG.** A PING is answered with a PONG by either end, at any time the
  peer may speak (before the handshake, a server refuses a PING like anything but
  CONNECT); a PONG is traffic and nothing more.
- **The handshake's deadline.** ``handshake_timeout_s`` after the session starts, a
  handshake not done means the peer is not speaking the protocol (or not at all): the
  connection is closed (``handshake_left_s``; the server's shell asks it from a timer
  at the deadline, the client's bounds its whole opening, TCP and TLS included, with
  the same number).
- **Silence.** Any bytes from the peer, a frame's fragment included, are traffic
  (``traffic``). After ``keepalive_interval_s`` of silence an end whose handshake is
  done sends a PING (before it, there is no session to keep alive); after twice that
  the peer is taken for gone and the connection closed. The shell asks ``due`` every
  ``check_interval_s`` (half the interval), so a PING leaves between one and one and a
  half intervals into a silence, and a silent peer is dropped between two and two and
  a half.

Invariants: the phase only moves forward (HANDSHAKE → OPEN → CLOSED); the time given
never goes back; nothing is due once the session is closed.
"""

from __future__ import annotations

import enum

from protocol.proto import pulsar_api_pb2 as pb

T = pb.BaseCommand


class Role(enum.Enum):
    CLIENT = "client"   # sends CONNECT, waits for CONNECTED
    SERVER = "server"   # waits for CONNECT, answers CONNECTED


class Phase(enum.Enum):
    HANDSHAKE = 1       # the opening command has not been exchanged yet
    OPEN = 2            # handshake done: requests flow, keep-alive runs
    CLOSED = 3          # the shell closed the connection, or the peer went away


class Verdict(enum.Enum):
    """What a shell does with a command it received."""

    HANDLE = "handle"   # pass it to the shell's handler for its type
    PONG = "pong"       # a PING: answer PONG, nothing else
    DROP = "drop"       # a PONG: its arrival counted as traffic already
    IGNORE = "ignore"   # not expected now, harmless: drop it
    REFUSE = "refuse"   # not allowed now: answer an error and close the connection


class Due(enum.Enum):
    """What the clock asks of a shell."""

    NOTHING = "nothing"
    PING = "ping"                   # send a PING
    CLOSE_SILENT = "close-silent"   # the peer is gone: close the connection


# The command each end waits for before anything else.
OPENING: dict[Role, int] = {Role.SERVER: T.CONNECT, Role.CLIENT: T.CONNECTED}
# Before the handshake: what each end does with what it may receive, and with anything
# else. A server takes CONNECT only; a client its CONNECTED, an AUTH_CHALLENGE, and the
# keep-alive.
_BEFORE_HANDSHAKE: dict[Role, dict[int, Verdict]] = {
    Role.SERVER: {T.CONNECT: Verdict.HANDLE},
    Role.CLIENT: {T.CONNECTED: Verdict.HANDLE, T.AUTH_CHALLENGE: Verdict.HANDLE, T.PING: Verdict.PONG,
                  T.PONG: Verdict.DROP},
}
_OTHERWISE_BEFORE_HANDSHAKE: dict[Role, Verdict] = {Role.SERVER: Verdict.REFUSE, Role.CLIENT: Verdict.IGNORE}
# Once open, the same for both ends: the keep-alive, and everything else to the shell.
_WHEN_OPEN: dict[int, Verdict] = {T.PING: Verdict.PONG, T.PONG: Verdict.DROP}
assert all(_BEFORE_HANDSHAKE[role][OPENING[role]] is Verdict.HANDLE for role in Role)
# Silence past this many keep-alive intervals means the peer is gone (Pulsar: a PING
# unanswered for one more interval).
SILENT_INTERVALS_MAX = 2


class Session:
    """One connection's session rules. ``now_s`` is a monotonic clock's reading (the
    shell's ``time.monotonic()``), given at the start and with every event."""

    def __init__(self, role: Role, *, keepalive_interval_s: float, handshake_timeout_s: float,
                 now_s: float) -> None:
        assert keepalive_interval_s > 0, keepalive_interval_s
        assert handshake_timeout_s > 0, handshake_timeout_s
        self.role = role
        self.keepalive_interval_s = keepalive_interval_s
        self.handshake_timeout_s = handshake_timeout_s
        self.phase = Phase.HANDSHAKE
        self._started_s = now_s
        self._last_traffic_s = now_s
        self._now_s = now_s

    # --- what the shell tells the session ----------------------------------------------------------

    def traffic(self, now_s: float) -> None:
        """Bytes came from the peer (a whole frame or a piece of one)."""
        self._advance(now_s)
        self._last_traffic_s = now_s

    def handshake_done(self) -> None:
        """The opening is exchanged: the server wrote CONNECTED, or the client read it."""
        assert self.phase is not Phase.CLOSED, "handshake after close"
        assert self.phase is Phase.HANDSHAKE, "handshake done twice"
        self.phase = Phase.OPEN

    def closed(self) -> None:
        """The connection is closing or gone: nothing is due any more."""
        self.phase = Phase.CLOSED

    # --- what the session tells the shell ----------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.phase is Phase.OPEN

    @property
    def check_interval_s(self) -> float:
        """How often the shell asks ``due`` (half the keep-alive interval)."""
        return self.keepalive_interval_s / 2

    def received(self, command_type: int) -> Verdict:
        """What to do with a command the peer sent (its ``BaseCommand.Type``)."""
        if self.phase is Phase.HANDSHAKE:
            return _BEFORE_HANDSHAKE[self.role].get(command_type, _OTHERWISE_BEFORE_HANDSHAKE[self.role])
        return _WHEN_OPEN.get(command_type, Verdict.HANDLE)

    def handshake_left_s(self, now_s: float) -> float | None:
        """Seconds left before the handshake's deadline (0 or less: overdue, close the
        connection); None once the handshake is done or the session closed. A shell's
        timer that fires a little early (another clock's rounding) finds time left and
        waits for it."""
        self._advance(now_s)
        if self.phase is not Phase.HANDSHAKE:
            return None
        return self.handshake_timeout_s - (now_s - self._started_s)

    def silent_s(self, now_s: float) -> float:
        """Seconds since the peer last sent anything."""
        self._advance(now_s)
        silent = now_s - self._last_traffic_s
        assert silent >= 0, silent
        return silent

    def due(self, now_s: float) -> Due:
        """What the keep-alive asks for now (the shell calls it every
        ``check_interval_s``)."""
        if self.phase is Phase.CLOSED:
            return Due.NOTHING
        silent = self.silent_s(now_s)
        if silent > SILENT_INTERVALS_MAX * self.keepalive_interval_s:
            return Due.CLOSE_SILENT
        if silent > self.keepalive_interval_s and self.phase is Phase.OPEN:
            return Due.PING
        return Due.NOTHING

    def _advance(self, now_s: float) -> None:
        assert now_s >= self._now_s, (now_s, self._now_s)   # a monotonic clock
        self._now_s = now_s
