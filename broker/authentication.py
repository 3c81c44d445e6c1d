"""Who a client is: the broker's authentication, off unless configured.

Several providers at once, as Pulsar's ``authenticationProviders``: a client is
checked by the provider named by its auth method, and only those listed in
``authentication_providers`` are accepted.

| method | binary protocol (CONNECT) | HTTP | role |
|---|---|---|---|
| ``token`` | auth data = the JWT (``AuthenticationToken``) | ``Authorization: Bearer <jwt>`` | the token's ``sub`` |
| ``tls`` | the client certificate of the TLS handshake (``AuthenticationTLS``) | the client certificate | the certificate subject's CN |
| ``basic`` | auth data = ``user:password`` (``AuthenticationBasic``) | ``Authorization: Basic base64(user:password)`` | the user |

An HTTP request with no Authorization header but a verified client certificate is a
``tls`` one when that provider is on. A client that presents nothing gets the anonymous
role if one is configured (Pulsar's ``anonymousUserRole``), and is refused otherwise.
"Nothing" is what the official clients send when configured without authentication:
the method name ``none`` (their ``AuthenticationDisabled``), or no method at all (older
clients, our own); on HTTP, a request without an Authorization header (and without a
client certificate the tls provider accepts).

Tokens are checked against a secret key (HS256) or a public key (RS256), read from the
key value given (``file:///path`` or ``data:;base64,...``). A key file is read again
when its modification time changes, so a key is rotated without a restart (checked at
most every ``KEY_RECHECK_S``); the basic auth file likewise (runtime/password_file.py).
Client certificates are verified by the TLS handshake against the listener's
``trust_certs_file`` (runtime/tls.py) before any provider sees them. A bcrypt check runs
in a worker thread, at most ``BASIC_CHECKS_IN_FLIGHT_MAX`` at a time, never on the
event loop.

Nothing here logs a token, a password or a key: errors name what was wrong, never the
value.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from dataclasses import dataclass
from runtime.password_file import PasswordFile
from common.errors import AuthenticationFailed, ConfigError
from runtime.tls import certificate_common_name
from runtime.tokens import KeyFileVerifier, TokenVerifier

# The auth method names the official clients send (AuthenticationToken, AuthenticationTLS,
# AuthenticationBasic), which are also the provider names of authentication_providers.
TOKEN_METHOD = "token"
TLS_METHOD = "tls"
BASIC_METHOD = "basic"
METHODS = (TOKEN_METHOD, TLS_METHOD, BASIC_METHOD)
# The method name of the official clients' AuthenticationDisabled (a client configured
# without authentication): never a provider, always "no credentials".
NONE_METHOD = "none"
# How often a key file's modification time is looked at (a stat per this, not per check).
KEY_RECHECK_S = 2.0
# bcrypt checks at once, in threads: each holds a core for tens of milliseconds, so a few
# keep the broker's loop (and its other clients) responsive under a password-guessing burst.
BASIC_CHECKS_IN_FLIGHT_MAX = 2
# Longest auth method name kept from a client (in errors and logs).
METHOD_NAME_BYTES_MAX = 64


# The longest role a proxy may name for its client.
ROLE_BYTES_MAX = 1024


@dataclass(frozen=True)
class AuthConfig:
    # Clients must prove a role (CONNECT auth data, HTTP Authorization, a client certificate).
    authentication_enabled: bool = False
    # Comma-separated providers accepted at once (Pulsar's authenticationProviders), by
    # auth method name: token, tls, basic.
    authentication_providers: str = TOKEN_METHOD
    # Roles are checked against superusers, tenant admins and namespace permissions.
    # Needs authentication (a role to check).
    authorization_enabled: bool = False
    # Comma-separated roles that may do everything (Pulsar's superUserRoles).
    superuser_roles: str = ""
    # Comma-separated roles that may ask on behalf of another (Pulsar's proxyRoles): the
    # gateway's service role, when it authenticates its callers' client certificates
    # itself and asks a broker for the permissions of their CN.
    proxy_roles: str = ""
    # The token key: a secret key (HS256) or a public key (RS256), as file:///path or
    # data:;base64,... (Pulsar's tokenSecretKey / tokenPublicKey). Exactly one with the
    # token provider on.
    token_secret_key: str = ""
    token_public_key: str = ""
    # The basic provider's users: an htpasswd file (bcrypt hashes, htpasswd -B) as a
    # path, file:///path or data:;base64,... (Pulsar's basicAuthConf). Needed with basic on.
    basic_auth_file: str = ""
    # The role of a client that presents no credentials ("": such clients are refused).
    anonymous_role: str = ""
    # A file holding the token this broker presents to the other brokers when an admin
    # request it authorized reaches partitions they serve (broker/admin/fanout.py): of
    # a superuser role there (Pulsar's brokerClientAuthenticationParameters). Read again
    # when it changes. Empty: the caller's own Authorization is passed on, which a
    # caller known only by its client certificate does not have.
    broker_client_token_file: str = ""
    # How often connected producers and consumers are checked against their role's
    # current permissions and their token's expiry: a revoke on another broker acts
    # within this (a revoke on this broker acts at once). A connection whose token has
    # expired is sent AUTH_CHALLENGE if its client announced auth refresh (closed
    # otherwise), and closed if no valid answer came by the next check.
    permission_check_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.authorization_enabled and not self.authentication_enabled:
            raise ConfigError("authorization_enabled needs authentication_enabled (a role to authorize)")
        unknown = sorted(set(self.providers) - set(METHODS))
        if unknown:
            raise ConfigError(f"authentication_providers: unknown {unknown}; known: {list(METHODS)}")
        if self.authentication_enabled and not self.providers:
            raise ConfigError("with authentication on, authentication_providers must name at least one provider")
        if self.authentication_enabled and TOKEN_METHOD in self.providers \
                and bool(self.token_secret_key) == bool(self.token_public_key):
            raise ConfigError("with the token provider on, give exactly one of token_secret_key and token_public_key")
        if self.authentication_enabled and BASIC_METHOD in self.providers and not self.basic_auth_file:
            raise ConfigError("with the basic provider on, basic_auth_file must name the users' file")
        if not 0.05 <= self.permission_check_interval_s <= 3600:
            raise ConfigError("permission_check_interval_s must be in [0.05, 3600]")
        if self.authorization_enabled and not self.superusers:
            raise ConfigError("with authorization on, superuser_roles must name at least one role")

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name.strip() for name in self.authentication_providers.split(",")
                                   if name.strip()))

    @property
    def superusers(self) -> frozenset[str]:
        return frozenset(role.strip() for role in self.superuser_roles.split(",") if role.strip())

    @property
    def proxies(self) -> frozenset[str]:
        return frozenset(role.strip() for role in self.proxy_roles.split(",") if role.strip())

    def __repr__(self) -> str:
        # Logged at start: key values may be inline (data:...), so only say which is set.
        return (f"AuthConfig(authentication_enabled={self.authentication_enabled}, "
                f"authentication_providers={','.join(self.providers)!r}, "
                f"authorization_enabled={self.authorization_enabled}, superuser_roles={self.superuser_roles!r}, "
                f"proxy_roles={self.proxy_roles!r}, "
                f"token_key={'secret' if self.token_secret_key else 'public' if self.token_public_key else 'none'}, "
                f"basic_auth_file={'set' if self.basic_auth_file else 'none'}, "
                f"anonymous_role={self.anonymous_role!r}, "
                f"broker_client_token_file={self.broker_client_token_file!r}, "
                f"permission_check_interval_s={self.permission_check_interval_s})")


@dataclass(frozen=True)
class Identity:
    role: str
    # When its credential stops being valid (seconds since the epoch); None: never.
    expires_at_s: float | None = None
    # The provider that vouched for it (token, tls, basic; "" for the anonymous role).
    method: str = ""


class Authenticator:
    """Turns credentials into an Identity (AuthenticationFailed otherwise)."""

    def __init__(self, config: AuthConfig) -> None:
        self.config = config
        self.enabled = config.authentication_enabled
        self.providers = frozenset(config.providers) if self.enabled else frozenset()
        self._keys: KeyFileVerifier | None = None
        self._passwords: PasswordFile | None = None
        self._basic_checks: asyncio.Semaphore | None = None
        if TOKEN_METHOD in self.providers:
            self._keys = KeyFileVerifier(config.token_secret_key or config.token_public_key,
                                         public_key=not config.token_secret_key, recheck_s=KEY_RECHECK_S)
        if BASIC_METHOD in self.providers:
            self._passwords = PasswordFile(config.basic_auth_file)

    def _verifier_now(self) -> TokenVerifier:
        """The verifier, with the key file read again if it changed since."""
        assert self._keys is not None
        return self._keys.current()

    def authenticate_token(self, data: bytes | str | None) -> Identity:
        claims = self._verifier_now().claims(data or b"")
        expiry = claims.get("exp")
        return Identity(claims["sub"], float(expiry) if isinstance(expiry, (int, float)) else None, TOKEN_METHOD)

    async def _authenticate_basic(self, data: bytes | str | None) -> Identity:
        assert self._passwords is not None
        credentials = data.encode() if isinstance(data, str) else (data or b"")
        if self._basic_checks is None:
            self._basic_checks = asyncio.Semaphore(BASIC_CHECKS_IN_FLIGHT_MAX)
        async with self._basic_checks:
            user = await asyncio.to_thread(self._passwords.check, credentials)
        return Identity(user, None, BASIC_METHOD)

    async def authenticate(self, method: str, data: bytes | str | None,
                           peer_certificate: dict | None = None) -> Identity:
        """The identity for ``method`` and its auth data ("" and None: nothing presented);
        ``peer_certificate``: the verified client certificate of a TLS connection."""
        assert self.enabled
        if method == NONE_METHOD or (not method and not data):
            # The credentials themselves (if any came with "none") are not looked at:
            # the client said it presents none.
            if self.config.anonymous_role:
                return Identity(self.config.anonymous_role)
            raise AuthenticationFailed(
                "authentication is required: the client presented no credentials "
                f"(auth method {method or 'absent'!r}) and this broker has no anonymous role; "
                f"configure the client with one of: {', '.join(sorted(self.providers))}")
        if method not in self.providers:
            raise AuthenticationFailed(f"unsupported authentication method {method[:METHOD_NAME_BYTES_MAX]!r} "
                                       f"(supported: {', '.join(sorted(self.providers))})")
        if method == TOKEN_METHOD:
            return self.authenticate_token(data)
        if method == BASIC_METHOD:
            return await self._authenticate_basic(data)
        assert method == TLS_METHOD
        role = certificate_common_name(peer_certificate)
        if role is None:
            raise AuthenticationFailed("tls authentication needs a client certificate with a subject CN "
                                       "(over a TLS connection that verifies it)")
        return Identity(role, None, TLS_METHOD)

    async def authenticate_http(self, authorization: str | None, peer_certificate: dict | None = None) -> Identity:
        """The identity of an HTTP request from its Authorization header (Bearer: token,
        Basic: basic) or, without one, its verified client certificate (tls)."""
        if not authorization:
            if peer_certificate and TLS_METHOD in self.providers:
                return await self.authenticate(TLS_METHOD, None, peer_certificate)
            return await self.authenticate("", None)
        scheme, _, credentials = authorization.partition(" ")
        credentials = credentials.strip()
        if scheme.lower() == "bearer" and credentials:
            return await self.authenticate(TOKEN_METHOD, credentials)
        if scheme.lower() == "basic" and credentials:
            try:
                decoded = base64.b64decode(credentials, validate=True)
            except (binascii.Error, ValueError):
                raise AuthenticationFailed("the Basic credentials are not valid base64") from None
            return await self.authenticate(BASIC_METHOD, decoded)
        raise AuthenticationFailed("the Authorization header must be 'Bearer <token>' or 'Basic <base64>'")

    def on_behalf_of(self, proxy: Identity, original_principal: str, original_method: str = "") -> Identity:
        """The identity a proxy names (CONNECT's or a lookup's ``original_principal``):
        honoured only from a role of ``proxy_roles`` (Pulsar's proxyRoles), so that no
        client can claim another's identity by talking to a broker directly."""
        if proxy.role not in self.config.proxies:
            raise AuthenticationFailed(f"role {proxy.role!r} is not a proxy role: it may not name an "
                                       "original_principal")
        if not original_principal:
            raise AuthenticationFailed("the proxy named an empty original_principal")
        return Identity(original_principal[:ROLE_BYTES_MAX], proxy.expires_at_s,
                        (original_method or proxy.method)[:METHOD_NAME_BYTES_MAX])

    async def proxied_client(self, proxy: Identity, original_principal: str, original_method: str = "",
                             original_data: str | None = None) -> Identity:
        """The identity of a proxy's CONNECT naming its client (``on_behalf_of``). When
        the proxy forwards the client's own credential (``original_auth_data``) of a
        method this broker verifies from data alone (token, basic), it is verified too:
        it must prove ``original_principal``, and its expiry is the connection's, not
        the proxy's — the client's answer to AUTH_CHALLENGE, piped through the proxy,
        renews it (Pulsar's originalAuthState). Otherwise the proxy's word stands until
        the proxy's own credential expires, and no refresh is possible (Pulsar's "cannot
        revalidate user credential when using proxy and not forwarding the credentials")."""
        identity = self.on_behalf_of(proxy, original_principal, original_method)
        method = identity.method
        if not original_data or method not in (TOKEN_METHOD, BASIC_METHOD) or method not in self.providers:
            return identity
        client = await self.authenticate(method, original_data)
        if client.role != identity.role:
            raise AuthenticationFailed("the original_auth_data the proxy forwarded proves another role than its "
                                       "original_principal")
        return client

    def still_valid(self, identity: Identity, now_s: float | None = None) -> bool:
        return identity.expires_at_s is None or identity.expires_at_s > (time.time() if now_s is None else now_s)
