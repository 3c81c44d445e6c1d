"""Writes that leave together: one send per connection for what one socket read caused.

A broker reading one reply of its bookie settles the entries that reply confirmed, and in
that same turn writes, to each client connection, the entries' dispatch (MESSAGE) and
their receipts (SEND_RECEIPT). Written one by one, each ``transport.write`` on an idle
socket is a ``send`` of its own (~70 us on this machine: a loopback send runs the
receiver's TCP input) and may wake the receiver once per frame. Inside a scope
(``begin`` … ``end``, or ``batched_writes()``) the writes that go through ``write`` are
held, in order, per transport, and handed to each transport once, as one
``writelines``, when the outermost scope ends: one send per connection for the whole
read.

The scope is opened by the code that reads a socket (``data_received``), around
synchronous work only: nothing awaits inside it, so nothing is held past the end of the
read that caused it, and what it holds is bounded by what that read caused. One scope per
thread (each event loop runs on a thread of its own); an inner scope joins the outer one.
A transport closed while its writes are held gets them first: call ``release`` before
``close`` (asyncio sends what a transport holds before it closes). A transport's
flow control (``pause_writing`` past its high-water mark) sees held bytes only when the
scope ends; until then what is held is bounded by the read's consequences (a caught-up
dispatcher sends only the entries a bookie reply confirmed, within its permits).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Scope(threading.local):
    held: dict[asyncio.WriteTransport, list] | None = None


_local = _Scope()


def begin() -> bool:
    """Opens a scope unless one is open on this thread; True when this call opened it, and
    the caller then calls ``end`` (in a ``finally``). Plain calls rather than a generator
    context manager: a scope is opened on every socket read of the broker, and
    ``contextlib.contextmanager`` costs ~3.4 us a scope here, these two ~0.7 us."""
    if _local.held is not None:
        return False
    _local.held = {}
    return True


def end() -> None:
    """Closes the scope ``begin`` opened: each transport gets what is held for it in one
    ``writelines``; a transport whose write fails does not cost the others theirs (the
    first error is raised after)."""
    held = _local.held
    _local.held = None
    if not held:
        return
    failure: BaseException | None = None
    for transport, buffers in held.items():
        try:
            if not transport.is_closing():
                transport.writelines(buffers)
        except Exception as error:  # noqa: BLE001 - the other transports still get theirs
            failure = failure or error
    if failure is not None:
        raise failure


@contextmanager
def batched_writes() -> Iterator[None]:
    """``begin`` / ``end`` as a context manager (where a few microseconds do not matter)."""
    opened = begin()
    try:
        yield
    finally:
        if opened:
            end()


def write(transport: asyncio.WriteTransport, buffers: list) -> None:
    """``transport.writelines(buffers)`` now, or when the open scope ends."""
    held = _local.held
    if held is None:
        transport.writelines(buffers)
        return
    pending = held.get(transport)
    if pending is None:
        held[transport] = list(buffers)
    else:
        pending.extend(buffers)


def release(transport: asyncio.WriteTransport) -> None:
    """Writes what the open scope holds for ``transport`` now (before it is closed)."""
    held = _local.held
    if held is not None:
        buffers = held.pop(transport, None)
        if buffers and not transport.is_closing():
            transport.writelines(buffers)
