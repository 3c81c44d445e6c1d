"""Admin calls fanned out to the brokers serving a partitioned topic's partitions
(broker/admin/fanout.py), against a real aiohttp server on loopback standing in for the
other broker.

Proves that: a call sends the method, body, query and the caller's Authorization (and
nothing else of the caller's headers) to the partition's own path, or this broker's own
token instead when it has one (read again when its file changes); a 404 is ABSENT, an
empty answer None; an owner's catalogue error comes back as the same typed error with
the owner named, an error without a code as the HTTP error of its status, a refused
connection as 502; a change's outcomes go on past a failed partition and then raise the
first failure as its own type naming the partitions it was applied to, and raise
nothing when all answered; a partition's steps here and calls to other brokers run
side by side, at most CALLS_AT_ONCE_MAX at once, and answer in order; a change applied
here and elsewhere answers by partition.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request

from broker.admin import fanout
from broker.service import PARTITION_CALL_OUTCOMES, OwnerInfo
from common.errors import AlreadyExists, ConfigError, PreconditionFailed
from runtime.tokens import TokenFile
from common.topic_name import TopicName

TOPIC = TopicName.parse("persistent://public/default/orders")


def _service(broker_client_token=None) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(plain_ports_enabled=True), broker_client_token=broker_client_token,
                           partition_calls=dict.fromkeys(PARTITION_CALL_OUTCOMES, 0))


def _caller(headers: dict[str, str]) -> web.Request:
    return make_mocked_request("PUT", "/admin/v2/persistent/public/default/orders/subscription/s", headers=headers)


@pytest.fixture
async def owner():
    """A stand-in broker answering by the last path segment; it records each request."""
    seen: list[dict] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "path": request.path, "query": dict(request.query),
                     "body": await request.text(), "headers": dict(request.headers)})
        last = request.path.rsplit("/", 1)[1]
        if last == "missing":
            return web.json_response({"reason": "no such subscription", "code": 4007}, status=404)
        if last == "exists":
            return web.json_response({"reason": "subscription s already exists", "code": 1007}, status=409)
        if last == "teapot":
            return web.Response(status=412, text="<html>not json</html>")
        if last == "empty":
            return web.Response(status=204)
        return web.json_response({"ok": last})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app, host="127.0.0.1") as server:
        info = OwnerInfo("other", "pulsar://127.0.0.1:1", f"http://127.0.0.1:{server.port}", False)
        yield info, seen


async def test_a_call_goes_to_the_partition_path_with_the_callers_credentials(owner):
    info, seen = owner
    partition = TOPIC.partition(3)
    request = _caller({"Authorization": "Bearer t0ken", "Cookie": "session=1", "X-Other": "x"})
    async with fanout.PartitionCalls(_service(), request) as calls:
        answer = await calls.call("POST", info, partition, "subscription/s/skip/2", body={"a": 1},
                                  query={"force": "true"})
    assert answer == {"ok": "2"}
    assert seen[0]["method"] == "POST"
    assert seen[0]["path"] == "/admin/v2/persistent/public/default/orders-partition-3/subscription/s/skip/2"
    assert seen[0]["query"] == {"force": "true"}
    assert json.loads(seen[0]["body"]) == {"a": 1}
    assert seen[0]["headers"]["Authorization"] == "Bearer t0ken"
    assert "Cookie" not in seen[0]["headers"] and "X-Other" not in seen[0]["headers"]


async def test_absent_empty_and_errors(owner):
    info, _ = owner
    partition = TOPIC.partition(0)
    service = _service()
    async with fanout.PartitionCalls(service, _caller({})) as calls:
        assert await calls.call("DELETE", info, partition, "missing") is fanout.ABSENT
        assert await calls.json(info, partition, "missing") is None
        assert await calls.call("PUT", info, partition, "empty") is None
        with pytest.raises(AlreadyExists) as exists:
            await calls.call("PUT", info, partition, "exists")
        assert str(partition) in exists.value.message and "already exists" in exists.value.message
        with pytest.raises(web.HTTPPreconditionFailed) as teapot:
            await calls.call("PUT", info, partition, "teapot")
        assert "not json" in teapot.value.reason
    # What the metrics say (magnetar_broker_partition_calls by outcome).
    assert service.partition_calls == {"ok": 1, "absent": 2, "refused": 2, "unreachable": 0}


async def test_an_owner_that_does_not_answer_is_a_bad_gateway(caplog):
    info = OwnerInfo("gone", "pulsar://127.0.0.1:1", "http://127.0.0.1:1", False)
    service = _service()
    async with fanout.PartitionCalls(service, _caller({})) as calls:
        with pytest.raises(web.HTTPBadGateway) as refused:
            await calls.call("GET", info, TOPIC.partition(1), "stats")
    assert "orders-partition-1" in refused.value.reason
    assert service.partition_calls["unreachable"] == 1
    assert any("not reachable" in record.getMessage() and "http://127.0.0.1:1" in record.getMessage()
               for record in caplog.records)


async def _ok() -> None:
    return None


async def _absent() -> object:
    return fanout.ABSENT


async def _fails(error: Exception) -> None:
    raise error


async def test_outcomes_go_on_past_a_failure_and_name_what_was_applied():
    outcomes = fanout.Outcomes("deleting subscription s on orders")
    await outcomes.run(TOPIC.partition(0), _ok())
    await outcomes.run(TOPIC.partition(1), _fails(PreconditionFailed("consumers attached")))
    await outcomes.run(TOPIC.partition(2), _absent())
    await outcomes.run(TOPIC.partition(3), _ok())
    await outcomes.run(TOPIC.partition(4), _fails(web.HTTPBadGateway(reason="down")))
    assert [p.partition_index for p in outcomes.applied] == [0, 3]
    assert [p.partition_index for p in outcomes.absent] == [2]
    with pytest.raises(PreconditionFailed) as failure:
        outcomes.raise_failure()
    message = failure.value.message
    assert "deleting subscription s on orders" in message and "2 partition(s)" in message
    assert "orders-partition-1" in message and "consumers attached" in message
    assert message.endswith("applied to partitions: 0, 3")


async def test_outcomes_raise_an_http_failure_as_its_type_and_nothing_when_all_answered():
    outcomes = fanout.Outcomes("unloading orders")
    await outcomes.run(TOPIC.partition(0), _fails(web.HTTPBadGateway(reason="down")))
    with pytest.raises(web.HTTPBadGateway) as failure:
        outcomes.raise_failure()
    assert "applied to partitions: none" in failure.value.reason
    fine = fanout.Outcomes("unloading orders")
    await fine.run(TOPIC.partition(0), _ok())
    fine.raise_failure()


async def test_calls_to_other_brokers_run_a_bounded_number_at_once_and_answer_in_order():
    running = [0]
    most = [0]

    async def call(index: int) -> int:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.001 * (index % 3))
        running[0] -= 1
        return index

    assert await fanout.bounded_gather(call(i) for i in range(50)) == list(range(50))
    assert most[0] == fanout.CALLS_AT_ONCE_MAX


async def test_a_change_applied_here_and_elsewhere_answers_by_partition(owner):
    info, seen = owner
    here = OwnerInfo("me", "pulsar://127.0.0.1:2", "http://127.0.0.1:2", True)
    owners = [(TOPIC.partition(i), here if i % 2 == 0 else info) for i in range(6)]

    async def local(partition: TopicName) -> object:
        return fanout.ABSENT if partition.partition_index == 4 else {"here": partition.partition_index}

    async with fanout.PartitionCalls(_service(), _caller({})) as calls:
        answers = await fanout.apply_to_partitions(calls, owners, "terminating orders", local, "POST", "terminate")
    assert [p.partition_index for p in answers] == [0, 1, 2, 3, 5]                  # 4 is absent
    assert answers[TOPIC.partition(1)] == {"ok": "terminate"} and answers[TOPIC.partition(2)] == {"here": 2}
    assert sorted(request["path"] for request in seen) == [
        f"/admin/v2/persistent/public/default/orders-partition-{i}/terminate" for i in (1, 3, 5)]


async def test_this_brokers_own_partitions_change_side_by_side_too(owner):
    """Each local step waits until four have begun: one after another they could not
    finish (the timeout would fail the test)."""
    info, _ = owner
    here = OwnerInfo("me", "pulsar://127.0.0.1:2", "http://127.0.0.1:2", True)
    owners = [(TOPIC.partition(i), here) for i in range(4)] + [(TOPIC.partition(4), info)]
    begun = [0]
    all_begun = asyncio.Event()

    async def local(partition: TopicName) -> object:
        begun[0] += 1
        if begun[0] == 4:
            all_begun.set()
        await asyncio.wait_for(all_begun.wait(), 5)
        return {"here": partition.partition_index}

    async with fanout.PartitionCalls(_service(), _caller({})) as calls:
        answers = await fanout.apply_to_partitions(calls, owners, "unloading orders", local, "PUT", "unload")
    assert [p.partition_index for p in answers] == [0, 1, 2, 3, 4]


async def test_the_first_failure_stops_the_other_calls_and_is_raised_as_itself():
    finished = []

    async def call(index: int) -> int:
        if index == 3:
            raise AlreadyExists("partition 3 has it")
        await asyncio.sleep(0.05)
        finished.append(index)
        return index

    with pytest.raises(AlreadyExists, match="partition 3 has it"):
        await fanout.bounded_gather(call(i) for i in range(40))
    await asyncio.sleep(0.1)
    assert finished == []                  # cancelled with the failure, none left running


async def test_a_broker_with_a_client_token_asks_with_it_instead_of_the_callers(owner, tmp_path):
    info, seen = owner
    token_file = tmp_path / "broker.token"
    token_file.write_text("broker-t0ken\n")
    tokens = TokenFile(str(token_file), recheck_s=0.0)
    service = _service(tokens.current)
    async with fanout.PartitionCalls(service, _caller({"Authorization": "Basic dXNlcjpwdw=="})) as calls:
        await calls.call("GET", info, TOPIC.partition(0), "stats")
    # A caller known by its client certificate only (no Authorization) is covered too.
    async with fanout.PartitionCalls(service, _caller({})) as calls:
        await calls.call("GET", info, TOPIC.partition(1), "stats")
    assert [entry["headers"]["Authorization"] for entry in seen] == ["Bearer broker-t0ken"] * 2
    # A renewed token (a Secret replaced in place) is used by the next request.
    token_file.write_text("renewed-t0ken\n")
    os.utime(token_file, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    async with fanout.PartitionCalls(service, _caller({"Authorization": "Bearer caller"})) as calls:
        await calls.call("GET", info, TOPIC.partition(2), "stats")
    assert seen[-1]["headers"]["Authorization"] == "Bearer renewed-t0ken"


def test_a_missing_broker_client_token_file_fails_the_start(tmp_path):
    with pytest.raises(ConfigError, match="cannot read token file"):
        TokenFile(str(tmp_path / "absent.token"))
