"""Who may talk to a bookie: service tokens on every RPC, TLS on the gRPC port.

With ``authentication_enabled`` every RPC (each add stream, each read, fence, LAC and
info call) must carry gRPC metadata ``authorization: Bearer <token>``, a token made
with the cluster's token key (runtime/tokens.py) whose role is one of
``allowed_roles`` (the brokers' service role); anything else is answered
UNAUTHENTICATED (no token, bad token) or PERMISSION_DENIED (a role not allowed) before
the servicer runs, so an unauthenticated peer can neither add nor read. The last
token verified is remembered until its expiry, so a broker's steady stream of reads
costs one signature check, not one per call. The token key is read again when its file
changes (common/tokens.KeyFileVerifier, looked at every few seconds), and the
remembered token is then checked again under the new key: a key rotated by replacing
the file (a mounted Secret) takes effect without a restart.

TLS (``BookieSecurityConfig.tls``): the gRPC port serves TLS with the certificate
files, read again on a handshake after they changed (grpc's dynamic server
credentials), optionally requiring client certificates signed by the trust file
(mutual TLS).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import grpc

from common.errors import AuthenticationFailed, ConfigError
from runtime.tls import TlsConfig
from runtime.tokens import KeyFileVerifier

log = logging.getLogger(__name__)

METADATA_KEY = "authorization"


@dataclass(frozen=True)
class BookieSecurityConfig:
    authentication_enabled: bool = False
    # HS256 secret key or RS256 public key (file:///path or data:;base64,...).
    token_secret_key: str = ""
    token_public_key: str = ""
    # Comma-separated roles that may add and read (the brokers' service role).
    allowed_roles: str = ""
    tls: TlsConfig = field(default_factory=TlsConfig)

    def __post_init__(self) -> None:
        if self.authentication_enabled:
            if bool(self.token_secret_key) == bool(self.token_public_key):
                raise ConfigError("bookie authentication needs exactly one of token_secret_key and token_public_key")
            if not self.roles:
                raise ConfigError("bookie authentication needs allowed_roles (the brokers' service role)")

    @property
    def roles(self) -> frozenset[str]:
        return frozenset(role.strip() for role in self.allowed_roles.split(",") if role.strip())

    def __repr__(self) -> str:
        return (f"BookieSecurityConfig(authentication_enabled={self.authentication_enabled}, "
                f"allowed_roles={self.allowed_roles!r}, tls={self.tls!r})")


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, config: BookieSecurityConfig) -> None:
        # Read again when its file changes: a rotated key takes effect without a restart.
        self._keys = KeyFileVerifier(config.token_secret_key or config.token_public_key,
                                     public_key=not config.token_secret_key)
        self._roles = config.roles
        # (token, expires at or None, key generation): the last one that verified,
        # forgotten when the key changes (a token of the old key is checked again).
        self._verified: tuple[str, float | None, int] | None = None
        self._refusing = False

    def _check(self, metadata) -> tuple[grpc.StatusCode, str] | None:
        token = ""
        for key, value in metadata or ():
            if key == METADATA_KEY and isinstance(value, str) and value.startswith("Bearer "):
                token = value[len("Bearer "):].strip()
        return self.check_token(token)

    def check_token(self, token: str) -> tuple[grpc.StatusCode, str] | None:
        """None when ``token`` may add and read; else the status and why (never the
        token). Also what the add socket asks of its writer's hello."""
        if not token:
            return grpc.StatusCode.UNAUTHENTICATED, "a service token is required"
        verifier = self._keys.current()
        generation = self._keys.generation
        verified = self._verified
        if verified is not None and verified[0] == token and verified[2] == generation \
                and (verified[1] is None or verified[1] > time.time()):
            return None
        try:
            claims = verifier.claims(token)
        except AuthenticationFailed as error:
            return grpc.StatusCode.UNAUTHENTICATED, error.message
        if claims["sub"] not in self._roles:
            return grpc.StatusCode.PERMISSION_DENIED, f"role {claims['sub']!r} may not use this bookie"
        expiry = claims.get("exp")
        self._verified = (token, float(expiry) if isinstance(expiry, (int, float)) else None, generation)
        return None

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        refusal = self._check(handler_call_details.invocation_metadata)
        if refusal is None or handler is None:
            self._refusing = False
            return handler
        if not self._refusing:   # once per episode, never the token
            self._refusing = True
            log.warning("refusing an RPC: method=%s status=%s reason=%s", handler_call_details.method,
                        refusal[0].name, refusal[1])
        code, details = refusal

        async def abort_unary(request, context):
            await context.abort(code, details)

        async def abort_stream(request_iterator, context):
            await context.abort(code, details)
            yield  # never reached: makes this an async generator, as the handler kind wants

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(abort_stream, handler.request_deserializer,
                                                         handler.response_serializer)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(abort_unary, handler.request_deserializer,
                                                        handler.response_serializer)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(abort_stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(abort_unary, handler.request_deserializer,
                                                   handler.response_serializer)


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def server_credentials(config: TlsConfig) -> grpc.ServerCredentials:
    """TLS credentials whose certificate is read again when its files change."""
    assert config.enabled

    def stamp() -> tuple:
        return tuple((os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in config.files())

    def configuration() -> grpc.ServerCertificateConfiguration:
        root = _read(config.trust_certs_file) if config.trust_certs_file else None
        return grpc.ssl_server_certificate_configuration(((_read(config.key_file), _read(config.cert_file)),),
                                                         root_certificates=root)

    try:
        initial = configuration()
        state = {"stamp": stamp()}
    except OSError as error:
        raise ConfigError(f"cannot read the bookie's TLS files: {error}") from None

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            now = stamp()
            if now == state["stamp"]:
                return None
            fresh = configuration()
        except OSError:
            return None   # a file being replaced: keep the current certificate
        state["stamp"] = now
        log.info("bookie TLS certificate reloaded: cert_file=%s", config.cert_file)
        return fresh

    return grpc.dynamic_ssl_server_credentials(initial, fetch,
                                               require_client_authentication=config.require_client_cert)
