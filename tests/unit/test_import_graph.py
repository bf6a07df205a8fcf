"""The layering (collectors -> session -> sinks -> store -> analysis -> render -> cli) has no
circle: no module reaches itself through the imports of others, counting the imports made
inside functions too (a lazy import keeps start-up fast; it is still a dependency). Imports
under `if TYPE_CHECKING:` are left out: they name types for the checker and never run. Read
from the source with ast, so it holds on any machine."""
import ast
from pathlib import Path

from helpers import REPO

# import name -> source folder (pyproject's package-dir: collectors/ installs as counterprof.collectors)
PACKAGES = {"counterprof": REPO / "counterprof", "counterprof.collectors": REPO / "collectors"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "bootstrap" in path.parts:    # runs inside the workload, imports no counterprof
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _run_time_nodes(tree: ast.AST):
    """Every node, but not the bodies of `if TYPE_CHECKING:` (type-only imports)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and isinstance(node.test, (ast.Name, ast.Attribute)) \
                and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The counterprof modules `name` imports when it runs, anywhere in its body."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in _run_time_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:    # `from pkg import module` imports the module
                out.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in known and m != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iteratively)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_type_only_imports_are_not_counted(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n"
                   "else:\n    from p import b\n"
                   "def f():\n    from p import c\n")
    known = {"p.a": mod, "p.b": mod, "p.c": mod}
    assert imports_of("p.m", mod, known) == {"p.b", "p.c"}


def test_the_finder_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_circle():
    known = modules()
    assert "counterprof.session" in known and "counterprof.collectors.perf" in known
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert sum(map(len, graph.values())) > 200    # the edges are seen (relative imports resolved)
    assert circles(graph) == [], "modules that import each other (directly or round a circle)"
