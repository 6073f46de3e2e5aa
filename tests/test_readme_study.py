"""The study records' generated sections (docs/) come from a sweep's files."""

import json
import os
import subprocess
import sys

import analysis_fixtures as fx
import pytest

from experiments import readme_study
from rl_batch import provenance
from tests.test_provenance import _session


@pytest.mark.slow  # 7 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_study_section_from_a_sweep(tmp_path):
    d = fx.write_sweep(str(tmp_path / "s"), seed_factors=(0.9, 1.0, 1.1))
    with open(os.path.join(d, "throughput.json"), "w") as f:
        json.dump(fx.throughput_json(), f)
    for name in os.listdir(os.path.join(d, "runs")):
        provenance._write(os.path.join(d, "runs", name), [_session()])
    argv = ["grpo_sweep.py", "--config.sweep.seeds=0,1,2"]
    started = "2026-12-01T10:00:00+00:00"
    provenance.record_command(
        d, argv, started, 600.0, [1.0, 1.0, 1.0], "finished", module="experiments.grpo_sweep"
    )
    section = readme_study.study_section(d)
    assert section.startswith(readme_study.BEGIN) and section.endswith(readme_study.END)
    assert "`python -m experiments.grpo_sweep --config.sweep.seeds=0,1,2`" in section
    assert "10.0 min wall, started 2026-12-01T10:00:00+00:00" in section
    assert "3 seed(s) per configuration, 24 runs" in section
    assert "| T is U-shaped in B |" in section and "Cost structure" in section
    assert "Recommendation: Undecided at this power" in section  # 10% seed spread
    assert "**Recommendation.** Undecided at this power" in section  # first, in one line
    assert "- hardware.cpu_model: Some CPU" in section
    text = f"# x\n\nbefore\n{readme_study.BEGIN}\nOLD-SECTION\n{readme_study.END}\nafter\n"
    new = readme_study.replace_section(text, section)
    assert new.startswith("# x\n\nbefore\n") and new.endswith("\nafter\n")
    assert "OLD-SECTION" not in new and section in new
    with pytest.raises(ValueError, match="no <!-- study:begin -->"):
        readme_study.replace_section("# x\n", section)


def test_each_study_record_has_its_markers_and_the_readme_none():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, record in readme_study.RECORDS.items():
        assert readme_study.doc_path(name) == record
        text = open(os.path.join(root, record)).read()
        for other in readme_study.RECORDS:
            begin, end = readme_study.markers(other)
            want = 1 if other == name else 0
            assert text.count(begin) == want and text.count(end) == want, (record, other)
    readme = open(os.path.join(root, "README.md")).read()
    assert "<!-- study:begin -->" not in readme and "<!-- ppo_study:begin -->" not in readme
    assert readme_study.doc_path("study", "other.md") == "other.md"
    with pytest.raises(ValueError, match="--section=nope: no study record"):
        readme_study.doc_path("nope")


def test_a_bad_section_or_a_file_without_markers_is_one_line_before_analysis(tmp_path):
    plain = tmp_path / "plain.md"
    plain.write_text("# no markers\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for args, want in (
        (["--section=nope"], "error: nope: --section=nope: no study record holds it"),
        ([f"--doc={plain}"], "the file has no <!-- study:begin -->"),
    ):
        cmd = [sys.executable, "-m", "experiments.readme_study", "--sweep=/nonexistent", *args]
        out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert want in out.stderr.strip().splitlines()[-1]


def test_the_ppo_section_has_its_own_markers_and_the_critic_table(tmp_path):
    configs = [(32, 1, "sqrt", 1.0), (64, 1, "sqrt", 1.0), (32, 1, "sqrt", 1.0, "k2")]
    d = fx.write_sweep(
        str(tmp_path / "p"), configs=configs, algo="ppo", reference="P32_G1_sqrt_s0",
        critic=True, warmup_updates=3, seed_factors=(0.9, 1.0, 1.1),
    )  # fmt: skip
    path = os.path.join(d, "runs", "P32_G1_sqrt_s0", "metrics.jsonl")
    lines = [json.loads(x) for x in open(path)]
    with open(path, "w") as f:
        f.writelines(json.dumps({**r, "explained_variance": 0.5}) + "\n" for r in lines)
    provenance.record_command(d, ["ppo_sweep.py"], "2026-12-01T10:00:00+00:00", 60.0, [1.0], "ok")
    section = readme_study.study_section(d, "ppo_study")
    begin, end = readme_study.markers("ppo_study")
    assert section.startswith(begin) and section.endswith(end)
    assert "| PPO: the critic's batch scale is the actor's |" in section
    assert "| ppo-P32-G1-sqrt | 32 | 0.5 (1 seed, no CI) |" in section
    both = f"{readme_study.BEGIN}\nGRPO\n{readme_study.END}\n{begin}\nOLD\n{end}\n"
    new = readme_study.replace_section(both, section, "ppo_study")
    assert "GRPO" in new and "OLD" not in new and section in new
