"""The package's layout: the root holds a few modules, each a concept of its own; the layers import downwards
only (samplers never import the algorithms or callbacks, algorithms never the callbacks, the plugin never the
application), and no two modules import each other. A module is as long as its one concept needs."""

from __future__ import annotations

import ast
from pathlib import Path

import composer_dynsample

PACKAGE = Path(composer_dynsample.__file__).parent
MAX_ROOT_MODULES = 12

#: Every module at the package root, and its concept in a few words.
ROOT_MODULES: dict[str, str] = {
    "__init__": "the public names, imported on first use",
    "__main__": "python -m composer_dynsample",
    "_lazy": "the one deferred import",
    "batches": "a tensor's lookup in a Composer batch or outputs",
    "checkpoints": "checkpoint files checked before unpickling",
    "distances": "every distance, one name set",
    "distributed": "every cross-rank operation",
    "file_checks": "what a file is and its hash",
    "lightning": "PyTorch Lightning support",
    "schedulers": "learning-rate schedules as Composer schedulers",
    "testing": "the harnesses a user's own test suite imports",
}


def test_the_root_holds_only_the_listed_modules() -> None:
    found = sorted(path.stem for path in PACKAGE.glob("*.py"))
    unlisted = [name for name in found if name not in ROOT_MODULES]
    assert not unlisted, (
        f"composer_dynsample/ holds modules not in ROOT_MODULES: {unlisted}; add each to a folder of its "
        "concept, or list it in ROOT_MODULES with its concept."
    )
    gone = sorted(set(ROOT_MODULES) - set(found))
    assert not gone, (
        f"ROOT_MODULES lists modules that are not at the root: {gone}; remove them from the list."
    )
    assert len(found) <= MAX_ROOT_MODULES, (
        f"composer_dynsample/ holds {len(found)} modules, more than {MAX_ROOT_MODULES}: move some into a "
        "folder of their concept."
    )


#: Which packages a package's modules never import (at the top or inside a function): the layers of
#: docs/layout.md. The plugin (samplers, mining, losses, algorithms, callbacks, metrics) never imports the
#: application (cli, config, export) nor a test harness (testing).
NEVER_IMPORTS: dict[str, tuple[str, ...]] = {
    "samplers": ("algorithms", "callbacks", "cli", "config", "export", "testing"),
    "mining": ("algorithms", "callbacks", "samplers", "cli", "config", "export", "testing"),
    "losses": ("algorithms", "callbacks", "samplers", "cli", "config", "export", "testing"),
    "algorithms": ("callbacks", "cli", "config", "export", "testing"),
    "callbacks": ("cli", "config", "export"),
    "metrics": ("algorithms", "callbacks", "samplers", "cli", "config", "export", "testing"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package's modules ``path`` imports anywhere in its code (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith(PACKAGE.name)
        ):
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(PACKAGE.name))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_the_layers_import_downwards_only() -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in _graph().items()
        for target in targets
        for layer, never in NEVER_IMPORTS.items()
        if name.startswith(f"{PACKAGE.name}.{layer}")
        and any(target.startswith(f"{PACKAGE.name}.{other}") for other in never)
    )
    assert not wrong, f"imports against the layers (docs/layout.md): {wrong}"


def test_no_two_modules_import_each_other() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    # A package and the modules its __init__ re-exports are one unit, not a cycle.
    cycles = [c for c in cycles if not all(m.startswith(min(c, key=len)) for m in c)]
    assert not cycles, f"modules that import each other, directly or around a circle: {cycles}"
