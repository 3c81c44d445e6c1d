"""The topic list a pattern consumer asks for (GET_TOPICS_OF_NAMESPACE), as Pulsar
answers it: the namespace's persistent topics, filtered by the client's pattern when it
sends one, with a hash of the answer so a client that already holds that list is told
"unchanged" instead of receiving it again. Pure.

- Filtering: the pattern (and each topic name) is taken without its ``persistent://``
  scheme and must match the whole name (Java's ``Matcher.matches``). A pattern that is
  too long or does not compile is not applied: the whole list goes back with
  ``filtered`` false, and the client filters it itself (what Pulsar does for patterns
  it cannot take).
- Hash: CRC32C over the sorted names, each followed by a newline, as 8 hex digits. It
  is only compared with what this broker computed before, so it need not equal
  Pulsar's own digest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import crc32c

# Longer patterns are not applied on the broker (bounds the work one request causes).
PATTERN_CHARS_MAX = 1000
_SCHEME = re.compile(r"^[a-z\-]+://")


@dataclass(frozen=True)
class TopicListAnswer:
    topics: list[str]
    filtered: bool
    topics_hash: str
    changed: bool


def topics_hash(topics: list[str]) -> str:
    digest = 0
    for name in sorted(topics):
        digest = crc32c.crc32c(name.encode() + b"\n", digest)
    return f"{digest:08x}"


def _without_scheme(name: str) -> str:
    return _SCHEME.sub("", name, count=1)


def answer(topics: list[str], pattern: str | None, client_hash: str | None) -> TopicListAnswer:
    filtered = False
    if pattern:
        compiled = None
        if len(pattern) <= PATTERN_CHARS_MAX:
            try:
                compiled = re.compile(_without_scheme(pattern))
            except re.error:
                compiled = None
        if compiled is not None:
            topics = [t for t in topics if compiled.fullmatch(_without_scheme(t))]
            filtered = True
    digest = topics_hash(topics)
    if client_hash is not None and client_hash == digest:
        return TopicListAnswer([], filtered, digest, changed=False)
    return TopicListAnswer(sorted(topics), filtered, digest, changed=True)
