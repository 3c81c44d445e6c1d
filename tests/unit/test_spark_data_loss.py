"""spark/data_loss.py: when a stream's offset points at messages retention deleted."""

from spark.data_loss import LedgerHistory, Loss, find_loss

TOPIC = "persistent://public/default/t"


def test_earliest_and_a_stored_ledger_lose_nothing():
    assert find_loss(TOPIC, None, {}, []) is None
    assert find_loss(TOPIC, (10, 3), {10: 20, 12: 5}, []) is None


def test_a_deleted_ledger_without_memory_is_a_loss_up_to_the_oldest_stored():
    assert find_loss(TOPIC, (10, 3), {12: 5, 14: 1}, []) == Loss(TOPIC, (10, 3), (12, 0))
    assert find_loss(TOPIC, (10, 3), {}, []) == Loss(TOPIC, (10, 3), None)
    # Ledgers older than the offset do not count as "after" it.
    assert find_loss(TOPIC, (10, 3), {9: 5}, []) == Loss(TOPIC, (10, 3), None)


def test_the_last_entry_of_a_closed_ledger_whose_successors_are_stored_or_empty_loses_nothing():
    history = LedgerHistory()
    history.observe(TOPIC, [(10, None)])
    history.observe(TOPIC, [(10, 4), (11, 0), (12, None)])
    seen = history.ledgers(TOPIC)
    assert seen == [(10, 4), (11, 0), (12, None)]
    assert find_loss(TOPIC, (10, 3), {12: 7}, seen) is None
    # Not the last entry: entry 4... of ledger 10 were deleted.
    assert find_loss(TOPIC, (10, 2), {12: 7}, seen) == Loss(TOPIC, (10, 2), (12, 0))
    # The successor held messages and is gone too.
    assert find_loss(TOPIC, (10, 3), {13: 7}, [(10, 4), (12, 6)]) == Loss(TOPIC, (10, 3), (13, 0))
    # Nothing seen after it: what came next is unknown.
    assert find_loss(TOPIC, (10, 3), {13: 7}, [(10, 4)]) == Loss(TOPIC, (10, 3), (13, 0))


def test_history_is_bounded_and_keeps_known_counts():
    history = LedgerHistory(ledgers_max=3)
    history.observe(TOPIC, [(1, 5), (2, 5), (3, None)])
    history.observe(TOPIC, [(3, None), (4, None)])
    history.observe(TOPIC, [(3, 2)])
    assert history.ledgers(TOPIC) == [(2, 5), (3, 2), (4, None)]
    history.observe(TOPIC, [(3, None)])
    assert history.ledgers(TOPIC)[1] == (3, 2)
