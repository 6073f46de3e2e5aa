"""``report.md`` of a sweep: time-to-target tables, ratios, critical batches, recommendation.

Every missing time-to-target quantity is written "not reached" (or "incomplete" while a
seed that has not reached is still running), never a number. An estimate from one seed
is written ``1234 (1 seed, no CI)``: it has no interval.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from rl_batch import provenance
from rl_batch.analysis import (
    cost_model,
    critical_batch,
    extension,
    findings,
    measurement,
    noise_scale,
    planner,
    saturation,
    stability,
    time_to_target,
)
from rl_batch.analysis.time_to_target import (
    INCOMPLETE,
    NO_TIMING,
    NOT_REACHED,
    Analysis,
    ConfigStats,
    fmt_estimate,
    markdown_table,
)


def _num(v: float | None, spec: str = ".4g", missing: str = NOT_REACHED) -> str:
    return missing if v is None else f"{v:{spec}}"


def _seeds_cell(s: ConfigStats) -> str:
    """``reached/seeds``, plus how many seeds are still running without having reached."""
    cell = f"{s.n_reached}/{s.n_seeds}"
    return cell + (f" ({s.n_pending} running)" if s.incomplete else "")


def updates_to_band_edge(analysis: Analysis, k) -> list[float]:
    """The updates each seed of configuration ``k`` needed to the band's lower edge
    (its first crossing, read as N* is: ``analysis.crossing``), of the seeds that
    reached it; [] without a band. How far past Adam's first steps the band lies."""
    if analysis.band_lo is None:
        return []
    out = []
    for run in analysis.runs_by_key.get(k, []):
        edge = time_to_target.run_time_to_target(
            run, analysis.band_lo, None, crossing=analysis.crossing
        )
        if edge.updates_to_target is not None:
            out.append(float(edge.updates_to_target))
    return out


def _edge_cell(updates: list[float]) -> str:
    """``median [min, max]`` of updates to the band's lower edge, or "-"."""
    if not updates:
        return "-"
    return f"{np.median(updates):.4g} [{min(updates):.4g}, {max(updates):.4g}]"


def config_table(analysis: Analysis) -> list[str]:
    """Per-configuration N*, q, T and updates to target (mean [bootstrap CI]); with a
    band, the updates to its lower edge (median [min, max] over seeds)."""
    band = analysis.band_lo is not None
    rows = []
    for k, s in analysis.stats.items():
        miss = s.missing_label
        row = [
            k.name,
            k.batch,
            k.prompts,
            k.group_size,
            k.lr_rule,
            _seeds_cell(s),
            fmt_estimate(s.n_star, ".4g", miss),
            fmt_estimate(s.q, ".4g", "-"),
            fmt_estimate(s.time_to_target_s, ".4g", s.time_missing_label),
            fmt_estimate(s.updates_to_target, ".4g", miss),
        ]
        rows.append(row + ([_edge_cell(updates_to_band_edge(analysis, k))] if band else []))
    header = [
        "config",
        "B",
        "P",
        "G",
        "LR rule",
        "seeds reached",
        "N* (responses)",
        "q (responses/s)",
        "T (s)",
        "updates to target",
    ]
    if band:
        header.append(f"updates to {analysis.band_lo:g} (median [min, max])")
    return markdown_table(header, rows)


def run_table(analysis: Analysis) -> list[str]:
    """Per-run N*, q, T, updates."""
    rows = []
    for k, runs in analysis.runs_by_key.items():
        for r in runs:
            t = analysis.targets[r.name]
            miss = f"{NOT_REACHED} yet" if t.pending else NOT_REACHED
            timed = t.q is not None  # a run that logged no time has no q, T, train s
            rows.append(
                [
                    r.name,
                    k.name,
                    "-" if r.seed is None else r.seed,
                    r.status,
                    _num(t.n_star, missing=miss),
                    _num(t.q, ".4g") if t.q is not None else "-",
                    _num(t.time_to_target_s, missing=miss) if timed else NO_TIMING,
                    _num(t.updates_to_target, missing=miss),
                    f"{t.responses_final:.0f}",
                    f"{t.time_train_s:.4g}" if timed else NO_TIMING,
                ]
            )
    header = [
        "run",
        "config",
        "seed",
        "status",
        "N*",
        "q",
        "T (s)",
        "updates",
        "responses run",
        "train s run",
    ]
    return markdown_table(header, rows)


