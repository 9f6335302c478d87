"""The layer map of docs/architecture.md holds: no module of ``sglang`` imports a module of a
higher layer (at any depth: module level, inside functions, under TYPE_CHECKING), and no module
imports itself through others (no cycle, whatever the layers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "python" / "sglang"

# Longest prefix wins. Equal ranks may import each other; a module imports only its rank or lower.
LAYERS: dict[str, int] = {
    "sglang.version": 0,
    "sglang.srt.kernels": 0,
    "sglang.srt.sampling": 0,
    "sglang.srt.constrained": 0,
    "sglang.srt.function_call": 0,
    "sglang.srt.utils": 0,  # SGLang's process helpers (kill_process_tree) for its test kits
    "sglang.srt.core": 1,
    "sglang.srt.mem_cache": 1,
    "sglang.srt.layers": 2,
    "sglang.srt.models": 2,
    "sglang.srt.multimodal": 3,
    "sglang.srt.model_executor": 4,
    "sglang.srt.managers": 5,
    "sglang.srt.server_args": 5,
    "sglang.srt.entrypoints": 6,
    "sglang.launch_server": 6,
    "sglang.test": 7,  # SGLang's sglang.test.test_utils, for its kits and lmms-eval
}
# The package root re-exports Engine lazily (``sglang.Engine``): the one upward import allowed.
# Modules read the version from ``sglang.version``.
EXEMPT = {"sglang", "sglang.srt"}


def layer_of(module: str) -> int | None:
    best = None
    for prefix, rank in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, rank)
    return None if best is None else best[1]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``sglang`` import in the file, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import module`` imports the module when there is one.
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if _is_module(sub, root) else base))
    return [(line, m) for line, m in found if m == "sglang" or m.startswith("sglang.")]


def _is_module(name: str, root: Path) -> bool:
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def upward_imports(root: Path = PACKAGE_ROOT) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        if name in EXEMPT:
            continue
        own = layer_of(name)
        if own is None:
            problems.append(f"{name}: not in the layer map")
            continue
        for line, target in imported_modules(path, name, root):
            rank = layer_of(target)
            if target in EXEMPT:
                continue
            if rank is None or rank > own:
                problems.append(f"{name}:{line} imports {target} (layer {rank} > {own})")
    return problems


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Module -> the ``sglang`` modules it imports (an import names the module it names; the
    packages above it are not counted)."""
    graph = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        graph[name] = {m for _, m in imported_modules(path, name, root) if m != name}
    return graph


def module_cycles(root: Path = PACKAGE_ROOT) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v] & graph.keys()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_cycle() -> None:
    assert module_cycles() == []


def _copy_with_late_import(tmp_path: Path, module: str, imported: str) -> Path:
    """A copy of the package whose ``module`` (a path under it) ends with a function-level
    ``imported`` (an import statement)."""
    import shutil

    copy = tmp_path / "sglang"
    shutil.copytree(PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / module
    path.write_text(path.read_text() + f"\n\ndef _late():\n    {imported}\n")
    return copy


def test_a_module_cycle_is_caught(tmp_path: Path) -> None:
    """The checker itself: one late import that closes a cycle inside a package fails."""
    late = "from sglang.srt.layers.quantization import packed_linear"
    copy = _copy_with_late_import(tmp_path, "srt/layers/quantization/base.py", late)
    cycles = module_cycles(copy)
    want = ["sglang.srt.layers.quantization.base", "sglang.srt.layers.quantization.packed_linear"]
    assert want in cycles, cycles


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_imports() == []


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    """The checker itself: a copy of the package with one upward import added fails."""
    late = "from sglang.srt.managers import scheduler"
    copy = _copy_with_late_import(tmp_path, "srt/core/req.py", late)
    problems = upward_imports(copy)
    assert any("sglang.srt.core.req" in p and "sglang.srt.managers" in p for p in problems)


@pytest.mark.parametrize(
    ("module", "rank"),
    [("sglang.srt.core.req", 1), ("sglang.srt.kernels.build", 0), ("sglang.test.test_utils", 7)],
)
def test_longest_prefix_decides(module: str, rank: int) -> None:
    assert layer_of(module) == rank


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_package_never_imports_development_tools() -> None:
    """``sglang_dev`` (the tiny families' recipes, checkpoint writers, video clips) stays in the
    repository: nothing installed imports it."""
    offenders = [
        str(path.relative_to(PACKAGE_ROOT))
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
        if "sglang_dev" in _top_level_imports(path)
    ]
    assert offenders == []


def test_the_package_holds_no_family_recipe() -> None:
    """The installed package builds no test model: no module defines ``FAMILY_SPECS`` (every
    recipe is ``sglang_dev.tiny_models``); its default model is the packaged OCR reader."""
    recipes = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "FAMILY_SPECS" for t in targets):
                recipes.append(module_name(path, PACKAGE_ROOT))
    assert recipes == []
    assert (PACKAGE_ROOT / "default_model" / "model.safetensors").is_file()


def test_the_wheel_leaves_development_tools_out() -> None:
    """The packages setuptools finds from pyproject's ``packages.find``: ``sglang`` only, with
    the default model's folder among its package data."""
    import tomllib
    from setuptools import find_namespace_packages

    repo = PACKAGE_ROOT.parents[1]
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_namespace_packages(where=str(repo / pyproject["packages"]["find"]["where"][0]))
    assert not any(p.startswith("sglang.tiny_models") for p in packages)
    assert [p for p in packages if p.split(".")[0] != "sglang"] == []
    assert "default_model/*" in pyproject["package-data"]["sglang"]


def test_start_up_imports_no_development_tool() -> None:
    """Resolving the default model (as the launcher does without ``--model-path``) imports no
    recipe and no development tool."""
    import subprocess
    import sys

    code = (
        "import sys; import sglang.launch_server; "
        "from sglang.srt.entrypoints.default_model import resolve_model_path; "
        "print(resolve_model_path(None)); "
        "print(sorted(m for m in sys.modules if m.startswith(('sglang_dev', 'benchmark'))))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    path, modules = run.stdout.strip().splitlines()
    assert path == str(PACKAGE_ROOT / "default_model") and modules == "[]"
