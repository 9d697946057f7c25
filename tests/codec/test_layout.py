"""The layout shows the architecture, and stays so: no import cycles (imports inside
functions counted), rooms of at most 15 modules, a library that imports no filesystem,
guarded links, and a module map in docs/design.md that is the tree's."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
LAYERS = ("codec", "vfs")
#: What the library may never import, at module level or inside a function.
FILESYSTEM_ONLY = ("cutfs.vfs", "pyfuse3", "trio")


def _modules() -> dict[str, Path]:
    found = {}
    for layer in LAYERS:
        for path in (REPOSITORY / layer).rglob("*.py"):
            parts = list(path.relative_to(REPOSITORY).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found["cutfs." + ".".join(parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules ``path`` imports, anywhere in it but under ``if TYPE_CHECKING:``: of
    cutfs's own, the module (or the package a name is imported from); others by name."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                found.add(dotted if dotted in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or not (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return groups


def test_no_module_imports_one_that_imports_it_back() -> None:
    modules = _modules()
    graph = {
        name: {imported for imported in _imports(path, modules) if imported in modules} - {name}
        for name, path in modules.items()
    }
    assert _cycles(graph) == []


def test_the_library_imports_no_filesystem() -> None:
    modules = _modules()
    offending = {
        name: sorted(
            imported for imported in _imports(path, modules) if imported.startswith(FILESYSTEM_ONLY)
        )
        for name, path in modules.items()
        if name.startswith("cutfs.codec")
    }
    assert {name: found for name, found in offending.items() if found} == {}


def test_no_folder_holds_more_than_fifteen_modules() -> None:
    folders = {path.parent for layer in LAYERS for path in (REPOSITORY / layer).rglob("*.py")}
    crowded = {
        folder.relative_to(REPOSITORY).as_posix(): count
        for folder in folders
        if (count := sum(1 for p in folder.glob("*.py") if not p.name.startswith("__"))) > 15
    }
    assert crowded == {}


@pytest.mark.parametrize("layer", LAYERS)
def test_the_top_level_folders_cannot_be_imported_by_their_own_names(layer: str) -> None:
    """From the repository root, ``import codec.errors`` would give second copies of
    cutfs's classes; it is refused with a message that says what to import."""
    result = subprocess.run(
        [sys.executable, "-c", f"import {layer}.errors" if layer == "codec" else f"import {layer}"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert f"import cutfs.{layer}, not {layer}" in result.stderr


def test_the_module_map_of_the_design_notes_is_the_trees() -> None:
    result = subprocess.run(
        [sys.executable, str(REPOSITORY / "scripts" / "module_map.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    design = (REPOSITORY / "docs" / "design.md").read_text()
    begin = "<!-- module map: made by scripts/module_map.py -->\n"
    shown = design[design.index(begin) + len(begin) : design.index("<!-- end of module map -->")]
    assert shown == result.stdout, "run: python scripts/module_map.py --write"
