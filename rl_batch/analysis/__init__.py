"""Scaling analysis of run and sweep directories (numpy + matplotlib; never imports JAX).

Typical use (script or notebook)::

    from rl_batch import analysis
    sweep = analysis.load_sweep("sweeps/grpo_cpu")
    a = analysis.analyze_sweep(sweep)                    # N*, q, T, ratios with CIs
    crit = analysis.critical_training_batch(a, tol=0.2)  # edge of invariance
    plan = analysis.plan_full(a)                         # Algorithm 1
    paths = analysis.write_all("sweeps/grpo_cpu")        # figures/ and report.md

Modules: ``curves`` (loading), ``time_to_target``, ``critical_batch``, ``noise_scale``,
``cost_model`` (throughput file, generation plateau, KV-cache bound), ``planner`` (also
edge optima and the grid extension's next points), ``saturation`` (ScaleRL's ceiling fit),
``figures`` and ``report`` (matplotlib is imported only by those two, on first use).
"""

from rl_batch.analysis.cost_model import (
    THROUGHPUT_FILE,
    GenerationReport,
    ModelShape,
    Throughput,
    fit_generation,
    fit_update,
    generation_report,
    load_throughput,
    max_kv_batch,
    write_throughput,
)
from rl_batch.analysis.critical_batch import (
    CriticalTrainingBatch,
    GradNormTrend,
    critical_training_batch,
    grad_norm_trend,
)
from rl_batch.analysis.curves import (
    RunData,
    Sweep,
    group_runs,
    load_run,
    load_sweep,
    truncate_run,
)
from rl_batch.analysis.noise_scale import (
    NoiseScaleEMA,
    group_noise_scales,
    group_noise_terms,
    run_noise_scale,
)
from rl_batch.analysis.planner import Plan, plan_full, plan_pilot, plan_to_json
from rl_batch.analysis.time_to_target import (
    INCOMPLETE,
    NOT_REACHED,
    Analysis,
    Estimate,
    analyze_sweep,
    first_crossing,
    run_time_to_target,
)
from rl_batch.gradient_noise import noise_scale_terms, simple_noise_scale


def write_all(sweep_dir, target=None, **kwargs):
    """Writes ``<sweep>/figures/*`` and ``<sweep>/report.md``; see ``figures.write_all``."""
    from rl_batch.analysis import figures  # matplotlib only when figures are wanted.

    return figures.write_all(sweep_dir, target=target, **kwargs)


__all__ = [
    "INCOMPLETE",
    "NOT_REACHED",
    "THROUGHPUT_FILE",
    "Analysis",
    "CriticalTrainingBatch",
    "Estimate",
    "GenerationReport",
    "GradNormTrend",
    "ModelShape",
    "NoiseScaleEMA",
    "Plan",
    "RunData",
    "Sweep",
    "Throughput",
    "analyze_sweep",
    "critical_training_batch",
    "first_crossing",
    "fit_generation",
    "fit_update",
    "generation_report",
    "grad_norm_trend",
    "group_noise_scales",
    "group_noise_terms",
    "group_runs",
    "load_run",
    "load_sweep",
    "load_throughput",
    "max_kv_batch",
    "noise_scale_terms",
    "plan_full",
    "plan_pilot",
    "plan_to_json",
    "run_noise_scale",
    "run_time_to_target",
    "simple_noise_scale",
    "truncate_run",
    "write_all",
    "write_throughput",
]
