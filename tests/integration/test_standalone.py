"""``magnetar standalone`` as a user runs it (what ``make run`` starts).

Proves: it brings up etcd and three bookies and says so; the shell can list the bookies
and write and read a ledger through it; it stops cleanly on SIGTERM; started again on
the same data directory, the ledger is still there and reads back intact.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

from tests.cluster import contiguous_free_ports, free_port, python_command, run_cli


def standalone_ports(bookies: int = 3) -> dict[str, int]:
    return {"etcd": free_port(), "peer": free_port(), "bookie": contiguous_free_ports(bookies),
            "http": contiguous_free_ports(bookies), "broker": free_port(), "broker_http": free_port(),
            "gateway": free_port(), "autorecovery": free_port()}


async def start_standalone(data_dir: str, ports: dict[str, int], *extra: str,
                           env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """``magnetar standalone`` on ``ports`` (``extra`` flags after them; ``env`` added to
    this process's environment), once it says it is ready."""
    process = await asyncio.create_subprocess_exec(
        *python_command("standalone", "--data-dir", data_dir, "--etcd-port", str(ports["etcd"]),
                        "--etcd-peer-port", str(ports["peer"]), "--bookie-port-base", str(ports["bookie"]),
                        "--bookie-http-port-base", str(ports["http"]), "--broker-port", str(ports["broker"]),
                        "--broker-http-port", str(ports["broker_http"]), "--gateway-port", str(ports["gateway"]),
                        "--autorecovery-http-port", str(ports["autorecovery"]), *extra),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        env={**os.environ, **env} if env else None)
    assert process.stdout is not None
    lines: list[bytes] = []
    async with asyncio.timeout(90):
        while True:
            line = await process.stdout.readline()
            lines.append(line)
            assert line, "standalone exited before it was ready:\n" + b"".join(lines[-40:]).decode(errors="replace")
            if b"standalone ready" in line:
                return process


async def _until_auditor(port: int) -> None:
    import urllib.request

    def metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    async with asyncio.timeout(30):
        while "magnetar_autorecovery_auditor 1.0" not in await asyncio.to_thread(metrics):
            await asyncio.sleep(0.2)


async def stop_standalone(process: asyncio.subprocess.Process) -> int:
    process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(60):
        return await process.wait()


async def test_standalone_survives_restart_with_its_data(tmp_path):
    ports = standalone_ports()
    data_dir = str(tmp_path / "standalone")
    metadata = f"etcd://127.0.0.1:{ports['etcd']}"
    process = await start_standalone(data_dir, ports)
    try:
        code, stdout, _ = await run_cli("shell", "--metadata", metadata, "listbookies")
        assert code == 0
        assert len(json.loads(stdout.splitlines()[-1])["bookies"]) == 3
        code, stdout, stderr = await run_cli("--log-level", "warning", "shell", "--metadata", metadata,
                                             "simpletest", "--entries", "5000")
        result = json.loads(stdout.splitlines()[-1])
        assert code == 0, stderr
        assert result["acked"] == 5000
        ledger_id = result["ledger_id"]
        # The standalone runs auto-recovery too (a lost bookie's copies made again,
        # orphan ledgers collected): it answers /health and is the elected auditor.
        await _until_auditor(ports["autorecovery"])
    finally:
        assert await stop_standalone(process) == 0

    process = await start_standalone(data_dir, ports)
    try:
        code, stdout, _ = await run_cli("--log-level", "warning", "shell", "--metadata", metadata,
                                        "readledger", "--ledger", str(ledger_id), "--check-pattern")
        report = json.loads(stdout.splitlines()[-1])
        assert code == 0, report
        assert report["entries"] == 5000 and report["digest_errors"] == 0 and report["pattern_errors"] == 0
    finally:
        assert await stop_standalone(process) == 0


async def test_message_ids_and_acks_survive_a_standalone_restart(tmp_path):
    """Through ``magnetar standalone`` with the official client: message ids read after
    a restart of the whole standalone (etcd, bookies, broker) are the ones the send
    receipts gave, and a durable subscription resumes after its last acknowledgement
    (acknowledgements were flushed by the clean shutdown). The standalone's HTTP gateway
    serves too, and receipts it issued before the restart are still accepted after it
    (the receipt secret is kept in the data directory)."""
    import aiohttp
    import pulsar

    ports = standalone_ports()
    data_dir = str(tmp_path / "standalone")
    service_url = f"pulsar://127.0.0.1:{ports['broker']}"
    topic = "persistent://public/default/restart-ids"
    process = await start_standalone(data_dir, ports)
    try:
        def first_half():
            client = pulsar.Client(service_url, operation_timeout_seconds=30)
            try:
                consumer = client.subscribe(topic, "keeper", initial_position=pulsar.InitialPosition.Earliest)
                producer = client.create_producer(topic, batching_enabled=False)
                ids = [producer.send(f"m{i}".encode()) for i in range(2000)]
                for i in range(1200):
                    message = consumer.receive(timeout_millis=10_000)
                    assert message.data() == f"m{i}".encode()
                    consumer.acknowledge(message)
                consumer.close()
                return [(m.ledger_id(), m.entry_id()) for m in ids]
            finally:
                client.close()

        sent = await asyncio.to_thread(first_half)
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{ports['gateway']}/v1/topics/persistent/public/default/restart-http"
            async with session.put(f"{base}/subscriptions/w", json={"initial_position": "earliest"}) as response:
                assert response.status == 200, await response.text()
            async with session.post(f"{base}/messages", json={"messages": [{"payload": "a"}, {"payload": "b"}]}) as response:
                assert response.status == 200, await response.text()
            async with session.post(f"{base}/subscriptions/w/pull",
                                    json={"max_messages": 2, "wait_ms": 5000, "lease_ms": 600_000}) as response:
                pulled = (await response.json())["messages"]
        assert sorted(m["payload"] for m in pulled) == ["a", "b"]
    finally:
        assert await stop_standalone(process) == 0

    process = await start_standalone(data_dir, ports)
    try:
        def second_half():
            client = pulsar.Client(service_url, operation_timeout_seconds=30)
            try:
                reader = client.create_reader(topic, pulsar.MessageId.earliest)
                seen = []
                for i in range(2000):
                    message = reader.read_next(10_000)
                    assert message.data() == f"m{i}".encode()
                    seen.append((message.message_id().ledger_id(), message.message_id().entry_id()))
                consumer = client.subscribe(topic, "keeper")
                resumed = [consumer.receive(timeout_millis=10_000).data() for _ in range(800)]
                return seen, resumed
            finally:
                client.close()

        seen, resumed = await asyncio.to_thread(second_half)
        assert seen == sent
        assert resumed == [f"m{i}".encode() for i in range(1200, 2000)]
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/subscriptions/w/ack",
                                    json={"receipts": [m["receipt"] for m in pulled]}) as response:
                assert (await response.json())["results"] == [{"status": "acked"}] * 2
            async with session.post(f"{base}/subscriptions/w/pull", json={"max_messages": 2, "wait_ms": 2000}) as response:
                assert (await response.json())["messages"] == []
    finally:
        assert await stop_standalone(process) == 0
