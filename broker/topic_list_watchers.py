"""Topic-list watchers (WATCH_TOPIC_LIST): a pattern consumer is told when a topic that
matches its pattern appears in, or disappears from, its namespace, instead of waiting
for its next GET_TOPICS_OF_NAMESPACE poll.

Theory of operation:
- A namespace's topics are the keys of its managed ledgers in etcd (the same list
  GET_TOPICS_OF_NAMESPACE answers from). One ``PrefixCache`` per watched namespace
  mirrors that prefix with an etcd watch; it is shared by every watcher of the
  namespace on this broker and stopped when the last one closes (reference count).
- A key that appears is a new topic, a key that vanishes a deleted one; a key that
  changes (a ledger rolled over) is neither. Each watcher keeps the set of topics that
  match its pattern and, on a change that concerns it, is sent a WATCH_TOPIC_UPDATE
  with what came and went and the hash of its whole list after the change (the same
  hash GET_TOPICS_OF_NAMESPACE gives, ``topic_list.topics_hash``).
- Patterns follow ``topic_list.answer``: the scheme is removed and the whole name must
  match. A pattern this broker cannot apply (too long, does not compile) is refused,
  since a watcher must be able to tell which topics concern it.
- Bounded: at most ``watchers_per_connection_max`` watchers per connection; a watcher
  belongs to its connection and is closed with it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import unquote

from broker.topic_list import PATTERN_CHARS_MAX, topics_hash
from common.errors import InvalidArgument, MagnetarError, TooManyRequests
from common.topic_name import NamespaceName
from metadata import keys
from metadata.prefix_cache import PrefixCache
from metadata.store import MetadataStore, Record

log = logging.getLogger(__name__)

_SCHEME = re.compile(r"^[a-z\-]+://")

# (new topics, deleted topics, hash of the watcher's list after the change)
UpdateSink = Callable[[list[str], list[str], str], None]


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The watcher's pattern, compiled as GET_TOPICS_OF_NAMESPACE applies it; raises
    InvalidArgument when it cannot be applied."""
    if not pattern or len(pattern) > PATTERN_CHARS_MAX:
        raise InvalidArgument(f"a topics pattern must have 1 to {PATTERN_CHARS_MAX} characters")
    try:
        return re.compile(_SCHEME.sub("", pattern, count=1))
    except re.error as error:
        raise InvalidArgument(f"topics pattern does not compile: {error}") from None


def _matches(compiled: re.Pattern[str], topic: str) -> bool:
    return compiled.fullmatch(_SCHEME.sub("", topic, count=1)) is not None


@dataclass(eq=False)
class TopicListWatcher:
    namespace: NamespaceName
    compiled: re.Pattern[str]
    sink: UpdateSink
    topics: set[str] = field(default_factory=set)

    @property
    def topics_hash(self) -> str:
        return topics_hash(list(self.topics))

    def apply(self, new_topics: list[str], deleted_topics: list[str]) -> None:
        """Pure step: updates the watcher's set and tells its sink what concerns it."""
        came = [t for t in new_topics if t not in self.topics and _matches(self.compiled, t)]
        went = [t for t in deleted_topics if t in self.topics]
        if not came and not went:
            return
        self.topics.update(came)
        self.topics.difference_update(went)
        assert all(_matches(self.compiled, t) for t in came)
        self.sink(sorted(came), sorted(went), self.topics_hash)


