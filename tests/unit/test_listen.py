"""Turning bind failures into one operator error (runtime/listen.py, runtime/ops_http.py).

What it proves: probing a port another socket listens on finds EADDRINUSE, a free port
None; the error built from it is a PortInUse (a ConfigError, code 1009) whose message
names the address, the port and the flag, with the reason in words; the ops HTTP server
on a taken port raises that error naming the flag it was given, not aiohttp's OSError.

How: real loopback sockets; no other process.
"""

from __future__ import annotations

import errno
import socket

import pytest
from prometheus_client import CollectorRegistry

from common.errors import ConfigError, PortInUse, error_for_code
from runtime.listen import bind_failure, probe_bind
from runtime.ops_http import build_ops_app, start_ops_server


def _listener() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_probe_finds_a_listener_and_not_a_free_port():
    sock, port = _listener()
    with sock:
        refused = probe_bind("127.0.0.1", port)
        assert refused is not None and refused.errno == errno.EADDRINUSE
    assert probe_bind("127.0.0.1", port) is None


def test_the_error_names_the_flag_and_the_port():
    error = bind_failure("--http-port", "127.0.0.1", 8001, OSError(errno.EADDRINUSE, "Address already in use"))
    assert isinstance(error, PortInUse) and isinstance(error, ConfigError)
    assert (error.flag, error.host, error.port) == ("--http-port", "127.0.0.1", 8001)
    assert str(error) == ("cannot listen on 127.0.0.1:8001 (--http-port 8001): already in use by another "
                          "process; stop the process holding it or give another --http-port")
    assert "not an address of this host" in str(bind_failure("--port", "10.9.9.9", 1, OSError(errno.EADDRNOTAVAIL, "")))
    assert isinstance(error_for_code(PortInUse.code, "x"), PortInUse)


async def test_the_ops_server_on_a_taken_port_raises_port_in_use():
    sock, port = _listener()

    async def health():
        return True, {}

    with sock:
        with pytest.raises(PortInUse) as caught:
            await start_ops_server(build_ops_app(CollectorRegistry(), health), "127.0.0.1", port, flag="--http-port")
    assert caught.value.flag == "--http-port" and caught.value.port == port
