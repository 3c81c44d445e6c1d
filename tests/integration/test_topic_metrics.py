"""Per-topic and per-subscription Prometheus series on a real broker: the official
client publishes and consumes, the test scrapes /metrics over HTTP and reads Pulsar's
series (names and labels) back, then checks the cardinality limit and the
namespace-level switch on a broker restarted with them."""

from __future__ import annotations

import time

from tests.cluster import unique, wait_until
from tests.metrics_scrape import scrape, value


async def test_topic_and_subscription_series_follow_official_client_traffic(cluster):
    """20 messages published to a topic with two subscriptions: one whose consumer
    received 20 and acknowledged 5, one that has no consumer. /metrics then shows the
    topic's producers, consumers, subscriptions, storage and backlog, each
    subscription's backlog, unacked count and consumers, and an in-rate measured over
    two scrapes while messages flow."""
    import pulsar

    await cluster.start_bookies(2)
    (broker,) = await cluster.start_brokers(1)
    namespace = "public/default"
    topic = f"persistent://{namespace}/{unique('metrics')}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        idle = client.subscribe(topic, "idle")
        idle.close()   # a durable subscription, no consumer: it keeps a backlog
        consumer = client.subscribe(topic, "reader", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(20):
            producer.send(f"m-{index}".encode())
        received = [consumer.receive(timeout_millis=10_000) for _ in range(20)]
        for message in received[:5]:
            consumer.acknowledge(message)
        topic_labels = {"cluster": "standalone", "namespace": namespace, "topic": topic}

        def settled():
            families = scrape(broker.web_service_url)
            reader_unacked = value(families, "pulsar_subscription_unacked_messages",
                                   **topic_labels, subscription="reader")
            return families if reader_unacked == 15 else None

        families = wait_until(settled, 15, "the reader's 15 unacknowledged messages in /metrics")
        assert value(families, "pulsar_producers_count", **topic_labels) == 1
        assert value(families, "pulsar_consumers_count", **topic_labels) == 1
        assert value(families, "pulsar_subscriptions_count", **topic_labels) == 2
        assert value(families, "pulsar_storage_size", **topic_labels) > 20 * len(b"m-00")
        idle_labels = {**topic_labels, "subscription": "idle"}
        reader_labels = {**topic_labels, "subscription": "reader"}
        assert value(families, "pulsar_subscription_back_log", **idle_labels) == 20
        assert value(families, "pulsar_subscription_consumers_count", **idle_labels) == 0
        assert value(families, "pulsar_subscription_back_log", **reader_labels) == 15
        assert value(families, "pulsar_subscription_consumers_count", **reader_labels) == 1
        assert value(families, "pulsar_subscription_delayed", **reader_labels) == 0
        assert value(families, "pulsar_msg_backlog", **topic_labels) == 35
        assert value(families, "pulsar_topics_count", cluster="standalone", namespace=namespace) >= 1
        assert value(families, "magnetar_broker_metrics_topics_folded") == 0
        assert value(families, "magnetar_broker_lease_held") == 1

        # Rates: measured between scrapes at least a second apart, while sending.
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < 1.5:
            producer.send(b"rate")
            sent += 1
        families = scrape(broker.web_service_url)
        elapsed = time.monotonic() - started
        rate_in = value(families, "pulsar_rate_in", **topic_labels)
        # The window runs from the previous scrape (just before the loop) to this one:
        # at least the loop's 1.5 s, at most ``elapsed`` plus that scrape's own time.
        assert rate_in is not None and sent / (elapsed + 0.5) <= rate_in <= sent / 1.5, (rate_in, sent, elapsed)
        assert value(families, "pulsar_throughput_in", **topic_labels) >= rate_in * len(b"rate")
        assert value(families, "pulsar_rate_out", **topic_labels) > 0   # the reader got them too
        producer.close()
        consumer.close()
    finally:
        client.close()


async def test_topics_past_the_limit_fold_into_namespace_series_and_the_switch_folds_all(cluster):
    """A broker with --metrics-topics-max 2 serving 4 topics of a namespace writes
    series for the first 2 (name order), one namespace series for the other 2 (their
    sums, no topic label) and counts 2 folded; restarted with --no-topic-level-metrics,
    every topic is folded and no subscription series is written."""
    import pulsar

    await cluster.start_bookies(2)
    (broker,) = await cluster.start_brokers(1, extra_args=["--metrics-topics-max", "2"])
    prefix = unique("fold")
    namespace = "public/default"
    topics = [f"persistent://{namespace}/{prefix}-{index}" for index in range(4)]

    def publish(count_by_topic: dict[str, int]) -> None:
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            for topic, count in count_by_topic.items():
                client.subscribe(topic, "s").close()
                producer = client.create_producer(topic, batching_enabled=False)
                for _ in range(count):
                    producer.send(b"x")
                producer.close()
        finally:
            client.close()

    publish({topic: index + 1 for index, topic in enumerate(topics)})
    families = scrape(broker.web_service_url)
    for index, topic in enumerate(topics[:2]):
        labels = {"cluster": "standalone", "namespace": namespace, "topic": topic}
        assert value(families, "pulsar_msg_backlog", **labels) == index + 1
        assert value(families, "pulsar_subscription_back_log", **labels, subscription="s") == index + 1
    for topic in topics[2:]:
        assert not [s for s in families["pulsar_msg_backlog"] if s.labels.get("topic") == topic]
    namespace_labels = {"cluster": "standalone", "namespace": namespace}
    assert value(families, "pulsar_msg_backlog", **namespace_labels) == 3 + 4
    assert value(families, "pulsar_subscriptions_count", **namespace_labels) == 2
    assert value(families, "magnetar_broker_metrics_topics_folded") == 2
    assert value(families, "magnetar_broker_metrics_subscriptions_omitted") == 2
    assert value(families, "pulsar_topics_count", **namespace_labels) == 4

    await broker.terminate(timeout_s=20)
    broker.extra_args = ["--no-topic-level-metrics"]
    await broker.start()
    publish({topic: 1 for topic in topics})
    families = scrape(broker.web_service_url)
    assert not [s for s in families["pulsar_msg_backlog"] if "topic" in s.labels]
    assert not families.get("pulsar_subscription_back_log")
    # Backlogs kept across the restart (1..4), plus one more message each.
    assert value(families, "pulsar_msg_backlog", **namespace_labels) == (1 + 2 + 3 + 4) + 4
    assert value(families, "pulsar_producers_count", **namespace_labels) == 0
    assert value(families, "magnetar_broker_metrics_topics_folded") == 0


async def test_topic_and_subscription_rates_match_what_the_official_client_sent_and_received(cluster):
    """Rates on a real broker, against what the official client saw between two scrapes.
    A batching producer sends at about 150 msg/s (several messages per entry: the rates
    count messages, as Pulsar's do, not entries) to a topic with two subscriptions: one
    whose listener receives everything, one whose consumer holds a 10-message receiver
    queue it never reads (so nothing is dispatched to it once that is full). Between
    two scrapes the topic's pulsar_rate_in and the reading subscription's
    pulsar_subscription_msg_rate_out lie within the bounds the client's own
    timestamps give (messages stored, resp. received, inside the window, over the
    window's length, with a small slack for the client's lag), the stalled
    subscription's rate is 0, and the topic's pulsar_rate_out is the sum of its
    subscriptions'."""
    import threading

    import pulsar

    await cluster.start_bookies(2)
    (broker,) = await cluster.start_brokers(1)
    namespace = "public/default"
    topic = f"persistent://{namespace}/{unique('rates')}"
    labels = {"cluster": "standalone", "namespace": namespace, "topic": topic}
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    stored_at: list[float] = []     # when each send's receipt came back (client clock)
    received_at: list[float] = []   # when the reading listener got each message
    lock = threading.Lock()

    def on_message(consumer, message):
        with lock:
            received_at.append(time.monotonic())
        consumer.acknowledge(message)

    def on_stored(result, _message_id):
        assert result == pulsar.Result.Ok, result
        with lock:
            stored_at.append(time.monotonic())

    stop = threading.Event()
    try:
        reader = client.subscribe(topic, "reading", consumer_type=pulsar.ConsumerType.Shared,
                                  message_listener=on_message)
        stalled = client.subscribe(topic, "stalled", receiver_queue_size=10)
        producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=20)

        def produce() -> None:
            next_at = time.monotonic()
            while not stop.is_set():
                producer.send_async(b"r" * 100, on_stored)
                next_at += 1 / 150
                time.sleep(max(0.0, next_at - time.monotonic()))

        sender = threading.Thread(target=produce, daemon=True)
        sender.start()
        time.sleep(1.5)                 # the stalled consumer's queue is full by now

        def timed_scrape() -> tuple[float, float, dict]:
            before = time.monotonic()
            families = scrape(broker.web_service_url)
            return before, time.monotonic(), families

        first_before, first_after, _ = timed_scrape()
        time.sleep(4.0)
        second_before, second_after, families = timed_scrape()
        stop.set()
        sender.join(timeout=10)
        producer.flush()
        slack_s = 0.5

        def bounds(times: list[float]) -> tuple[float, float]:
            with lock:
                inside = sum(1 for t in times if first_after + slack_s <= t <= second_before)
                around = sum(1 for t in times if first_before <= t <= second_after + slack_s)
            return inside / (second_after - first_before), around / (second_before - first_after)

        rate_in = value(families, "pulsar_rate_in", **labels)
        low, high = bounds(stored_at)
        assert low > 100, f"the producer sent too slowly to measure anything: {low:.1f} msg/s"
        assert rate_in is not None and low <= rate_in <= high, (low, rate_in, high)

        reading_rate = value(families, "pulsar_subscription_msg_rate_out", **labels, subscription="reading")
        low, high = bounds(received_at)
        assert reading_rate is not None and low <= reading_rate <= high, (low, reading_rate, high)
        assert value(families, "pulsar_subscription_msg_rate_out", **labels, subscription="stalled") == 0
        assert value(families, "pulsar_subscription_msg_throughput_out", **labels, subscription="stalled") == 0
        assert value(families, "pulsar_subscription_msg_throughput_out", **labels,
                     subscription="reading") >= reading_rate * 100
        assert value(families, "pulsar_rate_out", **labels) == reading_rate
        assert value(families, "pulsar_throughput_in", **labels) >= rate_in * 100
        stalled.close()
        reader.close()
        producer.close()
    finally:
        stop.set()
        client.close()
