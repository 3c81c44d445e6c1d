"""A coordinator telling another broker the outcome of a transaction: the
END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION requests Pulsar's coordinator sends to
topic owners, over the binary protocol. One connection per owner, opened on demand,
kept while it works; a request waits at most ``request_timeout_s``. The caller
(transaction_coordinator.py) retries failures; a broken connection is dropped and
opened again on the next request. Connections are few: one per broker of the cluster.

Authentication: with ``--broker-client-token-file`` (the token of a superuser role,
the one this broker presents to the others for admin calls too) the CONNECT carries
it as method ``token``; the owner lets only a superuser send END_TXN_ON_*. Without it
nothing is presented (a cluster with authentication off). A ``pulsar+ssl://`` owner is
reached over TLS with the broker's peer context (runtime/tls.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from typing import Callable
from urllib.parse import urlparse

from common.errors import MagnetarError, ServiceNotReady
from protocol import txn_commands
from protocol.codec import NEED_DATA, CommandDecoder, encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import error_for_server_error
from transactions.records import TxnId

log = logging.getLogger(__name__)

T = pb.BaseCommand
_ANSWERS = {T.END_TXN_ON_PARTITION_RESPONSE: "endTxnOnPartitionResponse",
            T.END_TXN_ON_SUBSCRIPTION_RESPONSE: "endTxnOnSubscriptionResponse"}
_FRAME_BYTES_MAX = 5 * 1024 * 1024
_PEERS_MAX = 1024


class _Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.waiting: dict[int, asyncio.Future[pb.BaseCommand]] = {}
        self.task: asyncio.Task[None] | None = None
        self.closed = False

    async def read_loop(self) -> None:
        decoder = CommandDecoder(frame_bytes_max=_FRAME_BYTES_MAX)
        try:
            while True:
                chunk = await self.reader.read(65536)
                if not chunk:
                    break
                decoder.feed(chunk)
                while (frame := decoder.next_command()) is not NEED_DATA:
                    command = frame.command
                    if command.type == T.PING:
                        self.writer.write(encode_command(wrap(pb.CommandPong())))
                    field = _ANSWERS.get(command.type)
                    if field is not None:
                        future = self.waiting.pop(getattr(command, field).request_id, None)
                        if future is not None and not future.done():
                            future.set_result(command)
                    elif command.type == T.ERROR:
                        future = self.waiting.pop(command.error.request_id, None)
                        if future is not None and not future.done():
                            future.set_exception(error_for_server_error(command.error.error, command.error.message))
        except (OSError, MagnetarError) as error:
            log.info("transaction peer connection failed: error=%s", error)
        finally:
            self.closed = True
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(ServiceNotReady("connection to the topic's owner closed"))
            self.writer.close()


class TransactionPeers:
    def __init__(self, request_timeout_s: float, *, token: Callable[[], str] | None = None,
                 tls: Callable[[], ssl.SSLContext] | None = None) -> None:
        """``token``: the current broker client token, or None; ``tls``: the current
        client context toward other brokers, or None (TLS peers refused)."""
        self._request_timeout_s = request_timeout_s
        self._token = token
        self._tls = tls
        self._peers: dict[str, _Peer] = {}
        self._request_ids = itertools.count(1)

    async def _peer(self, service_url: str) -> _Peer:
        peer = self._peers.get(service_url)
        if peer is not None and not peer.closed:
            return peer
        url = urlparse(service_url)
        if url.scheme == "pulsar":
            context = None
        elif url.scheme == "pulsar+ssl" and self._tls is not None:
            context = self._tls()
        else:
            raise ServiceNotReady(f"transaction outcome to {service_url}: no way to reach that broker "
                                  "(pulsar://, or pulsar+ssl:// with TLS configured)")
        connect = pb.CommandConnect(client_version="magnetar-broker", protocol_version=pb.v20)
        if self._token is not None:
            connect.auth_method_name = "token"
            connect.auth_data = self._token().encode()
        async with asyncio.timeout(self._request_timeout_s):
            reader, writer = await asyncio.open_connection(url.hostname, url.port, ssl=context)
            writer.write(encode_command(wrap(connect)))
            decoder = CommandDecoder(frame_bytes_max=_FRAME_BYTES_MAX)
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    raise ServiceNotReady(f"{service_url} closed the connection before CONNECTED")
                decoder.feed(chunk)
                frame = decoder.next_command()
                if frame is not NEED_DATA:
                    if frame.command.type != T.CONNECTED:
                        writer.close()
                        detail = (f": {pb.ServerError.Name(frame.command.error.error)} {frame.command.error.message}"
                                  if frame.command.type == T.ERROR else "")
                        raise ServiceNotReady(f"{service_url} answered CONNECT with "
                                              f"{T.Type.Name(frame.command.type)}{detail}")
                    break
        peer = _Peer(reader, writer)
        peer.task = asyncio.get_running_loop().create_task(peer.read_loop())
        old = self._peers.pop(service_url, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        self._peers[service_url] = peer
        while len(self._peers) > _PEERS_MAX:
            _url, evicted = next(iter(self._peers.items()))
            self._peers.pop(_url)
            if evicted.task is not None:
                evicted.task.cancel()
        return peer

    async def _request(self, service_url: str, command: pb.BaseCommand, request_id: int) -> pb.BaseCommand:
        peer = await self._peer(service_url)
        future: asyncio.Future[pb.BaseCommand] = asyncio.get_running_loop().create_future()
        peer.waiting[request_id] = future
        peer.writer.write(encode_command(command))
        try:
            async with asyncio.timeout(self._request_timeout_s):
                answer = await future
        finally:
            peer.waiting.pop(request_id, None)
        body = getattr(answer, _ANSWERS[answer.type])
        if body.HasField("error"):
            raise error_for_server_error(body.error, body.message)
        return answer

    async def end_on_partition(self, service_url: str, txn_id: TxnId, topic: str, commit: bool) -> None:
        request_id = next(self._request_ids)
        await self._request(service_url, txn_commands.end_txn_on_partition(
            request_id, (txn_id.most, txn_id.least), topic, commit), request_id)

    async def end_on_subscription(self, service_url: str, txn_id: TxnId, topic: str, subscription: str,
                                  commit: bool) -> None:
        request_id = next(self._request_ids)
        await self._request(service_url, txn_commands.end_txn_on_subscription(
            request_id, (txn_id.most, txn_id.least), topic, subscription, commit), request_id)

    async def close(self) -> None:
        for peer in self._peers.values():
            if peer.task is not None:
                peer.task.cancel()
        await asyncio.gather(*(p.task for p in self._peers.values() if p.task is not None), return_exceptions=True)
        self._peers.clear()
