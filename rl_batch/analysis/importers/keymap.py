"""Key maps: which logged metric and which config entry is which quantity of our contract.

A key map is JSON data (``keymaps/<framework>.json``; copy one and edit it for custom
metric names). Its fields:

- ``framework``, ``description``, ``algo`` (the sweep's algorithm name).
- ``config_files``: files, relative to a run directory, holding the run's config (JSON,
  or YAML when PyYAML is installed); the first that exists is read. ``config_defaults``:
  values of config entries a run may lack (TRL's ``world_size``).
- ``step``: the keys that carry a row's update count, alternatives in order;
  ``"__step__"`` is the writer's own step (TensorBoard's event step, W&B's ``_step``,
  verl's ``step``). ``first_update_step``: the step the first update logs at (1 when a
  row at step s comes after s updates; 0 when after s + 1).
- ``eval_accuracy`` (required): validation accuracy in [0, 1]; ``eval_k`` optional.
- ``prompts``, ``group_size``, ``batch``: config values (`ValueSpec`); two of the three
  are needed (B = P x G). ``batch_metric``: a logged count of the responses each update
  retained, which replaces B per step when it is there.
- ``time``: ``step`` (seconds of one step) or ``phases`` (``generate``, ``score``,
  ``update`` seconds, summed when there is no step key), minus ``exclude`` (validation,
  checkpoints) where those are timed inside the step (``exclude_in_step``: true, false,
  or a rule by version and, where none is recorded, by evidence: ``step_timers`` names
  every timer inside the step, `convert.excluded_inside_step`); the step's seconds that
  are no phase are idle/other (``time_idle_s``). ``step_window``: ``"row"`` (a step key's
  value is that update's) or ``"since_last_row"`` (the mean over the updates since the
  previous row that logged it, as the Hugging Face Trainer averages between logs). Or
  ``elapsed`` (cumulative seconds since the start); or ``timestamps`` (the rows'
  wall-clock times). None of them: no timing (N* and r_N only).
- ``versions``: the framework versions the map was checked against and how each times
  a step (documentation for the reader; ``exclude_in_step`` is what the import uses).
- ``lr`` (logged), ``lr_config`` (a config entry), ``lr_rule`` (our rule name, or
  ``"unknown"``; ``{"config": "dotted.key"}`` reads each run's from its config),
  ``seed`` (a `ValueSpec`), ``metrics``: our update-line field -> keys.

Metric names are lists of alternatives; the first that a run logs wins, and ``*``
matches any characters (``fnmatch``). A pattern that matches two keys of one run is an
error naming both.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

KEYMAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keymaps")
NATIVE_STEP = "__step__"
PHASES = ("generate", "score", "update")
REQUIRED_FIELDS = ("framework", "step", "eval_accuracy", "time")
UPDATE_METRICS = ("grad_norm", "loss", "reward_mean", "kl", "clip_frac", "gen_tokens")
TIME_FIELDS = {
    "step",
    "phases",
    "exclude",
    "exclude_in_step",
    "step_timers",
    "step_window",
    "elapsed",
    "timestamps",
}
STEP_WINDOWS = ("row", "since_last_row")
# Fields of our own that ``--set name=value`` sets directly, whatever the key map reads.
FIELD_OVERRIDES = ("prompts", "group_size", "batch", "seed", "lr", "lr_rule")


class ImportProblem(ValueError):
    """Bad input for an import: its message is one line naming the run, file and key."""


def builtin_keymaps() -> list[str]:
    """Names of the key maps shipped with the package (``keymaps/*.json``)."""
    return sorted(f[: -len(".json")] for f in os.listdir(KEYMAP_DIR) if f.endswith(".json"))


def keymap_path(name_or_path: str) -> str:
    """The file of a shipped key map by name (``"verl"``), or ``name_or_path`` itself."""
    if os.path.exists(name_or_path):
        return name_or_path
    path = os.path.join(KEYMAP_DIR, f"{name_or_path}.json")
    if not os.path.exists(path):
        raise ImportProblem(
            f"key map {name_or_path!r}: no such file, and not one of {builtin_keymaps()}"
        )
    return path


def load_keymap(name_or_path: str) -> dict[str, Any]:
    """Reads and checks a key map (a shipped name or a JSON file).

    Raises:
      ImportProblem: malformed JSON or a missing field, named with the file.
    """
    path = keymap_path(name_or_path)
    with open(path) as f:
        try:
            km = json.load(f)
        except json.JSONDecodeError as e:
            raise ImportProblem(f"{path}: malformed key map JSON: {e}") from None
    if not isinstance(km, dict):
        raise ImportProblem(f"{path}: a key map is a JSON object")
    for field in REQUIRED_FIELDS:
        if field not in km:
            raise ImportProblem(f"{path}: key map has no {field!r} field")
    unknown = set(km.get("time") or {}) - TIME_FIELDS
    if unknown:
        raise ImportProblem(f"{path}: unknown 'time' fields {sorted(unknown)}")
    bad = set((km.get("time") or {}).get("phases") or {}) - set(PHASES)
    if bad:
        raise ImportProblem(f"{path}: unknown time phases {sorted(bad)}; expected {PHASES}")
    window = (km.get("time") or {}).get("step_window", "row")
    if window not in STEP_WINDOWS:
        raise ImportProblem(f"{path}: time.step_window {window!r}: expected one of {STEP_WINDOWS}")
    rule = (km.get("time") or {}).get("exclude_in_step", True)
    if not isinstance(rule, bool) and not (isinstance(rule, dict) and "inside_before" in rule):
        raise ImportProblem(
            f"{path}: time.exclude_in_step {rule!r}: expected true, false or "
            '{"version_config": [keys], "inside_before": "X.Y.Z"}'
        )
    km["_path"] = path
    return km


def alternatives(value: Any) -> list[str]:
    """A key-map entry as a list of key alternatives (None -> [], a string -> [it])."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def match_key(patterns: Sequence[str], keys: Iterable[str]) -> str | None:
    """The first of ``keys`` that the first matching pattern names (``fnmatch``).

    Raises:
      ImportProblem: a pattern matches more than one key (message without the run; the
        caller adds it).
    """
    keys = sorted(set(keys))
    for pattern in patterns:
        if pattern in keys:
            return pattern
        hits = fnmatch.filter(keys, pattern)
        if len(hits) > 1:
            raise ImportProblem(
                f"pattern {pattern!r} matches {len(hits)} keys ({', '.join(hits[:4])}); "
                "name one in the key map"
            )
        if hits:
            return hits[0]
    return None


def config_get(config: dict[str, Any], dotted: str, defaults: dict[str, Any]) -> Any:
    """``config["a"]["b"]`` for ``"a.b"`` (also a flat ``config["a.b"]``), else the
    key map's default, else None."""
    if dotted in config:
        return config[dotted]
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return defaults.get(dotted)
        node = node[part]
    return node


def resolve_value(
    spec: dict[str, Any] | None, config: dict[str, Any], defaults: dict[str, Any]
) -> tuple[float | None, str | None]:
    """A `ValueSpec` ``{"product": [terms], "divide": [terms]}`` on a config.

    A term is a dotted config key or a number. Returns (value, None), or (None, the first
    missing key) when a key is absent, or (None, None) when ``spec`` is None.
    """
    if spec is None:
        return None, None
    value = 1.0
    for op, terms in (("product", spec.get("product") or []), ("divide", spec.get("divide"))):
        for term in terms or []:
            v = term if isinstance(term, (int, float)) else config_get(config, term, defaults)
            if v is None:
                return None, str(term)
            try:
                v = float(v)
            except (TypeError, ValueError):
                return None, str(term)
            value = value * v if op == "product" else value / v
    return value, None


def version_tuple(text: Any) -> tuple[int, ...] | None:
    """``"0.5.0"`` -> (0, 5, 0); ``"0.6.0.dev"`` -> (0, 6, 0); None when no leading number."""
    parts = []
    for piece in str(text).lstrip("v").split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):
            break
    return tuple(parts) or None
