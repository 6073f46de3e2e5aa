"""Command-line pieces shared by the ``experiments`` entry points.

``define_config`` registers ``--config`` (with its ``--config.*`` overrides): ml_collections
applies the overrides while the flag is defined, at import, and an unknown field there
ends in a chained traceback; here it ends in one line naming the flag and the closest
field. ``print_config_and_exit`` backs ``--print_config``, ``print_fields_and_exit``
``--help_config`` (every field with its value and the comment that explains it).

``run`` is the one error path of every command (``experiments/*.py``, ``launch/*.py``):
``app.run`` whose user mistakes (a bad flag or value, a missing or malformed file, a
locked or damaged run directory, a full disk; `user_error_types`) end in one line
``error: ...`` on stderr, the last line the process writes, and exit status 1. Anything
else is a bug and keeps its traceback. See docs/errors.md.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import os
import re
import sys
import textwrap
import tokenize
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from absl import app, flags
from ml_collections import ConfigDict, config_flags

# ------------------------------------------------------------------ one line for every mistake

# Mistakes defined in modules that import JAX (not imported here before flag parsing: an
# exception of one can only exist once its module is loaded): (module, class name).
_LOADED_USER_ERRORS = (("rl_batch.runs.accounting", "RunStuckError"),)


def user_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions that are a user's mistake (or the machine's), not a bug.

    ValueError (bad values, malformed or damaged files and checkpoints; every config
    check raises one), OSError (missing files and directories, permissions, a full disk:
    ``artifacts.DiskFullError``), a locked run directory (``locks.DirectoryLocked``),
    ``app.UsageError``, absl flag errors, and a run stopped for making no progress.
    """
    from rl_batch import locks

    types: list[type[BaseException]] = [
        ValueError, OSError, locks.DirectoryLocked, app.UsageError, flags.Error,
    ]  # fmt: skip
    for module, name in _LOADED_USER_ERRORS:
        if module in sys.modules:
            types.append(getattr(sys.modules[module], name))
    return tuple(types)


def error_line(problem: BaseException | str) -> str:
    """``error: <message>`` on one line (a message's further lines joined with "; ")."""
    text = problem if isinstance(problem, str) else str(problem)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines and isinstance(problem, BaseException):
        lines = [type(problem).__name__]
    return "error: " + "; ".join(lines).removeprefix("error: ")


def fail(problem: BaseException | str) -> NoReturn:
    """Stops the command with `error_line` (as ``SystemExit``: exit status 1)."""
    raise SystemExit(error_line(problem)) from None


