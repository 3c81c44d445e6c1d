"""The proxy's side of security: who a client is, and how the proxy says so to brokers.

With ``--authentication-enabled`` the proxy checks each client's CONNECT itself, before
anything reaches a broker, with the providers of ``--authentication-providers`` (the
brokers' methods, as Pulsar's proxy has providers of its own):

| method | what the client presents | role |
|---|---|---|
| ``token`` | auth data = the JWT (``AuthenticationToken``); the brokers' key | the token's ``sub`` |
| ``basic`` | auth data = ``user:password`` (``AuthenticationBasic``); ``--basic-auth-file`` | the user |
| ``tls`` | the client certificate of the TLS handshake (``AuthenticationTLS``) on the TLS port, verified against ``--tls-trust-certs-file`` | the subject's CN |

It then connects to brokers with its own token (``--broker-token-file``, a role in the
brokers' ``--proxy-roles``) and names its client in ``original_principal`` /
``original_auth_method`` (and ``original_auth_data`` with ``--forward-auth-data``) on
the piped CONNECT and on the CONNECT of the links its lookup-phase requests go over
(``proxy/upstream.py``). Brokers honour those fields only from a proxy role.
Authorization stays the brokers'.

Without it, a piped client's CONNECT reaches the broker with the client's own
credentials, and the broker authenticates the client directly.

Either way, ``original_*`` fields a client sends are dropped: only the proxy sets them.
A bcrypt check runs in a worker thread, at most ``BASIC_CHECKS_IN_FLIGHT_MAX`` at a time.
Nothing here logs a credential.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from common.errors import AuthenticationFailed, ConfigError
from runtime.password_file import PasswordFile
from runtime.tls import certificate_common_name
from runtime.tokens import KeyFileVerifier, TokenFile, expires_at_s
from protocol.proto import pulsar_api_pb2 as pb

TOKEN_METHOD = "token"
BASIC_METHOD = "basic"
TLS_METHOD = "tls"
METHODS = (TOKEN_METHOD, BASIC_METHOD, TLS_METHOD)
ORIGINAL_FIELDS = ("original_principal", "original_auth_data", "original_auth_method")
# bcrypt checks at once, in threads (the brokers' bound: each holds a core for tens of ms).
BASIC_CHECKS_IN_FLIGHT_MAX = 2
# Longest auth method name kept from a client (in errors and logs).
METHOD_NAME_BYTES_MAX = 64


@dataclass(frozen=True)
class ProxyAuthConfig:
    authentication_enabled: bool = False
    # Comma-separated methods accepted from clients: token, basic, tls.
    authentication_providers: str = TOKEN_METHOD
    token_secret_key: str = ""
    token_public_key: str = ""
    # The basic provider's users: an htpasswd file (bcrypt), the brokers' format.
    basic_auth_file: str = ""
    # The proxy's own token for brokers (a path; read again when it changes).
    broker_token_file: str = ""
    forward_auth_data: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.providers) - set(METHODS))
        if unknown:
            raise ConfigError(f"authentication_providers: unknown {unknown}; known: {list(METHODS)}")
        if not self.authentication_enabled:
            return
        if not self.providers:
            raise ConfigError("with authentication on, --authentication-providers must name at least one method")
        if TOKEN_METHOD in self.providers and bool(self.token_secret_key) == bool(self.token_public_key):
            raise ConfigError("with the token provider on, give exactly one of --token-secret-key and "
                              "--token-public-key")
        if BASIC_METHOD in self.providers and not self.basic_auth_file:
            raise ConfigError("with the basic provider on, --basic-auth-file must name the users' file")
        if not self.broker_token_file:
            raise ConfigError("with authentication on, --broker-token-file must hold the proxy's own token "
                              "(a role in the brokers' --proxy-roles)")

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name.strip() for name in self.authentication_providers.split(",")
                                   if name.strip()))


@dataclass(frozen=True)
class Client:
    role: str
    method: str
    data: bytes
    # When its credential stops being valid (seconds since the epoch; a token's exp);
    # None: never.
    expires_at_s: float | None = None


class ProxyAuthenticator:
    def __init__(self, config: ProxyAuthConfig) -> None:
        self.config = config
        self.enabled = config.authentication_enabled
        self.providers = frozenset(config.providers) if self.enabled else frozenset()
        self._keys = KeyFileVerifier(config.token_secret_key or config.token_public_key,
                                     public_key=not config.token_secret_key) \
            if TOKEN_METHOD in self.providers else None
        self._passwords = PasswordFile(config.basic_auth_file) if BASIC_METHOD in self.providers else None
        self._basic_checks: asyncio.Semaphore | None = None
        self._own_token = TokenFile(config.broker_token_file) if config.broker_token_file else None

    async def authenticate(self, connect: pb.CommandConnect, peer_certificate: dict | None = None) -> Client | None:
        """The client a CONNECT proves (None with authentication off); AuthenticationFailed
        if it proves none. ``peer_certificate``: the client certificate the TLS
        handshake verified (None on the plain port or without one)."""
        if not self.enabled:
            return None
        method = connect.auth_method_name if connect.HasField("auth_method_name") else ""
        data = connect.auth_data if connect.HasField("auth_data") else b""
        if method not in self.providers:
            raise AuthenticationFailed(f"the proxy does not accept the authentication method "
                                       f"{method[:METHOD_NAME_BYTES_MAX] or 'none'!r} (accepted: "
                                       f"{', '.join(sorted(self.providers))})")
        if method == TOKEN_METHOD:
            assert self._keys is not None
            claims = self._keys.current().claims(data)
            return Client(claims["sub"], method, data, expires_at_s(claims))
        if method == BASIC_METHOD:
            assert self._passwords is not None
            if self._basic_checks is None:
                self._basic_checks = asyncio.Semaphore(BASIC_CHECKS_IN_FLIGHT_MAX)
            async with self._basic_checks:
                user = await asyncio.to_thread(self._passwords.check, data)
            return Client(user, method, data)
        assert method == TLS_METHOD
        role = certificate_common_name(peer_certificate)
        if role is None:
            raise AuthenticationFailed("tls authentication needs a client certificate with a subject CN, "
                                       "presented on the proxy's TLS port")
        return Client(role, method, b"")

    def own_credentials(self) -> tuple[str, bytes] | None:
        """(method, data) the proxy presents to brokers, None when it has no token."""
        if self._own_token is None:
            return None
        return TOKEN_METHOD, self._own_token.current().encode()

    def for_broker(self, connect: pb.CommandConnect, client: Client | None) -> pb.CommandConnect:
        """The CONNECT the broker of a piped client gets."""
        forwarded = pb.CommandConnect()
        forwarded.CopyFrom(connect)
        forwarded.ClearField("proxy_to_broker_url")
        for name in ORIGINAL_FIELDS:
            forwarded.ClearField(name)
        if client is None:
            return forwarded
        method, data = self.own_credentials()
        forwarded.auth_method_name, forwarded.auth_data = method, data
        forwarded.original_principal = client.role
        forwarded.original_auth_method = client.method
        if self.forwards_refreshable(client):
            # The broker verifies the client's token and, when it expires, challenges:
            # the client's AUTH_RESPONSE (its fresh token) is piped to the broker as it
            # is, so its own announcement of refresh support stands.
            forwarded.original_auth_data = client.data.decode("ascii", errors="replace")
        else:
            if self.config.forward_auth_data and client.data:
                forwarded.original_auth_data = client.data.decode("ascii", errors="replace")
            # Nothing the client could answer a challenge with would renew this
            # connection's credential (the proxy's): the broker closes it at expiry.
            forwarded.feature_flags.supports_auth_refresh = False
        return forwarded

    def forwards_refreshable(self, client: Client) -> bool:
        """The client's token goes to brokers (``--forward-auth-data``): they verify it and
        may challenge the client for a fresh one."""
        return self.config.forward_auth_data and client.method == TOKEN_METHOD and bool(client.data)

    def connect_fields_for(self, client: Client) -> dict:
        """The CONNECT fields of a lookup link that speaks for ``client``: the proxy's own
        credentials and the client named, as on its piped CONNECT."""
        method, data = self.own_credentials()
        fields = {"auth_method_name": method, "auth_data": data, "original_principal": client.role,
                  "original_auth_method": client.method}
        if self.config.forward_auth_data and client.data:
            fields["original_auth_data"] = client.data.decode("ascii", errors="replace")
        return fields

    @staticmethod
    def strip_original(body) -> None:
        """Clears a forwarded lookup-phase request's original_* fields: a client may not
        name anyone, and the link it goes over names the client already (its CONNECT)."""
        for name in ORIGINAL_FIELDS:
            if body.DESCRIPTOR.fields_by_name.get(name) is not None:
                body.ClearField(name)
