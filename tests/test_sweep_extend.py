"""The sweep's grid extension past an edge optimum (``sweep.extend_edges``), with a
synthetic run function: each point writes a run of ``analysis_fixtures`` whose sample
cost makes B = 32 the fastest batch, so a grid of B = 64, 128 must grow down to 16."""

import os

import analysis_fixtures as fx
import pytest

from experiments import sweep_main
from experiments.configs import base
from rl_batch import artifacts
from rl_batch.analysis import extension
from rl_batch.sweeps import calibrate, extend, processes, sweep


def _mult(batch: int) -> float:
    """tau multiplier: invariance up to B = 32, then r_N ~ (B / 32)^0.85 (T least at 32)."""
    return max(1.0, (batch / 32) ** 0.85)


class FakeGrid:
    """``run_grid``: writes the synthetic runs of the points not yet written."""

    def __init__(self, sweep_dir):
        self.sweep_dir, self.written, self.passes = sweep_dir, [], 0

    def __call__(self, config):
        self.passes += 1
        points = sweep.expand_grid(config)
        runs = []
        for p in points:
            run_dir = os.path.join(self.sweep_dir, artifacts.RUNS_DIR, p.name)
            if not os.path.exists(os.path.join(run_dir, artifacts.SUMMARY_FILE)):
                batch = p.prompts * p.group_size
                tau = fx.TAU0 * _mult(batch) * fx.SEED_TAU_FACTORS[p.seed]
                fx.write_run(run_dir, prompts=p.prompts, group_size=p.group_size, tau=tau,
                             seed=p.seed)  # fmt: skip
                self.written.append(p.name)
            runs.append({"name": p.name, "prompts": p.prompts, "group_size": p.group_size,
                         "lr_rule": p.lr_rule, "seed": p.seed, "status": "finished"})  # fmt: skip
        ref = sweep.reference_key(config, points)
        record = {
            "name": "extend",
            "algo": "grpo",
            "target": config.target,
            "reference": next(p.name for p in points if p.key == ref),
            "budget_responses": fx.BUDGET,
            "eval_every_responses": fx.EVAL_EVERY,
            "runs": runs,
        }
        artifacts.write_json_atomic(os.path.join(self.sweep_dir, artifacts.SWEEP_FILE), record)
        return record


def _config(**sweep_fields):
    c = base.sweep_config(base.run_config())
    c.target = fx.TARGET
    c.sweep.prompts, c.sweep.seeds, c.sweep.extend_edges = "8,16", "0,1", True
    for k, v in sweep_fields.items():
        c.sweep[k] = v
    return c


WRITER = processes.Processes(writer=True, device_count=1)
NEXT = sweep_main.next_edge_step  # the analysis's answer, as the sweep programs pass it


