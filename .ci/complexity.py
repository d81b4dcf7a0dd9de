"""Gate: no function of the packages is more complex than :data:`LIMIT`, counted as radon counts
(``radon cc``: cyclomatic complexity, radon 6's ``ComplexityVisitor``), unless :data:`REASONS`
states why.

radon is not a dependency (the gate runs on the standard library), so its rule is here, and
``tests/test_complexity_gate.py`` holds it to functions whose radon numbers the test states. A
function starts at 1 and adds, over its body (not over the bodies of the functions and classes it
defines, which are counted on their own; a lambda's body is its own):

* ``if``, ``elif`` and a conditional expression (``a if c else b``): 1 each;
* ``for``, ``async for`` and ``while``: 1, and 1 more with an ``else``;
* ``try``: 1 per ``except`` handler, and 1 more with an ``else`` (``finally`` adds nothing);
* a boolean operator: 1 per operand after the first (``a and b or c`` adds 2);
* a comprehension's ``for``: 1, and 1 per ``if`` it filters with;
* ``match``: 1 per ``case``, less one for a ``case _``;
* ``assert``: 1.

``with`` adds nothing (radon's #123), nor does a lambda itself (#68). ruff's C901 (McCabe) counts
neither boolean operators nor conditional expressions nor comprehensions, so a function can pass it
at 15 and stand at 30 here.

Standard library only: ``python .ci/complexity.py`` from the repository's root; exits 1 naming each
function over the limit without its reason, and each reason that no longer names such a function."""

from __future__ import annotations

import ast
import pathlib
import sys

PACKAGES = ("prereg", "audit", "cotangent", "harness", "analysis")
LIMIT = 15
#: Why a function stands over :data:`LIMIT` (each a reason a reviewer can weigh; ruff's C901,
#: which counts no boolean operator, conditional expression or comprehension, is at most 15 on all).
CHECKS = (
    "independent checks in a row, each one condition and the problem it names (radon counts every and/or)"
)
COTANGENT = "cotangent/ is left as it is by issue 60's cleanup (the method; its bit-for-bit tests)"
RENDER = (
    "a section of the published texts: each branch is one cell's or sentence's form in one kind of study "
    "(points or reductions, calibrated or not, report.md or the page), each form checked byte for byte by "
    "the public audit's re-render of the committed studies"
)
GRAMMAR = (
    "the YAML subset reader: a branch per token kind of its grammar (the thorough tier's generated documents)"
)
#: ``path:qualified name`` -> why the function stays over :data:`LIMIT` (a table of cases is a
#: reason; a long procedure is not). The gate fails on an entry that no longer names such a function.
REASONS: dict[str, str] = {
    "audit/anchors.py:check_anchor": CHECKS,
    "audit/cli.py:_options": CHECKS,
    "audit/folder.py:_protocol_and_plan": CHECKS,
    "audit/folder.py:_with_snapshot": CHECKS,
    "audit/freeze.py:check_freeze": CHECKS,
    "audit/freeze.py:check_phase_kernels": CHECKS,
    "audit/freeze.py:check_protocol_copies": CHECKS,
    "audit/freeze.py:check_time": CHECKS,
    "audit/freeze.py:check_versions": CHECKS,
    "audit/freeze.py:check_what_ran": CHECKS,
    "audit/published.py:check_published": CHECKS,
    "harness/protocol.py:_refuse_unmeasurable": CHECKS,
    "prereg/barrier.py:_entry_problems": CHECKS,
    "prereg/barrier.py:look_problems": CHECKS,
    "prereg/evidence.py:clock_problems": CHECKS,
    "prereg/evidence.py:evidence_problems": CHECKS,
    "prereg/hypotheses.py:rule_problems": CHECKS,
    "prereg/formats/ledger.py:check_attempts": CHECKS,
    "prereg/formats/ledger.py:check_ledger": CHECKS,
    "prereg/formats/record.py:entry_problems": CHECKS,
    "prereg/planted.py:plant_problems": CHECKS,
    "prereg/recompute.py:compare": CHECKS,
    "prereg/replicates.py:replicates_problems": CHECKS,
    "prereg/sequential.py:looks_problems": CHECKS,
    "prereg/tag.py:read_tag": CHECKS,
    "cotangent/adamw.py:PackedAdamW.__init__": COTANGENT,
    "cotangent/groups.py:check_group": COTANGENT,
    "cotangent/pack.py:Pack._build_group": COTANGENT,
    "cotangent/pack.py:Pack.sync_grads": COTANGENT,
    "cotangent/verify.py:check_native_phase": COTANGENT,
    "cotangent/verify.py:state_dict_difference": COTANGENT,
    "prereg/render/findings.py:model_section": RENDER,
    "prereg/render/studies.py:_costs": RENDER,
    "prereg/render/studies.py:answer_figure": RENDER,
    "prereg/render/studies.py:factorial": RENDER,
    "prereg/yamlflow.py:_flow_collection": GRAMMAR,
    "prereg/yamlflow.py:flow_value": GRAMMAR,
    "prereg/yamlsub.py:_Reader._flow_line": GRAMMAR,
    "prereg/yamlsub.py:_Reader.block_scalar": GRAMMAR,
    "prereg/yamlsub.py:_Reader.inline": GRAMMAR,
}

_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _decisions(node: ast.AST) -> int:
    """What ``node`` itself adds (radon's ``generic_visit`` and ``visit_Assert``)."""
    if isinstance(node, (ast.If, ast.IfExp)):
        return 1
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        return 1 + bool(node.orelse)
    if isinstance(node, (ast.Try, ast.TryStar)):
        return len(node.handlers) + bool(node.orelse)
    if isinstance(node, ast.BoolOp):
        return len(node.values) - 1
    if isinstance(node, ast.comprehension):
        return 1 + len(node.ifs)
    if isinstance(node, ast.Match):
        wildcard = any(isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None for c in node.cases)
        return max(0, len(node.cases) - wildcard)
    if isinstance(node, ast.Assert):
        return 1
    return 0


def _count(node: ast.AST) -> int:
    """``node``'s decisions and those below it, stopping at a function or class it defines."""
    if isinstance(node, _OWN_SCOPE):
        return 0
    if isinstance(node, ast.Assert):  # radon's visit_Assert does not descend
        return 1
    return _decisions(node) + sum(_count(child) for child in ast.iter_child_nodes(node))


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The function's cyclomatic complexity as radon counts it."""
    return 1 + sum(_count(stmt) for stmt in fn.body)


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method in ``tree``, closures included, with its qualified name."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((prefix + node.name, node))
            out += functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            out += functions(node, f"{prefix}{node.name}.")
        else:
            out += functions(node, prefix)
    return out


def over(root: pathlib.Path) -> list[tuple[str, int, int]]:
    """Every function of the packages over :data:`LIMIT`: (``path:name``, line, complexity)."""
    rows = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for name, fn in functions(ast.parse(path.read_text(encoding="utf-8"))):
                n = complexity(fn)
                if n > LIMIT:
                    rows.append((f"{rel}:{name}", fn.lineno, n))
    return rows


def main() -> int:
    rows = over(pathlib.Path("."))
    bad = [
        f"{key.split(':')[0]}:{line}: {key.split(':')[1]} has complexity {n} (over {LIMIT})"
        for key, line, n in rows
        if key not in REASONS
    ]
    named = {key for key, _, _ in rows}
    bad += [
        f".ci/complexity.py: REASONS names {key}, which is not over {LIMIT}"
        for key in REASONS
        if key not in named
    ]
    print("\n".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
