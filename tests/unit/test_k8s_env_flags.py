"""MAGNETAR_<FLAG>: the environment sets the flags of the command that runs (magnetar/env_flags.py).

What it proves: a variable sets its flag, parsed by the command's own parser (so a bad
value fails like a bad flag); a flag on the command line wins over its variable; switches
take true/false words and refuse others; repeatable flags take comma-separated values;
the global options come from the environment too; variables that match no flag are left
alone; a required flag may come from the environment. How: cli.parse_command_line, the
one parse ``magnetar`` does, with a dict for the environment.
"""

from __future__ import annotations

import pytest

from magnetar import env_flags
from magnetar.cli import parse_command_line


BOOKIE = ["bookie"]
BOOKIE_ENV = {"MAGNETAR_METADATA": "etcd://e:2379", "MAGNETAR_JOURNAL_DIR": "/j", "MAGNETAR_LEDGER_DIR": "/l"}


def test_names():
    assert env_flags.env_name("--http-port") == "MAGNETAR_HTTP_PORT"
    assert env_flags.env_name("--no-auto-topic-creation") == "MAGNETAR_NO_AUTO_TOPIC_CREATION"


def test_variables_set_flags_and_required_flags_may_come_from_them():
    args = parse_command_line(BOOKIE, {**BOOKIE_ENV, "MAGNETAR_PORT": "3999", "MAGNETAR_WRITE_CACHE_MIB": "64"})
    assert args.metadata == "etcd://e:2379"
    assert args.journal_dir == "/j"
    assert args.ledger_dirs == ["/l"]
    assert args.port == 3999          # converted by the flag's own type
    assert args.write_cache_mib == 64


def test_flags_win_over_variables():
    argv = ["bookie", "--port", "1234", "--ledger-dir=/x", "--journal-dir", "/jj"]
    args = parse_command_line(argv, {**BOOKIE_ENV, "MAGNETAR_PORT": "3999"})
    assert args.port == 1234
    assert args.ledger_dirs == ["/x"]      # not ["/l", "/x"]: the variable is not used at all
    assert args.journal_dir == "/jj"


def test_repeatable_flags_take_commas():
    args = parse_command_line(BOOKIE, {**BOOKIE_ENV, "MAGNETAR_LEDGER_DIR": "/d1, /d2"})
    assert args.ledger_dirs == ["/d1", "/d2"]


@pytest.mark.parametrize(("value", "expected"), [("1", False), ("true", False), ("YES", False), ("on", False),
                                                 ("0", None), ("false", None), ("", None), ("off", None)])
def test_switches(value, expected):
    args = parse_command_line(["broker"], {"MAGNETAR_METADATA": "etcd://e:2379",
                                           "MAGNETAR_NO_AUTO_TOPIC_CREATION": value})
    # --no-auto-topic-creation stores False into allow_auto_topic_creation; absent: None.
    assert args.no_auto_topic_creation is expected


def test_a_switch_refuses_other_words():
    with pytest.raises(SystemExit) as raised:
        parse_command_line(["broker"], {"MAGNETAR_METADATA": "etcd://e:2379", "MAGNETAR_NO_SHEDDING": "maybe"})
    assert raised.value.code == 2


def test_a_bad_value_fails_like_a_bad_flag():
    with pytest.raises(SystemExit) as raised:
        parse_command_line(BOOKIE, {**BOOKIE_ENV, "MAGNETAR_PORT": "not-a-port"})
    assert raised.value.code == 2


def test_global_options_and_unrelated_variables():
    env = {**BOOKIE_ENV, "MAGNETAR_LOG_FORMAT": "json", "MAGNETAR_GATEWAY_SECRET": "k:00", "MAGNETAR_NOPE": "1"}
    args = parse_command_line(BOOKIE, env)
    assert args.log_format == "json"
    assert parse_command_line(["--log-format", "text", *BOOKIE], env).log_format == "text"


def test_only_the_running_command_is_mapped():
    # --service-url is the gateway's; a broker ignores MAGNETAR_SERVICE_URL.
    args = parse_command_line(["broker"], {"MAGNETAR_METADATA": "etcd://e:2379",
                                           "MAGNETAR_SERVICE_URL": "pulsar://x:1"})
    assert not hasattr(args, "service_url")
    gateway = parse_command_line(["gateway"], {"MAGNETAR_SERVICE_URL": "pulsar://x:1"})
    assert gateway.service_url == "pulsar://x:1"


def test_help_version_and_hidden_options_are_not_mapped():
    from magnetar.cli import build_parser, command_parser

    parser = build_parser(["broker"])
    names = env_flags.mapped_flags(command_parser(parser, "broker"))
    assert "MAGNETAR_HELP" not in names
    assert "MAGNETAR_ARCHIVE_PAUSE_AT" not in names     # tests only, hidden
    assert "MAGNETAR_ADVERTISED_ADDRESS" in names
    assert "MAGNETAR_VERSION" not in env_flags.mapped_flags(parser)
