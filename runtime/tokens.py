"""JSON Web Tokens as Pulsar's token authentication provider reads them.

A token is a JWT whose ``sub`` claim is the role; it is signed either with a secret key
(HS256, the same key verifies) or with the private half of an RSA key pair (RS256, the
public half verifies, so brokers never hold a key that can mint tokens). ``exp``, when
present, is honoured. This is what ``pulsar tokens create`` makes, so tokens and keys
move between a Pulsar cluster and Magnetar unchanged.

Keys are named as Pulsar names them: ``file:///path`` (or a bare path) for a key file,
``data:;base64,<base64>`` for the key inline. A secret key file holds the raw key bytes
(``create-secret-key --output``); key-pair files are DER (what Pulsar writes) or PEM.

Nothing here logs, and no error message carries a token or a key: callers may log the
messages of the errors raised here as they are.
"""

from __future__ import annotations

import abc
import base64
import binascii
import logging
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

# jwt (PyJWT) and cryptography are imported where a token or key is made or checked:
# together about 0.1 CPU-s at import, paid by every bookie and broker start even where
# no authentication is configured (the test suite starts a great many of them:
# tests/integration/test_ledger_client.py alone starts 22 bookies).

from common.errors import AuthenticationFailed, ConfigError

HS256 = "HS256"
RS256 = "RS256"
ALGORITHMS = (HS256, RS256)
# Pulsar's secret keys are 256 bits (Keys.secretKeyFor(HS256)).
SECRET_KEY_BYTES = 32
# RSA keys of 2048 bits: Pulsar's default for create-key-pair.
RSA_KEY_BITS = 2048
# Tokens longer than this are refused before any decoding (a role and an expiry make
# a few hundred bytes; 16 KiB leaves room for large claim sets).
TOKEN_BYTES_MAX = 16 * 1024
# Clock skew allowed on ``exp`` between the issuer and this process.
LEEWAY_S = 0


def read_key_value(value: str) -> bytes:
    """The bytes of a key named ``file:///path``, a bare path, or ``data:;base64,...``."""
    if value.startswith("data:"):
        _, _, encoded = value.partition(",")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError("an inline key (data:...) is not valid base64") from None
    path = value[len("file://"):] if value.startswith("file://") else value
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise ConfigError(f"cannot read key file {path}: {error.strerror}") from None


def create_secret_key() -> bytes:
    return secrets.token_bytes(SECRET_KEY_BYTES)


def create_key_pair() -> tuple[bytes, bytes]:
    """(private key, public key) of a new RSA pair, DER encoded like Pulsar's
    (PKCS#8 private key, X.509 SubjectPublicKeyInfo public key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    private_der = private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    public_der = private.public_key().public_bytes(serialization.Encoding.DER,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    return private_der, public_der


def _private_key(data: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization

    try:
        if data.lstrip().startswith(b"-----"):
            return serialization.load_pem_private_key(data, password=None)
        return serialization.load_der_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ConfigError("the private key is neither a PEM nor a DER RSA private key") from None


def _public_key(data: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization

    try:
        if data.lstrip().startswith(b"-----"):
            return serialization.load_pem_public_key(data)
        return serialization.load_der_public_key(data)
    except (ValueError, TypeError):
        raise ConfigError("the public key is neither a PEM nor a DER RSA public key") from None


def _checked_secret(secret: bytes) -> bytes:
    if len(secret) < SECRET_KEY_BYTES:
        raise ConfigError(f"a secret key must have at least {SECRET_KEY_BYTES} bytes")
    return secret


@dataclass(frozen=True)
class TokenSigner:
    """Makes tokens: with a secret key (HS256) or a private key (RS256)."""

    algorithm: str
    key: Any

    @classmethod
    def with_secret_key(cls, secret: bytes) -> "TokenSigner":
        return cls(HS256, _checked_secret(secret))

    @classmethod
    def with_private_key(cls, private_key: bytes) -> "TokenSigner":
        return cls(RS256, _private_key(private_key))

    def create(self, subject: str, *, expiry_s: float | None = None, now_s: float | None = None) -> str:
        if not subject:
            raise ConfigError("a token needs a subject (the role)")
        claims: dict[str, Any] = {"sub": subject}
        if expiry_s is not None:
            claims["exp"] = int((time.time() if now_s is None else now_s) + expiry_s)
        import jwt

        return jwt.encode(claims, self.key, algorithm=self.algorithm)


@dataclass(frozen=True)
class TokenVerifier:
    """Checks tokens: the signature with the secret key or the public key, then the
    expiry; returns the role (``sub``)."""

    algorithm: str
    key: Any

    @classmethod
    def with_secret_key(cls, secret: bytes) -> "TokenVerifier":
        return cls(HS256, _checked_secret(secret))

    @classmethod
    def with_public_key(cls, public_key: bytes) -> "TokenVerifier":
        return cls(RS256, _public_key(public_key))

    def claims(self, token: str | bytes, *, now_s: float | None = None) -> dict[str, Any]:
        """The verified claims. AuthenticationFailed for anything else; the message
        says why, never what the token was."""
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise AuthenticationFailed("the token is not ASCII") from None
        if not token:
            raise AuthenticationFailed("no token")
        if len(token) > TOKEN_BYTES_MAX:
            raise AuthenticationFailed(f"the token is longer than {TOKEN_BYTES_MAX} bytes")
        import jwt

        try:
            claims = jwt.decode(token, self.key, algorithms=[self.algorithm], leeway=LEEWAY_S,
                                options={"require": ["sub"], "verify_exp": now_s is None})
        except jwt.ExpiredSignatureError:
            raise AuthenticationFailed("the token has expired") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationFailed("the token's signature does not verify") from None
        except jwt.InvalidAlgorithmError:
            raise AuthenticationFailed(f"the token is not signed with {self.algorithm}") from None
        except jwt.MissingRequiredClaimError:
            raise AuthenticationFailed("the token has no subject (sub)") from None
        except jwt.PyJWTError as error:
            raise AuthenticationFailed(f"the token is not valid: {type(error).__name__}") from None
        except (ValueError, TypeError):
            raise AuthenticationFailed("the token is not valid") from None
        if now_s is not None and "exp" in claims and float(claims["exp"]) <= now_s:
            raise AuthenticationFailed("the token has expired")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise AuthenticationFailed("the token's subject (sub) is not a role name")
        return claims

    def role(self, token: str | bytes) -> str:
        return self.claims(token)["sub"]


def unverified_parts(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, claims) of a token without checking it (``magnetar tokens show``)."""
    import jwt

    try:
        return jwt.get_unverified_header(token), jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as error:
        raise AuthenticationFailed(f"not a token: {type(error).__name__}") from None