def one_line_errors(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
    """``main`` whose user mistakes (`user_error_types`) become `fail`."""

    @functools.wraps(main)
    def wrapped(argv):
        try:
            return main(argv)
        except user_error_types() as e:
            fail(e)

    return wrapped


def packaged_config(value: str) -> str:
    """A ``--config`` value with its file found from any directory.

    ``grpo_cpu`` (a name) and ``experiments/configs/grpo_cpu.py`` (the README's path, from
    outside the checkout) both name the packaged ``experiments/configs/grpo_cpu.py``; a
    file that exists from the working directory is taken as given, as is anything else
    (the loader then says it is missing). The ``:argument`` part is kept.
    """
    from experiments import configs

    path, sep, argument = value.partition(":")
    if not path or os.path.exists(path):
        return value
    name = os.path.basename(path)
    name = name if name.endswith(".py") else name + ".py"
    bare = os.sep not in path and "/" not in path
    packaged = configs.path(name)
    if os.path.isfile(packaged) and (bare or path.endswith(os.path.join("configs", name))):
        return packaged + sep + argument
    return value


def _with_packaged_configs(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config=VALUE`` as `packaged_config` resolves it."""
    out = []
    for arg in argv:
        if arg.startswith("--config="):
            arg = "--config=" + packaged_config(arg.removeprefix("--config="))
        out.append(arg)
    return out


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing with a bad flag (or value) as `fail`, not usage text.

    ``--config=NAME`` is found as `packaged_config` says. An unknown ``--config.<field>``
    with an explicit ``--config`` is found here (ml_collections loads that file while the
    flags are parsed, not at import) and is the one line `unknown_field_message`.
    """
    argv = _with_packaged_configs(argv)
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        fail(e)
    except (AttributeError, KeyError) as e:
        if not any(a.startswith("--config.") for a in argv):
            raise
        fail(unknown_field_message(e, argv))


def run(main: Callable[[list[str]], Any]) -> NoReturn:
    """``app.run(main)``, the shared error path of every command.

    A user's mistake, in the flags or in ``main``, prints one line ``error: ...`` and
    exits 1. That line is the last the process writes: it exits at once (``os._exit``,
    after flushing stdout and stderr), so no library's exit-time logging (e.g. orbax's
    after a failed save) follows it. Everything ``main`` wrote was flushed or closed when
    its exception left it.
    """
    try:
        app.run(one_line_errors(main), flags_parser=_parse_flags)
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        sys.stdout.flush()
        print(e.code, file=sys.stderr, flush=True)
        os._exit(1)
    raise AssertionError("unreachable: app.run exits")


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
        fail(unknown_field_message(e, sys.argv))


def apply_overrides(config: ConfigDict, overrides: dict[str, Any], source: str) -> ConfigDict:
    """``config`` (read from ``source``, e.g. a ``--config_json`` file) with the
    ``--config.<path>=value`` overrides (``FLAGS["config"].override_values``) set.

    Raises:
      ValueError: an override names a field ``config`` lacks, or a value of another type.
    """
    for path, value in overrides.items():
        keys = path.split(".")
        node = config
        for i, key in enumerate(keys):
            if not isinstance(node, ConfigDict) or key not in node:
                where = ".".join(keys[: i + 1])
                raise ValueError(f"--config.{path}: the config of {source} has no field {where!r}")
            if i + 1 < len(keys):
                node = node[key]
        try:
            node[keys[-1]] = value
        except TypeError as e:
            raise ValueError(f"--config.{path}={value!r}: {e}") from e
    return config


def print_config_and_exit(config: ConfigDict, resolve: Callable | None = None) -> NoReturn:
    """Prints ``config`` (after every override) as YAML and exits 0.

    Args:
      config: the config as given.
      resolve: validates it into a ``RunSpec`` (``rl_batch.runs.config.resolve``): a bad value
        is then an error, and what is printed is the config a run gets, with its
        ``derived`` section, the effective LR last.
    """
    if resolve is not None:
        spec = resolve(config)  # a RunSpec: its config view holds the derived section
        print(spec.config)
        how = spec.lr_arithmetic
        print(f"# effective LR: {spec.optimizer.lr:.6g}" + (f" ({how})" if how else ""))
    else:
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
    with open(path) as f:
        return _comments_by_field(f, _ASSIGNMENT)


def _comments_by_field(lines, pattern: re.Pattern) -> dict[str, str]:
    """``{field: the comment lines right above its line + its trailing comment}`` for
    the lines ``pattern`` matches (group 1: the field)."""
    comments: dict[str, str] = {}
    block: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        match = pattern.match(line)
        if match:
            trailing = _trailing_comment(line)
            text = " ".join(block + ([trailing] if trailing else []))
            if text:
                comments.setdefault(match.group(1), text)
        block = []
    return comments


_ATTRIBUTE = re.compile(r"^(\s+)(\w+(?:, \w+)*): (.*)$")
_CLASS_FIELD = re.compile(r"^\s+(\w+): [^=]+=")


def section_docs(cls, prefix: str = "") -> dict[str, str]:
    """``{prefix + field: meaning}`` of a section class (nested sections too, as
    ``field.sub``): its docstring's ``Attributes:`` entries (``a, b: text`` gives both),
    else the comment lines above a field's line in the class body and its own trailing
    comment. These are the words ``--help_config`` prints under each field."""
    docs: dict[str, str] = {}
    lines = (cls.__doc__ or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Attributes:"), None)
    names, indent = [], None
    for line in lines[start + 1 :] if start is not None else ():
        match = _ATTRIBUTE.match(line)
        if match and (indent is None or len(match.group(1)) == indent):
            indent, names = len(match.group(1)), match.group(2).split(", ")
            for name in names:
                docs[prefix + name] = match.group(3).strip()
        elif names and line.strip() and len(line) - len(line.lstrip()) > (indent or 0):
            for name in names:
                docs[prefix + name] += " " + line.strip()
        elif line.strip():
            break  # the block has ended
    for name, text in _body_comments(cls).items():
        docs.setdefault(prefix + name, text)
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            if dataclasses.is_dataclass(value):
                docs.update(section_docs(type(value), f"{prefix}{f.name}."))
    return docs


def _body_comments(cls) -> dict[str, str]:
    """``{field: its comments}`` from the class body's source (`_comments_by_field`)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    return _comments_by_field(source.splitlines(), _CLASS_FIELD)


def _leaves(config: ConfigDict, prefix: str = "") -> Iterator[tuple[str, object]]:
    for key in sorted(config.keys()):
        value = config[key]
        if isinstance(value, ConfigDict) and len(value):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value.to_dict() if isinstance(value, ConfigDict) else value


def describe_fields(
    config: ConfigDict, sources: Sequence[str] = (), docs: Mapping[str, str] | None = None
) -> str:
    """Every field of ``config`` as ``--config.<field>=<value>``, each followed by its
    comment from the first of ``sources`` (config files) that has one, else its meaning
    from ``docs``.

    Args:
      config: a config (after its overrides: the values shown are the ones a run gets).
      sources: config files whose comments describe the fields (e.g. the base config).
      docs: ``{field: meaning}`` of fields whose config file sets them from a section
        class (`section_docs` of ``base.SECTIONS``).
    """
    comments: dict[str, str] = {}
    for path in sources:
        if path and os.path.exists(path):
            for field, text in field_comments(path).items():
                comments.setdefault(field, text)
    for field, text in (docs or {}).items():
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

    docs: dict[str, str] = {}
    for prefix, cls in base.SECTIONS:
        for field, text in section_docs(cls, prefix).items():
            docs.setdefault(field, text)
    print(describe_fields(config, [config_file or "", base.__file__], docs))
    sys.exit(0)
