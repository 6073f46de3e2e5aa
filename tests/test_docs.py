"""The README's layout table names every module, and the docs' links resolve."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Docs the README links that other branches add (their text is written elsewhere).
PENDING = {
    "docs/import.md",
    "docs/rollout_engine.md",
    "docs/reliability.md",
    "docs/errors.md",
    "docs/study_design.md",
}


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def layout_paths(readme: str) -> set[str]:
    """Every path the layout table names: full paths, or file names under the bold
    ``rl_batch/<sub>/`` group row they follow."""
    table = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    paths, group = set(), ""
    for row in table.splitlines():
        if not row.startswith("| "):
            continue
        first = row.split(" | ", 1)[0].removeprefix("| ")
        header = re.fullmatch(r"\*\*`?([\w/ ]+?)`?\*\*", first.strip())
        if header:
            group = header.group(1) if header.group(1).startswith("rl_batch/") else ""
            continue
        for name in re.findall(r"`([^`]+)`", first):
            paths.add(name if "/" in name else group + name)
    return paths


def test_the_layout_table_names_every_module():
    named = layout_paths(_read("README.md"))
    modules = {
        os.path.relpath(p, ROOT)
        for p in glob.glob(os.path.join(ROOT, "rl_batch", "**", "*.py"), recursive=True)
        if not p.endswith("__init__.py")
    }
    assert not modules - named, f"modules missing from the README's layout: {modules - named}"
    assert not {p for p in named if p.endswith(".py")} - modules  # no stale rows
    for folder in ("experiments/", "launch/", "tests/", "colabs/", "docs/"):
        assert folder in named, folder


def test_the_layout_table_reaches_the_key_functions_in_one_hop():
    table = _read("README.md").split("## Layout", 1)[1]
    for module, names in {
        "rl_batch/algorithms/grpo.py": ["grpo_loss"],
        "rl_batch/rollout/static.py": ["decode"],
        "rl_batch/algorithms/lr_rules.py": ["scale_hparams"],
        "rl_batch/targets.py": ["time_to_target"],
        "rl_batch/analysis/time_to_target.py": ["analyze_sweep"],
        "rl_batch/analysis/findings.py": ["study_findings"],
        "rl_batch/sweeps/sweep.py": ["plan", "expand_grid", "point_config", "run_sweep"],
        "rl_batch/runs/run.py": ["run"],
    }.items():
        src = _read(module)
        for name in names:
            assert f"`{name}`" in table, (module, name)
            assert re.search(rf"^def {name}\(", src, re.M), (module, name)  # still there


def test_links_in_the_readme_and_docs_resolve():
    broken = []
    for doc in ["README.md", *sorted(glob.glob("docs/*.md", root_dir=ROOT))]:
        for link in re.findall(r"\]\(([^)#\s]+)", _read(doc)):
            path = os.path.normpath(os.path.join(os.path.dirname(doc), link))
            if (
                "://" not in link
                and path not in PENDING
                and not os.path.exists(os.path.join(ROOT, path))
            ):
                broken.append(f"{doc} -> {link}")
    assert not broken, broken


def test_modules_with_shape_letters_cite_the_glossary():
    assert os.path.exists(os.path.join(ROOT, "docs", "glossary.md"))
    for path in glob.glob(os.path.join(ROOT, "rl_batch", "**", "*.py"), recursive=True):
        text = _read(path)
        if "Shape letters" in text:
            assert "Shape letters (docs/glossary.md)" in text, os.path.relpath(path, ROOT)
