r"""How much of the reward variance could a critic explain at the starting policy?

  python -m experiments.value_bound --config=experiments/configs/ppo_cpu.py
  python -m experiments.value_bound --config=experiments/configs/grpo_cpu.py --group_by=

For a synthetic task (one canonical response per prompt) the starting policy's success
probability on validation prompt ``x`` is, to the exact-match lower bound, its
``p(x) = p(reference response | x)`` (``rl_batch.algorithms.exact_eval``). A value function that
knew every ``p(x)`` would explain ``Var_x p(x) / (m (1 - m))`` of the 0/1 reward variance
(``m`` the mean): the ceiling of a PPO critic's explained variance on fresh rollouts.
``--group_by`` (a key of the examples' ``meta``, e.g. ``op`` of ``arithmetic_mix``) also
prints each group's mean and the part of the ceiling the group alone explains. The
starting policy is the config's ``init`` (the cached warm start by default; trained on
first use).
"""

import json

import numpy as np
from absl import app, flags, logging

from experiments import cli, configs

_CONFIG = cli.define_config(
    "config", configs.path("ppo_cpu.py"), "Run or sweep config file.", lock_config=False
)
_GROUP_BY = flags.DEFINE_string("group_by", "op", "A meta key to group prompts by ('' = none).")


def explained_variance_bound(p_n, groups_n=None) -> dict:
    """The ceiling ``Var p / (m (1 - m))`` of per-prompt success probabilities ``p_n`` and,
    with ``groups_n`` (a label per prompt), each group's size and mean and the ceiling of
    a predictor that knows only the group."""
    p = np.asarray(p_n, dtype=np.float64)
    m = float(p.mean())
    denom = m * (1.0 - m)
    out = {"n": int(p.size), "mean": m, "bound": float(p.var()) / denom if denom else 0.0}
    if groups_n is not None:
        labels = np.asarray([str(g) for g in groups_n])
        means = {g: float(p[labels == g].mean()) for g in sorted(set(labels))}
        sizes = {g: int((labels == g).sum()) for g in means}
        between = sum(sizes[g] * (means[g] - m) ** 2 for g in means) / p.size
        out["groups"] = {g: (sizes[g], means[g]) for g in means}
        out["group_bound"] = between / denom if denom else 0.0
    return out


def main(argv):
    del argv
    from rl_batch.algorithms import exact_eval
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import run

    logging.set_verbosity(logging.WARNING)  # orbax logs the warm start's restore at INFO
    c = _CONFIG.value
    if "sweep" in c:
        del c["sweep"]
    spec = config_lib.resolve(c)
    c, model_config = spec.config, spec.model
    tokenizer = config_lib.make_tokenizer(c)
    _, val = run.load_task_data(spec, tokenizer)
    examples = [val[i] for i in range(len(val))]
    params = run.initial_params(spec)
    scorer = exact_eval.ReferenceScorer(
        model_config, tokenizer, examples, temperature=c.sampling.temperature
    )
    p_n = np.exp(scorer.logp(params))
    key = _GROUP_BY.value
    groups = None
    if key:
        metas = [
            e["meta"] if isinstance(e["meta"], dict) else json.loads(e["meta"]) for e in examples
        ]
        if not all(key in m for m in metas):
            raise app.UsageError(f"--group_by={key!r}: not a key of every example's meta")
        groups = [m[key] for m in metas]
    b = explained_variance_bound(p_n, groups)
    print(f"task {c.task.name}: {b['n']} validation prompts, mean p_ref {b['mean']:.3f}")
    print(f"explained-variance ceiling Var_x p(x) / (m (1 - m)) = {b['bound']:.3f}")
    if groups is not None:
        for g, (n, mean) in b["groups"].items():
            print(f"  {key}={g}: {n} prompts, mean p_ref {mean:.3f}")
        print(f"  {key} alone explains {b['group_bound']:.3f}")


if __name__ == "__main__":
    cli.run(main)
