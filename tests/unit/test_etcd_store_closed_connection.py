"""A metadata call whose connection the store closes under it (moving to the next
endpoint) fails with the store's own retriable error, never with a CancelledError
(issue 32: grpc.aio raises CancelledError from every call in flight on a closed channel,
and the leader's loop and the load reporter took it for their own cancellation and
ended silently).

The "etcd" here is a gRPC server that takes etcd's calls and never answers them (an
etcd member that lost its quorum does the same), so calls stay in flight until their
bound; no etcd process is needed. About 2 s.
"""

from __future__ import annotations

import asyncio

import grpc

from common.errors import MetadataUnavailable
from metadata.etcd_store import EtcdStore, EtcdStoreConfig


async def _silent_server() -> tuple[grpc.aio.Server, int]:
    """A gRPC server that takes etcd's KV calls and never answers them (as an etcd
    member without quorum does): calls on it stay in flight until their bound."""
    async def never(request: bytes, context) -> bytes:
        await asyncio.Event().wait()
        return b""
    handler = grpc.unary_unary_rpc_method_handler(never)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "etcdserverpb.KV", {"Range": handler, "Txn": handler, "Put": handler, "DeleteRange": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def test_a_call_on_a_connection_closed_under_it_fails_metadata_unavailable():
    async def scenario():
        server, port = await _silent_server()
        store = EtcdStore(EtcdStoreConfig(endpoints=(("127.0.0.1", port), ("127.0.0.1", port)),
                                          call_timeout_s=1.0, lease_thread=False))
        try:
            first = asyncio.ensure_future(store.get("/a"))
            await asyncio.sleep(0.4)
            # In flight when the first times out and the store closes their connection.
            second = asyncio.ensure_future(store.put("/b", b"v"))
            third = asyncio.ensure_future(store.get_prefix("/c/"))
            results = await asyncio.wait_for(asyncio.gather(first, second, third, return_exceptions=True), 10)
        finally:
            await store.close()
            await server.stop(0)
        return results
    results = asyncio.run(scenario())
    for result in results:
        assert isinstance(result, MetadataUnavailable), f"expected MetadataUnavailable, got {result!r}"
    assert any("closed under it" in str(result) for result in results), results
