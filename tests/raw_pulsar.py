"""A bare Pulsar-protocol connection for tests, through our own codec: to see exactly
which ServerError the broker answers a request with (the official client retries some,
such as ServiceNotReady and MetadataError, and reports only its timeout)."""

from __future__ import annotations

import socket


class RawConnection:
    """A bare Pulsar-protocol connection through our own codec: to see the ServerError a
    request is answered with (the official client retries ServiceNotReady inside)."""

    def __init__(self, service_url: str, **connect_fields) -> None:
        from protocol.codec import CommandDecoder, NEED_DATA, encode_command, wrap
        from protocol.proto import pulsar_api_pb2 as pb

        self.pb, self._encode, self._wrap, self._need_data = pb, encode_command, wrap, NEED_DATA
        self._decoder = CommandDecoder(frame_bytes_max=5 * 1024 * 1024 + 10 * 1024)
        host, port = service_url.removeprefix("pulsar://").rsplit(":", 1)
        self._socket = socket.create_connection((host, int(port)), timeout=15)
        self.send(pb.CommandConnect(client_version="raw-test", protocol_version=20, **connect_fields))
        assert self.next_command().type == pb.BaseCommand.CONNECTED

    def send(self, body) -> None:
        self._socket.sendall(self._encode(self._wrap(body)))

    def next_command(self):
        while True:
            frame = self._decoder.next_command()
            if frame is self._need_data:
                chunk = self._socket.recv(65536)
                assert chunk, "the broker closed the connection"
                self._decoder.feed(chunk)
                continue
            if frame.command.type == self.pb.BaseCommand.PING:
                self.send(self.pb.CommandPong())
                continue
            return frame.command

    def close(self) -> None:
        self._socket.close()