def test_extends_until_the_minimum_is_interior_and_reruns_only_new_points(tmp_path):
    sweep_dir = str(tmp_path)
    grid = FakeGrid(sweep_dir)
    extend.run_extending(_config(), sweep_dir, grid, WRITER, NEXT, log=lambda s: None)
    ext = extension.read_extensions(sweep_dir)
    assert [r["points"] for r in ext["rounds"]] == [["4x8:sqrt"], ["2x8:sqrt"]]
    assert "interior" in ext["stopped"] and "B = 32" in ext["stopped"]
    assert grid.passes == 3 and len(grid.written) == 8  # 2 + 1 + 1 configurations x 2 seeds
    # The reference stays the grid's smallest batch before the extension, 8 x 8.
    raw = artifacts.read_json(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
    assert raw["reference"] == "p8_g8_sqrt_s0"
    # The same command again: one pass over the extended grid, nothing new runs.
    again = FakeGrid(sweep_dir)
    extend.run_extending(_config(), sweep_dir, again, WRITER, NEXT, log=lambda s: None)
    assert again.passes == 1 and again.written == []
    assert len(extension.read_extensions(sweep_dir)["rounds"]) == 2
    assert "## Grid extension" in "\n".join(extension.extension_lines(sweep_dir))


def test_round_limit_stops_at_the_edge(tmp_path):
    sweep_dir = str(tmp_path)
    grid = FakeGrid(sweep_dir)
    extend.run_extending(
        _config(extend_max_rounds=1), sweep_dir, grid, WRITER, NEXT, log=lambda s: None
    )
    ext = extension.read_extensions(sweep_dir)
    assert [r["points"] for r in ext["rounds"]] == [["4x8:sqrt"]]
    assert ext["stopped"].startswith("limit: 1 extension round(s)")
    assert "a smaller batch was not tried" in ext["stopped"]


def test_extended_config_pins_the_reference_and_appends():
    c = _config(extra_points="16x8:fixed")
    out = extend.extended_config(c, ["4x8:sqrt", "16x8:fixed"])
    assert out.sweep.reference == "8x8:sqrt"
    assert out.sweep.extra_points == "16x8:fixed,4x8:sqrt"
    assert c.sweep.extra_points == "16x8:fixed"  # The caller's config is left alone.


def test_needs_a_target(tmp_path):
    c = _config()
    c.target = None
    with pytest.raises(ValueError, match="extend_edges=True needs a target"):
        extend.run_extending(c, str(tmp_path), FakeGrid(str(tmp_path)), WRITER, NEXT)


def test_with_the_sweeps_own_run_loop(tmp_path):
    """`sweep.run_sweep` itself (grid, records, skipping finished points), each point's
    run replaced by a synthetic one: the grid grows to B = 16 and a re-run runs nothing."""
    import functools

    from tests.run_fixtures import tiny_run_config

    calls = []

    def run_fn(spec):
        c = spec.inputs
        calls.append(c.name)
        tau = fx.TAU0 * _mult(c.prompts * c.group_size) * fx.SEED_TAU_FACTORS[c.seed]
        fx.write_run(c.run_dir, prompts=c.prompts, group_size=c.group_size, tau=tau,
                     seed=c.seed)  # fmt: skip
        # The point's own config, as a run writes it (a re-run compares it with the grid's).
        artifacts.write_json_atomic(os.path.join(c.run_dir, artifacts.CONFIG_FILE), spec.to_json())
        return {"status": "finished"}

    c = base.sweep_config(tiny_run_config(str(tmp_path / "work")))
    c.target, c.sweep.prompts, c.sweep.group_sizes, c.sweep.seeds = fx.TARGET, "8,16", "8", "0,1"
    c.sweep.extend_edges = True
    c.eval_every_responses = fx.EVAL_EVERY  # the synthetic runs' cadence (cross-checked)
    d = str(tmp_path / "sweep")
    grid = functools.partial(sweep.run_sweep, sweep_dir=d, run_fn=run_fn, processes=WRITER,
                             log=lambda s: None)  # fmt: skip
    ahead = sweep_main._ahead_points
    extend.run_extending(c, d, grid, WRITER, NEXT, log=lambda s: None, ahead=ahead)
    assert [n.rsplit("_", 1)[0] for n in calls[4:]] == ["p4_g8_sqrt"] * 2 + ["p2_g8_sqrt"] * 2
    raw = artifacts.read_json(os.path.join(d, artifacts.SWEEP_FILE))
    assert len(raw["runs"]) == 8 and raw["reference"] == "p8_g8_sqrt_s0"
    # The last pass's calibration would time the next smaller point ahead of any run, as
    # its point would run (the sqrt LR of B = 8), beside the configurations that ran.
    timed = calibrate.sweep_configs(d)
    assert list(timed) == ["2x8:sqrt", "4x8:sqrt", "8x8:sqrt", "16x8:sqrt", "1x8:sqrt"]
    one = timed["1x8:sqrt"]
    lr = {k: s.optimizer.lr for k, s in timed.items()}
    assert one.batch == 8 and lr["1x8:sqrt"] == pytest.approx(lr["2x8:sqrt"] / 2**0.5)
    assert not os.path.exists(one.inputs.run_dir)  # (nothing of the point is written)
    calls.clear()
    extend.run_extending(c, d, grid, WRITER, NEXT, log=lambda s: None)
    assert calls == []


def test_list_runs_includes_the_recorded_extension(tmp_path):
    sweep_dir = str(tmp_path)
    extend.run_extending(
        _config(), sweep_dir, FakeGrid(sweep_dir), WRITER, NEXT, log=lambda s: None
    )
    listed = extend.applied_extension(_config(), sweep_dir)[0]
    assert [p.key for p in sweep.expand_grid(listed)][::2] == [
        "2x8:sqrt", "4x8:sqrt", "8x8:sqrt", "16x8:sqrt"
    ]  # fmt: skip
    off = _config(extend_edges=False)
    assert extend.applied_extension(off, sweep_dir)[0] is off


def _other_grid(**fields):
    """The issue's grid: P = 2, 4 at G = 4, one seed, its own reference."""
    c = _config(group_sizes="4", reference="4x4:sqrt", seeds="0", **fields)
    c.sweep.prompts = "2,4"
    return c


def test_a_recorded_extension_applies_only_to_its_own_grid(tmp_path):
    sweep_dir = str(tmp_path)
    extend.run_extending(
        _config(), sweep_dir, FakeGrid(sweep_dir), WRITER, NEXT, log=lambda s: None
    )
    # The same grid, same directory: the recorded points, named.
    same, note = extend.applied_extension(_config(), sweep_dir)
    assert "4x8:sqrt" in same.sweep.extra_points and "2x8:sqrt" in same.sweep.extra_points
    assert note.startswith("grid extension recorded in") and "4x8:sqrt, 2x8:sqrt" in note
    # Another grid in that directory (other P and G; or only another seed): none of them.
    for other in (_other_grid(), _config(seeds="0,1,2")):
        listed, note = extend.applied_extension(other, sweep_dir)
        assert listed.sweep.extra_points == other.sweep.extra_points
        assert "extends another grid" in note
        with pytest.raises(ValueError, match="extension of another grid"):
            extend.run_extending(other, sweep_dir, FakeGrid(sweep_dir), WRITER, NEXT)
    # The grid's own points are listed for the other grid, and no point of the extension.
    names = [
        p.name for p in sweep.expand_grid(extend.applied_extension(_other_grid(), sweep_dir)[0])
    ]
    assert names == ["p2_g4_sqrt_s0", "p4_g4_sqrt_s0"]
    # Another directory: nothing recorded there.
    assert extend.applied_extension(_config(), str(tmp_path / "new")) == (_config(), "")


def test_an_extension_recorded_without_its_grid_is_matched_with_sweep_json(tmp_path):
    # extensions.json as 35add6f wrote it (no "grid"): sweep.json holds the grid last run.
    sweep_dir = str(tmp_path)
    extend.run_extending(
        _config(), sweep_dir, FakeGrid(sweep_dir), WRITER, NEXT, log=lambda s: None
    )
    path = os.path.join(sweep_dir, extension.EXTENSIONS_FILE)
    old = {k: v for k, v in artifacts.read_json(path).items() if k != "grid"}
    artifacts.write_json_atomic(path, old)
    assert extend.applied_extension(_config(), sweep_dir)[1].startswith("grid extension")
    assert "extends another grid" in extend.applied_extension(_other_grid(), sweep_dir)[1]
    # A re-run of the study adopts the file (and records the grid in it).
    again = FakeGrid(sweep_dir)
    extend.run_extending(_config(), sweep_dir, again, WRITER, NEXT, log=lambda s: None)
    assert again.written == [] and extension.read_extensions(sweep_dir)["grid"]["reference"] == (
        "8x8:sqrt"
    )


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_the_issue_listing_with_the_default_studys_extension_beside_it(tmp_path):
    """The report: after the default study extended its grid to B = 8 in its directory,
    the issue's grid listed there got ``p1_g8_sqrt_s0`` first."""
    import json
    import subprocess
    import sys

    from experiments.configs import grpo_cpu

    sweep_dir = str(tmp_path / "grpo_cpu")
    default = grpo_cpu.get_config()
    ext = {"version": 1, "rounds": [{"points": ["1x8:sqrt"], "reason": "B = 16 is the smallest",
           "best": "p2_g8_sqrt"}], "stopped": "limit: P = 1",
           "grid": extend.grid_identity(default)}  # fmt: skip
    os.makedirs(sweep_dir)
    artifacts.write_json_atomic(os.path.join(sweep_dir, extension.EXTENSIONS_FILE), ext)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def listed(*flags):
        out = subprocess.run(
            [sys.executable, "-m", "experiments.grpo_sweep", f"--sweep_dir={sweep_dir}", *flags,
             "--list_runs"],
            cwd=repo, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        return [r["name"] for r in json.loads(out.stdout)], out.stderr

    names, err = listed(
        "--config.sweep.prompts=2,4", "--config.sweep.group_sizes=4",
        "--config.sweep.lr_rules=sqrt", "--config.sweep.seeds=0",
        "--config.sweep.reference=4x4:sqrt", "--config.sweep.extra_points=",
    )  # fmt: skip
    assert names == ["p2_g4_sqrt_s0", "p4_g4_sqrt_s0"] and "extends another grid" in err
    names, err = listed()  # the study's own grid: B = 8 first, and said so
    assert names[0] == "p1_g8_sqrt_s0" and "adds 1x8:sqrt" in err
