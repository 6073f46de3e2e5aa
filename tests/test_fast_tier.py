"""The fast tier (`pytest -m "not slow"`) still covers every module: each rl_batch module is
imported by a test file that has at least one test not marked slow.

The check reads the test files (no imports): a module counts as imported by a file when the
file imports it or one of its submodules (importing `rl_batch.a.b` runs `rl_batch/a/__init__`);
a file's test counts as fast unless the file sets `pytestmark = pytest.mark.slow` or the test
(or its class) carries `@pytest.mark.slow`.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Modules no test file imports by name, run in the fast tier through the module that imports
# them or starts them as a process (`python -m`), their facade: module -> facade. A test
# file that imports one takes it off this list.
VIA_FACADE = {
    "rl_batch.algorithms.optimizer": "rl_batch.algorithms.learner",
    "rl_batch.algorithms.train_state": "rl_batch.algorithms.learner",
    "rl_batch.analysis.importers.sweep": "rl_batch.analysis.importers",
    "rl_batch.rollout.continuous": "rl_batch.rollout.sampler",
    "rl_batch.rollout.decode_step": "rl_batch.rollout.sampler",
    "rl_batch.rollout.sampling": "rl_batch.rollout.sampler",
    "rl_batch.rollout.static": "rl_batch.rollout.sampler",
    "rl_batch.runs.metrics_log": "rl_batch.runs.run",
    "rl_batch.sweeps.worker": "rl_batch.sweeps.processes",
    "rl_batch.tasks.registry": "rl_batch.tasks",
}


def rl_batch_modules(root: str = ROOT) -> set[str]:
    """Dotted names of every module under rl_batch/ (a package is its __init__)."""
    names = set()
    for folder, _, files in os.walk(os.path.join(root, "rl_batch")):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), root)[: -len(".py")]
                parts = rel.split(os.sep)
                names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def imported_modules(source: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `source` imports (anywhere in the file), with the
    packages whose __init__ those imports run."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from a import b`: b is a submodule when one of that name exists, else a name in a.
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            if name in modules:
                found |= _with_parents(name) & modules
    return found


def _is_slow_mark(node: ast.expr) -> bool:
    """`pytest.mark.slow` itself (not a call, as the marker takes no arguments)."""
    return ast.unparse(node) == "pytest.mark.slow"


def _marks(node: ast.expr) -> list[ast.expr]:
    return list(node.elts) if isinstance(node, ast.List | ast.Tuple) else [node]


def has_fast_test(source: str) -> bool:
    """Whether `source` (a test file) has a test the fast tier runs."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            if any(_is_slow_mark(m) for m in _marks(node.value)):
                return False

    def fast(node: ast.AST) -> bool:
        return not any(_is_slow_mark(d) for d in node.decorator_list)

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and fast(node):
            return True
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test") and fast(node):
            if any(
                isinstance(m, ast.FunctionDef) and m.name.startswith("test") and fast(m)
                for m in node.body
            ):
                return True
    return False


def fast_coverage(root: str = ROOT) -> dict[str, list[str]]:
    """Each rl_batch module -> the test files with a fast test that import it."""
    modules = rl_batch_modules(root)
    cover: dict[str, list[str]] = {m: [] for m in sorted(modules)}
    tests = os.path.join(root, "tests")
    for name in sorted(os.listdir(tests)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        with open(os.path.join(tests, name)) as f:
            source = f.read()
        if has_fast_test(source):
            for module in imported_modules(source, modules):
                cover[module].append(name)
    return cover


def _source(module: str) -> str:
    path = os.path.join(ROOT, *module.split("."))
    path = path + ".py" if os.path.exists(path + ".py") else os.path.join(path, "__init__.py")
    with open(path) as f:
        return f.read()


def test_every_module_has_a_fast_test():
    cover = fast_coverage()
    uncovered = [m for m, files in cover.items() if not files and m not in VIA_FACADE]
    assert uncovered == [], f"no fast test file imports {uncovered}"
    now_direct = [m for m in VIA_FACADE if cover[m]]
    assert now_direct == [], f"tests import {now_direct} by name: drop them from VIA_FACADE"
    for module, facade in VIA_FACADE.items():
        assert cover[facade], f"{module}'s facade {facade} has no fast test"
        source = _source(facade)
        assert module in imported_modules(source, set(cover)) or f'"{module}"' in source, facade


def test_the_module_list_is_the_package():
    modules = rl_batch_modules()
    assert {"rl_batch", "rl_batch.runs", "rl_batch.runs.run", "rl_batch.tasks.base"} <= modules
    assert not any(m.endswith("__init__") for m in modules)


def test_imports_resolve_to_modules_and_their_packages():
    modules = {"rl_batch", "rl_batch.a", "rl_batch.a.b", "rl_batch.a.c", "rl_batch.d"}
    assert imported_modules("from rl_batch.a import b, helper\n", modules) == {
        "rl_batch",
        "rl_batch.a",
        "rl_batch.a.b",
    }
    assert imported_modules("import rl_batch.a.c as c\n", modules) == {
        "rl_batch",
        "rl_batch.a",
        "rl_batch.a.c",
    }
    assert imported_modules("def f():\n    from rl_batch import d\n", modules) == {
        "rl_batch",
        "rl_batch.d",
    }
    assert imported_modules("import os\nfrom experiments import x\n", modules) == set()


def test_slow_marks_leave_no_fast_test():
    assert has_fast_test("def test_a():\n    pass\n")
    assert not has_fast_test("import pytest\npytestmark = pytest.mark.slow\ndef test_a(): pass\n")
    assert not has_fast_test("pytestmark = [pytest.mark.slow]\ndef test_a(): pass\n")
    assert not has_fast_test("@pytest.mark.slow\ndef test_a(): pass\ndef helper(): pass\n")
    assert has_fast_test("@pytest.mark.slow\ndef test_a(): pass\ndef test_b(): pass\n")
    assert not has_fast_test("@pytest.mark.slow\nclass TestA:\n    def test_a(self): pass\n")
    assert has_fast_test(
        "class TestA:\n    @pytest.mark.slow\n    def test_a(self): pass\n"
        "    def test_b(self): pass\n"
    )
