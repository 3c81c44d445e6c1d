"""Why the official client failed: the broker's own reason and catalogue code.

The official Python client (pulsar-client, over the C++ client) raises an exception that
carries only the result (``NotAllowedError``, ``TopicNotFound``); the broker's reason,
sent in the ServerError's ``message`` (``subscription billing is Shared, not Exclusive``,
``tenant my-tenant does not exist``), reaches only the C++ client's log lines. Parsing
those lines would tie the tools to a log format that changes between client versions,
and the lines carry no catalogue code anyway.

So a tool whose producer or consumer could not be created asks the broker the same
question again, once, with Magnetar's own protocol client (``client/``), which keeps the
ServerError's message and maps its code to the catalogue (protocol/server_errors.py):
the same lookup, then the same PRODUCER (no message is sent) or SUBSCRIBE (same name,
type and initial position). Every refusal a newcomer meets is deterministic (a missing
tenant or namespace, a topic name the broker refuses, another subscription type, an
exclusive consumer already there, a role without permission), so the second answer is
the first one's reason. If the second attempt succeeds (the first failure was
transient: a broker restarting), the tool says so rather than invent a reason; a
subscription the second attempt created is the one the user asked for anyway.

The code is the catalogue class the ServerError maps to on the client side: several
classes share one Pulsar code (a missing tenant and a missing topic are both Pulsar's
TopicNotFound), so the reason text is what tells them apart.

The attempt is bounded (``DIAGNOSIS_TIMEOUT_S``) and made only after a failure.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from common import errors
from common.errors import MagnetarError

# A lookup and one request, on a broker that answered the official client already (or
# did not: then the connect timeout below decides).
DIAGNOSIS_TIMEOUT_S = 10.0
_CONNECT_TIMEOUT_MS = 5_000

# The official client's results, as the catalogue class a caller acts on, for the
# failures the second attempt cannot explain (it succeeded, or could not be made).
_RESULT_CLASSES: dict[str, type[MagnetarError]] = {
    "Timeout": errors.OperationTimeout,
    "ConnectError": errors.ServiceNotReady,
    "ServiceUnitNotReady": errors.ServiceNotReady,
    "TopicNotFound": errors.TopicNotFound,
    "SubscriptionNotFound": errors.SubscriptionNotFound,
    "ConsumerBusy": errors.ConsumerBusy,
    "ProducerBusy": errors.ProducerBusy,
    "ProducerFenced": errors.ProducerFenced,
    "NotAllowedError": errors.NotAllowed,
    "TopicTerminated": errors.TopicTerminated,
    "InvalidTopicName": errors.InvalidArgument,
    "AuthenticationError": errors.AuthenticationFailed,
    "AuthorizationError": errors.AuthorizationDenied,
    "ProducerBlockedQuotaExceededError": errors.ProducerBlockedQuota,
    "ProducerBlockedQuotaExceededException": errors.ProducerBlockedQuotaException,
    "IncompatibleSchema": errors.IncompatibleSchema,
    "TooManyLookupRequestException": errors.TooManyRequests,
    "ProducerQueueIsFull": errors.TooManyRequests,
    "MessageTooBig": errors.EntryTooLarge,
}


@dataclass(frozen=True)
class Explanation:
    reason: str
    error_name: str
    code: int


def result_class(result_name: str) -> type[MagnetarError]:
    return _RESULT_CLASSES.get(result_name, errors.BrokerError)


def from_result(result_name: str, reason: str) -> Explanation:
    cls = result_class(result_name)
    return Explanation(reason, cls.__name__, cls.code)


def explain(service_url: str, token: str, topic: str, subscribe: dict | None, official_error: str) -> Explanation:
    """The broker's answer to the step the official client failed at: a producer on
    ``topic``, or (``subscribe``: subscription, sub_type, initial_position) a consumer."""
    result_name = official_error.split(":", 1)[0].strip()
    if not service_url.startswith(("pulsar://", "pulsar+ssl://")):
        return from_result(result_name, f"{official_error} (the broker's reason is asked for only over pulsar://)")
    try:
        return asyncio.run(_ask(service_url, token, topic, subscribe))
    except TimeoutError:
        return from_result(result_name, f"{official_error}; the broker gave no answer within {DIAGNOSIS_TIMEOUT_S:g} s")
    except MagnetarError as error:
        return Explanation(error.message, type(error).__name__, error.code)
    except _Succeeded:
        return from_result(result_name, f"{official_error}; the same request made again succeeded, so the "
                                        "failure was passing (a broker restarting or moving the topic): try again")


class _Succeeded(Exception):
    pass


async def _ask(service_url: str, token: str, topic: str, subscribe: dict | None) -> Explanation:
    from client.client import PulsarClient
    from client.config import ClientConfig
    from common.topic_name import TopicName

    config = ClientConfig(connect_timeout_ms=_CONNECT_TIMEOUT_MS, operation_timeout_ms=int(DIAGNOSIS_TIMEOUT_S * 1000),
                          auth_token=token)
    client = PulsarClient(service_url, config)
    try:
        async with asyncio.timeout(DIAGNOSIS_TIMEOUT_S):
            # The broker parses the name: its refusal names the bad character.
            partitions = await client.partitions(topic)
            target = topic
            if partitions > 0:
                target = str(TopicName.parse(topic).partition(0))
            if subscribe is None:
                producer = await client.create_producer(target)
                await producer.close()
            else:
                consumer = await client.subscribe(target, subscribe["subscription"], sub_type=subscribe["sub_type"],
                                                  initial_position=subscribe["initial_position"])
                await consumer.close()
    finally:
        await client.close()
    raise _Succeeded()
