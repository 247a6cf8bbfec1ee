"""`rota`'s options and help, made from the settings classes' declarations
(resources/settings.py): the defaults, ranges and variable names shown are the ones read."""

import argparse
from datetime import timedelta
from typing import Any, Callable

from rota.resources.settings import Declared, declared, whole_number


def _option_type(setting: Declared) -> Callable[[str], Any]:
    if setting.kind is int:
        def whole(raw: str) -> int:
            try:
                return whole_number(raw, setting.ge, setting.le)
            except ValueError as wrong:
                raise argparse.ArgumentTypeError(str(wrong)) from None
        return whole
    return float if setting.kind is timedelta else setting.kind


def add_options(parser: argparse.ArgumentParser, settings: type) -> None:
    """An option for each field of `settings` that declares a flag; a timedelta is given in
    seconds, and a switch turns its field's default over."""
    for setting in declared(settings):
        if setting.flag is None:
            continue
        if setting.kind is bool:
            parser.add_argument(setting.flag, dest=setting.name, help=setting.help,
                                action="store_false" if setting.default else "store_true")
            continue
        default = setting.default.total_seconds() if setting.kind is timedelta else setting.default
        parser.add_argument(setting.flag, dest=setting.name, type=_option_type(setting), default=default,
                            metavar=setting.flag.lstrip("-").upper(), help=setting.help)


def settings_from(settings: type, args: argparse.Namespace):
    """`settings` as the options added by add_options set it."""
    values = {}
    for setting in declared(settings):
        if setting.flag:
            value = getattr(args, setting.name)
            values[setting.name] = timedelta(seconds=value) if setting.kind is timedelta else value
    return settings(**values)


def environment_help(classes: list[type]) -> str:
    """A line for each variable the classes read: what it sets, its range and its default."""
    settings = [setting for cls in classes for setting in declared(cls) if setting.env]
    if not settings:
        return ""
    width = max(len(setting.env) for setting in settings)
    lines = []
    for setting in settings:
        facts = []
        if setting.ge is not None and setting.le is not None:
            facts.append(f"{setting.ge} to {setting.le}")
        if setting.default not in (None, ""):
            facts.append(f"default: {setting.default}")
        lines.append(f"  {setting.env:<{width}} {setting.help}" + (f" ({', '.join(facts)})" if facts else ""))
    return "\n".join(lines)


class CommandParser(argparse.ArgumentParser):
    """A command whose help ends with the environment it reads: `environment` as written,
    then the variables of the classes `settings()` returns. `settings` is called only to
    show the help: a Dagster resource's declaration imports Dagster, which `rota worker`
    must not pay for at every start."""

    def __init__(self, *args, environment: str = "", settings: Callable[[], list[type]] = list, **kwargs):
        super().__init__(*args, **kwargs)
        self._environment, self._settings = environment, settings

    def format_help(self) -> str:
        self.epilog = "\n".join(part for part in (self._environment, environment_help(self._settings())) if part)
        return super().format_help()
