"""Publish back-pressure: the pending-send bounds (broker/publish_limits.py) and the
connection that obeys them (broker/connection.py).

What it proves:
- the core: a send that fills its connection's, its topic's or the broker's bound
  (sends or bytes) pauses that connection's reading, once (not per send); the pause
  lasts until every bound the connection hit has drained to the resume ratio (so it
  does not flap at the bound); other connections block on a full topic at their next
  send and all resume together; a gone connection blocks nothing; counts return to
  zero and empty topic scopes are dropped; the pause and block counters count episodes;
- through a real ServerConnection and BrokerService, with storage holding adds
  (FakeLedgerClient.hold_adds): reading of the producers' connections pauses when the
  topic's bound (5 sends) is reached, the other producer's connection pauses at its
  next send, the broker-wide bytes bound pauses a publisher of another topic, nothing
  is refused (no SEND_ERROR), and once storage completes the adds every send gets its
  receipt, in order, and reading resumes; the metrics show the pending sends and the
  pauses;
- BrokerConfig validates the new bounds and names the field.

How: the core is driven directly with callback-recording gates; the connection tests
use the in-memory metadata store, the fake ledger client and a fake transport that
records pause_reading/resume_reading, feeding real SEND frames (codec-encoded).
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.config import BrokerConfig
from managed_ledger.managed_ledger import ManagedLedgerConfig
from broker.metrics import register_broker_metrics
from broker.publish_limits import BROKER, CONNECTION, PUBLISH_RATE, TOPIC, Limit, PublishLimits
from broker.connection import ServerConnection
from broker.service import BrokerService
from common.errors import ConfigError
from metadata.memory_store import MemoryStore
from protocol.codec import encode_payload_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from tests.unit.fake_ledger_client import FakeLedgerClient
from tests.unit.test_broker_connection import Client, FakeTransport, GatedOwnership, settle

T = pb.BaseCommand
MIB = 1024 * 1024


# --- the core ------------------------------------------------------------------------------------

class Switch:
    """Records a gate's pause/resume calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


def _limits(connection=(4, 10_000), topic=(6, 10_000), broker=(10, 10_000), ratio=0.5) -> PublishLimits:
    return PublishLimits(Limit(*connection, ratio), Limit(*topic, ratio), Limit(*broker, ratio))


def test_the_connection_bound_pauses_once_and_resumes_at_half():
    """4 sends fill the connection's bound: one pause. Answering 1 (3 left) does not
    resume, answering the 2nd (2 left = half) does."""
    limits = _limits()
    switch = Switch()
    gate = limits.gate("c1", switch.pause, switch.resume)
    sent = [limits.on_send(gate, "t", 10) for _ in range(4)]
    assert switch.calls == ["pause"]
    assert gate.paused and [s.kind for s in gate.blocked_on] == [CONNECTION]
    limits.on_send_done(sent.pop(), 10)
    assert switch.calls == ["pause"]
    limits.on_send_done(sent.pop(), 10)
    assert switch.calls == ["pause", "resume"]
    assert not gate.paused
    for scopes in sent:
        limits.on_send_done(scopes, 10)
    assert limits.broker.sends == 0 and limits.broker.size_bytes == 0
    assert limits.topic_count == 0
    assert limits.stats.reading_pauses == 1 and limits.stats.reading_resumes == 1
    assert limits.stats.blocks_by_kind == {CONNECTION: 1, TOPIC: 0, BROKER: 0, PUBLISH_RATE: 0}


def test_a_full_topic_blocks_every_connection_that_sends_to_it_and_releases_them_together():
    """Topic bound 6: connection A sends 3, B sends 3 (the 6th fills it: B pauses); A's
    next send pauses A too. Other topics are unaffected. When the topic drains to 3,
    both resume."""
    limits = _limits(connection=(100, 10_000))
    a, b, c = Switch(), Switch(), Switch()
    gate_a = limits.gate("a", a.pause, a.resume)
    gate_b = limits.gate("b", b.pause, b.resume)
    gate_c = limits.gate("c", c.pause, c.resume)
    sent = [limits.on_send(gate_a, "t", 1) for _ in range(3)]
    sent += [limits.on_send(gate_b, "t", 1) for _ in range(3)]
    assert (a.calls, b.calls) == ([], ["pause"])
    sent.append(limits.on_send(gate_a, "t", 1))
    assert a.calls == ["pause"]
    other = limits.on_send(gate_c, "other", 1)
    assert c.calls == []
    for scopes in sent[:3]:
        limits.on_send_done(scopes, 1)
    assert (a.calls, b.calls) == (["pause"], ["pause"])     # 4 left: above half of 6
    limits.on_send_done(sent[3], 1)
    assert (a.calls, b.calls) == (["pause", "resume"], ["pause", "resume"])
    limits.on_send_done(other, 1)
    assert limits.stats.blocks_by_kind[TOPIC] == 2


