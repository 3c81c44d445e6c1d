"""The hosts harness's checker (tests/hosts/checker.py) on hand-made histories.

What it proves: it can fail — a receipt never delivered is lost (per subscription), a
failover or key-shared first delivery out of send order is a violation (shared
promises none), a receipt whose message id goes backwards is one, a delivery of
something never sent is one; redeliveries are counted as duplicates, told apart from a
second stored copy; a recovered ledger ending before an acknowledged entry is a
violation; two brokers' serving intervals of one bundle that overlap are two
writers, also across a broker's kill -9 and restart (the interval open at the kill
ends there), and back-to-back hand-overs are not; a stall is the longest gap between
receipts that overlaps the fault, counted from its start. How: pure functions over lists of events and log
text; no processes.
"""

from __future__ import annotations

from tests.hosts import checker


def send(seq: int, ledger: int, entry: int, producer: str = "p0", key: str = "k0") -> list[dict]:
    return [{"type": "invoke", "f": "send", "producer": producer, "key": key, "seq": seq, "t": seq},
            {"type": "ok", "f": "send", "producer": producer, "key": key, "seq": seq, "ledger": ledger,
             "entry": entry, "t": seq + 0.5}]


def receive(subscription: str, mode: str, seq: int, t: float, ledger: int = 1, entry: int | None = None,
            producer: str = "p0", key: str = "k0") -> dict:
    return {"type": "receive", "subscription": subscription, "mode": mode, "consumer": "c0", "producer": producer,
            "key": key, "seq": seq, "ledger": ledger, "entry": seq if entry is None else entry, "redelivery": 0,
            "t": t}


def test_a_clean_history_passes_and_counts_duplicates():
    produced = send(0, 1, 0) + send(1, 1, 1)
    consumed = [receive("failover-t0", "failover", 0, 10), receive("failover-t0", "failover", 1, 11),
                receive("failover-t0", "failover", 1, 12),                     # redelivered
                receive("failover-t0", "failover", 1, 13, entry=7)]            # a second stored copy
    verdict = checker.check_histories(produced, consumed)
    assert verdict.ok, verdict.summary()
    assert verdict.acknowledged == 2
    assert verdict.duplicates["failover-t0"] == 2
    assert verdict.stored_twice["failover-t0"] == 1


def test_an_acknowledged_message_never_delivered_is_lost():
    produced = send(0, 1, 0) + send(1, 1, 1)
    consumed = [receive("shared-t0", "shared", 0, 10), receive("failover-t0", "failover", 0, 10),
                receive("failover-t0", "failover", 1, 11)]
    verdict = checker.check_histories(produced, consumed)
    assert not verdict.ok
    assert verdict.lost == {"shared-t0": ["p0|1"], "failover-t0": []}
    # A subscription that delivered nothing at all loses everything.
    ready = {"type": "ready", "subscriptions": {"key_shared-t0": "key_shared"}, "t": 0}
    verdict = checker.check_histories(produced, [ready] + consumed)
    assert verdict.lost["key_shared-t0"] == ["p0|0", "p0|1"]


def test_order_is_checked_where_the_mode_promises_it():
    produced = send(0, 1, 0) + send(1, 1, 1, key="k1")
    out_of_order = [(1, 10), (0, 11)]
    for mode, violated in [("failover", True), ("key_shared", False), ("shared", False)]:
        consumed = [receive(f"{mode}-t0", mode, seq, t, key=f"k{seq}") for seq, t in out_of_order]
        verdict = checker.check_histories(produced, consumed)
        assert bool(verdict.order_violations) is violated, (mode, verdict.order_violations)
    # Key-shared: one key's messages out of order is a violation.
    produced = send(0, 1, 0) + send(1, 1, 1)
    consumed = [receive("key_shared-t0", "key_shared", seq, t) for seq, t in out_of_order]
    assert checker.check_histories(produced, consumed).order_violations


def test_receipts_going_backwards_and_strangers_are_violations():
    produced = send(0, 2, 5) + send(1, 2, 4)
    consumed = [receive("shared-t0", "shared", 0, 10, 2, 5), receive("shared-t0", "shared", 1, 11, 2, 4),
                receive("shared-t0", "shared", 9, 12)]
    verdict = checker.check_histories(produced, consumed)
    assert verdict.receipt_order_violations
    assert verdict.unexpected


def serving(what: str, bundle: str, broker: str, t: float) -> str:
    return f"INFO bundle serving {what}: bundle={bundle} broker_id={broker} wall_time={t:.6f}\n"


def test_overlapping_serving_intervals_are_two_writers():
    logs = {"b0": serving("started", "ns/0x0", "b0", 1) + serving("stopped", "ns/0x0", "b0", 5),
            "b1": serving("started", "ns/0x0", "b1", 4)}
    assert checker.check_single_writer(logs)
    logs["b1"] = serving("started", "ns/0x0", "b1", 5.5)
    assert checker.check_single_writer(logs) == []


def test_an_interval_open_at_a_kill_ends_at_the_kill():
    listening = "INFO broker listening: broker_id=b0\n"
    logs = {"b0": listening + serving("started", "ns/0x0", "b0", 1) + listening,
            "b1": serving("started", "ns/0x0", "b1", 12)}
    assert checker.check_single_writer(logs, {"b0": [10.0]}) == []
    assert checker.check_single_writer(logs, {"b0": [13.0]}), "a kill after the other's start is an overlap"
    assert checker.check_single_writer(logs, {}), "without the kill time the interval stays open"


def test_the_stall_is_the_longest_gap_overlapping_the_fault():
    assert checker.longest_gap([0, 1, 2, 9, 10], 1.5, 4) == 7
    assert checker.longest_gap([0, 1, 2, 9, 10], 3, 4) == 6, "counted from the window's start"
    assert checker.longest_gap([0, 1, 2, 9, 10], 11, 12) == 0
    figures = checker.fault_figures([{"kind": "isolate-broker", "target": "b", "start": 3, "end": 4}],
                                    [{"type": "ok", "producer": "p0", "t": t} for t in (0, 1, 2, 9, 10)],
                                    [{"type": "receive", "subscription": "s", "t": t} for t in (0, 8)])
    assert figures[0]["publish_stall_s"] == 6 and figures[0]["consume_stall_s"] == 5


def test_a_recovered_ledger_shorter_than_its_receipts_is_a_violation():
    produced = send(0, 7, 0) + send(1, 7, 1)
    assert checker.check_recovered_ledgers(produced, {"b1": "ledger recovered: ledger_id=7 last_entry_id=1 x"}) == []
    assert checker.check_recovered_ledgers(produced, {"b1": "ledger recovered: ledger_id=7 last_entry_id=2 x"}) == []
    assert checker.check_recovered_ledgers(produced, {"b1": "ledger recovered: ledger_id=7 last_entry_id=0 x"})
