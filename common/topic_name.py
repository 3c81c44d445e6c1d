"""Topic names, as Pulsar spells them. Pure.

    persistent://tenant/namespace/local-name[-partition-N]

Short forms are completed the way Pulsar's clients do: ``my-topic`` is
``persistent://public/default/my-topic`` and ``tenant/ns/my-topic`` gets the
``persistent://`` domain. Only the persistent domain is served. A partitioned topic
``t`` with N partitions is N topics ``t-partition-0 .. t-partition-(N-1)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from common.errors import InvalidArgument, NotAllowed

PERSISTENT = "persistent"
NON_PERSISTENT = "non-persistent"
PARTITION_SUFFIX = "-partition-"
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"

# Pulsar allows these characters in tenant and namespace names.
_NAME_PART = re.compile(r"^[-=:.\w]+$")
# Local names may not be empty and may not hold '/', control characters or whitespace
# (a space, a tab, U+00A0, ...): a name with a space is almost always a quoting mistake
# in a shell, it cannot be typed back into a URL or a command line as it was printed,
# and Pulsar's own tools split on whitespace. Everything else (``:``, ``%``, ``?``,
# ``#``, non-ASCII letters) is allowed and percent-encoded where a name becomes a path.
_LOCAL_NAME_BAD = re.compile(r"[\x00-\x1f\x7f/\s]")
_PARTITIONED = re.compile(r"^(?P<base>.+)-partition-(?P<index>0|[1-9][0-9]*)$")
NAME_BYTES_MAX = 1024


@dataclass(frozen=True, slots=True)
class NamespaceName:
    tenant: str
    namespace: str

    def __str__(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @classmethod
    def parse(cls, text: str) -> "NamespaceName":
        parts = text.split("/")
        if len(parts) != 2:
            raise InvalidArgument(f"namespace must be tenant/namespace: {text!r}")
        validate_name_part(parts[0], "tenant")
        validate_name_part(parts[1], "namespace")
        return cls(parts[0], parts[1])


@dataclass(frozen=True, slots=True)
class TopicName:
    domain: str
    tenant: str
    namespace: str
    local_name: str

    @classmethod
    def parse(cls, text: str) -> "TopicName":
        if not text or len(text.encode()) > NAME_BYTES_MAX:
            raise InvalidArgument(f"topic name must be 1..{NAME_BYTES_MAX} bytes")
        if "://" in text:
            domain, _, rest = text.partition("://")
        else:
            domain, rest = PERSISTENT, text
            if "/" not in rest:
                rest = f"{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}/{rest}"
        if domain == NON_PERSISTENT:
            # NotAllowed, not InvalidArgument: the official C++-based clients retry a lookup
            # answered InvalidTopicName until their operation timeout (30 s by default),
            # while NotAllowedError fails at once.
            raise NotAllowed("non-persistent:// topics are not served by Magnetar (only persistent://)")
        if domain != PERSISTENT:
            raise InvalidArgument(f"only persistent:// topics are served, not {domain}://")
        parts = rest.split("/", 2)
        if len(parts) != 3:
            raise InvalidArgument(f"topic name must be persistent://tenant/namespace/topic: {text!r}")
        tenant, namespace, local_name = parts
        validate_name_part(tenant, "tenant")
        validate_name_part(namespace, "namespace")
        if not local_name:
            raise InvalidArgument(f"topic name {text!r} has an empty local name")
        if bad := _LOCAL_NAME_BAD.search(local_name):
            raise InvalidArgument(f"bad topic name {local_name!r}: it holds {bad.group()!r}; a topic's local name "
                                  "may not hold whitespace, control characters or '/'")
        return cls(domain, tenant, namespace, local_name)

    @classmethod
    def from_parts(cls, tenant: str, namespace: str, local_name: str) -> "TopicName":
        return cls.parse(f"{PERSISTENT}://{tenant}/{namespace}/{local_name}")

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"

    @property
    def namespace_name(self) -> NamespaceName:
        return NamespaceName(self.tenant, self.namespace)

    @property
    def partition_index(self) -> int:
        """The partition this topic is (-1 if it is not a partition)."""
        match = _PARTITIONED.match(self.local_name)
        return int(match.group("index")) if match else -1

    @property
    def is_partition(self) -> bool:
        return self.partition_index >= 0

    @property
    def partitioned_parent(self) -> "TopicName":
        """For ``t-partition-3`` the topic ``t``; a non-partition returns itself."""
        match = _PARTITIONED.match(self.local_name)
        if not match:
            return self
        return TopicName(self.domain, self.tenant, self.namespace, match.group("base"))

    def partition(self, index: int) -> "TopicName":
        assert index >= 0
        return TopicName(self.domain, self.tenant, self.namespace, f"{self.local_name}{PARTITION_SUFFIX}{index}")

    @property
    def key_path(self) -> str:
        """A metadata key path for this topic (the local name percent-encoded so any
        name is one key segment)."""
        return f"{self.domain}/{self.tenant}/{self.namespace}/{quote(self.local_name, safe='')}"

    @property
    def rest_path(self) -> str:
        """The path Pulsar's admin REST uses: persistent/tenant/ns/encoded-name."""
        return self.key_path


def validate_name_part(text: str, what: str) -> None:
    # fullmatch, not match: the pattern's "$" also matches before a trailing newline.
    if not text or not _NAME_PART.fullmatch(text):
        raise InvalidArgument(f"bad {what} name {text!r}")
