"""No import cycles among `service` modules, and `policies` never reaches up into `environment`.

A cycle between two modules means neither can be read, tested or moved without
the other, and an import inside a function only hides the cycle until that
function runs. So the graph here is built with `ast` from every import in
``service/**/*.py`` — module level, inside functions and under ``TYPE_CHECKING``,
absolute and relative — and the strongly connected components are found with
Tarjan's algorithm (networkx is not a dependency).

An edge goes from a module to the module it names: ``from service.storage import
tables`` points at ``service.storage.log.tables`` when that is a module, and
``from service.storage import make_engine`` at the package ``service.storage``.
Importing a submodule also runs its package's ``__init__``, but that implicit
edge is left out: a package re-exporting its own submodules is not a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "service"


def module_name(path: Path, root: Path) -> str:
    """Dotted name of `path` under `root` (``storage/__init__.py`` is ``storage``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names, resolving ``level`` dots against `module`."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """The project modules `path` (module `module`) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, is_package)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    # `import service.a.b` names a module; keep the longest known prefix of each name.
    edges: set[str] = set()
    for name in found:
        parts = name.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        if parts:
            edges.add(".".join(parts))
    edges.discard(module)
    return edges


def import_graph(root: Path, package: str = "service") -> dict[str, set[str]]:
    """Module -> the project modules it imports, for every ``.py`` under ``root/package``."""
    paths = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    known = set(paths)
    return {name: imports_of(path, name, known) for name, path in paths.items()}


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node (iterative: no recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def _describe(component: list[str], graph: Mapping[str, set[str]]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(edges)


def test_service_has_no_import_cycles() -> None:
    graph = import_graph(ROOT)
    cycles = strongly_connected(graph)
    assert not cycles, "\n".join(_describe(c, graph) for c in cycles)


def test_policies_never_import_environment() -> None:
    graph = import_graph(ROOT)
    reach = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module == "service.policies" or module.startswith("service.policies.")
        for target in targets
        if target == "service.environment" or target.startswith("service.environment.")
    )
    assert reach == []


def test_the_check_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.b import thing\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nthing = 1\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert strongly_connected(graph) == [["pkg.a", "pkg.sub.b"]]