def test_bytes_bound_the_topic_and_the_broker():
    """The topic's bytes bound (1,000) pauses at 1,000 bytes whatever the count; the
    broker's bytes bound (1,500) pauses a connection publishing to another topic."""
    limits = _limits(connection=(100, 10_000), topic=(100, 1_000), broker=(100, 1_500))
    a, b = Switch(), Switch()
    gate_a = limits.gate("a", a.pause, a.resume)
    gate_b = limits.gate("b", b.pause, b.resume)
    first = limits.on_send(gate_a, "t1", 600)
    second = limits.on_send(gate_a, "t1", 400)
    assert a.calls == ["pause"] and {s.kind for s in gate_a.blocked_on} == {TOPIC}
    third = limits.on_send(gate_b, "t2", 500)
    assert b.calls == ["pause"] and {s.kind for s in gate_b.blocked_on} == {BROKER}
    limits.on_send_done(first, 600)       # t1: 400 <= 500; broker: 900 > 750
    assert a.calls == ["pause", "resume"] and b.calls == ["pause"]
    limits.on_send_done(second, 400)      # broker: 500 <= 750
    assert b.calls == ["pause", "resume"]
    limits.on_send_done(third, 500)
    assert limits.broker.sends == 0 and limits.topic_count == 0


def test_a_connection_blocked_on_two_bounds_waits_for_both():
    """A connection that filled its own bound and the topic's resumes only when both
    drained."""
    limits = _limits(connection=(2, 10_000), topic=(3, 10_000))
    a, b = Switch(), Switch()
    gate_a = limits.gate("a", a.pause, a.resume)
    gate_b = limits.gate("b", b.pause, b.resume)
    from_b = limits.on_send(gate_b, "t", 1)
    from_a = [limits.on_send(gate_a, "t", 1) for _ in range(2)]   # a: 2/2, t: 3/3
    assert {s.kind for s in gate_a.blocked_on} == {CONNECTION, TOPIC}
    limits.on_send_done(from_b, 1)        # t: 2 > 1 (half of 3, rounded down)
    limits.on_send_done(from_a[0], 1)     # a: 1 <= 1, t: 1 <= 1
    assert a.calls == ["pause", "resume"]
    limits.on_send_done(from_a[1], 1)


def test_a_gone_connection_blocks_nothing_and_its_sends_still_count_down():
    """forget() removes the gate from the scopes it was blocked on; its pending sends
    are answered later and the counts reach zero; it is never resumed."""
    limits = _limits(connection=(100, 10_000), topic=(2, 10_000))
    a = Switch()
    gate_a = limits.gate("a", a.pause, a.resume)
    sent = [limits.on_send(gate_a, "t", 5) for _ in range(2)]
    assert a.calls == ["pause"]
    limits.forget(gate_a)
    assert not gate_a.paused
    for scopes in sent:
        limits.on_send_done(scopes, 5)
    assert a.calls == ["pause"]
    assert limits.broker.sends == 0 and limits.topic_count == 0


# --- through a connection ---------------------------------------------------------------------------

class RecordingTransport(FakeTransport):
    def __init__(self, protocol: ServerConnection) -> None:
        super().__init__(protocol)
        self.reading = True
        self.pauses = 0

    def pause_reading(self) -> None:
        assert self.reading, "paused twice"
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        assert not self.reading, "resumed while reading"
        self.reading = True


async def _service(**overrides) -> tuple[BrokerService, FakeLedgerClient]:
    ledger_client = FakeLedgerClient()
    config = BrokerConfig(metadata_url="memory://", managed_ledger=ManagedLedgerConfig(1, 1, 1),
                          retention_check_interval_s=3600, **overrides)
    service = BrokerService(config, MemoryStore(), ledger_client, topic_ownership=GatedOwnership())
    await service.start()
    return service, ledger_client


async def _producer(service: BrokerService, topic: str) -> Client:
    connection = ServerConnection(service)
    transport = RecordingTransport(connection)
    connection.connection_made(transport)
    client = Client(connection, transport)
    client.send(pb.CommandConnect(client_version="test", protocol_version=pb.v21))
    client.send(pb.CommandProducer(topic=topic, producer_id=1, request_id=1, producer_name=f"p-{id(client)}"))
    await settle()
    answers = client.answers()
    assert [a.type for a in answers] == [T.CONNECTED, T.PRODUCER_SUCCESS]
    return client


def _send_frame(sequence_id: int, payload: bytes) -> bytes:
    return encode_payload_command(
        wrap(pb.CommandSend(producer_id=1, sequence_id=sequence_id, num_messages=1)),
        pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1), payload)


def _receipts(client: Client) -> tuple[list[int], list[pb.BaseCommand]]:
    answers = client.answers()
    receipts = [a.send_receipt.sequence_id for a in answers if a.type == T.SEND_RECEIPT]
    others = [a for a in answers if a.type != T.SEND_RECEIPT]
    return receipts, others