class _NamespaceMirror:
    """The watched managed-ledger keys of one namespace, and its watchers."""

    def __init__(self, store: MetadataStore, namespace: NamespaceName) -> None:
        self.namespace = namespace
        self.prefix = keys.managed_ledgers_of_namespace(namespace.tenant, namespace.namespace)
        self.watchers: set[TopicListWatcher] = set()
        self.cache = PrefixCache(store, self.prefix, self._on_change)
        self.started = False

    def topic_of(self, key: str) -> str:
        assert key.startswith(self.prefix), (key, self.prefix)
        return f"persistent://{self.namespace}/{unquote(key[len(self.prefix):])}"

    def topics(self) -> list[str]:
        return [self.topic_of(key) for key in self.cache.records]

    def _on_change(self, key: str, old: Record | None, new: Record | None) -> None:
        if not self.started:
            return   # the first listing: nobody is told of what was there already
        if old is None and new is not None:
            came, went = [self.topic_of(key)], []
        elif old is not None and new is None:
            came, went = [], [self.topic_of(key)]
        else:
            return   # a rewrite of an existing topic's record (a rollover): no news
        for watcher in list(self.watchers):
            watcher.apply(came, went)


class TopicListWatchers:
    """Every topic-list watcher of one broker, with one etcd mirror per namespace."""

    def __init__(self, store: MetadataStore, watchers_per_connection_max: int) -> None:
        assert watchers_per_connection_max > 0
        self._store = store
        self.watchers_per_connection_max = watchers_per_connection_max
        self._mirrors: dict[NamespaceName, _NamespaceMirror] = {}
        # Opening a mirror awaits etcd: watchers of one namespace arriving together
        # share the first one's opening.
        self._opening: dict[NamespaceName, asyncio.Future[_NamespaceMirror]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def namespaces_watched(self) -> int:
        return len(self._mirrors)

    async def watch(self, namespace: NamespaceName, pattern: str, sink: UpdateSink,
                    watchers_on_connection: int) -> TopicListWatcher:
        """A watcher of ``namespace`` for ``pattern``, holding the topics that match now
        (``watcher.topics``); later changes go to ``sink``."""
        if watchers_on_connection >= self.watchers_per_connection_max:
            raise TooManyRequests(f"more than {self.watchers_per_connection_max} topic-list watchers "
                                  "on this connection")
        compiled = compile_pattern(pattern)
        mirror = await self._mirror(namespace)
        watcher = TopicListWatcher(namespace, compiled, sink,
                                   {t for t in mirror.topics() if _matches(compiled, t)})
        mirror.watchers.add(watcher)
        return watcher

    async def _mirror(self, namespace: NamespaceName) -> _NamespaceMirror:
        mirror = self._mirrors.get(namespace)
        if mirror is not None:
            return mirror
        opening = self._opening.get(namespace)
        if opening is not None:
            return await asyncio.shield(opening)
        future: asyncio.Future[_NamespaceMirror] = asyncio.get_running_loop().create_future()
        self._opening[namespace] = future
        mirror = _NamespaceMirror(self._store, namespace)
        try:
            await mirror.cache.start()
            mirror.started = True
        except BaseException as error:
            await mirror.cache.close()
            if isinstance(error, MagnetarError):
                future.set_exception(error)
                future.exception()   # retrieved: the waiters (if any) re-raise it
            else:
                future.cancel()
            raise
        finally:
            del self._opening[namespace]
        self._mirrors[namespace] = mirror
        future.set_result(mirror)
        log.info("topic-list mirror opened: namespace=%s", namespace)
        return mirror

    def unwatch(self, watcher: TopicListWatcher) -> None:
        """Forgets ``watcher`` (synchronous, so a lost connection can call it); the
        namespace's mirror stops when its last watcher goes, in a task this registry
        owns and ``close`` awaits."""
        mirror = self._mirrors.get(watcher.namespace)
        if mirror is None or watcher not in mirror.watchers:
            return
        mirror.watchers.discard(watcher)
        if not mirror.watchers:
            del self._mirrors[watcher.namespace]
            task = asyncio.get_running_loop().create_task(mirror.cache.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            log.info("topic-list mirror closed: namespace=%s", watcher.namespace)

    async def close(self) -> None:
        mirrors, self._mirrors = list(self._mirrors.values()), {}
        for mirror in mirrors:
            mirror.watchers.clear()
            await mirror.cache.close()
        await asyncio.gather(*self._closing, return_exceptions=True)
