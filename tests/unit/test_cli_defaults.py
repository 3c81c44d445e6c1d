"""One source of defaults: ``magnetar bookie`` and ``magnetar broker`` take every
default from their config dataclasses (bookie/main.py, broker/main.py,
runtime/config_options.py).

What it proves:
- with only the required flags, the config the CLI builds equals the dataclasses'
  defaults, field for field (the bug: --entry-log-mib defaulted to 256 MiB while
  LedgerStorageConfig.entry_log_bytes_max is 512 MiB);
- for every flag, giving it the default --help shows yields that same config, so each
  flag's unit conversion and shown default agree with its field; every flag of both
  commands is in the table (none can set a field past it); switches set their field
  only when given;
- a flag given sets its field (in its unit) and nothing else;
- the derived HTTP ports: a bookie's is its gRPC port + 4820 (3181 -> 8001, the
  standalone's layout), a broker's its binary port + 1430 (6650 -> 8080); two bookies
  given only distinct --port values get distinct HTTP ports; port 0 gives 0;
- unacked_per_consumer_max is one BrokerConfig field with a flag, and a shared
  consumer of a broker configured with 2 receives only 2 messages before it acks.

How: the commands' own add_arguments/config_from_args on a fresh argparse parser; the
last test runs a real ServerConnection/BrokerService over the in-memory store and the
fake ledger client.
"""

from __future__ import annotations

import argparse

import pytest

from broker.archiver_config import ArchiverConfig

from bookie import main as bookie_main
from bookie.config import BookieConfig, JournalConfig, LedgerStorageConfig
from broker import main as broker_main
from broker.config import BrokerConfig
from broker.connection import ServerConnection
from managed_ledger.managed_ledger import ManagedLedgerConfig
from broker.service import BrokerService
from bundles.config import BundlesConfig
from runtime.config_options import flag_default
from metadata.memory_store import MemoryStore
from protocol.codec import encode_payload_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from tests.unit.fake_ledger_client import FakeLedgerClient
from tests.unit.test_broker_connection import Client, FakeTransport, GatedOwnership, settle

MIB = 1024 * 1024
T = pb.BaseCommand

BOOKIE_REQUIRED = ["--metadata", "etcd://127.0.0.1:2379", "--journal-dir", "/j", "--ledger-dir", "/d"]
BROKER_REQUIRED = ["--metadata", "etcd://127.0.0.1:2379"]


def _bookie(*flags: str) -> BookieConfig:
    parser = argparse.ArgumentParser()
    bookie_main.add_arguments(parser)
    return bookie_main.config_from_args(parser.parse_args([*BOOKIE_REQUIRED, *flags]))


def _broker(*flags: str) -> tuple[BrokerConfig, BundlesConfig]:
    parser = argparse.ArgumentParser()
    broker_main.add_arguments(parser)
    args = parser.parse_args([*BROKER_REQUIRED, *flags])
    return (broker_main.config_from_args(args), broker_main.bundles_config_from_args(args),
            broker_main.archiver_config_from_args(args))


BOOKIE_DEFAULT = BookieConfig(metadata_url="etcd://127.0.0.1:2379", journal=JournalConfig(journal_dir="/j"),
                              storage=LedgerStorageConfig(ledger_dirs=("/d",)))
BROKER_DEFAULT = (BrokerConfig(metadata_url="etcd://127.0.0.1:2379"), BundlesConfig(), ArchiverConfig())


def test_the_bookie_cli_defaults_are_the_dataclass_defaults():
    """Only the required flags: the config equals the dataclasses' defaults."""
    assert _bookie() == BOOKIE_DEFAULT
    assert _bookie().storage.entry_log_bytes_max == 512 * MIB


def test_the_broker_cli_defaults_are_the_dataclass_defaults():
    assert _broker() == BROKER_DEFAULT


@pytest.mark.parametrize("option", [o for o in bookie_main.OPTIONS if o.switch_to is None],
                         ids=lambda o: o.flag)
def test_each_bookie_flag_given_its_shown_default_changes_nothing(option):
    """The flag set to the default --help shows gives the default config (fields with
    a derived default are given the value derived for the default port)."""
    value = flag_default(option)
    if value is None or value == "":
        configs = (BOOKIE_DEFAULT, BOOKIE_DEFAULT.security, BOOKIE_DEFAULT.security.tls, BOOKIE_DEFAULT.metadata_tls)
        value = getattr(next(c for c in configs if isinstance(c, option.config)), option.field)
    assert _bookie(option.flag, str(value)) == BOOKIE_DEFAULT


@pytest.mark.parametrize("option", [o for o in broker_main.OPTIONS if o.switch_to is None],
                         ids=lambda o: o.flag)
