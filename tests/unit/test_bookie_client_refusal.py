"""A bookie that refuses a client's credentials aborts its add stream at once; gRPC's
core may then report the call as INTERNAL to the stream's writer or to its reader,
losing the real status. Whichever sees it first, the add fails with the refusal
(an authentication error), never as a failed bookie the writer would replace."""

import asyncio

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata

from common.errors import AuthenticationFailed, BookieUnavailable
from ledger.bookie_client import BookieClient
from ledger.config import LedgerClientConfig


def _rpc_error(code: grpc.StatusCode, details: str) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details=details)


class _RefusedCall:
    """An AddEntries call whose reader sees the abort as INTERNAL, and whose writes
    hang (written) or succeed, as the race goes."""

    def __init__(self, writes_fail: bool) -> None:
        self._writes_fail = writes_fail
        self.cancelled = False

    async def write(self, _request) -> None:
        if self._writes_fail:
            await asyncio.sleep(0.05)
            raise _rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core")

    async def read(self):
        raise _rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core")

    def cancel(self) -> None:
        self.cancelled = True


class _Stub:
    def __init__(self, info_code: grpc.StatusCode | None, writes_fail: bool) -> None:
        self._info_code = info_code
        self._writes_fail = writes_fail

    def AddEntries(self, metadata=None):  # noqa: N802 - gRPC's method name
        return _RefusedCall(self._writes_fail)

    async def Info(self, _request, timeout=None, metadata=None):  # noqa: N802
        if self._info_code is not None:
            raise _rpc_error(self._info_code, "a service token is required")
        return object()


async def _add_outcome(info_code: grpc.StatusCode | None, writes_fail: bool) -> Exception:
    client = BookieClient("b1", "127.0.0.1:1", LedgerClientConfig(add_timeout_s=5.0))
    client._stub = _Stub(info_code, writes_fail)  # the edge: a bookie's gRPC service
    try:
        with pytest.raises(Exception) as caught:
            async with asyncio.timeout(5):
                await client.add(1, 0, b"entry")
        return caught.value
    finally:
        await client.close()


@pytest.mark.parametrize("writes_fail", [False, True], ids=["reader-sees-it", "both-see-it"])
async def test_refused_add_fails_as_a_refusal_whoever_sees_the_abort(writes_fail):
    error = await _add_outcome(grpc.StatusCode.UNAUTHENTICATED, writes_fail)
    assert isinstance(error, AuthenticationFailed), repr(error)


async def test_a_bookie_that_accepts_the_credentials_is_unavailable():
    error = await _add_outcome(None, False)
    assert isinstance(error, BookieUnavailable), repr(error)
    assert "INTERNAL" in str(error)