def ratio_table(analysis: Analysis) -> list[str]:
    """Per-configuration r_N, r_q, T/T_ref and updates ratio against the reference."""
    rows = []
    for k, r in analysis.ratios.items():
        miss = r.missing_label
        rows.append(
            [
                k.name,
                k.batch,
                fmt_estimate(r.r_n, missing=miss),
                fmt_estimate(r.r_q, missing="-"),
                fmt_estimate(r.r_t, missing=r.time_missing_label),
                fmt_estimate(r.r_updates, missing=miss),
                f"{r.ideal_updates:.3g}",
            ]
        )
    header = [
        "config",
        "B",
        "r_N",
        "r_q",
        "T/T_ref = r_N/r_q",
        "updates ratio",
        "ideal updates ratio (B_ref/B)",
    ]
    return markdown_table(header, rows)


def study_shares(
    analysis: Analysis,
    generation: cost_model.GenerationReport | None,
    tol: float,
    resamples: int = stability.DEFAULT_RESAMPLES,
) -> stability.Shares | None:
    """The study's verdict and recommendation shares over ``resamples`` seed resamples
    (``stability.seed_shares``; None for 0 resamples or fewer than 2 seeds)."""
    if not resamples:
        return None
    return stability.seed_shares(
        analysis, lambda a: findings.study_findings(a, generation, tol), resamples
    )


def findings_section(
    analysis: Analysis,
    generation: cost_model.GenerationReport | None,
    tol: float,
    shares: stability.Shares | None = None,
) -> list[str]:
    """The study's findings with our measurement, a verdict and, given ``shares``
    (``study_shares``), how often resampled seeds reach the same verdict; and the cost
    structure."""
    found = findings.study_findings(analysis, generation, tol)
    verdicts = shares.verdicts if shares is not None else {}
    header = ["finding", "the study", "measured here", "verdict", "how decided"]
    header += ["same verdict on resampled seeds"] if verdicts else []
    rows = [
        [f.name, f.paper, f.measured, f"**{f.verdict}**", f.note]
        + ([stability.fmt_shares(f.verdict, verdicts.get(f.name, {}))] if verdicts else [])
        for f in found
    ]
    out = ["## Findings", "", *markdown_table(header, rows), ""]
    n_seeds = sorted({s.n_seeds for s in analysis.stats.values()})
    out.append(
        f"Verdicts at {analysis.level:.0%} intervals over {'/'.join(map(str, n_seeds))} "
        'seed(s) per configuration; "undecided at this power" means the interval does not '
        "decide it (more seeds would)."
        + (
            " The last column: the share of "
            f"{shares.resamples} resamples of the seeds (with replacement; a drawn seed brings "
            "its runs of every configuration) that reach the same verdict, i.e. how often a "
            "rerun with as many fresh seeds would, as far as these seeds tell (seed noise "
            "only: every resample keeps this sweep's timing). Below ~90% the verdict sits "
            "near its decision line."
            if shares is not None and verdicts
            else ""
        )
    )
    out += [
        "",
        "Cost structure (share of training time, all runs of each batch):",
        "",
    ]
    costs = findings.cost_structure(analysis)
    out += markdown_table(
        ["B", "generation", "scoring", "update", "idle"],
        [[b, *(f"{s[p]:.0%}" for p in findings.COST_PARTS)] for b, s in costs],
    )
    return out + ["", findings.cost_sentence(costs), ""]


def recommendation_shares_lines(
    shares: stability.Shares | None, plan: planner.Plan | None = None
) -> list[str]:
    """The full plan's recommendation set over seed resamples (not for a pilot plan)."""
    if plan is not None and plan.mode != "full":
        return []
    sentence = stability.recommendation_sentence(shares)
    return [sentence, ""] if sentence else []


