"""Gate: the import graph runs one way, and the core and the audit stand on the standard library.

The packages and what each may import (besides the standard library and itself):

    prereg     nothing of ours           the core: records format, rules, statistics, rendering
    audit      prereg                    the public audit
    cotangent  nothing of ours (torch)   the method
    analysis   prereg                    the report: summary files, power, calibration, plots
    harness    prereg, cotangent, analysis (its public modules, from the command line)

``analysis/public_audit.py`` (the entry script) imports ``audit`` alone; nothing imports it, and
nothing but it imports ``audit``. ``prereg`` and ``audit`` import only ``sys.stdlib_module_names``
(the public audit runs on a bare Python), checked on the source and again on what a real import
loads under ``python -I -S``. ``sys.path`` is edited only where a reason is listed in
:data:`SYS_PATH` (the packages and the benchmark scripts, which run from an installed checkout and
import no test helper), and ``importlib`` loads no module of ours (only users' plug-ins).

Standard library only: ``python .ci/imports.py`` from the repository's root; exits 1 naming each
import that breaks a rule."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

OURS = ("prereg", "audit", "cotangent", "analysis", "harness")
MAY = {
    "prereg": set(),
    "audit": {"prereg"},
    "cotangent": set(),
    "analysis": {"prereg"},
    "harness": {"prereg", "cotangent", "analysis"},
    "tests": set(OURS) - {"audit"} | {"audit"},  # tests may import anything of ours
    "benchmarks": {"prereg", "cotangent", "analysis", "harness"},
    "examples": {"cotangent", "harness"},
}
STDLIB_ONLY = ("prereg", "audit")
ENTRY = "analysis/public_audit.py"
#: The only files that touch ``sys.path``, each with its reason.
SYS_PATH = {
    ENTRY: "a script run by its path: puts the repository root first so the packages load once",
    "harness/plugins.py": "users' plug-ins are imported from the study's root",
    "harness/clitools.py": "users' plug-ins are imported from the study's root",
    "harness/execute/launchers.py": "the worker's bootstrap (a script) imports the frozen code path",
}


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(n.lineno, a.name) for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module != "__future__":
            out.append((n.lineno, "." * n.level + (n.module or "")))
    return out


def main() -> int:
    bad: list[str] = []
    for top in (*OURS, "tests", "benchmarks", "examples"):
        for p in sorted(pathlib.Path(top).rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            rel = p.as_posix()
            text = p.read_text(encoding="utf-8")
            for line, mod in imports(p):
                if mod.startswith("."):
                    if top in STDLIB_ONLY or top in OURS:
                        bad.append(
                            f"{rel}:{line}: relative import {mod} (name the package: one name, one load)"
                        )
                    continue
                head = mod.split(".")[0]
                if rel == ENTRY:
                    if head not in sys.stdlib_module_names and head != "audit":
                        bad.append(f"{rel}:{line}: {mod} (the entry script imports the audit alone)")
                    continue
                if top == "benchmarks" and head in ("conftest", "tests"):
                    bad.append(
                        f"{rel}:{line}: a benchmark imports the tests' {mod} (it stands on the packages)"
                    )
                elif mod == "analysis.public_audit" or mod == "public_audit":
                    bad.append(f"{rel}:{line}: imports the entry script (import from audit or prereg)")
                elif head in OURS and head != top and head not in MAY.get(top, set()):
                    bad.append(f"{rel}:{line}: {top} imports {mod} (allowed: {sorted(MAY.get(top, set()))})")
                elif (
                    top in STDLIB_ONLY
                    and head not in sys.stdlib_module_names
                    and head not in (top, *MAY[top])
                ):
                    bad.append(f"{rel}:{line}: {mod} is not in the standard library")
            if top in (*OURS, "benchmarks") and "sys.path" in text and rel not in SYS_PATH:
                bad.append(f"{rel}: edits or reads sys.path (allowed only in {', '.join(SYS_PATH)})")
            if top in OURS and "import_module(" in text:
                for line, src in enumerate(text.splitlines(), 1):
                    if "import_module(" in src and any(f"'{o}" in src or f'"{o}' in src for o in OURS):
                        bad.append(f"{rel}:{line}: importlib loads a module of ours by name")
    # what a real import of the audit loads, on a bare Python
    probe = (
        "import sys; sys.path.insert(0, '.'); import audit.cli, prereg.render.page; "
        "ours = ('prereg', 'audit'); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names "
        "and m.split('.')[0] not in ours and m != '__main__')))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True)
    if out.returncode != 0 or out.stdout.strip():
        bad.append(f"the audit under python -I -S loads {out.stdout.strip() or out.stderr.strip()[-300:]}")
    print("\n".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
