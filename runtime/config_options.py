"""Command-line options that set config dataclass fields, with the dataclass as the one
source of defaults.

A server's flags are a table of ``ConfigOption`` rows, each naming the dataclass and
field it sets (and the unit of a scaled flag: ``--entry-log-mib`` sets
``entry_log_bytes_max`` in MiB). ``add_config_options`` gives every flag the default
``None`` and shows the field's default in ``--help``; ``config_overrides`` returns only
the fields whose flags were given, so a flag left out leaves the dataclass default in
force. The CLI cannot drift from the dataclasses: there is no second copy of a default.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class ConfigOption:
    flag: str                 # "--entry-log-mib"
    config: type              # the dataclass that owns the field
    field: str                # "entry_log_bytes_max"
    help: str = ""
    # The field's value is the flag's times this (MIB for a flag in MiB).
    unit: int = 1
    # A switch that sets a boolean field to this value when given ("--no-shedding"
    # sets shedding_enabled to False); None for a flag that takes a value.
    switch_to: bool | None = None
    # The flag's type; by default that of the field's default (after the unit).
    type: Callable[[str], Any] | None = None
    # What --help says the default is, when the dataclass derives it (None: the field's).
    default_text: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def field_default(config: type, name: str) -> Any:
    """The default of a dataclass field (its default or default_factory())."""
    for item in dataclasses.fields(config):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
            raise LookupError(f"{config.__name__}.{name} has no default")
    raise LookupError(f"{config.__name__} has no field {name}")


def flag_default(option: ConfigOption) -> Any:
    """The field's default in the flag's unit."""
    value = field_default(option.config, option.field)
    if option.unit != 1 and value is not None:
        assert value % option.unit == 0, (option.flag, value, option.unit)
        return value // option.unit
    return value


def add_config_options(parser: argparse.ArgumentParser, options: Sequence[ConfigOption]) -> None:
    for option in options:
        default = flag_default(option)
        shown = option.default_text if option.default_text is not None else default
        help_text = f"{option.help} (default: {shown})" if option.help else f"default: {shown}"
        if option.switch_to is not None:
            parser.add_argument(option.flag, dest=option.dest, action="store_const", const=option.switch_to,
                                default=None, help=option.help or None)
            continue
        value_type = option.type or (type(default) if default is not None else str)
        parser.add_argument(option.flag, dest=option.dest, type=value_type, default=None,
                            help=help_text.replace("%", "%%"))


def config_overrides(args: argparse.Namespace, options: Sequence[ConfigOption], config: type) -> dict[str, Any]:
    """The fields of ``config`` whose flags were given, converted to the field's unit."""
    overrides: dict[str, Any] = {}
    for option in options:
        if option.config is not config:
            continue
        value = getattr(args, option.dest)
        if value is None:
            continue
        overrides[option.field] = value * option.unit if option.unit != 1 else value
    return overrides
