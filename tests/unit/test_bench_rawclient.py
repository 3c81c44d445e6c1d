"""The benchmark's raw Pulsar client (bench/rawclient.py), with no sockets.

Proves that: every command it builds carries its required fields and encodes; a batch
template splits back (protocol.batch.parse_batch) into the messages it was built from;
a SEND frame decodes, fed whole, in halves at every split point and byte by byte, to
the sequence ids and count it was built with, with a checksum that verifies and differs
per sequence id (metadata changes per send); the send window admits at most its size
and accepts receipts only in send order with advancing positions; the consumer's tally
grants permits back once half the queue is used and counts duplicates and redeliveries;
ack grouping names each entry once (individual) or the newest one (cumulative); the
connection shell answers PINGs, matches answers to requests, and turns a SEND_ERROR, an
unsolicited close or a malformed frame into a failure that stops the run.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import rawclient  # noqa: E402
from protocol.batch import message_count, parse_batch  # noqa: E402
from protocol.codec import NEED_DATA, CommandDecoder, encode_command, encode_payload_command, wrap  # noqa: E402
from protocol.proto import pulsar_api_pb2 as pb  # noqa: E402

BC = pb.BaseCommand


def decode_all(data: bytes, step: int | None = None) -> list:
    decoder = CommandDecoder()
    frames = []
    chunks = [data] if step is None else [data[i:i + step] for i in range(0, len(data), step)]
    for chunk in chunks:
        decoder.feed(chunk)
        while (frame := decoder.next_command()) is not NEED_DATA:
            frames.append(frame)
    return frames


# --- commands ----------------------------------------------------------------------------------

@pytest.mark.parametrize("command, kind", [
    (rawclient.connect_command(), BC.CONNECT),
    (rawclient.producer_command("persistent://public/default/t", 1, 2), BC.PRODUCER),
    (rawclient.subscribe_command("persistent://public/default/t", "s", pb.CommandSubscribe.Shared, 3, 4,
                                 consumer_name="c"), BC.SUBSCRIBE),
    (rawclient.flow_command(3, 1000), BC.FLOW),
    (rawclient.ack_command(3, [(1, 2), (1, 3)], cumulative=False), BC.ACK),
    (rawclient.ack_command(3, [(1, 3)], cumulative=True, request_id=9), BC.ACK),
    (rawclient.close_producer_command(1, 5), BC.CLOSE_PRODUCER),
    (rawclient.close_consumer_command(3, 6), BC.CLOSE_CONSUMER),
])
def test_commands_encode_and_decode_to_their_type(command, kind):
    [frame] = decode_all(encode_command(command))
    assert frame.command.type == kind
    assert frame.command == command


def test_ack_command_fields():
    individual = rawclient.ack_command(7, [(1, 2), (1, 3)], cumulative=False).ack
    assert individual.ack_type == pb.CommandAck.Individual
    assert [(m.ledgerId, m.entryId) for m in individual.message_id] == [(1, 2), (1, 3)]
    assert not individual.HasField("request_id")
    cumulative = rawclient.ack_command(7, [(4, 5)], cumulative=True, request_id=11).ack
    assert cumulative.ack_type == pb.CommandAck.Cumulative
    assert cumulative.request_id == 11


def test_ack_command_refuses_empty_and_multi_position_cumulative():
    with pytest.raises(AssertionError):
        rawclient.ack_command(1, [], cumulative=False)
    with pytest.raises(AssertionError):
        rawclient.ack_command(1, [(1, 1), (1, 2)], cumulative=True)


# --- batches and SEND frames -----------------------------------------------------------------

@pytest.mark.parametrize("count, size", [(1, 4), (1, 1024), (10, 1024), (100, 1024), (3, 17)])
def test_batch_template_splits_into_its_messages(count, size):
    batch = rawclient.build_batch(count, size)
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=count)
    messages = parse_batch(metadata, batch.payload)
    assert len(messages) == count == batch.message_count
    assert all(len(m.payload) == size for m in messages)
    assert [bytes(m.payload[:4]) for m in messages] == [index.to_bytes(4, "big") for index in range(count)]
    assert len({bytes(m.payload) for m in messages}) == count


def test_batch_template_with_given_filler_is_deterministic():
    filler = b"x" * 60
    assert rawclient.build_batch(5, 64, filler) == rawclient.build_batch(5, 64, filler)


def test_send_frame_decodes_whole_in_halves_and_bytewise():
    batch = rawclient.build_batch(7, 32)
    data = rawclient.send_frame(3, "producer-a", 700, batch, 1_700_000_000_000)
    expected = decode_all(data)
    assert len(expected) == 1
    for split in range(1, len(data)):
        decoder = CommandDecoder()
        decoder.feed(data[:split])
        assert decoder.next_command() is NEED_DATA
        decoder.feed(data[split:])
        frame = decoder.next_command()
        assert frame.command == expected[0].command
    [bytewise] = decode_all(data, step=1)
    assert bytewise.command == expected[0].command
    [frame] = expected
    send = frame.command.send
    assert (send.producer_id, send.sequence_id, send.num_messages, send.highest_sequence_id) == (3, 700, 7, 706)
    metadata = frame.payload.metadata
    assert metadata.producer_name == "producer-a"
    assert (metadata.sequence_id, metadata.highest_sequence_id) == (700, 706)
    assert metadata.publish_time == 1_700_000_000_000
    assert message_count(metadata) == 7
    assert bytes(frame.payload.payload) == batch.payload


def test_send_frame_checksum_is_recomputed_per_sequence():
    batch = rawclient.build_batch(4, 64)
    first = decode_all(rawclient.send_frame(1, "p", 0, batch, 5))[0]
    second = decode_all(rawclient.send_frame(1, "p", 4, batch, 5))[0]
    assert first.payload.checksum != second.payload.checksum


def test_send_frame_matches_codec_encoding():
    batch = rawclient.build_batch(2, 8, b"abcd")
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=10, publish_time=99, num_messages_in_batch=2,
                                  highest_sequence_id=11)
    command = wrap(pb.CommandSend(producer_id=1, sequence_id=10, num_messages=2, highest_sequence_id=11))
    assert rawclient.send_frame(1, "p", 10, batch, 99) == encode_payload_command(command, metadata, batch.payload)


# --- the send window ------------------------------------------------------------------------------

def test_send_window_bounds_and_orders_receipts():
    window = rawclient.SendWindow(2)
    window.on_sent(0, 10)
    window.on_sent(10, 10)
    assert not window.has_room
    with pytest.raises(AssertionError):
        window.on_sent(20, 10)
    assert window.on_receipt(0, (5, 0)) == 10
    assert window.has_room and window.outstanding == 1
    window.on_sent(20, 10)
    assert window.on_receipt(10, (5, 1)) == 10
    assert window.on_receipt(20, (6, 0)) == 10
    assert (window.entries_sent, window.messages_sent, window.entries_acked, window.messages_acked) == (3, 30, 3, 30)
    assert window.outstanding == 0


@pytest.mark.parametrize("receipts", [
    [(10, (1, 0))],                  # not the oldest outstanding
    [(0, (1, 5)), (10, (1, 5))],     # position does not advance
    [(0, (2, 0)), (10, (1, 9))],     # position goes back
])
def test_send_window_refuses_receipts_out_of_order(receipts):
    window = rawclient.SendWindow(4)
    window.on_sent(0, 10)
    window.on_sent(10, 10)
    with pytest.raises(rawclient.ProtocolViolation):
        for sequence_id, position in receipts:
            window.on_receipt(sequence_id, position)


def test_send_window_refuses_receipt_with_nothing_outstanding():
    with pytest.raises(rawclient.ProtocolViolation):
        rawclient.SendWindow(1).on_receipt(0, (1, 0))


def test_send_window_refuses_sequence_ids_that_do_not_increase():
    window = rawclient.SendWindow(4)
    window.on_sent(10, 1)
    with pytest.raises(AssertionError):
        window.on_sent(10, 1)


# --- consumer tally and acks -----------------------------------------------------------------

def test_tally_grants_permits_back_at_half_the_queue():
    tally = rawclient.ConsumeTally(permits_max=100)
    grants = [tally.on_message((1, entry_id), 10, 0) for entry_id in range(12)]
    assert grants == [0, 0, 0, 0, 50, 0, 0, 0, 0, 50, 0, 0]
    assert (tally.entries, tally.messages, tally.duplicates) == (12, 120, 0)


def test_tally_grants_what_a_large_batch_used():
    tally = rawclient.ConsumeTally(permits_max=10)
    assert tally.on_message((1, 0), 100, 0) == 100


def test_tally_counts_duplicates_and_redeliveries():
    tally = rawclient.ConsumeTally(permits_max=1000)
    tally.on_message((1, 0), 1, 0)
    tally.on_message((1, 1), 1, 0)
    tally.on_message((1, 0), 1, 1)
    assert (tally.entries, tally.duplicates, tally.redelivered_entries) == (3, 1, 1)
    assert tally.positions == {(1, 0), (1, 1)}


def test_individual_acks_name_each_entry_once_in_groups():
    grouper = rawclient.AckGrouper(cumulative=False, group_entries_max=3)
    sent = [grouper.add((1, entry_id)) for entry_id in range(7)]
    assert sent == [None, None, [(1, 0), (1, 1), (1, 2)], None, None, [(1, 3), (1, 4), (1, 5)], None]
    assert grouper.take() == [(1, 6)]
    assert grouper.take() is None
    assert (grouper.commands, grouper.entries_acked, grouper.last_position) == (3, 7, (1, 6))


def test_one_ack_per_entry_by_default_group_of_one():
    grouper = rawclient.AckGrouper(cumulative=False, group_entries_max=1)
    assert [grouper.add((2, entry_id)) for entry_id in range(3)] == [[(2, 0)], [(2, 1)], [(2, 2)]]


def test_cumulative_acks_name_the_newest_entry():
    grouper = rawclient.AckGrouper(cumulative=True, group_entries_max=2)
    assert grouper.add((1, 0)) is None
    assert grouper.add((1, 1)) == [(1, 1)]
    assert grouper.add((2, 0)) is None
    assert grouper.take() == [(2, 0)]


# --- settings, URLs, positions ---------------------------------------------------------------

def test_consume_settings_problems():
    def settings(**fields):
        return rawclient.ConsumeSettings(service_url="pulsar://h:1", topic="t", subscription="s", **fields)

    assert settings().problem() is None
    assert "cumulative" in settings(sub_type="shared", cumulative=True).problem()
    assert settings(sub_type="exclusive", cumulative=True).problem() is None
    assert settings(sub_type="nope").problem() is not None
    assert settings(initial_position="middle").problem() is not None
    assert settings(messages=0).problem() is not None
    assert settings(permits=1).problem() is not None


@pytest.mark.parametrize("url, expected", [
    ("pulsar://127.0.0.1:6650", ("127.0.0.1", 6650)),
    ("pulsar://localhost:1/", ("localhost", 1)),
])
def test_service_url_parses(url, expected):
    assert rawclient.parse_service_url(url) == expected


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "pulsar://127.0.0.1", "pulsar://:6650", "pulsar://h:x"])
def test_bad_service_urls_raise(url):
    with pytest.raises(ValueError):
        rawclient.parse_service_url(url)


def test_positions_round_trip_sorted():
    positions = {(3, 1), (1, 2**40), (1, 0)}
    data = rawclient.encode_positions(positions)
    assert len(data) == 16 * len(positions)
    assert rawclient.decode_positions(data) == sorted(positions)


# --- the connection shell, without a socket ---------------------------------------------------

class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False

    def write(self, data) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def frames(self) -> list:
        frames = decode_all(bytes(self.written))
        self.written.clear()
        return frames


def open_fake() -> tuple[rawclient.RawConnection, FakeTransport]:
    connection = rawclient.RawConnection()
    transport = FakeTransport()
    connection.connection_made(transport)
    return connection, transport


async def test_connection_answers_ping_and_matches_requests():
    connection, transport = open_fake()
    connection.data_received(encode_command(wrap(pb.CommandPing())))
    assert [f.command.type for f in transport.frames()] == [BC.PONG]
    request_id = connection.request_id()
    pending = asyncio.ensure_future(connection.request(rawclient.close_consumer_command(1, request_id),
                                                       request_id, "CLOSE_CONSUMER"))
    await asyncio.sleep(0)
    assert [f.command.type for f in transport.frames()] == [BC.CLOSE_CONSUMER]
    connection.data_received(encode_command(wrap(pb.CommandSuccess(request_id=request_id))))
    frame = await pending
    assert frame.command.type == BC.SUCCESS


async def test_connection_raises_request_failed_on_error():
    connection, transport = open_fake()
    request_id = connection.request_id()
    pending = asyncio.ensure_future(connection.request(rawclient.producer_command("t", 1, request_id),
                                                       request_id, "PRODUCER"))
    await asyncio.sleep(0)
    connection.data_received(encode_command(wrap(pb.CommandError(request_id=request_id, error=pb.TopicNotFound,
                                                                 message="gone"))))
    with pytest.raises(rawclient.RequestFailed, match="TopicNotFound"):
        await pending


@pytest.mark.parametrize("command", [
    wrap(pb.CommandSendError(producer_id=1, sequence_id=0, error=pb.PersistenceError, message="disk")),
    wrap(pb.CommandCloseConsumer(consumer_id=1, request_id=2**64 - 1)),
    wrap(pb.CommandCloseProducer(producer_id=1, request_id=2**64 - 1)),
])
async def test_connection_fails_the_run_on_violations(command):
    connection, transport = open_fake()
    connection.data_received(encode_command(command))
    assert isinstance(connection.failure, rawclient.ProtocolViolation)
    assert transport.closing
    with pytest.raises(rawclient.ProtocolViolation):
        connection.check()


async def test_connection_fails_the_run_on_malformed_bytes():
    connection, transport = open_fake()
    connection.data_received(b"\x00\x00\x00\x01\x00")
    assert connection.failure is not None
    assert transport.closing


async def test_connection_hands_receipts_and_messages_to_callbacks():
    connection, _ = open_fake()
    receipts, messages, reads = [], [], []
    connection.on_receipt = receipts.append
    connection.on_message = messages.append
    connection.on_read_done = lambda: reads.append(True)
    receipt = wrap(pb.CommandSendReceipt(producer_id=1, sequence_id=0,
                                         message_id=pb.MessageIdData(ledgerId=4, entryId=0)))
    batch = rawclient.build_batch(3, 8)
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=3)
    message = encode_payload_command(wrap(pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(
        ledgerId=4, entryId=0))), metadata, batch.payload)
    connection.data_received(encode_command(receipt) + message)
    assert [r.sequence_id for r in receipts] == [0]
    assert [message_count(m.payload.metadata) for m in messages] == [3]
    assert reads == [True]
    assert connection.failure is None