def test_each_broker_flag_given_its_shown_default_changes_nothing(option):
    value = flag_default(option)
    if value is None or value == "":
        # Configs nested in BrokerConfig (auth) are searched too.
        from ledger.config import BookieTlsConfig, LedgerClientConfig

        configs = (*BROKER_DEFAULT, BROKER_DEFAULT[0].auth, BROKER_DEFAULT[0].tls, LedgerClientConfig(),
                   BookieTlsConfig(), BROKER_DEFAULT[0].metadata_tls)
        value = getattr(next(c for c in configs if isinstance(c, option.config)), option.field)
    assert _broker(option.flag, str(value)) == BROKER_DEFAULT


@pytest.mark.parametrize("module, required", [(bookie_main, {"metadata", "journal_dir", "ledger_dirs"}),
                                              (broker_main, {"metadata", "archive_pause_at", "compaction_pause_at"})])
def test_every_flag_is_in_the_options_table(module, required):
    """No flag of the command sets a field outside the table (which is what keeps a
    second default from creeping in)."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    dests = {action.dest for action in parser._actions if action.dest != "help"}
    assert dests == required | {option.dest for option in module.OPTIONS}
    for action in parser._actions:
        if action.dest not in required and action.dest != "help":
            assert action.default is None, action.dest


def test_switches_set_their_field_only_when_given():
    config, bundles, _archiver = _broker()
    assert config.allow_auto_topic_creation and bundles.shedding_enabled
    config, bundles, _archiver = _broker("--no-auto-topic-creation", "--no-shedding")
    assert not config.allow_auto_topic_creation and not bundles.shedding_enabled


def test_a_given_flag_sets_its_field_in_its_unit():
    """--entry-log-mib 64 is 64 MiB; --journal-group-mib and --group-wait-ms reach the
    journal; --disk-usage-threshold alone derives the low-water mark; broker flags
    reach the managed ledger, the pending-send bounds and the bundles config."""
    config = _bookie("--entry-log-mib", "64", "--journal-group-mib", "16", "--group-wait-ms", "2",
                     "--disk-usage-threshold", "0.8")
    assert config.storage.entry_log_bytes_max == 64 * MIB
    assert config.journal.group_bytes_max == 16 * MIB
    assert config.journal.group_wait_ms_max == 2.0
    assert (config.disk.usage_threshold, config.disk.usage_lwm_threshold) == (0.8, pytest.approx(0.75))
    broker, bundles, _archiver = _broker("--ledger-max-mib", "10", "--pending-send-mib-per-broker-max", "512",
                              "--pending-sends-per-topic-max", "77", "--unacked-per-consumer-max", "9",
                              "--default-bundles", "8")
    assert broker.managed_ledger.ledger_bytes_max == 10 * MIB
    assert broker.pending_send_bytes_per_broker_max == 512 * MIB
    assert broker.pending_sends_per_topic_max == 77
    assert broker.unacked_per_consumer_max == 9
    assert bundles.default_bundles == 8


def test_http_ports_derive_from_the_service_port():
    """Bookie: gRPC port + 4820; broker: binary port + 1430; 0 stays 0; an explicit
    --http-port wins."""
    assert _bookie().http_port == 8001
    first, second = _bookie("--port", "3181"), _bookie("--port", "3182")
    assert (first.http_port, second.http_port) == (8001, 8002)
    assert _bookie("--port", "0").http_port == 0
    assert _bookie("--port", "3182", "--http-port", "9000").http_port == 9000
    assert _broker()[0].http_port == 8080
    assert _broker("--port", "6651")[0].http_port == 8081
    assert _broker("--port", "0")[0].http_port == 0


async def test_unacked_per_consumer_max_reaches_the_dispatcher():
    """A broker configured with unacked_per_consumer_max=2: a shared consumer with 100
    permits receives 2 of 5 published messages until it acknowledges."""
    config = BrokerConfig(metadata_url="memory://", managed_ledger=ManagedLedgerConfig(1, 1, 1),
                          retention_check_interval_s=3600, unacked_per_consumer_max=2)
    service = BrokerService(config, MemoryStore(), FakeLedgerClient(), topic_ownership=GatedOwnership())
    await service.start()
    connection = ServerConnection(service)
    transport = FakeTransport(connection)
    connection.connection_made(transport)
    client = Client(connection, transport)
    topic = "persistent://public/default/unacked"
    client.send(pb.CommandConnect(client_version="test", protocol_version=pb.v21))
    client.send(pb.CommandSubscribe(topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared,
                                    consumer_id=1, request_id=1))
    client.send(pb.CommandProducer(topic=topic, producer_id=1, request_id=2, producer_name="p"))
    await settle()
    client.answers()
    client.send(pb.CommandFlow(consumer_id=1, messagePermits=100))
    connection.data_received(b"".join(
        encode_payload_command(wrap(pb.CommandSend(producer_id=1, sequence_id=i, num_messages=1)),
                               pb.MessageMetadata(producer_name="p", sequence_id=i, publish_time=1), b"m%d" % i)
        for i in range(5)))
    await settle()
    messages = [a for a in client.answers() if a.type == T.MESSAGE]
    assert len(messages) == 2
    transport.close()
    await service.close()
