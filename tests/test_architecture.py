"""The map in docs/design.md, kept true: layers, no import cycles, no private imports, size.

Each rule has an allow-list of what breaks it today. An allow-list may only shrink: a new
violation fails here, and an entry that no longer applies fails too (remove it), so the
lists read as the remaining work of the architecture issue, nothing else.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "gpu_training"
MAX_LINES = 600

# Lowest first: a module imports only from its own layer or below (docs/design.md).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("_lazy", "config", "failure", "hardware")),
    ("configuration", ("job", "strategy.spec")),
    (
        "primitives",
        (
            "amp",
            "grad_norm",
            "schedule",
            "flight_recorder",
            "nonfinite",
            "nonfinite_guard",
            "dist_init",
            "process_group",
            "ddp",
            "rng",
            "traces",
            "memory",
            "monitor",
            "throughput",
            "tasks",
            "meta_device",
            "data",
            "streaming",
            "stateful_stream",
            "train_data",
            "step",
            "telemetry",
        ),
    ),
    (
        "data and checkpoints",
        (
            "batch_finder",
            "profiling",
            "checkpoint",
            "resume",
            "reporting",
            "log_window",
            "trackers",
            "evaluation",
        ),
    ),
    ("strategies and runtime", ("strategy", "preemption", "watchdog", "stall_report")),
    ("trainer", ("trainer",)),
    ("tools", ("diagnostics", "preflight", "launcher", "cost", "report_page")),
    ("command line", ("cli", "commands", "__main__")),
]

# (importer, imported) pairs that run up the layers today: none.
UPWARD_ALLOWED: set[tuple[str, str]] = set()

# Modules over MAX_LINES today: none (a new one must be split along its seams).
OVERSIZE_ALLOWED: set[str] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _target(importer: str, path: Path, node: ast.ImportFrom) -> str | None:
    if node.level:
        package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
        base = package[: len(package) - node.level + 1]
        return ".".join([*base, *([node.module] if node.module else [])])
    if node.module and node.module.startswith("gpu_training"):
        return node.module.removeprefix("gpu_training").removeprefix(".")
    return None


def _import_targets(name: str, path: Path, node: ast.AST) -> list[tuple[str, list[str]]]:
    """(imported module, names) for one import statement of our own modules, else nothing."""
    found: list[tuple[str, list[str]]] = []
    if isinstance(node, ast.ImportFrom):
        target = _target(name, path, node)
        if target is None:
            return found
        names = [a.name for a in node.names]
        submodules = [f"{target}.{n}".strip(".") for n in names]
        if any(s in MODULES for s in submodules) and target not in MODULES:
            found += [(sub, []) for sub in submodules]
        else:
            found.append((target, names))
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith("gpu_training."):
                found.append((alias.name.removeprefix("gpu_training."), []))
    return found


def _imports(top_level_only: bool = False) -> list[tuple[str, str, list[str], int]]:
    """(importer, imported module, names, line) for every import of our own modules."""
    found = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        for node in nodes:
            for imported, names in _import_targets(name, path, node):
                found.append((name, imported, names, node.lineno))
    return found


def _type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): its body never runs."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports() -> list[tuple[str, str, bool, int]]:
    """(importer, imported, deferred, line) for every import of our own modules that runs.

    At module level, or inside a function (``deferred``: it runs at the first call); not
    under ``if TYPE_CHECKING:``, which never runs.
    """
    found = []

    def visit(name: str, path: Path, node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                assert isinstance(child, ast.If)
                for other in child.orelse:
                    visit(name, path, other, deferred)
                continue
            for imported, _ in _import_targets(name, path, child):
                found.append((name, imported, deferred, getattr(child, "lineno", 0)))
            inner = deferred or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            visit(name, path, child, inner)

    for name, path in MODULES.items():
        visit(name, path, ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def _layer(module: str) -> int:
    best, depth = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = index, len(prefix)
    return best


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if m and _layer(m) < 0]
    assert not unplaced, f"place these modules in LAYERS (and docs/design.md): {unplaced}"


def test_imports_run_down_the_layers() -> None:
    upward = set()
    for importer, imported, _, _ in _imports():
        if not importer or imported not in MODULES or not imported:
            continue
        if _layer(imported) > _layer(importer):
            upward.add((importer, imported))
    new = sorted(upward - UPWARD_ALLOWED)
    assert not new, f"imports that run up the layers (docs/design.md): {new}"
    stale = sorted(UPWARD_ALLOWED - upward)
    assert not stale, f"fixed: remove from UPWARD_ALLOWED: {stale}"


# Imports inside a function that close a cycle today: ddp.train_one_epoch steps through `step`,
# which builds on ddp's helpers (docs/design.md, "primitives"). checkpoint/ has none: a format
# reader imported on first use sits below whoever imports it.
DEFERRED_CYCLES_ALLOWED: set[tuple[str, str]] = {("ddp", "step")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return False


def test_no_import_cycles_not_even_inside_functions() -> None:
    """Imports that run — at module level, or inside a function at its first call — form no
    cycle. Only ``if TYPE_CHECKING:`` imports, which never run, are left out."""
    graph: dict[str, set[str]] = defaultdict(set)
    module_level: set[tuple[str, str]] = set()
    for importer, imported, inside_function, _ in _runtime_imports():
        # a package's __init__ re-exporting its own modules is not a cycle with them
        own = imported in MODULES and imported not in ("", importer)
        if own and not importer.startswith(imported + "."):
            graph[importer].add(imported)
            if not inside_function:
                module_level.add((importer, imported))
    deferred = {(a, b) for a, targets in graph.items() for b in targets} - module_level
    allowed = DEFERRED_CYCLES_ALLOWED & deferred
    cut = {a: {b for b in targets if (a, b) not in allowed} for a, targets in graph.items()}
    cycles = _cycles(cut)
    inside = sorted({(c[i], c[i + 1]) for c in cycles for i in range(len(c) - 1)} & deferred)
    assert not cycles, f"import cycles: {cycles}; imported inside a function: {inside}"
    stale = sorted(
        edge
        for edge in DEFERRED_CYCLES_ALLOWED
        if edge not in deferred or not _reaches(cut, edge[1], edge[0])
    )
    assert not stale, f"fixed: remove from DEFERRED_CYCLES_ALLOWED: {stale}"


def _private_imports() -> set[tuple[str, str, str]]:
    found = set()
    for importer, imported, names, _ in _imports():
        for name in names:
            if f"{imported}.{name}" in MODULES:  # a private module of the package: fine
                continue
            if name.startswith("_") and not name.startswith("__") and imported != importer:
                found.add((importer, imported, name))
    return found


# Cross-module imports of private names today: none (a new one is a missing public helper or
# a missing owner: give it a public name, or move it).
PRIVATE_ALLOWED: dict[tuple[str, str], set[str]] = {}


def test_private_names_stay_in_their_module() -> None:
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for importer, imported, name in _private_imports():
        found[(importer, imported)].add(name)
    new = {k: sorted(v - PRIVATE_ALLOWED.get(k, set())) for k, v in found.items()}
    new = {k: v for k, v in new.items() if v}
    assert not new, f"cross-module imports of _private names: give them a public name: {new}"
    stale = {k: sorted(v - found.get(k, set())) for k, v in PRIVATE_ALLOWED.items()}
    stale = {k: v for k, v in stale.items() if v}
    assert not stale, f"fixed: remove from PRIVATE_ALLOWED: {stale}"


def test_modules_stay_small() -> None:
    sizes = {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()
    }
    big = {name for name, lines in sizes.items() if lines > MAX_LINES}
    new = sorted(big - OVERSIZE_ALLOWED)
    assert not new, f"over {MAX_LINES} lines: {[(n, sizes[n]) for n in new]}: split it"
    stale = sorted(OVERSIZE_ALLOWED - big)
    assert not stale, f"now small: remove from OVERSIZE_ALLOWED: {stale}"


def test_the_design_map_names_every_layer() -> None:
    design = (SRC.parent / "docs" / "design.md").read_text(encoding="utf-8")
    for name, prefixes in LAYERS:
        assert name in design, f"docs/design.md does not describe the layer {name!r}"
        for prefix in prefixes:
            assert f"`{prefix}" in design, f"docs/design.md does not place {prefix!r}"


def test_no_merge_conflict_markers_are_left_in_the_tree() -> None:
    root = SRC.parent
    files = [
        *root.glob("*.md"),
        *root.glob("*.toml"),
        *root.glob("Makefile"),
        *(
            p
            for d in ("src", "tests", "docs", "benchmarks", "examples", "configs")
            for p in (root / d).rglob("*")
            if p.suffix in {".py", ".md", ".yaml", ".toml", ".txt"}
        ),
    ]
    markers = ("<" * 7 + " ", "=" * 7 + "\n", ">" * 7 + " ")
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(True), 1)
        if line.startswith(markers) and (line != "=" * 7 + "\n" or path.suffix != ".md")
    ]
    assert not found, f"merge conflict markers: {found}"


# Documents of other projects that comments cite by their own paths.
_EXTERNAL_DOCS = ("torchtitan", "PyTorch's")
_DOC_REFERENCE = re.compile(r"(?<![\w/.-])((?:docs/|benchmarks/)?[A-Za-z_]+\.md)\b")


def test_comments_name_only_documents_that_exist() -> None:
    """A pointer such as ``(docs/design.md, "Traps")`` names a file of this repository: a
    comment that sends readers to a design file the repository does not have is a dead end."""
    root = SRC.parent
    dead = []
    for folder in ("src", "tests", "examples", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            if "lint_corpus" in path.parts:  # other people's scripts, kept as they wrote them
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, 1):
                if any(name in line for name in _EXTERNAL_DOCS):
                    continue
                for ref in _DOC_REFERENCE.findall(line):
                    places = (root / ref, root / "docs" / ref, path.parent / ref)
                    if not any(p.is_file() for p in places):
                        dead.append(f"{path.relative_to(root)}:{number}: {ref}")
    assert not dead, f"comments point to documents that do not exist: {dead}"


def test_every_test_left_out_of_make_test_has_a_target_that_runs_it() -> None:
    """A test marked ``matrix`` is left out of ``make test`` (tests/conftest.py); a Makefile
    target that selects ``matrix`` must name its file, or it would never run anywhere."""
    root = SRC.parent
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    named: set[str] = set()
    for line in makefile.splitlines():
        if re.search(r'-m (matrix|"matrix or not matrix")', line):
            named.update(re.findall(r"tests/(test_\w+\.py)", line))
    marked = sorted(
        path.name
        for path in (root / "tests").glob("test_*.py")
        if re.search(r"\bpytest\.mark\.matrix\b|\bmark\.matrix\b", path.read_text("utf-8"))
    )
    assert marked, "no test is marked matrix: this check would see nothing"
    assert [name for name in marked if name not in named] == []
