"""The proxy's pure parts: which broker a ``proxy_to_broker_url`` names (and which names
no broker), whole frames taken from a buffer without touching what follows, the limits'
checks, and the CONNECT a broker gets (client-set original_* fields never pass; an
authenticated client is named by the proxy)."""

from __future__ import annotations

import asyncio

import json

import pytest

from common.errors import AuthenticationFailed, ConfigError, MalformedFrame
from runtime.tokens import TokenSigner, create_secret_key
from protocol.codec import FrameTooLarge, encode_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from proxy.auth import ProxyAuthConfig, ProxyAuthenticator
from proxy.brokers import _addresses, address_key
from proxy.config import ProxyConfig
from proxy.framing import take_frame


def test_address_keys():
    assert address_key("pulsar://Broker-1:6650") == "broker-1:6650"
    assert address_key("pulsar+ssl://10.0.0.7:6651") == "10.0.0.7:6651"
    assert address_key("10.0.0.7:6650") == "10.0.0.7:6650"
    for bad in ("", "garbage", "pulsar://host", "pulsar://:6650", "pulsar://h:notaport", "pulsar://h:99999"):
        assert address_key(bad) is None, bad


def test_a_report_registers_its_plain_tls_and_listener_addresses():
    report = json.dumps({"broker_id": "b1", "service_url": "pulsar://10.0.0.1:6650",
                         "service_url_tls": "pulsar+ssl://10.0.0.1:6651", "web_service_url": "http://10.0.0.1:8080",
                         "listeners": {"external": "pulsar://b1.example.com:16650"}}).encode()
    found = dict(_addresses(report))
    assert set(found) == {"10.0.0.1:6650", "10.0.0.1:6651", "b1.example.com:16650"}
    assert found["10.0.0.1:6651"].tls and not found["10.0.0.1:6650"].tls
    assert _addresses(b"not json") == [] and _addresses(b"[1]") == []


def test_frames_are_taken_whole_and_the_rest_left_as_sent():
    ping = encode_command(wrap(pb.CommandPing()))
    connect = encode_command(wrap(pb.CommandConnect(client_version="t", protocol_version=20)))
    buffer = bytearray(connect + ping[:3])
    frame = take_frame(buffer, 1024 * 1024)
    assert frame.command.type == pb.BaseCommand.CONNECT
    assert bytes(buffer) == ping[:3] and take_frame(buffer, 1024 * 1024) is None
    buffer += ping[3:] + b"\x00\x00"
    assert take_frame(buffer, 1024 * 1024).command.type == pb.BaseCommand.PING
    assert bytes(buffer) == b"\x00\x00"
    with pytest.raises(FrameTooLarge):
        take_frame(bytearray(b"\x7f\xff\xff\xff"), 1024)
    with pytest.raises(MalformedFrame):
        take_frame(bytearray(b"\x00\x00\x00\x01\x00"), 1024)


def test_limits_are_checked():
    for bad in ({"connections_max": 0}, {"frame_bytes_max": 10}, {"handshake_timeout_s": 0},
                {"buffer_bytes_max": 10}, {"pending_lookups_max": 0}):
        with pytest.raises(ConfigError):
            ProxyConfig(**bad)


def test_without_authentication_the_clients_connect_goes_on_without_original_fields():
    auth = ProxyAuthenticator(ProxyAuthConfig())
    connect = pb.CommandConnect(client_version="t", protocol_version=20, auth_method_name="token",
                                auth_data=b"client-token", proxy_to_broker_url="pulsar://b:6650",
                                original_principal="someone-else", original_auth_method="token")
    assert asyncio.run(auth.authenticate(connect)) is None
    forwarded = auth.for_broker(connect, None)
    assert not forwarded.HasField("proxy_to_broker_url") and not forwarded.HasField("original_principal")
    assert not forwarded.HasField("original_auth_method")
    assert forwarded.auth_data == b"client-token"        # the broker authenticates the client itself
    lookup = pb.CommandLookupTopic(topic="t", request_id=1, original_principal="someone-else")
    auth.strip_original(lookup)
    assert not lookup.HasField("original_principal")


