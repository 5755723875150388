"""The package layout holds: no import cycle among hfspec's modules (counting imports inside functions), no Qt
below the front ends, and dependencies that flow one way between packages (docs/layout.md, "Architecture"); no
module over 400 lines and no function over 10 parameters (hfspec and gui), each exception named with its reason.

The graph is read from the source with `ast`, so an import inside a function counts as much as one at the top.
`from hfspec.pkg import name` is an edge to the submodule `hfspec.pkg.name` when that is a module, otherwise to
`hfspec.pkg` (its `__init__`). Importing a submodule also runs its parents' `__init__`; that implicit edge is not
counted (every module would then depend on `hfspec/__init__`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hfspec"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in the file, hfspec's own or not."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}"
                out.append((full if full in MODULES else module, node.lineno, id(node) in top))
    return out


def _own(target: str) -> str | None:
    """The hfspec module an import reaches (the longest known prefix), None for other packages."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _graph() -> dict[str, list[tuple[str, int]]]:
    graph = {}
    for name, path in MODULES.items():
        edges = []
        for target, line, _ in _imports(name, path):
            if target.split(".")[0] == "hfspec" and (own := _own(target)) is not None and own != name:
                edges.append((own, line))
        graph[name] = edges
    return graph


GRAPH = _graph()


def _cycle(graph: dict[str, list[tuple[str, int]]]) -> list[str] | None:
    """One cycle as a path of "module:line -> module" steps, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[tuple[str, int]] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        for target, line in graph.get(node, []):
            if state.get(target) == 1:
                start = next(i for i, (n, _) in enumerate(stack + [(node, line)]) if n == target)
                path = stack[start:] + [(node, line)]
                return [f"{n}:{ln}" for n, ln in path] + [target]
            if target not in state:
                stack.append((node, line))
                found = visit(target)
                stack.pop()
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_the_packages():
    for name in ("hfspec.api", "hfspec.decoding.loop", "hfspec.decoding.round", "hfspec.kernels.lean",
                 "hfspec.measure.ruler", "hfspec.io.loading", "hfspec.audit.command", "hfspec.drafts.registry"):
        assert name in MODULES, name
    assert ("hfspec.decoding.loop", "hfspec.drafts.base") in {(m, t) for m, es in GRAPH.items() for t, _ in es}


def test_no_import_cycle():
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": [("b", 1)], "b": [("c", 2)], "c": [("a", 3)]}) == ["a:1", "b:2", "c:3", "a"]
    assert _cycle({"a": [("b", 1)], "b": []}) is None


QT = ("PySide6", "PyQt5", "PyQt6", "shiboken6", "pyqtgraph", "gui")


def test_no_qt_or_gui_below_the_front_ends():
    """hfspec never imports the dashboard or Qt at module level; only the CLI's `gui` verb imports it, when run."""
    for name, path in MODULES.items():
        for target, line, at_top in _imports(name, path):
            if target.split(".")[0] in QT:
                assert not at_top and name == "hfspec.cli", f"{name}:{line} imports {target}"


