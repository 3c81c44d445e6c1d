"""Turning a failure to listen on a port into one clear operator error.

A server that cannot bind its port must say which port and which flag sets it, in one
line, and exit non-zero: ``PortInUse`` carries that. ``bind_failure`` builds it from the
OSError of a bind; ``probe_bind`` finds that OSError for servers whose library hides it
(grpc's add_insecure_port only says that binding failed).
"""

from __future__ import annotations

import errno
import socket

from common.errors import PortInUse

_REASONS = {
    errno.EADDRINUSE: "already in use by another process",
    errno.EADDRNOTAVAIL: "not an address of this host",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


def bind_failure(flag: str, host: str, port: int, error: OSError | None) -> PortInUse:
    """The operator error for a failed bind of ``host:port`` (set by ``flag``)."""
    if error is None:
        return PortInUse(flag, host, port, "binding failed")
    reason = _REASONS.get(error.errno or 0, error.strerror or str(error))
    return PortInUse(flag, host, port, reason)


def probe_bind(host: str, port: int) -> OSError | None:
    """Binds (and at once closes) a TCP socket on ``host:port`` with SO_REUSEADDR, as
    servers do; returns the OSError if that fails, None if the port is free now."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        return OSError(errno.EADDRNOTAVAIL, str(error))
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as error:
            return error
    return None
