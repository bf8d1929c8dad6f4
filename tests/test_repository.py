"""The shape of the repository: a package whose modules import in one direction, and code and docs
that state the current state (no pointers into an experiment log, no paths outside the repository)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "conv1d_silu"


def _module_name(path: Path) -> tuple[str, list[str]]:
    """A package file's dotted name relative to the package (the root's __init__ is "__init__") and
    the package it belongs to, as parts."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        package = parts[:-1]
        return ".".join(package) or "__init__", package
    return ".".join(parts), parts[:-1]


def _imports() -> dict[str, set[str]]:
    """module -> the package modules it imports, relative imports of any depth (at the top or inside
    functions); a name imported from a package counts as an import of that package."""
    files = {_module_name(p)[0]: p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        _, package = _module_name(path)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = package[: len(package) - (node.level - 1)]
            targets = [base + node.module.split(".")] if node.module else [base + [a.name] for a in node.names]
            for parts in targets:
                target = ".".join(parts)
                found.add(target if target in files else ".".join(base) or "__init__")
        graph[name] = found - {name}
    return graph


def test_the_package_imports_in_one_direction():
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == 2:
            return
        assert state.get(module) != 1, "import cycle: " + " -> ".join(path + [module])
        state[module] = 1
        for dep in graph.get(module, ()):
            visit(dep, path + [module])
        state[module] = 2

    for module in graph:
        visit(module, [])


# The layers from the bottom: each module imports only from its own layer's helpers or below.
LOWER = {
    "kernels": set(),
    "runtime": {"kernels", "config"},
    "gpu": {"kernels", "runtime", "routes", "documents", "dtypes"},
    "routes": {"config"},
    "reference": {"documents", "dtypes", "states", "validation"},
    "decoding": {"dtypes"},
}


@pytest.mark.parametrize("module", sorted(LOWER))
def test_lower_layers_import_nothing_above_them(module):
    assert _imports()[module] <= LOWER[module]


TEXT_FILES = [
    *PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cu"), *PACKAGE.rglob("*.cuh"), *(ROOT / "docs").glob("*.md"),
    *(ROOT / "tools").iterdir(), ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "benchmarks").glob("*.md"),
    *(ROOT / "examples").glob("*.py"),
]
LOG_POINTERS = re.compile(
    r"performance\.md v\d|\bv\d\d\b|wip/|DESIGN\.md|item 2|seed(?:'s| rule|-rule)|the seed\b|\.\./shared|/work/"
)


@pytest.mark.parametrize("path", sorted(p for p in TEXT_FILES if p.is_file()), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_and_docs_state_the_present(path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1) if LOG_POINTERS.search(line)]
    assert not hits, "\n".join(hits)


def test_readme_is_short_and_docs_are_a_current_state():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
    assert sum(len(p.read_text().splitlines()) for p in (ROOT / "docs").glob("*.md")) < 800
