"""One bounded reader: no module of prereg/ or audit/ opens or reads a file but prereg/bounded.py
(regular files only, size limits) and prereg/files.py (atomic writes). Prints each other call of
open(), io.open(), os.fdopen(), .read_text() or .read_bytes(), with its line; exit 1 if any."""

import ast
import pathlib
import sys

ALLOWED = {"prereg/bounded.py", "prereg/files.py"}
METHODS = {"read_text", "read_bytes", "fdopen"}


def offending(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Name) and f.id == "open":
            out.append((n.lineno, "open("))
        elif isinstance(f, ast.Attribute) and f.attr in METHODS:
            out.append((n.lineno, f".{f.attr}("))
        elif isinstance(f, ast.Attribute) and f.attr == "open" and isinstance(f.value, ast.Name):
            if f.value.id in ("io", "codecs", "builtins"):
                out.append((n.lineno, f"{f.value.id}.open("))
    return out


def main() -> int:
    bad = []
    for root in ("prereg", "audit"):
        for p in sorted(pathlib.Path(root).rglob("*.py")):
            rel = p.as_posix()
            if rel in ALLOWED or "__pycache__" in p.parts:
                continue
            for line, call in offending(ast.parse(p.read_text(), filename=rel)):
                bad.append(f"{rel}:{line}: {call} reads a file past prereg/bounded.py")
    print("\n".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