def _critical_section(analysis: Analysis, tol: float) -> list[str]:
    crit = critical_batch.critical_training_batch(analysis, tol)
    out = ["## Critical training batch", ""]
    if crit is None:
        return out + [
            "No sqrt-LR family with two or more batches whose reference reaches the target "
            "(every seed; an incomplete reference waits for its running seeds).",
            "",
        ]
    fam = crit.family[0]
    out.append(
        f"Family: {fam.algo}, G={fam.group_size}, LR rule {fam.lr_rule}; r_N against "
        f"{crit.reference.name}; inside the family while r_N <= 1 + {tol:g}."
    )
    out.append("")
    outside = "none measured" if crit.first_outside is None else str(crit.first_outside)
    if crit.first_outside_incomplete:
        out.append(
            f"- critical training batch: at least **{crit.critical_batch}** responses (the "
            f"walk stops at B = {crit.first_outside}, incomplete); r_N there "
            f"{fmt_estimate(crit.r_n_at_critical)}"
        )
        outside += " (incomplete: seeds still running, it may yet turn out inside)"
    else:
        if crit.has_interval:
            walk = f"CI walk: [{crit.critical_batch_lo}, {crit.critical_batch_hi}]"
        else:
            walk = "CI walk: unavailable, an r_N on the way has no interval (fewer than 2 seeds)"
        value = (
            f"**{crit.critical_batch}** responses"
            if crit.decided
            else f"undecided at this power ({crit.critical_batch} by the means)"
        )
        out.append(
            f"- critical training batch: {value} ({walk}); r_N there "
            f"{fmt_estimate(crit.r_n_at_critical)}"
        )
    out.append("- first batch outside the family: " + outside)
    out.append("")
    out += markdown_table(
        ["B", "r_N"],
        [
            [k.batch, fmt_estimate(e, missing=analysis.stats[k].missing_label)]
            for k, e in zip(crit.family, crit.r_n)
        ],
    )
    out.append("")
    for field in ("grad_norm", "critic_grad_norm"):
        tr = critical_batch.grad_norm_trend(analysis, field)
        if tr is None:
            continue
        out.append(
            f"Gradient norm `{field}` (seed mean over the first "
            f"{tr.window_responses:.0f} responses): log-log slope {tr.slope:.3f}; "
            f"decline slows at "
            f"{'-' if tr.slowdown_segment is None else tr.slowdown_segment}; knee "
            f"(norm^2 = g2 + s/B) at {_num(tr.knee_batch, '.4g') if tr.knee_batch else '-'}."
        )
        if tr.left_out:
            out.append(
                f"Left out: {', '.join(tr.left_out)} (stopped before "
                f"{tr.window_responses:.0f} responses)."
            )
        out.append("")
        seg = ["-", *(f"{s:.3f}" for s in tr.segment_slopes)]
        out += markdown_table(
            ["B", "mean norm", "slope from previous"],
            [[f"{b:.0f}", f"{n:.4g}", s] for b, n, s in zip(tr.batches, tr.norms, seg)],
        )
        out.append("")
    return out


