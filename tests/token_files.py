"""Token-authentication files for tests that start secured servers: a fresh secret key
written where a server's ``--token-secret-key file://...`` reads it, the signer of that
key, and token files for ``--broker-token-file``-style flags."""

from __future__ import annotations

import os

from runtime.tokens import TokenSigner, create_secret_key


def secret_key_file(directory: str) -> tuple[str, TokenSigner]:
    """(path of a new secret key written in ``directory``, a signer with it)."""
    key = create_secret_key()
    path = os.path.join(directory, "secret.key")
    with open(path, "wb") as handle:
        handle.write(key)
    return path, TokenSigner.with_secret_key(key)


def token_file(directory: str, name: str, signer: TokenSigner, role: str) -> str:
    """The path of file ``name`` in ``directory`` holding a token of ``role``."""
    path = os.path.join(directory, name)
    with open(path, "w") as handle:
        handle.write(signer.create(role))
    return path
