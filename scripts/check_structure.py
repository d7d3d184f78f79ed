"""Static checks of the house rules that formatters cannot see (part of ``make lint``).

1. No source file over 600 lines.
2. No import cycle among the modules of ``python/shardwise`` (imports inside functions count:
   a lazy import hides a cycle, it does not remove it).
3. No read of FSDP's private attributes outside ``python/shardwise/fsdp/``: other code asks the
   public API (``units()``, ``owned_slices()``, ...).
4. No library module (``fsdp/``, ``zero/``, ``pipeline/``, ``tensor_parallel/``, ``ops/``)
   imports the application, ``shardwise.train``.

Rules 1 and 2 hold a ratchet for what predates them: ``LONG_FILES`` (path -> the most lines it
may have) and ``KNOWN_CYCLES`` may only shrink. Each entry is work still to do.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "shardwise"
MAX_LINES = 600
SOURCE_SUFFIXES = {".py", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".sh"}
SOURCE_FOLDERS = ("csrc", "python", "tests", "examples", "benchmarks", "scripts")

# Files over the limit, with the most lines each may keep (it may only shrink): none. Those over it
# when the check arrived (the trainer's config and planner, their test, the shared-memory
# transport) were split then; keep the list empty.
LONG_FILES: dict[str, int] = {}
# Tolerated import cycles (a cycle found must lie inside one of these): none. The trainer's
# six-module cycle (cli, planner, gpt_costs, parallelize, step, trainer) was broken when the check
# arrived; keep the list empty.
KNOWN_CYCLES: list[set[str]] = []


def tracked_sources() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", *SOURCE_FOLDERS, "setup.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / p for p in out.split() if Path(p).suffix in SOURCE_SUFFIXES]


def long_files(paths: list[Path]) -> list[str]:
    errors = []
    for path in paths:
        if not path.exists():
            continue
        lines = len(path.read_text(errors="replace").splitlines())
        rel = path.relative_to(ROOT).as_posix()
        limit = LONG_FILES.get(rel, MAX_LINES)
        if rel in LONG_FILES and lines <= MAX_LINES:
            errors.append(f"{rel}: {lines} lines now; remove its entry from LONG_FILES")
        elif lines > limit:
            errors.append(
                f"{rel}: {lines} lines, over {limit}"
                + (" (its ratchet in LONG_FILES: it may only shrink)" if rel in LONG_FILES else "")
                + "; split it by responsibility"
            )
    return errors


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package modules `name` imports, anywhere in its body."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    # A module importing from its own package's __init__ (or an ancestor's) is how Python
    # packages expose names, not a dependency cycle of the code.
    return {m for m in found if m in modules and not name.startswith(m + ".")}


LIBRARY = ("fsdp", "zero", "pipeline", "tensor_parallel", "ops")
APPLICATION = "shardwise.train"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {
        name: imported(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
        for name, path in files.items()
    }


def import_cycles() -> list[set[str]]:
    return [c for c in strongly_connected(import_graph()) if len(c) > 1]


def layering_errors() -> list[str]:
    errors = []
    for name, imports in sorted(import_graph().items()):
        if name.split(".")[1:2] and name.split(".")[1] in LIBRARY:
            for target in sorted(imports):
                if target == APPLICATION or target.startswith(APPLICATION + "."):
                    errors.append(
                        f"{name} imports {target}: the library must not depend on the trainer; "
                        "move what both need out of shardwise.train"
                    )
    return errors


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, result, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    result.append(component)
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return result


def cycle_errors() -> list[str]:
    errors = []
    for cycle in import_cycles():
        if not any(cycle <= known for known in KNOWN_CYCLES):
            errors.append(
                "import cycle among " + ", ".join(sorted(cycle)) + ": move the shared code "
                "into a module both import, or invert the dependency"
            )
    return errors


def fsdp_private_names() -> set[str]:
    names = set()
    for path in (PACKAGE / "fsdp").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                names.add(node.attr)
    return names


def private_read_errors(paths: list[Path]) -> list[str]:
    private = fsdp_private_names()
    errors = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        if path.suffix != ".py" or rel.startswith(("python/shardwise/fsdp/", "tests/")):
            continue
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                errors.append(
                    f"{rel}:{node.lineno}: reads .{node.attr}, private to shardwise.fsdp; use "
                    "FullyShardedDataParallel's public methods (units(), owned_slices(), ...)"
                )
    return errors


def main() -> int:
    paths = tracked_sources()
    errors = long_files(paths) + cycle_errors() + layering_errors() + private_read_errors(paths)
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
