"""Checks across a set of imported runs: one group size per configuration, the LR rule.

A run's own checks (finite values, timing) are in `convert`; these need every run:

- `check_group_sizes`: the seeds of one configuration share G. Runs are one
  configuration's seeds when their names differ only in a seed suffix (``_s0``,
  ``-seed1``), or when they share P and LR under a rule that scales the LR with the
  batch (``sqrt``, ``linear``: a G of its own would need another LR). A stray G would
  otherwise become a configuration of its own, and the smallest batch the reference.
- `infer_lr_rule`: runs whose LR rule is unknown get the one rule (``sqrt``, ``linear``,
  ``fixed``) that every run's (B, LR) pair fits exactly, and the import says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from rl_batch.analysis.importers.convert import ImportedRun
from rl_batch.analysis.importers.keymap import ImportProblem

SEED_SUFFIX = re.compile(r"[_-](?:s|seed)\d+$")
RULE_EXPONENTS = {"fixed": 0.0, "sqrt": 0.5, "linear": 1.0}  # lr ~ B ** exponent
SCALED_RULES = ("sqrt", "linear")
REL_TOL = 1e-6  # "exactly", up to the decimal digits a config keeps


def configuration_stem(name: str) -> str:
    """A run name less its seed suffix: ``"b256_s1"`` -> ``"b256"``."""
    return SEED_SUFFIX.sub("", name)


def check_group_sizes(runs: Sequence[ImportedRun]) -> None:
    """Refuses runs of one configuration whose group sizes differ.

    Raises:
      ImportProblem: one line naming the configuration, its runs and their G.
    """
    groups: dict[tuple, list[ImportedRun]] = {}
    for r in runs:
        groups.setdefault(("name", configuration_stem(r.name)), []).append(r)
        if r.lr_rule in SCALED_RULES and r.lr is not None:
            groups.setdefault(("lr", r.prompts, r.lr_rule, r.lr), []).append(r)
    for key, members in groups.items():
        sizes = sorted({r.group_size for r in members})
        if len(members) < 2 or len(sizes) < 2:
            continue
        listed = ", ".join(f"{r.name} (G={r.group_size})" for r in members[:6])
        why = (
            f"runs named {key[1]!r} but for their seed"
            if key[0] == "name"
            else f"P={key[1]} with one LR {key[3]:g} under the {key[2]} rule"
        )
        raise ImportProblem(
            f"mixed group size G {sizes} in one configuration ({why}): {listed}; check "
            "each run's group size (key map 'group_size', or --set group_size=N)"
        )


def fitted_rule(pairs: Sequence[tuple[int, float]]) -> str | None:
    """The one rule of `RULE_EXPONENTS` that every (B, LR) pair fits exactly, or None
    (fewer than two batch sizes, a missing LR, or no rule or several)."""
    if len({b for b, _ in pairs}) < 2 or any(lr is None or lr <= 0 for _, lr in pairs):
        return None
    fits = []
    for rule, k in RULE_EXPONENTS.items():
        scale = [lr / b**k for b, lr in pairs]
        if all(math.isclose(c, scale[0], rel_tol=REL_TOL) for c in scale):
            fits.append(rule)
    return fits[0] if len(fits) == 1 else None


def infer_lr_rule(runs: Sequence[ImportedRun]) -> str | None:
    """Sets the LR rule of runs whose rule is unknown when their (B, LR) pairs fit one.

    Returns:
      One line for the import's output (what was inferred, or why not), or None when
      every run has a rule.
    """
    unknown = [r for r in runs if r.lr_rule == "unknown"]
    if not unknown:
        return None
    pairs = [(r.prompts * r.group_size, r.lr) for r in unknown]
    rule = fitted_rule(pairs)
    if rule is None:
        return (
            f"lr_rule: unknown for {len(unknown)} runs (their (B, LR) pairs fit no single "
            "rule of sqrt, linear, fixed); set it with --set lr_rule=NAME or the key map's "
            "lr_rule"
        )
    for r in unknown:
        r.lr_rule = rule
        r.notes.append(f"lr_rule {rule} inferred from the runs' (B, LR) pairs")
    b0, lr0 = min(pairs)
    form = {
        "fixed": f"LR = {lr0:.4g} at every B",
        "sqrt": f"LR = {lr0:.4g} x sqrt(B / {b0})",
        "linear": f"LR = {lr0:.4g} x B / {b0}",
    }[rule]
    return f"lr_rule: inferred {rule} for {len(unknown)} runs: every (B, LR) pair fits {form}"
