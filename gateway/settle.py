"""Acknowledging, nacking and extending by receipt handle, on any gateway instance.

Each handle is checked on its own (decoded, verified, in scope of the request's topic
and subscription) and gets its own result, in request order. Then:

- ack: applied at the broker by this instance, through its consumer on the same
  subscription (any consumer of a subscription may acknowledge any of its messages; the
  broker settles the message wherever it is pending) - in shared and broadcast mode,
  where joining with a consumer that takes no permits changes nothing. Then, in the
  background and best effort, the issuing instance is told too (a hint, marked so in
  the forwarding header: it only ends its leases, without a second ack at the broker),
  so it frees the lease at once instead of at its deadline. In key-shared, exclusive and failover mode a
  consumer joining would move keys or turns, so the ack is forwarded to the issuing
  instance instead.
- nack and extend change a lease, which lives at the issuing instance only: they are
  forwarded there (the handle names it) unless this is it. A forwarded request is never
  forwarded again.
- When the issuing instance is gone (refused connection, or a new process at its
  address), its broker connection went with it and the broker has redelivered what it
  held: the lease is lost (LeaseExpired). A timeout is retriable.

An ack, nack, extension or reject after the lease ended is refused with a per-receipt
LeaseExpired and changes nothing: the message went back to its subscription and may be
another worker's now, and a stale receipt never settles someone else's lease. An ack
after the receipt's own deadline is decided by the issuing instance (forwarded there),
which applies it only while the lease still holds (extended); its result says
``late: true``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from client.messages import MessageId
from common.errors import LeaseExpired, MagnetarError, OperationTimeout, error_for_code
from gateway.errors import error_document
from gateway.leases import State
from gateway.receipts import Receipt, decode
from gateway.service import GatewayService, now_unix_ms
from gateway.service import dead_letter_topic as service_dead_letter_topic

log = logging.getLogger(__name__)

FORWARDED_HEADER = "X-Magnetar-Forwarded"
# The header's value on the hint an acknowledging instance sends the issuing one: the
# broker has applied the ack already, so the issuer only ends its leases (no second ack).
HINT = "hint"
# Modes where an instance may join the subscription just to acknowledge.
_ACK_ANYWHERE_MODES = ("shared", "broadcast")


@dataclass(slots=True)
class Item:
    index: int
    handle: str
    receipt: Receipt | None = None
    result: dict | None = None

    def fail(self, error: MagnetarError) -> None:
        self.result = {"status": "error", "error": error_document(error)}


def _checked(service: GatewayService, topic: str, subscription: str, handles: list[str]) -> list[Item]:
    items = [Item(index, handle) for index, handle in enumerate(handles)]
    for item in items:
        try:
            # A handle issued here and remembered is the string this instance signed:
            # its receipt is known without decoding and verifying it again.
            receipt = service.issued.take(item.handle) or decode(item.handle, service.config.receipt_keys)
            receipt.check_scope(topic, subscription)
            item.receipt = receipt
        except MagnetarError as error:
            item.fail(error)
    return items


def _message_id(receipt: Receipt) -> MessageId:
    # tuple.__new__ straight: a NamedTuple's own __new__ is a Python-level wrapper.
    return tuple.__new__(MessageId, (receipt.ledger_id, receipt.entry_id, receipt.partition, receipt.batch_index,
                                     receipt.batch_size))


def _results(items: list[Item]) -> list[dict]:
    assert all(item.result is not None for item in items)
    return [item.result for item in items]  # type: ignore[misc]


# --- ack -------------------------------------------------------------------------------------------

async def ack(service: GatewayService, topic: str, subscription: str, handles: list[str], *, path: str,
              forwarded: bool, hint: bool = False) -> list[dict]:
    items = _checked(service, topic, subscription, handles)
    if hint:
        return _release(service, items)
    direct: dict[Any, list[Item]] = {}
    remote: dict[str, list[Item]] = {}
    hints: dict[str, list[Item]] = {}
    now_ms = now_unix_ms()
    for item in items:
        receipt = item.receipt
        if receipt is None:
            continue
        ours = service.is_ours(receipt)
        if receipt.deadline_ms < now_ms:
            # Past the receipt's deadline only the issuing instance knows whether the
            # lease still holds (extended): if it ended, the message went back to the
            # subscription and may be another worker's now, so the ack must not apply.
            if ours:
                if not _still_leased(service, receipt):
                    item.fail(LeaseExpired("the lease ended before this ack; the message went back to its "
                                           "subscription (it may be another worker's now) and was not acknowledged"))
                    continue
                direct.setdefault(service.key_of(receipt), []).append(item)
            elif forwarded:
                item.fail(LeaseExpired("receipt was issued by another gateway instance, which is gone; the message "
                                       "is back in its subscription"))
            else:
                remote.setdefault(receipt.issuer_url, []).append(item)
            continue
        if ours or receipt.mode in _ACK_ANYWHERE_MODES:
            direct.setdefault(service.key_of(receipt), []).append(item)
            if not ours and not forwarded:
                hints.setdefault(receipt.issuer_url, []).append(item)
        elif forwarded:
            item.fail(LeaseExpired("receipt was issued by another gateway instance, which is gone; the message "
                                   "is back in its subscription"))
        else:
            remote.setdefault(receipt.issuer_url, []).append(item)
    for key, group in direct.items():
        try:
            consumer = service.consumers.find(key)
            if consumer is None:
                if key.mode not in _ACK_ANYWHERE_MODES:
                    raise LeaseExpired("the consumer that received this message is gone; the message is back in "
                                       "its subscription")
                consumer = await service.consumers.get(key)
            await consumer.ack([_message_id(item.receipt) for item in group])  # type: ignore[arg-type]
        except MagnetarError as error:
            for item in group:
                item.fail(error)
            continue
        for item in group:
            assert item.receipt is not None
            item.result = {"status": "acked"}
            if item.receipt.deadline_ms < now_ms:
                item.result["late"] = True
        service.messages_acked += len(group)
        service.subscription_counts.add(key.topic, key.subscription, "acked", len(group))
    await _forward_groups(service, remote, path, {}, "acked")
    for issuer_url, group in hints.items():
        service.spawn_forward(_forward(service, issuer_url, path, [item.handle for item in group], {}, header=HINT))
    return _results(items)


def _release(service: GatewayService, items: list[Item]) -> list[dict]:
    """A hint from the instance that applied these acks at the broker: the leases held
    here for them end (on the same delivery attempt only), without acking again."""
    for item in items:
        receipt = item.receipt
        if receipt is None:
            continue
        consumer = service.consumers.find(service.key_of(receipt)) if service.is_ours(receipt) else None
        slot = None if consumer is None else consumer.table.find(receipt.position, receipt.batch_index)
        if slot is None or slot.attempt != receipt.attempt or not consumer.table.ack(receipt.position,  # type: ignore[union-attr]
                                                                                      receipt.batch_index):
            item.fail(_lease_gone(receipt))
            continue
        item.result = {"status": "acked"}
    return _results(items)


def _still_leased(service: GatewayService, receipt: Receipt) -> bool:
    consumer = service.consumers.find(service.key_of(receipt))
    slot = None if consumer is None else consumer.table.find(receipt.position, receipt.batch_index)
    return slot is not None and slot.state == State.LEASED and slot.attempt == receipt.attempt


# --- nack and extend ------------------------------------------------------------------------------

async def nack(service: GatewayService, topic: str, subscription: str, handles: list[str], delay_ms: int, *,
               path: str, forwarded: bool) -> list[dict]:
    items = _checked(service, topic, subscription, handles)
    remote = _split_remote(service, items, forwarded)
    now_s = time.monotonic()
    for item in items:
        if item.result is not None or item.receipt is None or not service.is_ours(item.receipt):
            continue
        receipt = item.receipt
        consumer = service.consumers.find(service.key_of(receipt))
        if consumer is None or not consumer.table.nack(receipt.position, receipt.batch_index, receipt.attempt,
                                                        delay_ms / 1000, now_s):
            item.fail(_lease_gone(receipt))
            continue
        item.result = {"status": "nacked"}
        service.messages_nacked += 1
        service.subscription_counts.add(topic, subscription, "nacked")
        if delay_ms == 0:
            consumer.tick(now_s)   # give it back now, not at the next tick
    await _forward_groups(service, remote, path, {"delay_ms": delay_ms}, "nacked")
    return _results(items)


async def extend(service: GatewayService, topic: str, subscription: str, handles: list[str], lease_ms: int, *,
                 path: str, forwarded: bool) -> list[dict]:
    items = _checked(service, topic, subscription, handles)
    remote = _split_remote(service, items, forwarded)
    now_s = time.monotonic()
    deadline_ms = now_unix_ms() + lease_ms
    for item in items:
        if item.result is not None or item.receipt is None or not service.is_ours(item.receipt):
            continue
        receipt = item.receipt
        consumer = service.consumers.find(service.key_of(receipt))
        slot = None if consumer is None else consumer.table.extend(receipt.position, receipt.batch_index,
                                                                   receipt.attempt, lease_ms / 1000, now_s)
        if slot is None:
            item.fail(_lease_gone(receipt))
            continue
        assert consumer is not None
        item.result = {"status": "extended",
                       "receipt": service.receipt(consumer, _message_id(receipt), receipt.attempt, deadline_ms),
                       "lease_deadline_ms": deadline_ms}
        service.leases_extended += 1
        service.subscription_counts.add(topic, subscription, "extended")
    await _forward_groups(service, remote, path, {"lease_ms": lease_ms}, "extended")
    return _results(items)


# --- reject -------------------------------------------------------------------------------------

async def reject(service: GatewayService, topic: str, subscription: str, handles: list[str],
                 dead_letter_topic: str | None, *, path: str, forwarded: bool) -> list[dict]:
    """Sends leased messages straight to the dead-letter topic (named, or Pulsar's
    default ``{topic}-{subscription}-DLQ``), then acknowledges them: SQS's and Pub/Sub's
    "this one will never work", without waiting for ``max_deliveries``. Only the issuing
    instance holds the message, so others forward it there."""
    items = _checked(service, topic, subscription, handles)
    remote = _split_remote(service, items, forwarded)
    target = service_dead_letter_topic(topic, subscription, dead_letter_topic)
    groups: dict[Any, tuple[Any, list[tuple[Item, Any]]]] = {}
    for item in items:
        if item.result is not None or item.receipt is None or not service.is_ours(item.receipt):
            continue
        receipt = item.receipt
        consumer = service.consumers.find(service.key_of(receipt))
        slot = None if consumer is None else consumer.table.find(receipt.position, receipt.batch_index)
        if slot is None or slot.state != State.LEASED or slot.attempt != receipt.attempt:
            item.fail(_lease_gone(receipt))
            continue
        groups.setdefault(consumer.key, (consumer, []))[1].append((item, slot))
    for consumer, pairs in groups.values():
        try:
            await service.dead_letter(target, consumer.key.topic, [slot.message for _, slot in pairs])
            await consumer.ack([slot.message.message_id for _, slot in pairs])
        except MagnetarError as error:
            for item, _ in pairs:
                item.fail(error)
            continue
        for item, _ in pairs:
            item.result = {"status": "rejected", "dead_letter_topic": target}
        service.messages_rejected += len(pairs)
    extra = {} if dead_letter_topic is None else {"dead_letter_topic": dead_letter_topic}
    await _forward_groups(service, remote, path, extra, "rejected")
    return _results(items)


def _lease_gone(receipt: Receipt) -> LeaseExpired:
    if receipt.deadline_ms < now_unix_ms():
        return LeaseExpired("the lease has expired; the message is back in its subscription")
    return LeaseExpired("the lease is over (acknowledged, nacked, or its gateway consumer reconnected); the "
                        "message is back in its subscription or settled")


def _split_remote(service: GatewayService, items: list[Item], forwarded: bool) -> dict[str, list[Item]]:
    remote: dict[str, list[Item]] = {}
    for item in items:
        if item.receipt is None or service.is_ours(item.receipt):
            continue
        if forwarded:
            item.fail(LeaseExpired("receipt was issued by another gateway instance, which is gone; the message "
                                   "is back in its subscription"))
        else:
            remote.setdefault(item.receipt.issuer_url, []).append(item)
    return remote


# --- forwarding ---------------------------------------------------------------------------------

async def _forward_groups(service: GatewayService, remote: dict[str, list[Item]], path: str, extra: dict,
                          what: str) -> None:
    if not remote:
        return
    groups = list(remote.items())
    answers = await asyncio.gather(*(_forward(service, issuer_url, path, [item.handle for item in group], extra)
                                     for issuer_url, group in groups), return_exceptions=True)
    for (issuer_url, group), answer in zip(groups, answers):
        if isinstance(answer, MagnetarError):
            for item in group:
                item.fail(answer)
            continue
        if isinstance(answer, BaseException):
            raise answer
        for item, result in zip(group, answer):
            item.result = result


async def _forward(service: GatewayService, issuer_url: str, path: str, handles: list[str], extra: dict,
                   header: str = "1") -> list[dict]:
    """Posts ``handles`` to the issuing instance; its per-receipt results."""
    assert service.http is not None
    try:
        async with service.http.post(f"{issuer_url}{path}", json={"receipts": handles, **extra},
                                     headers={FORWARDED_HEADER: header}) as response:
            document = await response.json(content_type=None)
    except aiohttp.ClientConnectorError:
        raise LeaseExpired("the gateway instance that issued this receipt is gone; its broker connection went "
                           "with it, so the message is back in its subscription") from None
    except (asyncio.TimeoutError, TimeoutError):
        raise OperationTimeout(f"the gateway instance that issued this receipt ({issuer_url}) did not answer "
                               "in time") from None
    except (aiohttp.ClientError, ValueError) as error:
        raise OperationTimeout(f"the gateway instance that issued this receipt ({issuer_url}) failed: "
                               f"{error}") from None
    if response.status != 200 or not isinstance(document, dict):
        if isinstance(document, dict) and isinstance(document.get("code"), int):
            raise error_for_code(document["code"], str(document.get("message", "")))
        raise OperationTimeout(f"the gateway instance {issuer_url} answered {response.status}")
    results = document.get("results")
    if not isinstance(results, list) or len(results) != len(handles):
        raise OperationTimeout(f"the gateway instance {issuer_url} answered without one result per receipt")
    return results
