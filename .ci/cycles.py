"""Gate: no import circle among the modules of the project's packages, type-only imports
(under ``if TYPE_CHECKING:``) and a submodule's import of its own package included.

Prints each circle (a strongly connected component of the import graph) and exits 1 if there is
one. Standard library only: ``python .ci/cycles.py`` from the repository's root."""

from __future__ import annotations

import ast
import pathlib
import sys


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for root in ("prereg", "audit", "cotangent", "harness", "analysis"):
        for p in pathlib.Path(root).rglob("*.py"):
            if "__pycache__" in p.parts:
                continue
            name = ".".join(p.with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def graph(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        package = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                if n.level:
                    base = package[: len(package) - (n.level - 1)]
                    t = ".".join(base + ([n.module] if n.module else []))
                else:
                    t = n.module or ""
                targets = [t] + [f"{t}.{a.name}" for a in n.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    edges[m].add(t)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    found = circles(graph(modules()))
    for c in found:
        print("import circle: " + " -> ".join(c))
    sys.exit(1 if found else 0)
