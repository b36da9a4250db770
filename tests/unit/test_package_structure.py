"""The package's shape (issues #17, #28): no import cycles between pipeline's modules, few imports that run from a
lower floor up, and no module over 500 lines. Read statically (ast), so the test imports nothing it checks.

Definitions (reproducible by hand or with any ast walker):

- An import is an ``import`` or ``from ... import`` statement, or an ``importlib.import_module("...")`` /
  ``__import__("...")`` call with a literal name, that names a module of pipeline/. ``from a.b import c`` imports
  ``a.b.c`` when that is a module, else ``a.b``; relative imports are resolved against the importer's package. The
  packages a submodule's import loads on the way (``a`` for ``a.b``) are not counted.
- Every import counts for cycles: at module level, inside a function, inside ``if __name__ == "__main__":`` (a lazy
  import that closes a cycle is still a cycle; run as ``python -m``, a module whose ``__main__`` block imports a module
  that imports it is loaded twice).
- A module-level import is one that runs when the module is imported: not inside a ``def`` or ``lambda`` body and
  not inside ``if __name__ == "__main__":``.
- An entry point is a module that no module of pipeline/ imports at all: a command that pipeline/cli loads by name,
  a ``__main__`` module, a ``python -m`` script.
- Floors: a module stands one floor above everything it imports, on the longest import path to the ground (a module
  that imports none is on floor 0). The imports counted are the module-level ones, except for an entry point,
  which stands above every module it imports, wherever the import is (nothing stands on it; a command imports what
  it runs inside the function that runs it, so that every other command starts without it).
- An upward import is an import (anywhere) from a module to one on a higher floor: a lazy import that reaches past
  the importer's own layer, usually to dodge a cycle. Counted as arrows: distinct (importer, imported) pairs.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "pipeline"
MAX_LINES = 500
MAX_UPWARD = 0  # issue #28 allows 3; none is left, so a new one must say why here


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_main_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def _walk(tree: ast.AST, module_level: bool):
    """ast.walk; ``module_level``: less the bodies of functions, lambdas and ``if __name__ == "__main__":``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if module_level and (_is_main_block(child) or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                               ast.Lambda))):
                continue
            todo.append(child)


def _dynamic_name(node: ast.AST) -> str | None:
    """The literal module name of ``importlib.import_module("x")`` or ``__import__("x", ...)``."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    func = ast.unparse(node.func)
    return node.args[0].value if func in ("importlib.import_module", "__import__", "import_module") else None


def imports(mods: dict[str, Path], module_level: bool = False) -> dict[str, set[str]]:
    """module -> the pipeline modules it imports (see the module docstring); ``module_level``: those imports only."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in _walk(ast.parse(path.read_text(), str(path)), module_level):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    targets.append(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif (name := _dynamic_name(node)) is not None:
                targets = [name]
            edges[mod] |= {t for t in targets if t in mods and t != mod}
    return edges


def floors(edges: dict[str, set[str]], module_level: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor (see the module docstring); ``edges``: every import, ``module_level``: those at module
    level. Needs no cycle among the imports counted."""
    imported = {t for targets in edges.values() for t in targets}
    below = {m: edges[m] if m not in imported else module_level[m] for m in edges}
    floor: dict[str, int] = {}
    for root in sorted(edges):
        todo = [root]
        while todo:
            m = todo[-1]
            missing = [t for t in below[m] if t not in floor]
            if missing:
                todo += missing
                continue
            floor[m] = 1 + max((floor[t] for t in below[m]), default=-1)
            todo.pop()
    return floor


def upward(edges: dict[str, set[str]], floor: dict[str, int]) -> list[str]:
    """Every import from a module to one on a higher floor, as ``importer (floor) -> imported (floor)``."""
    return [f"{m} ({floor[m]}) -> {t} ({floor[t]})" for m in sorted(edges) for t in sorted(edges[m])
            if floor[t] > floor[m]]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_floors_and_upward_imports():
    # d imports c lazily; cli, an entry point (imported by none), imports d lazily
    every = {"a": set(), "b": {"a"}, "c": {"b"}, "d": {"a", "c"}, "cli": {"d"}}
    top = {"a": set(), "b": {"a"}, "c": {"b"}, "d": {"a"}, "cli": set()}
    floor = floors(every, top)
    assert floor == {"a": 0, "b": 1, "c": 2, "d": 1, "cli": 2}
    assert upward(every, floor) == ["d (1) -> c (2)"]
    every["x"], top["x"] = {"cli"}, {"cli"}  # imported, cli is no entry point: its floor counts module level only
    assert upward(every, floors(every, top)) == ["cli (0) -> d (1)", "d (1) -> c (2)"]


def test_imports_are_read_everywhere(tmp_path):
    """Function-local, __main__-block and literal dynamic imports count; only the module-level ones set floors."""
    mods = {"p": tmp_path / "p.py", "p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"}
    mods["p"].write_text("")
    mods["p.a"].write_text("import importlib\n\ndef f():\n    importlib.import_module('p.b')\n")
    mods["p.b"].write_text("from p import a\n\nif __name__ == '__main__':\n    __import__('p')\n")
    assert imports(mods) == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.a", "p"}}
    assert imports(mods, module_level=True) == {"p": set(), "p.a": set(), "p.b": {"p.a"}}


def test_no_import_cycles():
    """No cycle, every import counted (function-local ones and ``__main__`` blocks included)."""
    mods = modules()
    assert "pipeline.cli" in mods or "pipeline.cli.__main__" in mods
    found = cycles(imports(mods))
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_few_imports_run_upward():
    """At most MAX_UPWARD imports from a lower floor up (definitions: the module docstring)."""
    mods = modules()
    every, top = imports(mods), imports(mods, module_level=True)
    assert cycles(top) == []
    arrows = upward(every, floors(every, top))
    assert len(arrows) <= MAX_UPWARD, f"{len(arrows)} upward imports (at most {MAX_UPWARD}):\n" + "\n".join(arrows)


def parts(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports between the package's parts: each file or subpackage directly under pipeline/ is one part
    (``pipeline.stages.mix.plan`` belongs to ``pipeline.stages``)."""
    def part(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {part(m): set() for m in edges}
    for m, targets in edges.items():
        out[part(m)] |= {part(t) for t in targets if part(t) != part(m)}
    return out


def test_the_parts_form_no_cycle():
    """No two parts of the package import each other, even through others: the parts stack up with no import running
    from a lower one to a higher one (the memory model below recipe, recipe below layout, layout below stages, stages
    below distribution and devices, init and cli on top)."""
    found = cycles(parts(imports(modules())))
    assert found == [], "parts that import each other: " + "; ".join(" <-> ".join(c) for c in found)
    assert cycles(parts({"p.a.x": {"p.b"}, "p.b": {"p.a.y"}, "p.a.y": set()})) == [["p.a", "p.b"]]


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, long


def test_every_subpackage_is_installed():
    """pyproject.toml lists every package under pipeline/ (a subpackage left out is missing from `pip install .`,
    e.g. the device install's reader)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert listed == found, (listed, found)
