"""Settings declared once.

Each field of a settings class (a dataclass, or the pydantic fields of a Dagster
ConfigurableResource) carries beside its default what it is (`help`) and where it is read
from: an environment variable (`env`) or a `rota` option (`flag`). The environment is read,
and the `rota` options and help are made, from these declarations alone, so a default, a
variable's name or a range changed in the class is changed everywhere.

A dataclass declares them in its fields' metadata; a ConfigurableResource as the pydantic
field's description (shown in the Dagster UI too) and `json_schema_extra`. Stdlib only:
`rota worker` reads its settings without importing Dagster."""

import dataclasses
import os
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Declared:
    name: str
    default: Any
    kind: type
    help: str
    env: str | None = None
    flag: str | None = None
    # Passed to the settings class as an EnvVar, never as its value: Dagster shows the
    # variable's name, and the value stays out of the run's config.
    secret: bool = False
    ge: int | None = None
    le: int | None = None


def _plain(annotation: Any) -> type:
    """`int` for `int`, `str` for `Optional[str]`."""
    arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
    return arguments[0] if arguments else annotation


def declared(settings: type) -> list[Declared]:
    """The fields of `settings` that declare where they are read from, in their order."""
    if dataclasses.is_dataclass(settings):
        return [Declared(f.name, f.default, f.type, **f.metadata) for f in dataclasses.fields(settings) if f.metadata]
    found = []
    for name, field in settings.model_fields.items():
        if field.json_schema_extra:
            bounds = {key: getattr(rule, key) for rule in field.metadata for key in ("ge", "le") if hasattr(rule, key)}
            found.append(Declared(name, field.default, _plain(field.annotation), field.description,
                                  **field.json_schema_extra, **bounds))
    return found


def whole_number(raw: str, ge: int | None = None, le: int | None = None) -> int:
    """`raw` as an int within the bounds, or a ValueError saying what was expected."""
    if raw.isascii() and raw.isdigit() and (ge is None or int(raw) >= ge) and (le is None or int(raw) <= le):
        return int(raw)
    if ge is not None and le is not None:
        expected = f" from {ge} to {le}"
    elif ge is not None:
        expected = f" of at least {ge}"
    else:
        expected = f" of at most {le}" if le is not None else ""
    raise ValueError(f"must be a whole number{expected}, not {raw!r}")


def read_environment(settings: type, secret: Callable[[str], Any] | None = None,
                     environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The values the environment sets for `settings`, by field name: a field whose variable
    is unset keeps its declared default. A secret field gets `secret(variable)` (Dagster's
    EnvVar); one set to the empty string counts as unset."""
    values = {}
    for setting in declared(settings):
        if setting.env is not None and not setting.secret and setting.kind not in (int, str):
            raise TypeError(f"{settings.__name__}.{setting.name} reads {setting.env}, but only a whole number or "
                            f"a text is read from the environment, not a {setting.kind.__name__}")
        if setting.env is None or setting.env not in environ:
            continue
        raw = environ[setting.env]
        if setting.secret:
            if raw:
                values[setting.name] = secret(setting.env)
        elif setting.kind is int:
            try:
                values[setting.name] = whole_number(raw, setting.ge, setting.le)
            except ValueError as wrong:
                raise ValueError(f"{setting.env} {wrong}") from None
        else:
            values[setting.name] = raw
    return values
