"""The proxy's pipe is bounded: a client that stops reading stops the broker's side
(real etcd and a real proxy process; the "broker" is a stand-in registered in etcd that
writes as fast as it is let, so what it managed to write is what the pipe absorbed).

Proves: with the client not reading, the broker side can write no more than the proxy's
buffer (1 MiB) plus the kernel's socket buffers — not the 256 MiB it offers — and the
proxy counts the pause (``magnetar_proxy_read_pauses_total{side="broker"}``); once the
client reads again, the broker's writes go on (reading resumed). About 10 s.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import urllib.request

from metadata import keys, open_store
from protocol.codec import encode_command, wrap
from protocol import commands
from protocol.proto import pulsar_api_pb2 as pb
from tests.cluster import Cluster

OFFERED_BYTES = 256 * 1024 * 1024
CHUNK = b"z" * 65536
# The proxy's 1 MiB plus socket buffers on both of its connections (loopback
# autotuning can reach a few MiB each): far below what is offered.
ABSORBED_BYTES_MAX = 32 * 1024 * 1024


def metric(http_url: str, name: str, labels: str) -> float:
    text = urllib.request.urlopen(f"{http_url}/metrics", timeout=10).read().decode()
    found = re.findall(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found[0]) if found else 0.0


async def test_a_client_that_stops_reading_stops_the_broker_side(etcd_process, tmp_path):
    written = {"bytes": 0}
    stop = asyncio.Event()

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)                 # the client's CONNECT
        writer.write(encode_command(commands.connected("stand-in", 20)))
        try:
            while written["bytes"] < OFFERED_BYTES and not stop.is_set():
                writer.write(CHUNK)
                await writer.drain()             # blocks while the proxy does not read
                written["bytes"] += len(CHUNK)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cluster = Cluster(etcd_process, str(tmp_path))
    store = open_store(cluster.metadata_url)
    client = None
    try:
        await store.put(keys.broker("stand-in"), json.dumps({
            "broker_id": "stand-in", "service_url": f"pulsar://127.0.0.1:{port}",
            "web_service_url": "http://127.0.0.1:1"}).encode())
        proxy = await cluster.proxy().start()
        proxy_port = int(proxy.service_url.rsplit(":", 1)[1])
        client = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        client.sendall(encode_command(wrap(pb.CommandConnect(
            client_version="t", protocol_version=20, proxy_to_broker_url=f"pulsar://127.0.0.1:{port}"))))
        assert await asyncio.to_thread(client.recv, 65536), "nothing piped back"
        # The client reads nothing more: the broker side must stall.
        await asyncio.sleep(4)
        stalled_at = written["bytes"]
        await asyncio.sleep(1)
        assert written["bytes"] == stalled_at, "the broker side kept writing into a client that does not read"
        assert stalled_at < ABSORBED_BYTES_MAX, f"{stalled_at} bytes absorbed by the pipe"
        assert metric(proxy.http_url, "magnetar_proxy_read_pauses_total", '{side="broker"}') >= 1
        # Reading again lets the broker go on.

        def drain(seconds: float) -> int:
            got = 0
            deadline = time.monotonic() + seconds
            client.settimeout(0.5)
            while time.monotonic() < deadline:
                try:
                    chunk = client.recv(1 << 20)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                got += len(chunk)
            return got

        received = await asyncio.to_thread(drain, 2.0)
        assert received > 0 and written["bytes"] > stalled_at + 4 * 1024 * 1024, (received, written)
        print(f"pipe absorbed {stalled_at / 1e6:.1f} MB before the broker side stalled; "
              f"{received / 1e6:.0f} MB read after resuming")
    finally:
        stop.set()
        if client is not None:
            client.close()
        server.close()
        await cluster.stop()
        await store.delete(keys.broker("stand-in"))
        await store.close()