def _noise_section(analysis: Analysis) -> list[str]:
    rows = []
    for k, runs in analysis.runs_by_key.items():
        for r in runs:
            for prefix in ("", "critic_"):
                s = noise_scale.run_noise_scale(r, prefix)
                if s is not None:
                    b_noise = "-"
                    if s.b_noise_lo is not None:
                        est = "no estimate" if s.b_noise is None else f"{s.b_noise:.4g}"
                        b_noise = f"{est} [{s.b_noise_lo:.4g}, {s.b_noise_hi:.4g}]"
                    rows.append(
                        [
                            r.name,
                            k.batch,
                            prefix.rstrip("_") or "actor",
                            s.source,
                            s.layout,
                            f"{s.final:.4g}",
                            f"{s.median_second_half:.4g}",
                            "-" if s.pooled is None else f"{s.pooled:.4g}",
                            b_noise,
                            "-" if s.inter is None else f"{s.inter:.4g}",
                            "-" if s.intra is None else f"{s.intra:.4g}",
                        ]
                    )
    if not rows:
        return []
    out = ["## Gradient noise scale (B_simple, B_noise)", ""]
    out += markdown_table(
        [
            "run",
            "B",
            "model",
            "source",
            "layout",
            "final (EMA)",
            "median, 2nd half",
            "pooled, 2nd half",
            "B_noise, pooled [95% CI]",
            "B_inter, pooled",
            "B_intra, pooled",
        ],
        rows,
    )
    out += [
        "",
        "B_noise = (G tr(Sigma_inter) + tr(Sigma_intra)) / |G|^2 in responses, the noise "
        "scale that matters when P grows, pooled over each run's second half (Fieller "
        "interval; 'no estimate' where the pooled |G|^2 <= 0). Layout 'groups' (whole "
        "groups per micro-batch unit) measures it as B_simple; with layout 'strided' "
        "B_simple is the intra-prompt term ~ tr(Sigma_intra) / (|G|^2 + tr(Sigma_inter) / "
        "P), which grows with P and is not B_noise (docs/noise_scale.md).",
    ]
    if any(r[9] != "-" for r in rows):
        out += [
            "",
            "B_inter = tr(Sigma_inter) / |G|^2 (the prompts' mean gradients) and B_intra = "
            "tr(Sigma_intra) / |G|^2 (within a group), in responses, from runs with "
            "grpo.group_noise (docs/noise_scale.md); a batch of P x G responses has noise "
            "scale G B_inter + B_intra.",
        ]
    meds = [float(r[6]) for r in rows if r[2] == "actor" and np.isfinite(float(r[6]))]
    if meds:
        layouts = sorted({r[4] for r in rows if r[2] == "actor"})
        out += [
            "",
            f"Median actor B_simple over runs: {np.median(meds):.4g} responses "
            f"(layout {', '.join(layouts)}).",
        ]
    return out + _noise_against_r_n(analysis) + [""]


def _noise_against_r_n(analysis: Analysis) -> list[str]:
    """Measured B_noise against the B_noise the family's r_N imply, in words."""
    crit = critical_batch.critical_training_batch(analysis)
    if crit is None:
        return []
    runs = [r for k in crit.family for r in analysis.runs_by_key.get(k, ())]
    cmp = noise_scale.compare_noise_scales(
        runs, [k.batch for k in crit.family], list(crit.r_n), crit.reference.batch
    )
    if cmp.measured is None and cmp.implied is None:
        return []
    out = [""]
    if cmp.measured is not None:
        est, lo, hi = cmp.measured
        value = "no estimate (pooled |G|^2 <= 0)" if np.isnan(est) else f"{est:.4g}"
        out.append(
            f"- measured B_noise, pooled over the family's {cmp.runs} runs: {value} "
            f"[{lo:.4g}, {hi:.4g}] responses"
        )
    else:
        out.append("- measured B_noise: none (no run of the family measures it; layout 'groups')")
    if cmp.implied is not None:
        i = cmp.implied
        out.append(
            f"- B_noise implied by r_N(B) = (1 + B / B_n) / (1 + {crit.reference.batch} / B_n) "
            f"over {i.points} batches: {i.b_noise:.4g} [{i.lo:.4g}, {i.hi:.4g}] responses "
            f"(chi2 {i.chi2:.3g} on {i.points - 1} d.o.f.)"
        )
    else:
        out.append("- B_noise implied by r_N: none (fewer than two r_N with an interval)")
    if cmp.agree is not None:
        verdict = "agree" if cmp.agree else "do not agree"
        out.append(f"- the two {verdict} within their 95% intervals")
    return out


