"""Issue 29: the structure's rules, checked on the source itself (the artefact here is the code).

* Nothing below the command line reads the process environment: the command line takes the run's one snapshot
  (``load_settings(os.environ)``, kept as ``Settings.environ``) and every later stage reads that. The named edges
  below are where a process starts or ends (docs/layout.md, "One run context").
* Every module under validate/rules/ is one the registry loads (a rule module the registry does not import never
  runs, silently).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "entrypoint" / "rocmft"

# Where reading os.environ is the point: a process's own edge. Each with its reason (docs/layout.md).
EDGES = {
    "cli/": "the command line: takes the run's one snapshot",
    "worker/": "the worker process: what torchrun set for it (LOCAL_RANK, WORLD_SIZE) and its secrets",
    "validate/child.py": "the parser child: takes its environment from the parse request",
    "validate/__init__.py": "starts the parser child with this process's environment, which must equal the worker's",
    "facts/probe.py": "the GPU probe child process: records what it ran with",
    "launch/run.py": "starts the worker processes from this process's environment",
    "proc.py": "undoes torch inductor's own write into os.environ",
    "image/": "build-time tools the Dockerfile runs, not part of a run",
    "console.py": "is_first_rank: every process (worker ranks too) prints once",
    "fsutil.py": "default_cache_dir (XDG_CACHE_HOME): needed before any settings exist, and by the worker",
    "config/lfargs.py": "the argument vocabulary's cache: read before the settings exist (it types them)",
}


def _reads_of_os_environ(tree: ast.AST) -> list[int]:
    """Line numbers of ``os.environ`` and ``os.getenv`` in a module (``from os import environ`` too)."""
    lines = []
    for node in ast.walk(tree):
        attribute = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
        if attribute and node.attr in ("environ", "getenv", "environb", "putenv", "unsetenv"):
            lines.append(node.lineno)
        imported = isinstance(node, ast.ImportFrom) and node.module == "os"
        if imported and any(alias.name in ("environ", "getenv") for alias in node.names):
            lines.append(node.lineno)
    return lines


def test_nothing_below_the_command_line_reads_the_process_environment():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if any(relative == edge or (edge.endswith("/") and relative.startswith(edge)) for edge in EDGES):
            continue
        for line in _reads_of_os_environ(ast.parse(path.read_text(), str(path))):
            found.append(f"{relative}:{line}")
    assert not found, (
        "these read os.environ below the command line; read plan.settings.environ (the run's snapshot) instead, "
        f"or name the module as a process edge in EDGES with its reason: {found}"
    )


def test_the_edges_exist():
    """An edge that no longer exists (renamed, removed) would silently widen the exemption."""
    for edge in EDGES:
        assert (PACKAGE / edge).exists(), edge


def test_every_rule_module_is_one_the_registry_loads():
    from rocmft.validate.rules import MODULES

    present = {p.stem for p in (PACKAGE / "validate" / "rules").glob("*.py")} - {"__init__", "common"}
    assert present == set(MODULES), (
        f"not loaded: {sorted(present - set(MODULES))}; missing: {sorted(set(MODULES) - present)}"
    )


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80  # issue 29: sizes a newcomer can read


def test_no_module_over_600_lines_and_no_function_over_80():
    """Every module of the package fits in 600 lines and every function (a method, a nested function) in 80,
    counted from its ``def`` to its last line."""
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative, text = path.relative_to(PACKAGE).as_posix(), path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{relative} ({len(text.splitlines())})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{relative}:{node.name} ({length})")
    assert not long_modules and not long_functions, (long_modules, long_functions)
