"""Token refresh on a connection (broker/connection.py): AUTH_CHALLENGE / AUTH_RESPONSE.

Proves: CONNECT with a token is authenticated (in a task) before CONNECTED; once the
token has expired, the permission check sends AUTH_CHALLENGE (method token, data
``refresh``) to a client that announced ``supports_auth_refresh``; an AUTH_RESPONSE
with a valid token of the same role keeps the connection open with the new expiry, and
the next expiry is challenged again; no answer by the next check, an invalid token, or
another role's token closes the connection; a client without the feature flag is closed
at expiry without a challenge.

How: a real ServerConnection and BrokerService (in-memory metadata, fake ledgers) with
token authentication on and the fake transport of test_broker_connection.
"""

from __future__ import annotations

import base64
import dataclasses
import time

from broker.authentication import AuthConfig
from broker.config import BrokerConfig
from broker.connection import ServerConnection
from managed_ledger.managed_ledger import ManagedLedgerConfig
from broker.service import BrokerService
from runtime.tokens import TokenSigner, create_secret_key
from metadata.memory_store import MemoryStore
from protocol.proto import pulsar_api_pb2 as pb
from tests.unit.fake_ledger_client import FakeLedgerClient
from tests.unit.test_broker_connection import Client, FakeTransport, GatedOwnership, settle

T = pb.BaseCommand
KEY = create_secret_key()
SIGNER = TokenSigner.with_secret_key(KEY)


async def _service() -> BrokerService:
    auth = AuthConfig(authentication_enabled=True,
                      token_secret_key="data:;base64," + base64.b64encode(KEY).decode())
    config = BrokerConfig(metadata_url="memory://", managed_ledger=ManagedLedgerConfig(1, 1, 1),
                          retention_check_interval_s=3600, auth=auth)
    service = BrokerService(config, MemoryStore(), FakeLedgerClient(), topic_ownership=GatedOwnership())
    await service.start()
    return service


async def _connect(service: BrokerService, role: str, *, refresh: bool = True) -> Client:
    connection = ServerConnection(service)
    transport = FakeTransport(connection)
    connection.connection_made(transport)
    client = Client(connection, transport)
    client.send(pb.CommandConnect(client_version="test", protocol_version=pb.v21, auth_method_name="token",
                                  auth_data=SIGNER.create(role, expiry_s=60).encode(),
                                  feature_flags=pb.FeatureFlags(supports_auth_refresh=refresh)))
    await settle()
    assert [answer.type for answer in client.answers()] == [T.CONNECTED]
    assert connection.identity is not None and connection.identity.role == role
    return client


def _expire(client: Client) -> None:
    connection = client.connection
    connection.identity = dataclasses.replace(connection.identity, expires_at_s=time.time() - 1)


def _answer(client: Client, token: str) -> None:
    client.send(pb.CommandAuthResponse(client_version="test", protocol_version=pb.v21,
                                       response=pb.AuthData(auth_method_name="token", auth_data=token.encode())))


async def test_a_fresh_token_keeps_the_connection_and_silence_closes_it():
    service = await _service()
    client = await _connect(service, "app")
    connection = client.connection
    _expire(client)
    await connection.recheck_permissions()
    (challenge,) = client.answers()
    assert challenge.type == T.AUTH_CHALLENGE
    assert (challenge.authChallenge.challenge.auth_method_name, challenge.authChallenge.challenge.auth_data) == \
        ("token", b"refresh")
    _answer(client, SIGNER.create("app", expiry_s=120))
    await settle()
    assert not connection.is_closing and connection.auth_refreshes == 1
    assert connection.identity.expires_at_s > time.time() + 60
    await connection.recheck_permissions()          # valid again: nothing is sent
    assert client.answers() == [] and not connection.is_closing
    _expire(client)
    await connection.recheck_permissions()          # the next expiry is challenged again
    assert [answer.type for answer in client.answers()] == [T.AUTH_CHALLENGE]
    await connection.recheck_permissions()          # no answer by the next check
    assert connection.is_closing
    await service.close()


async def test_an_invalid_answer_or_another_role_closes_the_connection():
    service = await _service()
    answers = {
        "expired": SIGNER.create("app", expiry_s=-5),
        "wrong key": TokenSigner.with_secret_key(create_secret_key()).create("app"),
        "another role": SIGNER.create("someone-else", expiry_s=60),
    }
    for case, token in answers.items():
        client = await _connect(service, "app")
        _expire(client)
        await client.connection.recheck_permissions()
        assert [answer.type for answer in client.answers()] == [T.AUTH_CHALLENGE], case
        _answer(client, token)
        await settle()
        assert client.connection.is_closing, case
        assert client.connection.identity.role == "app", case
    await service.close()


async def test_a_client_without_refresh_is_closed_at_expiry():
    service = await _service()
    client = await _connect(service, "app", refresh=False)
    _expire(client)
    await client.connection.recheck_permissions()
    assert client.answers() == [] and client.connection.is_closing
    await service.close()