def critic_section(analysis: Analysis) -> list[str]:
    """The PPO critic's explained variance per configuration (empty without any)."""
    rows = findings.critic_explained_variance(analysis)
    if not rows:
        return []
    out = ["## PPO critic", ""]
    out += markdown_table(
        ["configuration", "B", f"EV, last {findings.EV_WINDOW} warm-up updates", "EV, actor"],
        [
            [k.name, k.batch, fmt_estimate(w, missing="-"), fmt_estimate(t, missing="-")]
            for k, w, t in rows
        ],  # fmt: skip
    )
    out += [
        "",
        "EV: the critic's explained variance of the returns on each fresh rollout batch, "
        "before it trains on it (held-out), averaged per run; mean over seeds with its "
        f"{analysis.level:.0%} t interval.",
        "",
    ]
    return out


def _generation_section(
    gen: cost_model.GenerationReport | None, analysis: Analysis, tol: float
) -> list[str]:
    out = ["## Critical generation batch", ""]
    if gen is None:
        return out + [
            "No throughput data (no throughput.json, and fewer than two batches "
            "with gen_tokens/time_generate_s).",
            "",
        ]
    f = gen.fit
    problems = cost_model.fit_problems(gen, analysis.level)
    out += [
        f"Source: {gen.source} (device: {gen.device}). Fit t_step(c) = a + b c: "
        f"a = {f.a_s:.4g} s, b = {f.b_s:.4g} s; on tokens/s = c / (a + b c) R^2 = "
        f"{f.r2:.3f}, largest miss {f.max_rel_residual:.0%} of a measured point; asymptote "
        f"{f.asymptote:.4g} tokens/s.",
        "",
        (
            "**Fit quality:** poor (" + "; ".join(problems) + '): the verdict "generation '
            'throughput saturates", which rests on this model, is withheld.'
            if problems
            else f"Fit quality: no negative intercept, no larger c slower beyond noise, every "
            f"point within {cost_model.MAX_REL_RESIDUAL:.0%} of the fit."
        ),
        "",
    ]
    if gen.source == cost_model.THROUGHPUT_FILE:
        if gen.measured != cost_model.MODEL_NOT_RECORDED:  # Else a model note says so.
            out.append(f"The throughput file measured: {gen.measured}.")
        out += [*gen.model_notes, ""]
        out += [f"**Warning:** {w}" for w in gen.model_warnings]
        out += [""] if gen.model_warnings else []
    out += [
        f"- plateau ({gen.frac:.0%} of best measured): c = **{gen.plateau_batch_measured}**",
        f"- plateau ({gen.frac:.0%} of fitted asymptote): c = "
        + ("-" if gen.plateau_batch_fit is None else f"{gen.plateau_batch_fit:.4g}"),
        "- KV-cache bound: "
        + (
            "- (no model shape / device memory)"
            if gen.max_kv_batch is None
            else f"c <= {gen.max_kv_batch}"
        ),
    ]
    if gen.update_fit is not None:
        u = gen.update_fit
        out.append(
            f"- update time = {u.intercept_s:.4g} s + {u.s_per_token:.4g} s/token "
            f"(prompt + response tokens of the update; R^2 = {u.r2:.3f})"
        )
    if gen.update_fit_note:
        out.append(f"- {gen.update_fit_note}")
    out.append("")
    out += markdown_table(
        ["c", "tokens/s", "fit tokens/s", "fit / measured - 1"],
        [
            [f"{c:.0f}", f"{t:.4g}", f"{p:.4g}", f"{e:+.1%}"]
            for c, t, p, e in zip(f.batches, f.tokens_per_s, f.predict(f.batches), f.rel_residuals)
        ],
    )
    crit = critical_batch.critical_training_batch(analysis, tol)
    if crit is not None:
        cg, ct = gen.critical_generation_batch, crit.critical_batch
        if cg <= ct:
            order = "the throughput plateaus before invariance breaks"
        elif crit.first_outside_incomplete:
            order = "not known yet which comes first (the walk stops at an incomplete batch)"
        else:
            order = "invariance breaks before the throughput plateaus"
        at_least = "at least " if crit.first_outside_incomplete else ""
        out += [
            "",
            f"Critical generation batch {cg:.4g} vs critical training batch {at_least}{ct}: "
            f"{order}; pick by minimum T (below), not by either.",
        ]
    return out + [""]


