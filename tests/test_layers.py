"""The package's import arrows point down its layers, and there are no import cycles.

Layers (``rl_batch/__init__.py``): the shared top-level modules, then ``models`` and
``tasks``, ``rollout``, ``algorithms``, ``runs``, ``sweeps``; ``analysis`` reads run
artifacts and may import only the shared modules. Function-local imports count too.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "rl_batch"
SHARED = {
    "artifacts",
    "targets",
    "provenance",
    "tokenizers",
    "distributed",
    "locks",
    "gradient_noise",
    "bench",
}
LAYER = {"models": 1, "tasks": 1, "rollout": 2, "algorithms": 3, "runs": 4, "sweeps": 5}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: pathlib.Path, modules) -> set[str]:
    """Every rl_batch module ``path`` imports (``from a import b`` counts ``a.b`` when that
    is a module, else ``a``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("rl_batch")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rl_batch"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
    return found


def _layer(module: str) -> tuple[str, int]:
    parts = module.split(".")
    if len(parts) == 1:
        return "rl_batch", 6  # the package docstring imports nothing
    top = parts[1]
    if top in SHARED:
        return "shared", 0
    if top == "analysis":
        return "analysis", 6
    return top, LAYER[top]


def _edges():
    modules = _modules()
    return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def test_imports_point_down():
    upward = []
    for module, deps in _edges().items():
        name, layer = _layer(module)
        for dep in deps:
            dep_name, dep_layer = _layer(dep)
            if name == "analysis":
                ok = dep_name in ("analysis", "shared")
            else:
                ok = dep_layer < layer or dep_name == name
            if not ok:
                upward.append(f"{module} -> {dep}")
    assert not upward, upward


def test_no_import_cycles():
    edges = _edges()
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in sorted(edges.get(m, ())):
            if d not in edges:
                continue
            if state.get(d) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack, m, d]))
            if d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])


def test_library_never_starts_the_command_line_layer():
    """``rl_batch`` imports nothing of ``experiments`` or ``launch`` and starts none of their
    programs (its workers run through ``rl_batch.sweeps.worker``); text that tells a user
    which command to run is allowed."""
    starts = re.compile(
        r"""^\s*(from|import)\s+(experiments|launch)\b|["']-m["'],\s*f?["'](experiments|launch)\."""
    )
    hits = [
        f"{p.relative_to(ROOT.parent)}:{i}"
        for p in ROOT.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if starts.search(line)
    ]
    assert not hits, hits
