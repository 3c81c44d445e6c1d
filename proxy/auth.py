"""The proxy's side of security: who a client is, and how the proxy says so to brokers.

With ``--authentication-enabled`` the proxy checks each client's CONNECT itself (token
method: the brokers' key, ``--token-secret-key`` or ``--token-public-key``) before
anything reaches a broker; it then connects to brokers with its own token
(``--broker-token-file``, a role in the brokers' ``--proxy-roles``) and names its client
in ``original_principal`` / ``original_auth_method`` (and ``original_auth_data`` with
``--forward-auth-data``) on the piped CONNECT and on every forwarded lookup. Brokers
honour those fields only from a proxy role. Authorization stays the brokers'.

Without it, a piped client's CONNECT reaches the broker with the client's own
credentials, and the broker authenticates the client directly.

Either way, ``original_*`` fields a client sends are dropped: only the proxy sets them.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import AuthenticationFailed, ConfigError
from runtime.tokens import KeyFileVerifier, TokenFile
from protocol.proto import pulsar_api_pb2 as pb

TOKEN_METHOD = "token"
ORIGINAL_FIELDS = ("original_principal", "original_auth_data", "original_auth_method")


@dataclass(frozen=True)
class ProxyAuthConfig:
    authentication_enabled: bool = False
    token_secret_key: str = ""
    token_public_key: str = ""
    # The proxy's own token for brokers (a path; read again when it changes).
    broker_token_file: str = ""
    forward_auth_data: bool = False

    def __post_init__(self) -> None:
        if self.authentication_enabled:
            if bool(self.token_secret_key) == bool(self.token_public_key):
                raise ConfigError("with authentication on, give exactly one of --token-secret-key and "
                                  "--token-public-key")
            if not self.broker_token_file:
                raise ConfigError("with authentication on, --broker-token-file must hold the proxy's own token "
                                  "(a role in the brokers' --proxy-roles)")


@dataclass(frozen=True)
class Client:
    role: str
    method: str
    data: bytes


class ProxyAuthenticator:
    def __init__(self, config: ProxyAuthConfig) -> None:
        self.config = config
        self.enabled = config.authentication_enabled
        self._keys = KeyFileVerifier(config.token_secret_key or config.token_public_key,
                                     public_key=not config.token_secret_key) if self.enabled else None
        self._own_token = TokenFile(config.broker_token_file) if config.broker_token_file else None

    def authenticate(self, connect: pb.CommandConnect) -> Client | None:
        """The client a CONNECT proves (None with authentication off);
        AuthenticationFailed if it proves none."""
        if not self.enabled:
            return None
        assert self._keys is not None
        method = connect.auth_method_name if connect.HasField("auth_method_name") else ""
        if method != TOKEN_METHOD:
            raise AuthenticationFailed(f"the proxy accepts the token method only, not {method[:64]!r}")
        data = connect.auth_data if connect.HasField("auth_data") else b""
        role = self._keys.current().role(data)
        return Client(role, method, data)

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
        # The broker asks for fresh credentials of the connection's own role (the proxy's).
        forwarded.feature_flags.supports_auth_refresh = False
        forwarded.original_principal = client.role
        forwarded.original_auth_method = client.method
        if self.config.forward_auth_data:
            forwarded.original_auth_data = client.data.decode("ascii", errors="replace")
        return forwarded

    def name_client(self, body, client: Client | None) -> None:
        """Sets (or clears) the original_* fields of a forwarded lookup-phase request."""
        for name in ORIGINAL_FIELDS:
            if body.DESCRIPTOR.fields_by_name.get(name) is not None:
                body.ClearField(name)
        if client is None:
            return
        if body.DESCRIPTOR.fields_by_name.get("original_principal") is not None:
            body.original_principal = client.role
        if body.DESCRIPTOR.fields_by_name.get("original_auth_method") is not None:
            body.original_auth_method = client.method
        if self.config.forward_auth_data and body.DESCRIPTOR.fields_by_name.get("original_auth_data") is not None:
            body.original_auth_data = client.data.decode("ascii", errors="replace")