def _package(name: str) -> str:
    """The layer a module belongs to: its package under hfspec, or its own name for a top-level module."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "hfspec"


BASE = {"errors", "extras", "compat", "validate", "attrs", "dtypes"}  # used from everywhere
FRONT = {"api", "cli", "session", "settings", "report", "live", "hub_export", "hfspec", "__main__"}
# package -> the packages and top-level modules it must never import
FORBIDDEN = {
    "quant": {"kernels", "drafts", "decoding", "measure", "io", "audit"} | FRONT,
    "kernels": {"drafts", "decoding", "measure", "io", "audit"} | FRONT,
    "drafts": {"decoding", "measure", "audit"} | FRONT,
    "decoding": {"measure", "io", "audit"} | FRONT,
    "io": {"decoding", "measure", "audit"} | FRONT,
    "measure": {"audit", "cli", "session", "report", "live", "hub_export", "hfspec", "__main__"},
    "audit": {"cli", "hfspec", "__main__"},
    "errors": FRONT | {"quant", "kernels", "drafts", "decoding", "measure", "io", "audit", "validate"},
    "extras": FRONT | {"quant", "kernels", "drafts", "decoding", "measure", "io", "audit", "validate"},
    "compat": FRONT | {"quant", "kernels", "drafts", "decoding", "measure", "io", "audit", "validate"},
    "attrs": FRONT | {"quant", "kernels", "drafts", "decoding", "measure", "io", "audit", "validate", "errors", "extras",
                      "compat"},
    "dtypes": FRONT | {"quant", "kernels", "drafts", "decoding", "measure", "io", "audit", "validate", "errors", "extras",
                       "compat", "attrs"},
    "validate": FRONT | {"quant", "drafts", "decoding", "measure", "io", "audit"},
}
# (importer, imported): the exceptions, each with its reason
ALLOWED = {
    ("hfspec.drafts.sensitivity", "hfspec.report"): "the sensitivity result prints with the CLI's text table",
    ("hfspec.measure.results", "hfspec.settings"): "a run's result carries the RunSettings that produced it",
    ("hfspec.validate", "hfspec.kernels.cache"): "checking a cache argument asks the one module that reads HF caches",
}


def test_dependencies_flow_one_way():
    wrong = []
    for name, edges in GRAPH.items():
        forbidden = FORBIDDEN.get(_package(name), set())
        for target, line in edges:
            if _package(target) in forbidden and (name, target) not in ALLOWED:
                wrong.append(f"{name}:{line} imports {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)
    for name, target in ALLOWED:  # an exception no longer needed is dropped
        assert target in {t for t, _ in GRAPH[name]}, f"stale exception {name} -> {target}"


def test_a_package_imports_its_own_modules_not_its_init():
    """Inside a package, import the submodule: going through the package's `__init__` is how cycles start."""
    wrong = []
    for name, edges in GRAPH.items():
        for target, line in edges:
            if MODULES[target].name == "__init__.py" and name.startswith(target + ".") and target != "hfspec":
                wrong.append(f"{name}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


OLD_PATHS = ("hfspec.loading", "hfspec.exactness", "hfspec.costmodel")  # kept for code written against 0.1's docs


def test_old_import_paths_are_for_users_only():
    """The old paths that the 0.1 docs showed stay importable, but nothing inside hfspec goes through them."""
    users = [f"{name}:{line}" for name, edges in GRAPH.items() for target, line in edges if target in OLD_PATHS]
    assert not users, users


def test_hfspec_modules_are_imported_at_module_level():
    """An import of hfspec's own modules inside a function hides a dependency (and, often, a cycle); only optional
    dependencies (bitsandbytes, gguf, compressed-tensors, matplotlib, Qt) are imported inside functions."""
    hidden = [f"{name}:{line} imports {target}" for name, path in MODULES.items()
              for target, line, at_top in _imports(name, path) if target.split(".")[0] == "hfspec" and not at_top]
    assert not hidden, "\n".join(hidden)


# ---------------------------------------------------------------------------------------------------- size
FRONT_ENDS = ROOT / "gui"
MAX_LINES = 400
# module -> why it may be longer, for now
LONG_MODULES: dict[str, str] = {}
MAX_PARAMETERS = 10
# function -> why it may take more: the public entry points mirror `generate`'s keywords
MANY_PARAMETERS = {
    "hfspec.api.speculative_generate": "the custom_generate callable: transformers passes generate's preparation "
                                       "and the caller's keywords by name",
    "hfspec.api.generate": "the public entry point, mirroring target.generate's keywords",
    "hfspec.api.plain_generate": "the public entry point, mirroring target.generate's keywords",
}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted(FRONT_ENDS.rglob("*.py"))


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    wrong = [f"{path}: {n} lines" for path, n in long.items() if path not in LONG_MODULES]
    assert not wrong, f"modules over {MAX_LINES} lines (split them):\n" + "\n".join(wrong)
    stale = [path for path in LONG_MODULES if path not in long]
    assert not stale, f"no longer over {MAX_LINES} lines, drop the exception: {stale}"


def _parameter_counts(source: str, module: str) -> dict[str, int]:
    """function's dotted name -> its parameters (positional and keyword-only; not self, cls, *args, **kwargs)."""
    out = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                args = child.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                out[f"{prefix}.{child.name}"] = len([n for n in names if n not in ("self", "cls")])
                visit(child, f"{prefix}.{child.name}")
            else:
                visit(child, prefix)

    visit(ast.parse(source), module)
    return out


def test_no_function_over_10_parameters():
    counts = {name: n for path in _sources() for name, n in _parameter_counts(
        path.read_text(encoding="utf-8"), ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    ).items()}
    wrong = [f"{name}: {n}" for name, n in counts.items() if n > MAX_PARAMETERS and name not in MANY_PARAMETERS]
    assert not wrong, f"functions over {MAX_PARAMETERS} parameters (group them):\n" + "\n".join(sorted(wrong))
    stale = [name for name in MANY_PARAMETERS if counts.get(name, 0) <= MAX_PARAMETERS]
    assert not stale, f"no longer over {MAX_PARAMETERS} parameters, drop the exception: {stale}"


def test_the_parameter_count_skips_self_and_star_arguments():
    source = "class A:\n    def f(self, a, /, b, *args, c, **kw):\n        def g(x): pass\n"
    assert _parameter_counts(source, "m") == {"m.A.f": 3, "m.A.f.g": 1}