def test_an_authenticating_proxy_names_the_client_it_verified(tmp_path):
    key = create_secret_key()
    (tmp_path / "key").write_bytes(key)
    signer = TokenSigner.with_secret_key(key)
    (tmp_path / "proxy.token").write_text(signer.create("proxy-role"))
    auth = ProxyAuthenticator(ProxyAuthConfig(authentication_enabled=True, token_secret_key=f"file://{tmp_path}/key",
                                              broker_token_file=str(tmp_path / "proxy.token")))
    connect = pb.CommandConnect(client_version="t", protocol_version=20, auth_method_name="token",
                                auth_data=signer.create("bob").encode(), original_principal="alice")
    client = asyncio.run(auth.authenticate(connect))
    assert client.role == "bob"
    forwarded = auth.for_broker(connect, client)
    assert forwarded.original_principal == "bob" and forwarded.original_auth_method == "token"
    assert not forwarded.HasField("original_auth_data")          # only with --forward-auth-data
    assert signer.create("proxy-role").encode() == forwarded.auth_data
    lookup = pb.CommandPartitionedTopicMetadata(topic="t", request_id=1, original_principal="alice")
    auth.strip_original(lookup)   # the link it goes over names bob (its CONNECT)
    assert not lookup.HasField("original_principal")
    fields = auth.connect_fields_for(client)
    assert (fields["original_principal"], fields["original_auth_method"]) == ("bob", "token")
    assert fields["auth_data"] == signer.create("proxy-role").encode() and "original_auth_data" not in fields
    for bad in (pb.CommandConnect(client_version="t", protocol_version=20),
                pb.CommandConnect(client_version="t", protocol_version=20, auth_method_name="token",
                                  auth_data=TokenSigner.with_secret_key(create_secret_key()).create("x").encode()),
                pb.CommandConnect(client_version="t", protocol_version=20, auth_method_name="basic",
                                  auth_data=b"u:p")):
        with pytest.raises(AuthenticationFailed):
            asyncio.run(auth.authenticate(bad))
    with pytest.raises(ConfigError):
        ProxyAuthConfig(authentication_enabled=True, token_secret_key="data:;base64,AA==")


def test_basic_and_tls_clients_are_named_by_their_user_and_certificate(tmp_path):
    """The basic method checks ``user:password`` against an htpasswd file (bcrypt), the
    tls method takes the verified client certificate's CN; a method not configured, a
    wrong password, and tls without a certificate are refused."""
    import bcrypt

    (tmp_path / "users").write_bytes(b"carol:" + bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)) + b"\n")
    (tmp_path / "proxy.token").write_text("proxy-token")
    auth = ProxyAuthenticator(ProxyAuthConfig(authentication_enabled=True, authentication_providers="basic,tls",
                                              basic_auth_file=str(tmp_path / "users"),
                                              broker_token_file=str(tmp_path / "proxy.token"),
                                              forward_auth_data=True))

    def connect(method: str, data: bytes = b"") -> pb.CommandConnect:
        return pb.CommandConnect(client_version="t", protocol_version=20, auth_method_name=method, auth_data=data)

    carol = asyncio.run(auth.authenticate(connect("basic", b"carol:s3cret")))
    assert (carol.role, carol.method) == ("carol", "basic")
    forwarded = auth.for_broker(connect("basic", b"carol:s3cret"), carol)
    assert (forwarded.original_principal, forwarded.original_auth_method) == ("carol", "basic")
    assert (forwarded.auth_method_name, forwarded.auth_data) == ("token", b"proxy-token")
    certificate = {"subject": ((("organizationName", "x"),), (("commonName", "dave"),))}
    dave = asyncio.run(auth.authenticate(connect("tls"), certificate))
    assert (dave.role, dave.method) == ("dave", "tls")
    assert not auth.for_broker(connect("tls"), dave).HasField("original_auth_data")     # nothing to forward
    for bad, peer in ((connect("basic", b"carol:wrong"), None), (connect("basic", b"nobody:s3cret"), None),
                      (connect("tls"), None), (connect("token", b"x.y.z"), None), (connect(""), certificate)):
        with pytest.raises(AuthenticationFailed):
            asyncio.run(auth.authenticate(bad, peer))
    with pytest.raises(ConfigError):
        ProxyAuthConfig(authentication_enabled=True, authentication_providers="basic",
                        broker_token_file=str(tmp_path / "proxy.token"))
    with pytest.raises(ConfigError):
        ProxyAuthConfig(authentication_providers="kerberos")
