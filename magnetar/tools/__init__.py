"""Client-side tools of the ``magnetar`` command, each driving a cluster the way a user
would: the official ``pulsar-client`` over the binary protocol, or the admin REST API.

    produce.py            magnetar produce   send messages, print their ids
    consume.py            magnetar consume   receive, acknowledge and print messages
    admin.py              magnetar admin     a thin client over Pulsar's /admin/v2 paths
    perf.py               magnetar perf      pulsar-perf-like throughput and latency runs

    client.py             building the official client; messages and ids as JSON
    admin_client.py       the HTTP transport of admin (urllib, redirects, error reasons)
    perf_producer.py      perf produce: paced or max-rate publishing, publish latency
    perf_consumer.py      perf consume: receive and ack, end-to-end latency
    perf_stats.py         counters and progress lines shared by both perf sides
    perf_payload.py       the perf payload header (send time, producer id, sequence)
    latency_histogram.py  fixed-precision latency histogram (pure)
    token_bucket.py       rate pacing (pure)

None of them imports the broker: they see Magnetar only through its wire protocols, so
what they prove is what any Pulsar user would see.
"""
