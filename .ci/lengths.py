"""Gate: functions fit a screen. A function of the packages or of benchmarks/ over :data:`LIMIT`
lines needs a comment ``# long: <reason>`` on its ``def`` line or the line above (a table of cases
is a reason; a long procedure is not), and at most :data:`MOST` such functions may stand. Complexity is
``.ci/complexity.py``'s (radon's count), run by ``.ci/gates``.

Standard library only: ``python .ci/lengths.py`` from the repository's root; exits 1 naming each
function over the limit without its reason, or every long one when there are more than MOST."""

from __future__ import annotations

import ast
import pathlib
import sys

#: The packages and the benchmark scripts: every function of them fits a screen or says why.
PACKAGES = ("prereg", "audit", "cotangent", "harness", "analysis", "benchmarks")
LIMIT = 60  # lines from ``def`` to the function's last line, its docstring included
MOST = 10
MARK = "# long:"


def long_functions(root: pathlib.Path) -> list[tuple[str, int, str, int, str | None]]:
    """Every function over :data:`LIMIT` lines: (path, line, name, lines, its reason or None)."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            lines = text.splitlines()
            for node in ast.walk(ast.parse(text)):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n <= LIMIT:
                    continue
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                near = lines[max(first - 2, 0) : node.lineno]
                said = next((ln.split(MARK, 1)[1].strip() for ln in near if MARK in ln), None)
                out.append((path.relative_to(root).as_posix(), node.lineno, node.name, n, said or None))
    return out


def main() -> int:
    rows = long_functions(pathlib.Path("."))
    bad = [r for r in rows if r[4] is None]
    for path, line, name, n, _ in bad:
        print(f"{path}:{line}: {name} is {n} lines (over {LIMIT}) with no '{MARK} <reason>' comment")
    if len(rows) > MOST:
        print(f"{len(rows)} functions over {LIMIT} lines; at most {MOST} may stand, each with its reason:")
        for path, line, name, n, why in rows:
            print(f"  {path}:{line}: {name} ({n} lines){': ' + why if why else ''}")
    return 1 if bad or len(rows) > MOST else 0


if __name__ == "__main__":
    sys.exit(main())