def build_report(
    analysis: Analysis,
    generation: cost_model.GenerationReport | None = None,
    tol: float = critical_batch.DEFAULT_TOL,
    figures: Sequence[str] = (),
    skipped: Sequence[str] = (),
    plan: planner.Plan | None = None,
    resamples: int = stability.DEFAULT_RESAMPLES,
) -> str:
    """The markdown report of a sweep.

    Args:
      analysis: the sweep analysis.
      generation: critical generation batch report.
      tol: r_N tolerance of the critical training batch.
      figures: written figure paths (linked relative to the sweep directory).
      skipped: names of figures skipped for lack of data.
      plan: the plan to show (default: ``planner.plan_full(analysis)``).
      resamples: seed resamples behind the verdict and recommendation shares
        (``rl_batch.analysis.stability``; 0: none).

    Returns:
      The report text.
    """
    sw = analysis.sweep
    shares = study_shares(analysis, generation, tol, resamples)
    n_used = sum(len(v) for v in analysis.runs_by_key.values())
    plan = plan or planner.plan_full(analysis)
    out = [
        f"# Batch-size scaling report: {sw.name}",
        "",
        f"**Recommendation.** {plan.verdict}",
        "",
        f"Sweep `{sw.sweep_dir}`, algorithm {sw.algo}; target validation accuracy "
        f"**{analysis.target:g}**; reference {analysis.reference.name} (B = "
        f"{analysis.reference.batch}). {n_used} runs used, {len(analysis.excluded)} excluded. "
        f"Intervals: {measurement.interval_words(analysis)}. "
        f"{measurement.estimator_words(analysis)}; {measurement.crossing_words(analysis)}; "
        f"q: retained responses per training second up to N*; T = N*/q (see "
        f"Measurement). A configuration gets N*, T only when every seed reached "
        f'("{INCOMPLETE}" while a seed that has not reached is still running); one seed '
        f'gives no interval ("1 seed, no CI").',
        "",
        *(
            []
            if analysis.timed
            else [
                f"**{NO_TIMING.capitalize()}:** no run logged training time, so this report "
                "gives N* and r_N only; q, T, r_q, T/T_ref and the findings that need them "
                'read "no timing" or "not measured".\n'
            ]
        ),
        *[
            f"**Warning:** {w} (See Critical generation batch.)\n"
            for w in (generation.model_warnings if generation is not None else ())
        ],
        *findings_section(analysis, generation, tol, shares),
        "## Software and hardware",
        "",
        *provenance.describe_sweep({r.name: provenance.read(r.run_dir) for r in sw.runs}),
        "## Time to target per configuration",
        "",
        *config_table(analysis),
        "",
        "## Ratios against the reference",
        "",
        *ratio_table(analysis),
        "",
        *measurement.measurement_section(analysis),
        *saturation.saturation_section(analysis),
        *_critical_section(analysis, tol),
        *_noise_section(analysis),
        *critic_section(analysis),
        *_generation_section(generation, analysis, tol),
        "## Recommendation (Algorithm 1)",
        "",
        planner.format_plan_table(plan),
        "",
        *recommendation_shares_lines(shares, plan),
        *extension.extension_lines(sw.sweep_dir),
        "## Per run",
        "",
        *run_table(analysis),
        "",
    ]
    if figures or skipped:
        out += ["## Figures", ""]
        for p in figures:
            if p.endswith(".png"):
                rel = os.path.relpath(p, sw.sweep_dir)
                out.append(f"![{os.path.basename(p)}]({rel})")
        if skipped:
            out.append("")
            out.append("Skipped (no data): " + ", ".join(skipped) + ".")
        out.append("")
    if analysis.excluded:
        out += ["## Excluded runs", ""]
        out += markdown_table(["run", "reason"], [[n, why] for n, why in analysis.excluded])
        out.append("")
    return "\n".join(out)
