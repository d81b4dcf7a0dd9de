"""The complexity gate (``.ci/complexity.py``) counts as radon does (``radon cc``, radon 6's
``ComplexityVisitor``), which is not installed here: each function below states its radon number,
worked out by radon's rule construct by construct in the comments, and the gate must give it."""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("complexity_gate", ROOT / ".ci" / "complexity.py")
assert _spec is not None and _spec.loader is not None
gate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate)

SOURCE = textwrap.dedent(
    """
    def pick(x, y, z):
        if x or y or z:  # if +1, two "or" +2
            return [v for v in (x, y) if v]  # comprehension +1, its if +1
        return z if z else None  # conditional expression +1

    def loops(items, path):
        for item in items:  # for +1, its else +1
            if item:  # +1
                break
        else:
            pass
        while items:  # +1
            items = items[1:]
        try:
            with open(path) as fh:  # with: nothing
                fh.read()
        except OSError:  # a handler +1
            pass
        except ValueError:  # a handler +1
            pass
        else:  # try's else +1
            pass
        finally:  # nothing
            pass
        assert items == [] or path  # assert +1 (radon does not look inside it)

    def outer(n):
        def inner(k):  # its own: 1 + if
            if k:
                return k
            return 0

        key = lambda v: v if v else 0  # a lambda adds nothing; its conditional expression +1

        class Local:  # counted on its own (radon cc leaves out a class inside a function; the gate does not)
            def m(self):
                return 1 if n else 2

        return sorted(range(n), key=key) if n > 1 else [inner(n)]  # +1

    def kind(v):
        match v:  # 4 cases less the wildcard: +3
            case 0:
                return "zero"
            case [x, y]:
                return "pair"
            case {"a": 1}:
                return "map"
            case _:
                return "other"

    def two(v):
        match v:  # 2 cases, no wildcard: +2
            case 0:
                return "zero"
            case 1:
                return "one"

    def grid(n):  # first for +1, its if +1; second for +1, its two ifs +2
        return [(i, j) for i in range(n) if i for j in range(i) if j if i != j]

    async def fetch(xs):
        async for x in xs:  # +1
            async with x:  # nothing
                pass
        return [y async for y in xs if y]  # comprehension +1, its if +1
    """
)

#: radon's numbers for :data:`SOURCE`'s functions (``radon cc -s``), by radon's rule above.
RADON = {
    "pick": 7,
    "loops": 9,
    "outer": 3,
    "outer.inner": 2,
    "outer.Local.m": 2,
    "kind": 4,
    "two": 3,
    "grid": 6,
    "fetch": 4,
}


def test_the_gate_counts_each_construct_as_radon_does():
    got = {name: gate.complexity(fn) for name, fn in gate.functions(ast.parse(SOURCE))}
    assert got == RADON


def test_a_function_over_the_limit_fails_the_gate_unless_a_reason_names_it(tmp_path, monkeypatch, capsys):
    """16 decisions: one if with 15 operands of ``or`` (1 + 1 + 14 = 16), over the limit of 15; a
    reason lets it stand; a reason naming nothing over the limit fails the gate."""
    (tmp_path / "harness").mkdir()
    cond = " or ".join(f"x{i}" for i in range(15))
    (tmp_path / "harness" / "m.py").write_text(
        f"def f({', '.join(f'x{i}' for i in range(15))}):\n    if {cond}:\n        return 1\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gate, "PACKAGES", ("harness",))
    monkeypatch.setattr(gate, "REASONS", {})
    assert gate.LIMIT == 15
    assert gate.over(tmp_path) == [("harness/m.py:f", 1, 16)]
    assert gate.main() == 1 and "harness/m.py:1: f has complexity 16 (over 15)" in capsys.readouterr().out
    monkeypatch.setattr(gate, "REASONS", {"harness/m.py:f": "a table of cases"})
    assert gate.main() == 0
    monkeypatch.setattr(gate, "REASONS", {"harness/m.py:f": "a table", "harness/m.py:g": "gone"})
    assert (
        gate.main() == 1 and "REASONS names harness/m.py:g, which is not over 15" in capsys.readouterr().out
    )
