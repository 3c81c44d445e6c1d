"""Basic authentication's user file: htpasswd lines ``user:hash``, as Pulsar's
AuthenticationProviderBasic reads them (its ``basicAuthConf``).

Hashes understood: bcrypt only (``$2y$`` / ``$2b$`` / ``$2a$``, what ``htpasswd -B``
writes), checked by the ``bcrypt`` package. Apache's MD5-crypt (``$apr1$``, htpasswd's
``-m`` and its default), SHA-1 (``{SHA}``, ``-s``), DES crypt and plain text are refused at
load with an error naming the line (never its content) and the command that makes a
bcrypt hash instead: those schemes are fast to brute-force, and checking them would
need either an unmaintained library or hash code of our own. (Pulsar's provider also
takes MD5-crypt; a file made for it is re-made here with ``htpasswd -B``.) Blank lines
and ``#`` comments are skipped.

The file is read again when its modification time changes (at most every
``RECHECK_S``), so users are added or removed without a restart; a file that does not
parse then leaves the previous one in force.

A bcrypt check takes tens of milliseconds by design, so ``check`` is meant to run off
the event loop (broker/authentication.py runs it in a thread, a bounded number at a
time); successful checks are remembered for ``VERIFIED_TTL_S`` as a SHA-256 of
(user, password, stored hash), at most ``VERIFIED_ENTRIES_MAX`` of them, so a client
reconnecting does not pay a bcrypt again. A changed hash in the file misses that
memory at once. No password or hash is ever logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict

import bcrypt

from common.errors import AuthenticationFailed, ConfigError
from runtime.tokens import read_key_value

log = logging.getLogger(__name__)

RECHECK_S = 2.0
# Remembered successful checks: enough for the clients of a busy broker, small in memory
# (32-byte digests).
VERIFIED_ENTRIES_MAX = 4_096
VERIFIED_TTL_S = 300.0
USER_BYTES_MAX = 256
PASSWORD_BYTES_MAX = 1_024

# The refused schemes, recognised so the error can say what was found.
_WEAK_SCHEMES = ((b"$apr1$", "Apache MD5-crypt ($apr1$, htpasswd -m)"), (b"{SHA}", "SHA-1 ({SHA}, htpasswd -s)"),
                 (b"$1$", "MD5-crypt ($1$)"))


def _is_bcrypt(stored: bytes) -> bool:
    return stored.startswith((b"$2y$", b"$2b$", b"$2a$"))


def verify(password: bytes, stored: bytes) -> bool:
    """Whether ``password`` matches the stored bcrypt hash (False for anything else)."""
    if not _is_bcrypt(stored):
        return False
    try:
        # The bcrypt package reads $2b$; $2y$ (PHP's and htpasswd's name) is the same.
        return bcrypt.checkpw(password, b"$2b$" + stored[4:])
    except ValueError:
        return False


def parse(text: bytes) -> dict[str, bytes]:
    """{user: stored hash} of an htpasswd file; ConfigError naming the line of a bad one."""
    users: dict[str, bytes] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(b"#"):
            continue
        user, separator, stored = line.partition(b":")
        if not separator or not user or not stored:
            raise ConfigError(f"basic auth file, line {number}: not 'user:hash'")
        if not _is_bcrypt(stored):
            weak = next((name for prefix, name in _WEAK_SCHEMES if stored.startswith(prefix)), None)
            found = f"a weak hash, refused: {weak}" if weak else "no bcrypt hash (plain text or DES crypt?)"
            raise ConfigError(f"basic auth file, line {number}: {found}; only bcrypt hashes are accepted: "
                              "make the line again with 'htpasswd -B <file> <user>'")
        try:
            name = user.decode()
        except UnicodeDecodeError:
            raise ConfigError(f"basic auth file, line {number}: the user name is not UTF-8") from None
        users[name] = stored
    return users


class PasswordFile:
    """The users of a basic auth file (a path, ``file:///path`` or ``data:;base64,...``),
    kept in step with the file. Thread-safe: ``check`` runs in worker threads."""

    def __init__(self, value: str) -> None:
        self._value = value
        self._path = "" if value.startswith("data:") else value.removeprefix("file://")
        self._lock = threading.Lock()
        self._mtime_ns = -1
        self._checked_at = 0.0
        self._users = self._load()
        self._verified: OrderedDict[bytes, float] = OrderedDict()

    def _load(self) -> dict[str, bytes]:
        if self._path:
            try:
                self._mtime_ns = os.stat(self._path).st_mtime_ns
            except OSError as error:
                raise ConfigError(f"cannot read basic auth file {self._path}: {error.strerror}") from None
        return parse(read_key_value(self._value))

    def _users_now(self) -> dict[str, bytes]:
        now = time.monotonic()
        with self._lock:
            if self._path and now - self._checked_at >= RECHECK_S:
                self._checked_at = now
                try:
                    if os.stat(self._path).st_mtime_ns != self._mtime_ns:
                        self._users = self._load()
                        log.info("basic auth file reloaded: path=%s users=%d", self._path, len(self._users))
                except (OSError, ConfigError) as error:
                    log.warning("basic auth file did not reload, keeping the previous one: path=%s error=%s",
                                self._path, error)
            return self._users

    def check(self, credentials: bytes) -> str:
        """The user of ``user:password`` credentials; AuthenticationFailed otherwise
        (the same message for an unknown user and a wrong password)."""
        user_bytes, separator, password = credentials.partition(b":")
        if not separator or not user_bytes:
            raise AuthenticationFailed("basic credentials must be 'user:password'")
        if len(user_bytes) > USER_BYTES_MAX or len(password) > PASSWORD_BYTES_MAX:
            raise AuthenticationFailed("basic credentials are too long")
        try:
            user = user_bytes.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("the basic user name is not UTF-8") from None
        stored = self._users_now().get(user)
        if stored is None:
            raise AuthenticationFailed("unknown user or wrong password")
        memo = hashlib.sha256(b"\x00".join((user_bytes, password, stored))).digest()
        now = time.monotonic()
        with self._lock:
            seen = self._verified.get(memo)
            if seen is not None and now - seen < VERIFIED_TTL_S:
                return user
        if not verify(password, stored):
            raise AuthenticationFailed("unknown user or wrong password")
        with self._lock:
            self._verified[memo] = now
            self._verified.move_to_end(memo)
            while len(self._verified) > VERIFIED_ENTRIES_MAX:
                self._verified.popitem(last=False)
        return user