def expires_at_s(claims: dict[str, Any]) -> float | None:
    value = claims.get("exp")
    return float(value) if isinstance(value, (int, float)) else None


log = logging.getLogger(__name__)

# How often a KeyFileVerifier looks at its key file's modification time (a stat).
KEY_RECHECK_S = 2.0


class _ReloadedFile(abc.ABC):
    """A value read from a file and read again when the file changes (a mounted Secret
    replaced in place), so a process uses a renewed key or token without a restart.
    The file is looked at (one stat) at most every ``recheck_s``; a file that cannot be
    read or parsed at that moment (being replaced) keeps the value in use until it is
    whole. No path (an inline value) never changes. ``generation`` counts the values
    loaded. Subclasses say what they hold (``what``, for logs) and how to read it."""

    what = "file"

    def __init__(self, path: str, *, recheck_s: float | None, clock: Callable[[], float]) -> None:
        self.path = path
        self._recheck_s = KEY_RECHECK_S if recheck_s is None else recheck_s
        self._clock = clock
        self._checked_at = clock()
        self._mtime_ns = -1
        self.generation = 0
        self._value = self._reload()

    @abc.abstractmethod
    def _read(self):
        """The value, read now; ConfigError when the file does not hold a good one."""

    def _reload(self):
        mtime_ns = -1
        if self.path:
            try:
                mtime_ns = os.stat(self.path).st_mtime_ns
            except OSError as error:
                raise ConfigError(f"cannot read {self.what} {self.path}: {error.strerror}") from None
        value = self._read()
        self._mtime_ns = mtime_ns
        self.generation += 1
        return value

    def _current(self):
        now = self._clock()
        if self.path and now - self._checked_at >= self._recheck_s:
            self._checked_at = now
            try:
                if os.stat(self.path).st_mtime_ns != self._mtime_ns:
                    self._value = self._reload()
                    log.info("%s read again: path=%s generation=%d", self.what, self.path, self.generation)
            except (OSError, ConfigError) as error:
                log.info("%s not readable now, keeping the one in use: path=%s error=%s", self.what, self.path,
                         error)
        return self._value


class KeyFileVerifier(_ReloadedFile):
    """A TokenVerifier whose key (``file:///path`` or a bare path, read again when it
    changes; ``data:`` inline, never) is the one in the file now. ``generation`` tells a
    holder of verified-token caches when to forget them."""

    what = "token key"

    def __init__(self, value: str, *, public_key: bool, recheck_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._value_text = value
        self._public_key = public_key
        super().__init__("" if value.startswith("data:") else value.removeprefix("file://"),
                         recheck_s=recheck_s, clock=clock)

    def _read(self) -> TokenVerifier:
        data = read_key_value(self._value_text)
        return TokenVerifier.with_public_key(data) if self._public_key else TokenVerifier.with_secret_key(data)

    def current(self) -> TokenVerifier:
        return self._current()


class TokenFile(_ReloadedFile):
    """A token kept in a file, as it is now (an empty file keeps the one in use)."""

    what = "token file"

    def __init__(self, path: str, *, recheck_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(path, recheck_s=recheck_s, clock=clock)

    def _read(self) -> str:
        try:
            with open(self.path, encoding="ascii") as handle:
                token = handle.read().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read token file {self.path}: {error}") from None
        if not token:
            raise ConfigError(f"token file {self.path} is empty")
        return token

    def current(self) -> str:
        return self._current()
