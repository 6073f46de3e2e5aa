"""Command-line pieces shared by the ``experiments`` entry points.

``define_config`` registers ``--config`` (with its ``--config.*`` overrides): ml_collections
applies the overrides while the flag is defined, at import, and an unknown field there
ends in a chained traceback; here it ends in one line naming the flag and the closest
field. ``print_config_and_exit`` backs ``--print_config``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ml_collections import ConfigDict, config_flags


def _innermost_message(e: BaseException) -> str:
    """The text of the innermost KeyError/AttributeError that ml_collections chained."""
    messages = []
    while e is not None:
        arg = e.args[0] if e.args else ""
        messages.append(arg if isinstance(arg, str) else str(arg))
        e = e.__context__
    hints = [m for m in messages if "Did you mean" in m]
    return hints[-1] if hints else messages[-1]


def unknown_field_message(e: BaseException, argv: Sequence[str]) -> str:
    """One line: which ``--config.*`` flag names a field the config lacks, and the hint."""
    text = _innermost_message(e)
    field, _, hint = text.partition("\n")
    field = field.strip("'\"")
    flags_ = [a.split("=")[0] for a in argv if a.startswith("--config.")]
    named = [f for f in flags_ if f.rsplit(".", 1)[-1] == field] or flags_
    where = ", ".join(named) if named else "--config"
    return f"{where}: the config has no field {field!r}" + (f"; {hint.strip()}" if hint else "")


def define_config(name: str, default: str | None, help_text: str, **kwargs):
    """``config_flags.DEFINE_config_file`` that exits with one line on an unknown field."""
    try:
        return config_flags.DEFINE_config_file(name, default, help_text, **kwargs)
    except (AttributeError, KeyError) as e:
        sys.exit(f"error: {unknown_field_message(e, sys.argv)}")


def print_config_and_exit(config: ConfigDict) -> None:
    """Prints ``config`` (after every override) as YAML and exits 0."""
    print(config)
    sys.exit(0)
