"""algorithms/ and losses/ reach ranks only through composer_dynsample.distributed, the package's one rank API."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import composer_dynsample

PACKAGE = Path(composer_dynsample.__file__).parent
FORBIDDEN = ("torch.distributed", "composer.utils.dist")


def _imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize(
    "path",
    sorted([*PACKAGE.glob("algorithms/**/*.py"), *PACKAGE.glob("losses/**/*.py")]),
    ids=lambda path: str(path.relative_to(PACKAGE)),
)
def test_only_the_package_rank_api_is_used(path):
    offending = [name for name in _imported_modules(path) if name.startswith(FORBIDDEN)]
    assert not offending, f"{path} imports {offending}; use composer_dynsample.distributed instead."
