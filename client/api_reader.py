"""The user's reader: a non-durable exclusive subscription of its own on one topic (or
partition), positioned by message id or publish time, read with ``read_next``.

Start and seek by id: the broker positions at the id's entry; messages of that entry
before the id (a batch's earlier indexes), and the id itself unless inclusive, are
dropped here. ``seek`` by id moves so that the id is read next (inclusive), as the
official client's reader does after a seek.
"""

from __future__ import annotations

from common.errors import InvalidArgument

from client.api_consumer import Consumer, Message
from client.messages import MessageId, ReceivedMessage


class StartFilter:
    """Drops messages before a start id (and the id itself when not inclusive)."""

    def __init__(self) -> None:
        self.start: MessageId | None = None
        self.inclusive = True

    def set(self, start: MessageId | None, inclusive: bool) -> None:
        self.start, self.inclusive = start, inclusive

    def __call__(self, message: ReceivedMessage) -> bool:
        start = self.start
        if start is None:
            return True
        mine = message.message_id
        if (mine.ledger_id, mine.entry_id) != (start.ledger_id, start.entry_id):
            return (mine.ledger_id, mine.entry_id) > (start.ledger_id, start.entry_id)
        if start.batch_index < 0:
            return self.inclusive
        return mine.batch_index > start.batch_index or (self.inclusive and mine.batch_index == start.batch_index)


class Reader:
    def __init__(self, consumer: Consumer, start_filter: StartFilter) -> None:
        self._consumer = consumer
        self._filter = start_filter
        self._last_read: MessageId | None = None

    def topic(self) -> str:
        return self._consumer.topic()

    def is_connected(self) -> bool:
        return self._consumer.is_connected()

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        message = await self._consumer.receive(timeout_millis)
        self._last_read = message.message_id()
        return message

    def __aiter__(self) -> "Reader":
        return self

    async def __anext__(self) -> Message:
        message = await self._consumer.__anext__()
        self._last_read = message.message_id()
        return message

    async def has_message_available(self) -> bool:
        if self._consumer._queue:
            return True
        last = await self._consumer.get_last_message_id()
        if last.entry_id < 0 or last.entry_id == 0xFFFF_FFFF_FFFF_FFFF:
            return False
        reference = self._last_read or self._filter.start
        if reference is None:
            return True
        if (last.ledger_id, last.entry_id) != (reference.ledger_id, reference.entry_id):
            return (last.ledger_id, last.entry_id) > (reference.ledger_id, reference.entry_id)
        if self._last_read is None and self._filter.inclusive:
            return True
        return last.batch_index > reference.batch_index

    async def seek(self, position: MessageId | int) -> None:
        """To a message id (read next) or a publish time (epoch ms)."""
        if isinstance(position, MessageId):
            if position.ledger_id < 0:
                raise InvalidArgument("seek to a stored message's id")
            self._filter.set(position, True)
        else:
            self._filter.set(None, True)
        self._last_read = None
        await self._consumer.seek(position)

    async def close(self) -> None:
        await self._consumer.close()

    async def __aenter__(self) -> "Reader":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
