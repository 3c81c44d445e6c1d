"""client/routing.py: keys go to the partitions the official Python client (3.13, its
default BoostHash scheme) chose for them on a topic of 7 partitions (observed: each key
sent with partition_key, the partition read from the returned message id)."""

from client.routing import key_partition

OBSERVED_7 = {
    "k0": 3, "k1": 6, "k2": 1, "k3": 2, "k4": 4, "k5": 5, "k6": 6, "k7": 4, "k8": 4, "k9": 5, "k10": 5,
    "k11": 2, "k12": 0, "k13": 3, "k29": 0, "k38": 6,
    "user-316760": 5, "user-324679": 6, "user-332598": 4, "user-340517": 3, "user-348436": 1,
    "user-388031": 0, "user-451383": 0, "user-467221": 5,
}


def test_keys_go_where_the_official_client_sends_them():
    assert {key: key_partition(key, 7) for key in OBSERVED_7} == OBSERVED_7


def test_every_partition_is_in_range_and_used():
    chosen = {key_partition(f"user-{i}", 5) for i in range(200)}
    assert chosen == set(range(5))
    assert key_partition("", 3) in range(3)
    assert key_partition("ключ-ü", 4) in range(4)
