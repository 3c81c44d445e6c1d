"""Histogram bucket boundaries shared by every server's Prometheus metrics, so that
latencies measured in different processes can be compared bucket for bucket."""

# Latency buckets from 0.25 ms to 1 s: a journal fsync on a good disk is well under a
# millisecond, a stalled one hundreds.
LATENCY_BUCKETS_S = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
