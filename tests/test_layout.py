"""The package's layout follows the flow (docs/layout.md): a step imports only earlier steps and the ground floor,
and no modules import each other in a circle. Read from the code's own import statements (ast), every import
counted, those inside functions and ``TYPE_CHECKING`` blocks too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "entrypoint" / "rocmft"
# the flow, lowest first (DESIGN.md "The flow"); the ground floor is every top-level module but the entry points
STEPS = ["config", "facts", "render", "validate", "checks", "launch", "worker", "outputs", "cli"]
ENTRY_POINTS = {"rocmft.__main__": len(STEPS)}  # `python -m rocmft` is the cli
BUILD_TIME = "image"  # the image build's check: may use the ground floor, config and facts, and nothing uses it


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The rocmft modules ``path`` imports (``from rocmft.x import y`` counts rocmft.x, and rocmft.x.y when that
    is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the package uses absolute imports)"
            if node.module and node.module.split(".")[0] == "rocmft":
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "rocmft")
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def floor(module: str) -> int:
    """-1 for the ground floor, else the step's index in :data:`STEPS`."""
    if module in ENTRY_POINTS:
        return ENTRY_POINTS[module]
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] not in STEPS and parts[1] != BUILD_TIME):
        return -1
    return STEPS.index(parts[1]) if parts[1] in STEPS else STEPS.index("facts")  # image sits on facts


def test_no_step_imports_a_later_step():
    backward = []
    for module, targets in graph().items():
        for target in targets:
            if target.split(".")[1:2] == [BUILD_TIME] and not module.startswith(f"rocmft.{BUILD_TIME}"):
                backward.append(f"{module} -> {target} (the build check is used by nothing at run time)")
            elif floor(target) > floor(module):
                backward.append(f"{module} -> {target}")
    assert backward == [], "imports that run against the flow:\n" + "\n".join(sorted(backward))


def test_no_import_circles():
    edges = graph()
    # a submodule naming its own package (``from rocmft.checks import check``) reads the package's face: not a circle
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}
    circles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_ground_floor_imports_only_the_ground_floor():
    for module, targets in graph().items():
        if floor(module) == -1:
            assert all(floor(t) == -1 for t in targets), f"{module} imports {sorted(targets)}"


def test_every_subpackage_ships_in_the_wheel():
    """pyproject.toml lists the packages by hand (the package lives under entrypoint/, the templates and profiles
    elsewhere): a folder missing from the list is missing from the image (`No module named rocmft.validate.rules`
    in the cpu image was how this was found)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(init) for init in PACKAGE.rglob("__init__.py")}
    assert folders - listed == set()
