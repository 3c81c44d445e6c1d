"""Namespace policy changes applied when they happen, not at the next poll.

A namespace's policies live in one etcd key (``/namespaces/<tenant>/<ns>/policies``).
Every broker caches them for a few seconds (broker/resources.py), and what a loaded
topic does with a policy was applied when a producer registered or at the next policy
check (every ``policy_check_interval_s``): a change made through another broker, or
one that a topic acts on by itself (deduplication), took up to the cache's TTL plus a
check interval to arrive. So ``set-deduplication --enable`` and then an idempotent
produce through the gateway was refused as "deduplication is off" for 5-15 s.

Theory of operation: one task per broker watches the ``/namespaces/`` prefix from the
revision of a listing (nothing missed after it). On a change of a namespace's policies
key it drops that namespace's cached policies (every later read is fresh) and applies
the new deduplication setting to the namespace's loaded topics at once (turning it on
restores the producers' last sequence ids before the next message is stored), and
wakes the broker's policy pass (rate limits; the other policies are read fresh at
their next use). When the watch breaks or etcd
compacted its history (a ``reset``), the whole cache is dropped and every loaded topic
is brought in line, then the watch starts again from a new listing: a change is never
lost, at worst applied twice, and applying is idempotent. The periodic checks stay as
they were; this only makes changes arrive sooner.

Topics' own policies (``/topic-policies/...``, broker/topic_policies.py) are followed the
same way by a second watch (``follow_topic_policies``): a change drops that topic's
cached policies and wakes the policy pass, so the broker serving a topic applies a
change made through any broker (its rate limits, quotas, TTL) at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

from common.errors import MagnetarError
from common.topic_name import NamespaceName
from metadata import keys

log = logging.getLogger(__name__)

# Pause after the watch failed (etcd away) before listing and watching again; the
# watch itself has already retried its connection for its own bounded time.
RESTART_PAUSE_S = 1.0
_POLICIES_SUFFIX = "/policies"


def namespace_of_policies_key(key: str) -> NamespaceName | None:
    """The namespace whose policies ``key`` holds; None for any other key under the
    prefix (a namespace's bundles)."""
    if not key.startswith(keys.NAMESPACES) or not key.endswith(_POLICIES_SUFFIX):
        return None
    parts = key[len(keys.NAMESPACES):-len(_POLICIES_SUFFIX)].split("/")
    if len(parts) != 2 or not all(parts):
        return None
    return NamespaceName(parts[0], parts[1])


async def apply_to_topics(resources, topics: Iterable, namespace: NamespaceName | None) -> int:
    """Applies the current deduplication policy to the loaded ``topics`` of
    ``namespace`` (all of them when None); how many were brought in line."""
    applied = 0
    for topic in topics:
        if topic.closing or (namespace is not None and topic.name.namespace_name != namespace):
            continue
        try:
            policies = await resources.policies(topic.name.namespace_name)
            await topic.set_deduplication(bool(policies.deduplicationEnabled))
            applied += 1
        except MagnetarError as error:
            # The periodic checks and the next producer apply it later.
            log.warning("policy change not applied: topic=%s error=%s", topic.full_name, error)
    return applied


async def follow(store, resources, loaded_topics: Callable[[], list],
                 on_change: Callable[[], None] | None = None) -> None:
    """Runs until cancelled (the broker's background task set owns it). ``on_change``
    is called after a namespace's policies changed (the broker wakes its policy pass,
    which applies the rate limits)."""
    failing = False
    while True:
        try:
            _, revision = await store.get_prefix_at(keys.NAMESPACES)
            if failing:
                log.info("namespace policy watch running again")
                failing = False
            resources.forget_policies()
            await apply_to_topics(resources, loaded_topics(), None)
            watch = store.watch_prefix(keys.NAMESPACES, start_version=revision)
            try:
                async for event in watch:
                    if event.kind == "reset":
                        break                   # history compacted: list and start again
                    namespace = namespace_of_policies_key(event.key)
                    if namespace is None:
                        continue
                    resources.forget_policies(namespace)
                    if event.kind == "put":
                        count = await apply_to_topics(resources, loaded_topics(), namespace)
                        if on_change is not None:
                            on_change()
                        log.info("namespace policies changed, applied: namespace=%s topics=%d", namespace, count)
            finally:
                await watch.close()
        except MagnetarError as error:
            # Once per outage, not once a second while etcd is away.
            if not failing:
                log.warning("namespace policy watch failed, starting again: error=%s", error)
            failing = True
        await asyncio.sleep(RESTART_PAUSE_S)


async def follow_topic_policies(store, topic_policies, on_change: Callable[[], None]) -> None:
    """Runs until cancelled: drops ``topic_policies``' (a TopicPolicyStore) cached copy of
    a topic's policies when they change in etcd, and calls ``on_change``."""
    failing = False
    while True:
        try:
            _, revision = await store.get_prefix_at(keys.TOPIC_POLICIES)
            if failing:
                log.info("topic policy watch running again")
                failing = False
            topic_policies.forget_all()
            on_change()
            watch = store.watch_prefix(keys.TOPIC_POLICIES, start_version=revision)
            try:
                async for event in watch:
                    if event.kind == "reset":
                        break
                    topic_policies.forget_key(event.key[len(keys.TOPIC_POLICIES):])
                    on_change()
            finally:
                await watch.close()
        except MagnetarError as error:
            if not failing:
                log.warning("topic policy watch failed, starting again: error=%s", error)
            failing = True
        await asyncio.sleep(RESTART_PAUSE_S)
