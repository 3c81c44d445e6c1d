"""Who a client is: the broker's authentication, off unless configured.

With authentication on, every binary-protocol connection proves a role in CONNECT
(auth method ``token``, the JWT as auth data: what the official clients send for
``AuthenticationToken``) and every HTTP request in ``Authorization: Bearer <token>``.
A client that presents nothing gets the anonymous role if one is configured, and is
refused otherwise. The role is the token's ``sub`` (common/tokens.py).

Tokens are checked against a secret key (HS256) or a public key (RS256), read from
the key value given (``file:///path`` or ``data:;base64,...``). A key file is read
again when its modification time changes, so a key is rotated without a restart
(checked at most every ``KEY_RECHECK_S``).

Nothing here logs a token or a key: errors name what was wrong, never the value.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from common.errors import AuthenticationFailed, ConfigError
from common.tokens import TokenVerifier, read_key_value

# The auth method name the official clients send with AuthenticationToken.
TOKEN_METHOD = "token"
# How often a key file's modification time is looked at (a stat per this, not per check).
KEY_RECHECK_S = 2.0


@dataclass(frozen=True)
class AuthConfig:
    # Clients must prove a role (CONNECT auth data, HTTP Authorization: Bearer).
    authentication_enabled: bool = False
    # Roles are checked against superusers, tenant admins and namespace permissions.
    # Needs authentication (a role to check).
    authorization_enabled: bool = False
    # Comma-separated roles that may do everything (Pulsar's superUserRoles).
    superuser_roles: str = ""
    # The token key: a secret key (HS256) or a public key (RS256), as file:///path or
    # data:;base64,... (Pulsar's tokenSecretKey / tokenPublicKey). Exactly one with
    # authentication on.
    token_secret_key: str = ""
    token_public_key: str = ""
    # The role of a client that presents no credentials ("": such clients are refused).
    anonymous_role: str = ""
    # How often connected producers and consumers are checked against their role's
    # current permissions and their token's expiry: a revoke on another broker or an
    # expired token closes them within this (a revoke on this broker acts at once).
    permission_check_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.authorization_enabled and not self.authentication_enabled:
            raise ConfigError("authorization_enabled needs authentication_enabled (a role to authorize)")
        if self.authentication_enabled and bool(self.token_secret_key) == bool(self.token_public_key):
            raise ConfigError("with authentication on, give exactly one of token_secret_key and token_public_key")
        if not 0.05 <= self.permission_check_interval_s <= 3600:
            raise ConfigError("permission_check_interval_s must be in [0.05, 3600]")
        if self.authorization_enabled and not self.superusers:
            raise ConfigError("with authorization on, superuser_roles must name at least one role")

    @property
    def superusers(self) -> frozenset[str]:
        return frozenset(role.strip() for role in self.superuser_roles.split(",") if role.strip())

    def __repr__(self) -> str:
        # Logged at start: key values may be inline (data:...), so only say which is set.
        return (f"AuthConfig(authentication_enabled={self.authentication_enabled}, "
                f"authorization_enabled={self.authorization_enabled}, superuser_roles={self.superuser_roles!r}, "
                f"token_key={'secret' if self.token_secret_key else 'public' if self.token_public_key else 'none'}, "
                f"anonymous_role={self.anonymous_role!r}, "
                f"permission_check_interval_s={self.permission_check_interval_s})")


@dataclass(frozen=True)
class Identity:
    role: str
    # When its credential stops being valid (seconds since the epoch); None: never.
    expires_at_s: float | None = None


class Authenticator:
    """Turns credentials into an Identity (AuthenticationFailed otherwise)."""

    def __init__(self, config: AuthConfig) -> None:
        self.config = config
        self.enabled = config.authentication_enabled
        self._verifier: TokenVerifier | None = None
        self._key_path = ""
        self._key_mtime_ns = -1
        self._checked_at = 0.0
        if self.enabled:
            self._load_key()

    def _key_value(self) -> str:
        return self.config.token_secret_key or self.config.token_public_key

    def _load_key(self) -> None:
        value = self._key_value()
        data = read_key_value(value)
        if value.startswith("data:"):
            self._key_path = ""
        else:
            self._key_path = value[len("file://"):] if value.startswith("file://") else value
            self._key_mtime_ns = os.stat(self._key_path).st_mtime_ns
        self._verifier = (TokenVerifier.with_secret_key(data) if self.config.token_secret_key
                          else TokenVerifier.with_public_key(data))

    def _verifier_now(self) -> TokenVerifier:
        """The verifier, with the key file read again if it changed since."""
        now = time.monotonic()
        if self._key_path and now - self._checked_at >= KEY_RECHECK_S:
            self._checked_at = now
            try:
                mtime_ns = os.stat(self._key_path).st_mtime_ns
                if mtime_ns != self._key_mtime_ns:
                    self._load_key()
            except (OSError, ConfigError):
                pass   # a key file being replaced: keep the key we have until it is whole
        assert self._verifier is not None
        return self._verifier

    def authenticate(self, method: str, data: bytes | str | None) -> Identity:
        """The identity for ``method`` and its auth data ("" and None: nothing presented)."""
        assert self.enabled
        if not method and not data:
            if self.config.anonymous_role:
                return Identity(self.config.anonymous_role)
            raise AuthenticationFailed("authentication is required: no credentials were presented")
        if method != TOKEN_METHOD:
            raise AuthenticationFailed(f"unsupported authentication method {method[:64]!r} (supported: token)")
        claims = self._verifier_now().claims(data or b"")
        expiry = claims.get("exp")
        return Identity(claims["sub"], float(expiry) if isinstance(expiry, (int, float)) else None)

    def authenticate_http(self, authorization: str | None) -> Identity:
        """The identity of an HTTP request from its Authorization header."""
        if not authorization:
            return self.authenticate("", None)
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise AuthenticationFailed("the Authorization header must be 'Bearer <token>'")
        return self.authenticate(TOKEN_METHOD, credentials.strip())

    def still_valid(self, identity: Identity, now_s: float | None = None) -> bool:
        return identity.expires_at_s is None or identity.expires_at_s > (time.time() if now_s is None else now_s)
