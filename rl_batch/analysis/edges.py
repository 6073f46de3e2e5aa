"""Edge optima: an optimum at the smallest (or largest) batch tried is not a shown one.

`edge_sentence` says so beside a plan's best; `rl_batch.analysis.extension` names the
batches a sweep adds beyond such an edge (Algorithm 1 is a search, not a fixed grid).
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_batch.artifacts import Configuration

SMALLER, LARGER, BOTH = "smaller", "larger", "both"
EDGE_WORDS = {
    SMALLER: "at the edge of the grid: a smaller batch was not tried",
    LARGER: "at the edge of the grid: a larger batch was not tried",
    BOTH: "at the edge of the grid: neither a smaller nor a larger batch was tried",
}


def edge_family(keys: Sequence[Configuration], best: Configuration) -> list[Configuration]:
    """The configurations ``best`` is compared with along the batch axis: same algorithm,
    LR rule, critic settings and variant (any (P, G) split of B), sorted by batch."""
    fam = [k for k in keys if k.family == best.family]
    return sorted(fam, key=Configuration.sort_key)


def edge_side(keys: Sequence[Configuration], best: Configuration | None) -> str | None:
    """Whether ``best`` has the smallest (``"smaller"``: no smaller batch was tried), the
    largest (``"larger"``) or the only (``"both"``) batch of its family
    (`edge_family`); ``None`` when it is interior, or there is no best.

    Args:
      keys: every configuration of the sweep (tried, reached or not).
      best: the configuration with the smallest T.
    """
    if best is None:
        return None
    batches = sorted({k.batch for k in edge_family(keys, best)})
    if len(batches) == 1:
        return BOTH
    if best.batch == batches[0]:
        return SMALLER
    if best.batch == batches[-1]:
        return LARGER
    return None


def edge_sentence(keys: Sequence[Configuration], best: Configuration | None) -> str:
    """One sentence flagging an edge optimum (empty when the best is interior)."""
    side = edge_side(keys, best)
    if side is None:
        return ""
    fam = f"{best.algo}, {best.lr_rule} LR" + (f", critic {best.critic}" if best.critic else "")
    fam += f", variant {best.variant}" if best.variant else ""
    which = {SMALLER: "smallest", LARGER: "largest", BOTH: "only"}[side]
    return (
        f"The best mean T, B = {best.batch} ({best.name}), is the {which} batch of its "
        f"family ({fam}): {EDGE_WORDS[side]}, so it is not shown to be an optimum."
    )
