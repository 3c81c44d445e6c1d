"""Idempotent produce through the HTTP gateway (gateway/idempotent.py) on real processes:
etcd, 2 bookies, a broker, two gateways, the official client reading what was stored.

What it proves:
- a request that names a producer and numbers its messages, sent again (through the
  same gateway or the other), stores nothing twice: what was stored is answered
  ``duplicate``; an overlapping request stores only its new messages; the official
  client reads every message exactly once;
- after kill -9 of the broker and a restart, resending everything still stores nothing
  twice (the broker's deduplication state came back); after kill -9 of a gateway in the
  middle of a request, its retry through the other gateway stores each message once;
- on a partitioned topic a producer's keyless messages all go to one partition, so a
  resend finds them;
- an NDJSON stream with ``?producer=`` sent again from where it broke stores only
  what was not stored; bad lines are answered line by line;
- on a namespace without deduplication the gateway refuses (412) rather than promise
  what the broker would not keep; bad sequence ids and names are 400s.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import aiohttp
import pulsar
import pytest

from tests.cluster import Cluster

# Requests started until one is caught half written for the gateway kill test.
KILL_ATTEMPTS = 5

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster(etcd_process, tmp_path_factory):
    cluster = Cluster(etcd_process, str(tmp_path_factory.mktemp("gateway-idempotent")))

    async def start() -> None:
        await cluster.start_bookies(2)
        await cluster.start_brokers(1)
        await cluster.start_gateways(2)

    try:
        asyncio.run(start())
        yield cluster
    finally:
        asyncio.run(cluster.stop())


async def _call(session: aiohttp.ClientSession, method: str, url: str, body=None) -> tuple[int, object]:
    async with session.request(method, url, json=body) as response:
        return response.status, await response.json(content_type=None)


async def _dedup_namespace(session: aiohttp.ClientSession, admin: str) -> str:
    namespace = f"public/idem-{uuid.uuid4().hex[:6]}"
    status, _ = await _call(session, "PUT", f"{admin}/admin/v2/namespaces/{namespace}")
    assert status in (200, 204)
    status, _ = await _call(session, "POST", f"{admin}/admin/v2/namespaces/{namespace}/deduplication", True)
    assert status in (200, 204)
    return namespace


def _batch(producer: str, ids, **extra) -> dict:
    return {"producer": producer, "messages": [{"payload": f"m{i}", "sequence_id": i, **extra} for i in ids]}


def _statuses(document) -> list[str]:
    return [result["status"] for result in document["results"]]


def _read_all(service_url: str, topic: str, expected: int) -> list[str]:
    """Every message of ``topic`` from the earliest, through the official client (waits
    for ``expected``, then 2 s more for any extra copy)."""
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        payloads = []
        while True:
            try:
                message = reader.read_next(timeout_millis=30_000 if len(payloads) < expected else 2_000)
            except pulsar.Timeout:
                return payloads
            payloads.append(message.data().decode())
    finally:
        client.close()


async def test_resending_through_either_gateway_stores_each_message_once(cluster):
    first, second = (gateway.url for gateway in cluster.gateways[:2])
    admin = cluster.brokers[0].web_service_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        namespace = await _dedup_namespace(session, admin)
        topic = f"persistent://{namespace}/orders"
        path = f"/v1/topics/persistent/{namespace}/orders"

        status, document = await _call(session, "POST", f"{first}{path}/messages", _batch("writer", range(10)))
        assert status == 200 and _statuses(document) == ["stored"] * 10, document
        status, document = await _call(session, "POST", f"{second}{path}/messages", _batch("writer", range(10)))
        assert status == 200 and _statuses(document) == ["duplicate"] * 10, document
        status, document = await _call(session, "POST", f"{second}{path}/messages", _batch("writer", range(5, 15)))
        assert _statuses(document) == ["duplicate"] * 5 + ["stored"] * 5, document

        one = {"payload": "solo", "producer": "single", "sequence_id": 7}
        status, document = await _call(session, "POST", f"{first}{path}/message", one)
        assert status == 200 and document["duplicate"] is False and document["message_id"], document
        status, document = await _call(session, "POST", f"{second}{path}/message", one)
        assert status == 200 and document == {"message_id": None, "duplicate": True}, document

        # The same request twice at once through both gateways (a retry sent while the
        # first is still being written): stored once; the other copy is answered
        # duplicate, or refused as busy (retriable) while the first holds the name.
        results = await asyncio.gather(
            _call(session, "POST", f"{first}{path}/messages", _batch("writer", range(15, 20))),
            _call(session, "POST", f"{second}{path}/messages", _batch("writer", range(15, 20))))
        answers = sorted("busy" if status == 409 else ",".join(_statuses(document)) for status, document in results)
        assert answers[0] in ("busy", ",".join(["duplicate"] * 5)) and answers[1] == ",".join(["stored"] * 5), results
        for status, document in results:
            if status == 409:
                assert document["error"] == "ProducerNameInUse" and document["retriable"] is True, document
        # Two producers at once through one gateway: each stores its own.
        results = await asyncio.gather(
            _call(session, "POST", f"{first}{path}/messages", _batch("writer", range(20, 25))),
            _call(session, "POST", f"{first}{path}/messages", _batch("other", range(0, 5))))
        assert [_statuses(document) for _, document in results] == [["stored"] * 5] * 2, results

        # Sequence ids not increasing within a request: that message answers its own
        # error and is not stored, the others are (the document cannot say "increasing").
        status, document = await _call(session, "POST", f"{first}{path}/messages", {
            "producer": "writer", "messages": [{"payload": "m25", "sequence_id": 25},
                                               {"payload": "y", "sequence_id": 24}]})
        assert status == 200 and _statuses(document) == ["stored", "error"], document
        assert "is not above" in document["results"][1]["error"]["message"], document

        # Bad input: a clear 400, nothing stored.
        for body, words in [
            ({"producer": "writer", "messages": [{"payload": "x"}]}, "sequence_id is required"),
            ({"messages": [{"payload": "x", "sequence_id": 1}]}, "unknown field"),
        ]:
            status, document = await _call(session, "POST", f"{first}{path}/messages", body)
            assert status == 400 and words in document["message"], (status, document)
        status, document = await _call(session, "POST", f"{first}{path}/message", {"payload": "x", "sequence_id": 1})
        assert status == 400 and "needs body.producer" in document["message"], document

        expected = sorted([f"m{i}" for i in range(26)] + ["solo"] + [f"m{i}" for i in range(5)])
        assert sorted(_read_all(cluster.brokers[0].service_url, topic, len(expected))) == expected

        # kill -9 of the broker: its deduplication state comes back with the topic.
        broker = cluster.brokers[0]
        broker.kill9()
        await broker.start()
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            status, document = await _call(session, "POST", f"{second}{path}/messages", _batch("writer", range(25)))
            if status == 200 or asyncio.get_running_loop().time() > deadline:
                break
            assert document["retriable"], document       # the broker is coming back
            await asyncio.sleep(0.5)
        assert status == 200 and _statuses(document) == ["duplicate"] * 25, document
        assert sorted(_read_all(broker.service_url, topic, len(expected))) == expected


async def test_a_partitioned_topic_keeps_a_producers_keyless_messages_on_one_partition(cluster):
    gateway = cluster.gateways[0].url
    admin = cluster.brokers[0].web_service_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        namespace = await _dedup_namespace(session, admin)
        status, _ = await _call(session, "PUT", f"{admin}/admin/v2/persistent/{namespace}/events/partitions", 3)
        assert status in (200, 204)
        path = f"/v1/topics/persistent/{namespace}/events"
        for _ in range(2):
            status, document = await _call(session, "POST", f"{gateway}{path}/messages", _batch("w", range(6)))
            assert status == 200, document
        assert _statuses(document) == ["duplicate"] * 6
        keyed = {"producer": "k", "messages": [{"payload": f"k{i}", "key": f"key-{i}", "sequence_id": i}
                                               for i in range(12)]}
        status, document = await _call(session, "POST", f"{gateway}{path}/messages", keyed)
        assert _statuses(document) == ["stored"] * 12
        assert len({result["message_id"].split(":")[2] for result in document["results"]}) > 1   # keys spread
        status, document = await _call(session, "POST", f"{gateway}{path}/messages", keyed)
        assert _statuses(document) == ["duplicate"] * 12


async def _stream(session: aiohttp.ClientSession, url: str, lines: list[dict]) -> tuple[int, list[dict]]:
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    async with session.post(url, data=body, headers={"Content-Type": "application/x-ndjson"}) as response:
        text = await response.text()
        if response.status != 200:
            return response.status, [json.loads(text)]
        return response.status, [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_an_ndjson_stream_that_names_a_producer_is_safe_to_send_again(cluster):
    gateway = cluster.gateways[0].url
    admin = cluster.brokers[0].web_service_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        namespace = await _dedup_namespace(session, admin)
        url = f"{gateway}/v1/topics/persistent/{namespace}/lines/messages/stream?producer=loader"
        lines = [{"payload": f"l{i}", "sequence_id": i} for i in range(8)]
        status, results = await _stream(session, url, lines)
        assert status == 200 and [r["status"] for r in results] == ["stored"] * 8, results
        # The stream broke after line 5 (say): sent again from line 4 on, plus two new.
        status, results = await _stream(session, url, lines[4:] + [{"payload": f"l{i}", "sequence_id": i}
                                                                     for i in (8, 9)])
        assert [r["status"] for r in results] == ["duplicate"] * 4 + ["stored"] * 2, results
        # Bad lines are answered line by line, the others go on.
        status, results = await _stream(session, url, [{"payload": "x", "sequence_id": 20},
                                                       {"payload": "y", "sequence_id": 19},
                                                       {"payload": "z"}, {"payload": "w", "sequence_id": 21}])
        assert [r["status"] for r in results] == ["stored", "error", "error", "stored"], results
        assert "is not above" in results[1]["error"]["message"]
        assert "sequence_id is required" in results[2]["error"]["message"]
        topic = f"persistent://{namespace}/lines"
        expected = sorted([f"l{i}" for i in range(10)] + ["x", "w"])
        assert sorted(_read_all(cluster.brokers[0].service_url, topic, len(expected))) == expected
        # Without deduplication, refused before anything is read.
        status, results = await _stream(
            session, f"{gateway}/v1/topics/persistent/public/default/lines-{uuid.uuid4().hex[:6]}/messages/stream"
                     "?producer=loader", lines[:1])
        assert status == 412, results


async def test_without_deduplication_an_idempotent_produce_is_refused(cluster):
    gateway = cluster.gateways[1].url
    path = f"/v1/topics/persistent/public/default/plain-{uuid.uuid4().hex[:6]}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        status, document = await _call(session, "POST", f"{gateway}{path}/messages", _batch("w", range(3)))
        assert status == 412 and "needs deduplication" in document["message"], document
        status, document = await _call(session, "POST", f"{gateway}{path}/messages",
                                       {"messages": [{"payload": "plain"}]})
        assert status == 200 and _statuses(document) == ["stored"], document


async def test_deduplication_turned_on_applies_to_the_very_next_request(cluster):
    """A namespace without deduplication: an idempotent produce is refused (412; the
    gateway has now seen the policy off). The policy turned on through the admin API:
    the very next request, with no wait, is stored, and sent again is answered
    duplicate (issue 39: it was refused for another 5-15 s, the gateway's and the
    brokers' policy caches)."""
    gateway = cluster.gateways[0].url
    admin = cluster.brokers[0].web_service_url
    namespace = f"public/late-{uuid.uuid4().hex[:6]}"
    path = f"/v1/topics/persistent/{namespace}/orders"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        status, _ = await _call(session, "PUT", f"{admin}/admin/v2/namespaces/{namespace}")
        assert status in (200, 204)
        status, document = await _call(session, "POST", f"{gateway}{path}/messages", _batch("late", range(3)))
        assert status == 412, document
        status, _ = await _call(session, "POST", f"{admin}/admin/v2/namespaces/{namespace}/deduplication", True)
        assert status in (200, 204)
        status, document = await _call(session, "POST", f"{gateway}{path}/messages", _batch("late", range(3)))
        assert status == 200 and _statuses(document) == ["stored"] * 3, document
        status, document = await _call(session, "POST", f"{gateway}{path}/messages", _batch("late", range(3)))
        assert status == 200 and _statuses(document) == ["duplicate"] * 3, document


async def test_a_gateway_killed_mid_request_then_a_retry_through_another_stores_each_once(cluster):
    """kill -9 of the gateway while it writes an idempotent request of 1,000 messages;
    the client sends the same request through the other gateway until it is answered
    (409 busy while the broker still holds the dead gateway's producer, then stored or
    duplicate per message): every message is stored exactly once. A request the gateway
    finished before the poll saw it half written (a quick gateway, a slow poll on a busy
    machine) is not the case under test: the test tries again on a new topic, at most
    ``KILL_ATTEMPTS`` times."""
    victim, survivor = cluster.gateways[0], cluster.gateways[1]
    admin = cluster.brokers[0].web_service_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        namespace = await _dedup_namespace(session, admin)
        request = {"producer": "crash-writer",
                   "messages": [{"payload": f"c{i}", "sequence_id": i} for i in range(1000)]}
        for attempt in range(KILL_ATTEMPTS):
            topic = f"crash-{attempt}"
            path = f"/v1/topics/persistent/{namespace}/{topic}"
            first = asyncio.ensure_future(_call(session, "POST", f"{victim.url}{path}/messages", request))
            stats_url = f"{admin}/admin/v2/persistent/{namespace}/{topic}/internalStats"
            written = 0
            for _ in range(2000):                 # until the producer is writing: some stored, most not
                status, stats = await _call(session, "GET", stats_url)
                written = stats.get("entriesAddedCounter", 0) if status == 200 else 0
                if written >= 20 or first.done():
                    break
                await asyncio.sleep(0.002)
            if 20 <= written < 1000 and not first.done():
                break
            await first                           # all written before it was seen: again
        else:
            pytest.fail(f"every request was written whole before the poll saw it half done ({KILL_ATTEMPTS} tries)")
        victim.kill9()
        try:
            await first
        except aiohttp.ClientError:
            pass                                  # the connection died with the gateway
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            status, document = await _call(session, "POST", f"{survivor.url}{path}/messages", request)
            if status == 200 or asyncio.get_running_loop().time() > deadline:
                break
            assert document["retriable"], document
            await asyncio.sleep(0.2)
        assert status == 200, document
        statuses = _statuses(document)
        assert statuses.count("duplicate") >= written, (written, statuses.count("duplicate"))   # the first copy's
        assert set(statuses) <= {"stored", "duplicate"}, document
        expected = sorted(f"c{i}" for i in range(1000))
        assert sorted(_read_all(cluster.brokers[0].service_url, f"persistent://{namespace}/{topic}",
                                len(expected))) == expected
    await victim.start()                          # the module's other tests keep two gateways
