"""``magnetar standalone`` with every server on uvloop (``MAGNETAR_EVENT_LOOP=uvloop``,
common/event_loop.py), the option the performance work keeps for measuring.

Proves: the broker's adds reach the bookies through the add socket on uvloop's
transports (which are not subclasses of asyncio.Transport: an isinstance check there once
refused every connection, and every add timed out), and the official client gets its
receipts and its messages back, in order.
"""

from __future__ import annotations

import asyncio
import os

from tests.cluster import contiguous_free_ports, free_port, python_command
from tests.integration.test_standalone import stop_standalone

MESSAGES = 300


async def test_a_standalone_on_uvloop_stores_and_delivers(tmp_path):
    import pulsar

    ports = {"etcd": free_port(), "peer": free_port(), "broker": free_port(), "broker_http": free_port(),
             "gateway": free_port(), "autorecovery": free_port()}
    process = await asyncio.create_subprocess_exec(
        *python_command("standalone", "--data-dir", str(tmp_path / "data"), "--bookies", "1", "--copies", "1",
                        "--etcd-port", str(ports["etcd"]), "--etcd-peer-port", str(ports["peer"]),
                        "--bookie-port-base", str(contiguous_free_ports(1)),
                        "--bookie-http-port-base", str(contiguous_free_ports(1)),
                        "--broker-port", str(ports["broker"]), "--broker-http-port", str(ports["broker_http"]),
                        "--gateway-port", str(ports["gateway"]), "--autorecovery-http-port", str(ports["autorecovery"])),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MAGNETAR_EVENT_LOOP": "uvloop"})
    assert process.stdout is not None
    lines: list[bytes] = []
    drain: asyncio.Task | None = None
    try:
        async with asyncio.timeout(90):
            while b"standalone ready" not in (line := await process.stdout.readline()):
                lines.append(line)
                assert line, "standalone exited:\n" + b"".join(lines[-40:]).decode(errors="replace")
        # Keep its output pipe drained while the client runs.
        drain = asyncio.get_running_loop().create_task(process.stdout.read())

        def produce_and_consume() -> list[bytes]:
            client = pulsar.Client(f"pulsar://127.0.0.1:{ports['broker']}", operation_timeout_seconds=20)
            try:
                consumer = client.subscribe("uvloop-topic", "s", initial_position=pulsar.InitialPosition.Earliest)
                producer = client.create_producer("uvloop-topic", send_timeout_millis=15_000)
                for n in range(MESSAGES):
                    producer.send(f"m-{n}".encode())      # each send waits for its receipt
                received = []
                for _ in range(MESSAGES):
                    message = consumer.receive(timeout_millis=15_000)
                    consumer.acknowledge(message)
                    received.append(message.data())
                return received
            finally:
                client.close()

        received = await asyncio.to_thread(produce_and_consume)
        assert received == [f"m-{n}".encode() for n in range(MESSAGES)]
    finally:
        code = await stop_standalone(process)
        if drain is not None:
            drain.cancel()
    assert code == 0