async def test_reading_pauses_at_the_topic_bound_and_every_publish_completes():
    """Topic bound 5 sends, storage holding adds: A sends 4 (reading goes on), B sends 1
    (the topic is full: B pauses), A's next send pauses A too. Nothing is refused.
    Releasing the adds answers all 6 in order per producer and resumes both; the
    metrics counted the sends pending at the peak and the two pauses."""
    service, ledger_client = await _service(pending_sends_per_topic_max=5, pending_sends_per_connection_max=100)
    registry = CollectorRegistry()
    register_broker_metrics(service, registry)
    topic = "persistent://public/default/backpressure"
    a = await _producer(service, topic)
    b = await _producer(service, topic)
    ledger_client.hold_adds = True
    a.connection.data_received(b"".join(_send_frame(i, b"a%d" % i) for i in range(4)))
    assert a.transport.reading
    b.connection.data_received(_send_frame(0, b"b0"))
    assert not b.transport.reading and b.connection.reading_paused
    assert a.transport.reading
    a.connection.data_received(_send_frame(4, b"a4"))
    assert not a.transport.reading
    await settle()
    assert _receipts(a) == ([], []) and _receipts(b) == ([], [])    # held, not refused
    values = _scrape(registry)
    assert values["magnetar_broker_pending_sends"] == 6
    # The stored payload of each SEND: its metadata and message (from 0x0e01 on).
    assert values["magnetar_broker_pending_send_bytes"] == service.publish_limits.broker.size_bytes > 6 * 2
    assert values["magnetar_broker_publish_paused_connections"] == 2
    assert values["magnetar_broker_publish_reading_pauses_total"] == 2

    ledger_client.release_adds()
    await settle()
    assert _receipts(a) == ([0, 1, 2, 3, 4], [])
    assert _receipts(b) == ([0], [])
    assert a.transport.reading and b.transport.reading
    assert (a.transport.pauses, b.transport.pauses) == (1, 1)
    assert service.publish_limits.broker.sends == 0
    values = _scrape(registry)
    assert values["magnetar_broker_pending_sends"] == 0
    assert values["magnetar_broker_publish_paused_connections"] == 0
    assert values["magnetar_broker_publish_reading_resumes_total"] == 2
    for client in (a, b):
        client.transport.close()
    await service.close()


async def test_the_broker_wide_bytes_bound_pauses_a_publisher_of_another_topic():
    """Broker bytes bound 2 MiB (topics 2 MiB each): 3 sends of 600 KiB to topic 1 and
    one of 600 KiB to topic 2 reach 2.4 MiB; the sender of the send that crossed the
    bound pauses though neither topic is full. After storage catches up every send has
    its receipt and reading resumed."""
    service, ledger_client = await _service(pending_send_bytes_per_topic_max=2 * MIB,
                                            pending_send_bytes_per_broker_max=2 * MIB)
    one = await _producer(service, "persistent://public/default/bytes-1")
    two = await _producer(service, "persistent://public/default/bytes-2")
    ledger_client.hold_adds = True
    payload = bytes(600 * 1024)
    one.connection.data_received(b"".join(_send_frame(i, payload) for i in range(3)))
    assert one.transport.reading
    two.connection.data_received(_send_frame(0, payload))
    assert not two.transport.reading
    assert {s.kind for s in two.connection._read_gate.blocked_on} == {BROKER}
    ledger_client.release_adds()
    await settle()
    assert _receipts(one) == ([0, 1, 2], []) and _receipts(two) == ([0], [])
    assert two.transport.reading
    assert service.publish_limits.stats.blocks_by_kind[BROKER] >= 1
    for client in (one, two):
        client.transport.close()
    await service.close()


async def test_a_connection_lost_while_paused_still_counts_its_sends_down():
    """A paused connection goes away with its sends pending; when storage completes
    them the broker's counts return to zero and nothing is resumed on a closed
    transport."""
    service, ledger_client = await _service(pending_sends_per_connection_max=2)
    client = await _producer(service, "persistent://public/default/gone")
    ledger_client.hold_adds = True
    client.connection.data_received(_send_frame(0, b"x") + _send_frame(1, b"y"))
    assert not client.transport.reading
    client.transport.close()
    await settle()
    ledger_client.release_adds()
    await settle()
    assert service.publish_limits.broker.sends == 0
    assert not client.transport.reading
    await service.close()


def _scrape(registry: CollectorRegistry) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if not sample.labels:
                values[sample.name] = sample.value
    return values


# --- config --------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, field", [
    ({"pending_sends_per_topic_max": 0}, "pending_sends_per_topic_max"),
    ({"pending_sends_per_topic_max": 200_000}, "pending_sends_per_topic_max"),
    ({"pending_sends_per_broker_max": 0}, "pending_sends_per_topic_max"),
    ({"pending_send_bytes_per_topic_max": 1024}, "pending_send_bytes_per_topic_max"),
    ({"pending_send_bytes_per_topic_max": 512 * MIB}, "pending_send_bytes_per_topic_max"),
    ({"pending_sends_resume_ratio": 1.0}, "pending_sends_resume_ratio"),
    ({"pending_sends_resume_ratio": -0.1}, "pending_sends_resume_ratio"),
])
def test_the_config_validates_the_bounds(overrides, field):
    """Each inconsistent bound raises ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        BrokerConfig(metadata_url="memory://", **overrides)
