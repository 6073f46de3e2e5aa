"""Command-line pieces shared by the ``experiments`` entry points.

``define_config`` registers ``--config`` (with its ``--config.*`` overrides): ml_collections
applies the overrides while the flag is defined, at import, and an unknown field there
ends in a chained traceback; here it ends in one line naming the flag and the closest
field. ``print_config_and_exit`` backs ``--print_config``, ``print_fields_and_exit``
``--help_config`` (every field with its value and the comment that explains it).
"""

from __future__ import annotations

import io
import os
import re
import sys
import textwrap
import tokenize
from collections.abc import Iterator, Sequence

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


# ``c.task.eval_fraction = 0.0  # comment`` (``run.`` in base.sweep_config).
_ASSIGNMENT = re.compile(r"^\s*(?:c|run)\.([\w.]+)\s*=")


def _trailing_comment(line: str) -> str:
    """The ``# comment`` of a line of Python ('#' inside strings is not one)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return token.string.lstrip("#").strip()
    except (tokenize.TokenError, SyntaxError):  # an expression continued on the next line
        pass
    return ""


def field_comments(path: str) -> dict[str, str]:
    """``{"task.eval_fraction": "its comment"}`` from the assignments of a config file:
    the comment lines right above an assignment and its own trailing comment."""
    comments: dict[str, str] = {}
    block: list[str] = []
    with open(path) as f:
        for line in f:
            stripped = line.strip()
            if stripped.startswith("#"):
                block.append(stripped.lstrip("#").strip())
                continue
            match = _ASSIGNMENT.match(line)
            if match:
                trailing = _trailing_comment(line)
                text = " ".join(block + ([trailing] if trailing else []))
                if text:
                    comments.setdefault(match.group(1), text)
            block = []
    return comments


def _leaves(config: ConfigDict, prefix: str = "") -> Iterator[tuple[str, object]]:
    for key in sorted(config.keys()):
        value = config[key]
        if isinstance(value, ConfigDict) and len(value):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value.to_dict() if isinstance(value, ConfigDict) else value


def describe_fields(config: ConfigDict, sources: Sequence[str] = ()) -> str:
    """Every field of ``config`` as ``--config.<field>=<value>``, each followed by its
    comment from the first of ``sources`` (config files) that has one.

    Args:
      config: a config (after its overrides: the values shown are the ones a run gets).
      sources: config files whose comments describe the fields (e.g. the base config).
    """
    comments: dict[str, str] = {}
    for path in sources:
        if path and os.path.exists(path):
            for field, text in field_comments(path).items():
                comments.setdefault(field, text)
    lines = []
    for field, value in _leaves(config):
        lines.append(f"--config.{field}={value!r}")
        if field in comments:
            lines += textwrap.wrap(
                comments[field], width=88, initial_indent="    ", subsequent_indent="    "
            )
    return "\n".join(lines)


def print_fields_and_exit(config: ConfigDict, config_file: str | None = None) -> None:
    """Prints `describe_fields` (comments from ``config_file`` and the base config) and
    exits 0."""
    from experiments.configs import base

    print(describe_fields(config, [config_file or "", base.__file__]))
    sys.exit(0)
