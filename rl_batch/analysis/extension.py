"""Grid extension: the batches a sweep adds beyond an edge optimum (``sweep.extend_edges``).

`next_edge_points` reads the plan's best configuration without a variant; when it is at
the smallest (or largest) batch of its family (`rl_batch.analysis.edges`), it names the
next batch beyond it by the grid's factor. `rl_batch.sweeps.extend` runs those points
and records them in ``<sweep>/extensions.json``; `extension_lines` reports what was added.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rl_batch import artifacts
from rl_batch.analysis.edges import BOTH, EDGE_WORDS, LARGER, SMALLER, edge_family, edge_side
from rl_batch.analysis.planner import plan_full
from rl_batch.analysis.time_to_target import Analysis
from rl_batch.artifacts import Configuration


@dataclasses.dataclass(frozen=True)
class Extension:
    """The grid extension's next step (`next_edge_points`).

    Attributes:
      points: point keys (``"PxG:rule"``, sweep spelling) to add; empty: stop.
      reason: why these points, or why the extension stops.
      best: the configuration with the smallest mean T (``None``: none reached).
      side: the edge the best sits at (``"smaller"``, ``"larger"``, ``"both"``) or ``None``.
    """

    points: tuple[str, ...]
    reason: str
    best: Configuration | None = None
    side: str | None = None

    @property
    def stop(self) -> bool:
        return not self.points


def _grid_factor(batches: Sequence[int], best: int, toward: int, default: int) -> int | None:
    """The grid's factor at ``best``: its neighbour on the interior side over it (an
    integer, or ``None`` when the ratio is not one); ``default`` for a one-batch family."""
    if len(batches) < 2:
        return default
    i = batches.index(best)
    neighbour = batches[i + toward]
    hi, lo = max(neighbour, best), min(neighbour, best)
    return hi // lo if hi % lo == 0 and hi // lo >= 2 else None


def _smaller_point(
    best: Configuration, batches: Sequence[int], min_group: int, default_factor: int
) -> tuple[tuple[int, int] | None, str]:
    """``(P, G)`` of the batch below ``best`` (the smallest of its family's ``batches``)
    by the grid's factor (`next_edge_points`), or None and why it cannot be formed."""
    f = _grid_factor(batches, best.batch, +1, default_factor)
    p, g = best.prompts, best.group_size
    if f is None:
        return None, f"no integer grid factor above B = {best.batch}"
    if p > 1 and p % f == 0:
        return (p // f, g), ""
    if p == 1 and g % f == 0 and g // f >= min_group:
        return (1, g // f), ""
    if p == 1:
        return None, f"limit: P = 1 and G = {g} / {f} would be below {min_group}"
    return None, f"limit: P = {p} does not divide by the grid's factor {f}"


def ahead_points(
    keys: Sequence[Configuration], min_group: int = 2, default_factor: int = 2
) -> tuple[str, ...]:
    """The smaller-side extension points a calibration can time ahead: for each family
    without a variant, the point `next_edge_points` adds when its smallest batch is the
    best, where that point's batch is below every batch of ``keys`` (its steps are the
    cheapest of the sweep). A sweep calibrated with them needs no second calibration
    when its extension adds one (`rl_batch.sweeps.extend`)."""
    smallest = min((k.batch for k in keys), default=0)
    out: list[str] = []
    for fam in {k.family for k in keys if not k.variant}:
        members = sorted((k for k in keys if k.family == fam), key=Configuration.sort_key)
        first = members[0]
        batches = sorted({k.batch for k in members})
        point, _ = _smaller_point(first, batches, min_group, default_factor)
        if point and point[0] * point[1] < smallest:
            key = Configuration(first.algo, *point, first.lr_rule, first.critic, "").key
            out += [key] if key not in out else []
    return tuple(sorted(out))


def next_edge_points(
    analysis: Analysis,
    rounds_done: int = 0,
    max_rounds: int = 2,
    max_batch: int = 0,
    min_group: int = 2,
    default_factor: int = 2,
) -> Extension:
    """The next batch beyond an edge optimum, or why the search stops (a pure function).

    The best configuration is `plan_full`'s (smallest mean T/T_ref among those whose every
    seed reached the target). When it has the smallest batch of its family
    (`edge_family`), the next point is ``B / f`` with ``f`` the grid's factor (the ratio
    of the best's batch to its neighbour's): ``P / f`` prompts at the same group size, or,
    at ``P = 1``, ``G / f`` (not below ``min_group``); the largest batch gets ``P * f``.
    The new point keeps the best's LR rule (its LR follows from ``lr_ref`` and the rule)
    and critic settings. A one-batch family is extended both ways by ``default_factor``.

    Stops (no points) when: no configuration reached the target; the best is interior
    (a smaller and a larger batch were both tried); ``rounds_done >= max_rounds``; the
    next batch cannot be formed (P does not divide by f, or P = 1 and G / f would be
    below ``min_group``); or it would exceed ``max_batch`` (0: no bound).

    Args:
      analysis: the analysed sweep.
      rounds_done: extension rounds already run.
      max_rounds: the most extension rounds (``sweep.extend_max_rounds``).
      max_batch: the largest batch the extension may add (0: none), e.g. from memory.
      min_group: the smallest group size (2 for GRPO, whose advantage needs a group).
      default_factor: the factor of a family with a single batch.

    Returns:
      The points to add (sweep spelling) with the reason, or no points and why it stops.
    """
    keys = list(analysis.stats)
    # The search walks batch families without a variant (a variant, e.g. a batch-size
    # schedule, is compared with them, not extended): the best of those.
    best = next((r.key for r in plan_full(analysis).rows if r.reached and not r.key.variant), None)
    if best is None:
        return Extension((), "no configuration without a variant reached the target in every seed")
    side = edge_side(keys, best)
    if side is None:
        return Extension(
            (), f"the minimum of T (B = {best.batch}) is interior: both arms were tried", best
        )
    if rounds_done >= max_rounds:
        return Extension(
            (),
            f"limit: {rounds_done} extension round(s) done (max {max_rounds}); "
            f"B = {best.batch} stays {EDGE_WORDS[side]}",
            best,
            side,
        )
    batches = sorted({k.batch for k in edge_family(keys, best)})
    points, notes = [], []
    if side in (SMALLER, BOTH):
        point, note = _smaller_point(best, batches, min_group, default_factor)
        points += [point] if point else []
        notes += [note] if note else []
    if side in (LARGER, BOTH):
        f = _grid_factor(batches, best.batch, -1, default_factor)
        if f is None:
            notes.append(f"no integer grid factor below B = {best.batch}")
        elif max_batch and best.batch * f > max_batch:
            notes.append(f"limit: B = {best.batch * f} is over the largest batch {max_batch}")
        else:
            points.append((best.prompts * f, best.group_size))
    keys_out = tuple(
        Configuration(best.algo, p, g, best.lr_rule, best.critic, best.variant).key
        for p, g in points
    )
    if not keys_out:
        return Extension((), "; ".join(notes), best, side)
    added = ", ".join(f"B = {p * g} ({p}x{g})" for p, g in points)
    reason = f"B = {best.batch} is {EDGE_WORDS[side]}: adding {added}"
    return Extension(keys_out, "; ".join([reason, *notes]), best, side)


# <sweep>/extensions.json: its format is artifacts' (rl_batch.sweeps.extend writes it).
EXTENSIONS_FILE = artifacts.EXTENSIONS_FILE
read_extensions = artifacts.read_extensions


def extension_lines(sweep_dir: str) -> list[str]:
    """The report's lines on the grid extension (empty when the sweep was not extended)."""
    ext = read_extensions(sweep_dir)
    if not ext["rounds"] and not ext["stopped"]:
        return []
    out = ["## Grid extension (sweep.extend_edges)", ""]
    for i, r in enumerate(ext["rounds"], start=1):
        out.append(f"- round {i}: added {', '.join(r['points'])}: {r.get('reason', '')}")
    if ext["stopped"]:
        out.append(f"- stopped: {ext['stopped']}")
    return out + [""]
