"""The Pulsar protocol session's rules (protocol/session.py), for both ends.

What it proves: before the handshake a server takes only CONNECT (anything else is
refused, PING included) and a client only CONNECTED, AUTH_CHALLENGE and the keep-alive
(anything else is ignored); once open both ends answer PING with PONG, drop PONG and
hand everything else over; the handshake's deadline is reported as the time left, and
not at all once done or closed; the keep-alive pings only an open session, only past
one interval of silence, and declares the peer gone only past two; nothing is due once
closed; the phase never goes back. How: tables of (role, phase, command) → verdict;
hypothesis drives one session with random traffic and checks at increasing times
against the rule restated; two sessions wired through an in-memory link on a virtual
clock show that a quiet but live link stays open (each end's PING is answered) and a
cut one is closed by both ends between two and two and a half intervals.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.proto import pulsar_api_pb2 as pb
from protocol.session import OPENING, Due, Phase, Role, Session, Verdict

T = pb.BaseCommand
INTERVAL_S = 30.0
HANDSHAKE_S = 10.0


def session(role: Role, now_s: float = 0.0) -> Session:
    return Session(role, keepalive_interval_s=INTERVAL_S, handshake_timeout_s=HANDSHAKE_S, now_s=now_s)


def opened(role: Role) -> Session:
    s = session(role)
    s.handshake_done()
    return s


BEFORE_HANDSHAKE = [
    (Role.SERVER, T.CONNECT, Verdict.HANDLE),
    (Role.SERVER, T.PING, Verdict.REFUSE),
    (Role.SERVER, T.PONG, Verdict.REFUSE),
    (Role.SERVER, T.LOOKUP, Verdict.REFUSE),
    (Role.SERVER, T.PRODUCER, Verdict.REFUSE),
    (Role.SERVER, T.CONNECTED, Verdict.REFUSE),
    (Role.CLIENT, T.CONNECTED, Verdict.HANDLE),
    (Role.CLIENT, T.AUTH_CHALLENGE, Verdict.HANDLE),
    (Role.CLIENT, T.PING, Verdict.PONG),
    (Role.CLIENT, T.PONG, Verdict.DROP),
    (Role.CLIENT, T.ERROR, Verdict.IGNORE),
    (Role.CLIENT, T.MESSAGE, Verdict.IGNORE),
    (Role.CLIENT, T.CONNECT, Verdict.IGNORE),
]

WHEN_OPEN = [
    (role, command, verdict)
    for role in Role
    for command, verdict in [(T.PING, Verdict.PONG), (T.PONG, Verdict.DROP), (T.CONNECT, Verdict.HANDLE),
                             (T.CONNECTED, Verdict.HANDLE), (T.SEND, Verdict.HANDLE), (T.MESSAGE, Verdict.HANDLE),
                             (T.LOOKUP, Verdict.HANDLE), (T.AUTH_CHALLENGE, Verdict.HANDLE)]
]


@pytest.mark.parametrize("role, command, verdict", BEFORE_HANDSHAKE)
def test_what_may_come_before_the_handshake(role, command, verdict):
    assert session(role).received(command) is verdict


@pytest.mark.parametrize("role, command, verdict", WHEN_OPEN)
def test_what_an_open_session_does_with_each_command(role, command, verdict):
    assert opened(role).received(command) is verdict


def test_each_end_waits_for_the_other_ends_opening():
    assert OPENING == {Role.SERVER: T.CONNECT, Role.CLIENT: T.CONNECTED}


def test_the_handshake_deadline_counts_down_and_stops_when_done():
    s = session(Role.SERVER, now_s=100.0)
    assert s.handshake_left_s(100.0) == HANDSHAKE_S
    assert s.handshake_left_s(104.0) == pytest.approx(HANDSHAKE_S - 4)
    assert s.handshake_left_s(110.0) == 0          # overdue: the shell closes
    assert s.handshake_left_s(111.0) < 0
    s.handshake_done()
    assert s.handshake_left_s(112.0) is None
    closed = session(Role.CLIENT)
    closed.closed()
    assert closed.handshake_left_s(HANDSHAKE_S * 2) is None


def test_the_handshake_is_done_once_and_never_after_close():
    s = opened(Role.CLIENT)
    with pytest.raises(AssertionError):
        s.handshake_done()
    s = session(Role.SERVER)
    s.closed()
    with pytest.raises(AssertionError):
        s.handshake_done()


def test_time_never_goes_back():
    s = session(Role.SERVER, now_s=50.0)
    s.traffic(60.0)
    with pytest.raises(AssertionError):
        s.due(59.0)


KEEPALIVE = [
    # (open, silent seconds, what is due)
    (True, 0.0, Due.NOTHING),
    (True, INTERVAL_S, Due.NOTHING),               # exactly one interval: not yet
    (True, INTERVAL_S + 0.001, Due.PING),
    (True, 2 * INTERVAL_S, Due.PING),              # exactly two: still only a PING
    (True, 2 * INTERVAL_S + 0.001, Due.CLOSE_SILENT),
    (False, INTERVAL_S + 1, Due.NOTHING),          # no PING before the handshake
    (False, 2 * INTERVAL_S + 1, Due.CLOSE_SILENT),  # but silence still ends it
]


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("is_open, silent_s, due", KEEPALIVE)
def test_the_keepalive_by_silence(role, is_open, silent_s, due):
    s = opened(role) if is_open else session(role)
    s.traffic(1000.0)
    assert s.due(1000.0 + silent_s) is due
    assert s.silent_s(1000.0 + silent_s) == pytest.approx(silent_s)


def test_nothing_is_due_once_closed():
    s = opened(Role.CLIENT)
    s.closed()
    assert s.phase is Phase.CLOSED
    assert s.due(10 * INTERVAL_S) is Due.NOTHING


def test_the_check_runs_twice_an_interval():
    assert session(Role.SERVER).check_interval_s == INTERVAL_S / 2


EVENTS = st.lists(st.tuples(st.sampled_from(["traffic", "due", "handshake", "close"]),
                            st.floats(min_value=0, max_value=3 * INTERVAL_S, allow_nan=False)),
                  max_size=40)


@settings(max_examples=300, deadline=None)
@given(role=st.sampled_from(list(Role)), events=EVENTS)
def test_the_keepalive_agrees_with_the_rule_restated(role, events):
    """Random traffic, handshakes, closes and checks at increasing times: ``due`` is
    what the rule says from the last traffic and the phase, and the phase only moves
    forward."""
    s = session(role)
    now_s = last_traffic_s = 0.0
    order = [Phase.HANDSHAKE, Phase.OPEN, Phase.CLOSED]
    for kind, step_s in events:
        now_s += step_s
        before = s.phase
        if kind == "traffic":
            s.traffic(now_s)
            last_traffic_s = now_s
        elif kind == "handshake" and s.phase is Phase.HANDSHAKE:
            s.handshake_done()
        elif kind == "close":
            s.closed()
        elif kind == "due":
            silent = now_s - last_traffic_s
            if s.phase is Phase.CLOSED:
                expected = Due.NOTHING
            elif silent > 2 * INTERVAL_S:
                expected = Due.CLOSE_SILENT
            elif silent > INTERVAL_S and s.phase is Phase.OPEN:
                expected = Due.PING
            else:
                expected = Due.NOTHING
            assert s.due(now_s) is expected, (silent, s.phase)
        assert order.index(s.phase) >= order.index(before)


class Link:
    """Two sessions and what each has on its way to the other, on a virtual clock; each
    end runs its check every ``check_interval_s``, as the shells' keep-alive tasks do."""

    def __init__(self) -> None:
        self.client = session(Role.CLIENT)
        self.server = session(Role.SERVER)
        self.to = {Role.CLIENT: [], Role.SERVER: []}
        self.cut = False
        self.closed_at: dict[Role, float] = {}
        self.last_traffic_at: dict[Role, float] = {}

    def send(self, sender: Session, command: int) -> None:
        if not self.cut:
            self.to[Role.SERVER if sender is self.client else Role.CLIENT].append(command)

    def deliver(self, now_s: float) -> None:
        for end, peer in ((self.server, self.client), (self.client, self.server)):
            inbox, self.to[end.role] = self.to[end.role], []
            for command in inbox:
                end.traffic(now_s)
                self.last_traffic_at[end.role] = now_s
                verdict = end.received(command)
                if verdict is Verdict.PONG:
                    self.send(end, T.PONG)
                elif verdict is Verdict.HANDLE and command == T.CONNECT:
                    end.handshake_done()
                    self.send(end, T.CONNECTED)
                elif verdict is Verdict.HANDLE and command == T.CONNECTED:
                    end.handshake_done()
                else:
                    assert verdict in (Verdict.DROP, Verdict.HANDLE), verdict

    def check(self, now_s: float) -> None:
        for end in (self.client, self.server):
            due = end.due(now_s)
            if due is Due.PING:
                self.send(end, T.PING)
            elif due is Due.CLOSE_SILENT:
                end.closed()
                self.closed_at[end.role] = now_s

    def run(self, until_s: float, cut_at_s: float | None = None) -> None:
        self.send(self.client, T.CONNECT)
        now_s = 0.0
        step_s = self.client.check_interval_s
        while now_s < until_s:
            self.deliver(now_s)
            now_s += step_s
            if cut_at_s is not None and now_s >= cut_at_s:
                self.cut = True
            self.check(now_s)


def test_a_quiet_live_link_stays_open_on_the_pings_alone():
    link = Link()
    link.run(until_s=20 * INTERVAL_S)
    assert link.client.is_open and link.server.is_open
    assert link.closed_at == {}


def test_a_cut_link_is_closed_by_both_ends_within_two_and_a_half_intervals():
    cut_at_s = 5 * INTERVAL_S
    link = Link()
    link.run(until_s=10 * INTERVAL_S, cut_at_s=cut_at_s)
    assert set(link.closed_at) == {Role.CLIENT, Role.SERVER}
    for role, closed_at_s in link.closed_at.items():
        assert link.last_traffic_at[role] <= cut_at_s
        assert 2 * INTERVAL_S < closed_at_s - link.last_traffic_at[role] <= 2.5 * INTERVAL_S
