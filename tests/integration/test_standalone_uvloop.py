"""``magnetar standalone`` with every server on uvloop (``MAGNETAR_EVENT_LOOP=uvloop``,
runtime/event_loop.py), the option the performance work keeps for measuring.

Proves: the broker's adds reach the bookies through the add socket on uvloop's
transports (which are not subclasses of asyncio.Transport: an isinstance check there once
refused every connection, and every add timed out), and the official client gets its
receipts and its messages back, in order.
"""

from __future__ import annotations

import asyncio

from tests.integration.test_standalone import standalone_ports, start_standalone, stop_standalone

MESSAGES = 300


async def test_a_standalone_on_uvloop_stores_and_delivers(tmp_path):
    import pulsar

    ports = standalone_ports(bookies=1)
    process = await start_standalone(str(tmp_path / "data"), ports, "--bookies", "1", "--copies", "1",
                                     env={"MAGNETAR_EVENT_LOOP": "uvloop"})

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

    try:
        received = await asyncio.to_thread(produce_and_consume)
    finally:
        assert await stop_standalone(process) == 0
    assert received == [f"m-{n}".encode() for n in range(MESSAGES)]
