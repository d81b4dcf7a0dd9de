"""The benchmark scripts stand inside the import and length gates (``.ci/imports.py``,
``.ci/lengths.py``): no ``sys.path`` edit, no test helper imported, and no function over 60 lines
without its reason; the repository's own scripts pass."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _gate(name: str):
    spec = importlib.util.spec_from_file_location(f"gate_{name}", ROOT / ".ci" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_benchmark_that_edits_sys_path_or_imports_the_tests_fails_the_import_gate(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text(
        "import sys\nsys.path.insert(0, 'tests')\nfrom conftest import tiny_protocol\nimport harness.plan\n"
    )
    monkeypatch.chdir(tmp_path)
    assert _gate("imports").main() == 1
    out = capsys.readouterr().out
    assert "benchmarks/b.py: edits or reads sys.path" in out
    assert "benchmarks/b.py:3: a benchmark imports the tests' conftest" in out
    assert "benchmarks/b.py:4" not in out  # the packages are what a benchmark stands on


def test_a_long_benchmark_function_needs_its_reason(tmp_path, monkeypatch):
    lengths = _gate("lengths")
    (tmp_path / "benchmarks").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "benchmarks" / "b.py").write_text(f"def main():\n{body}")
    assert lengths.long_functions(tmp_path) == [("benchmarks/b.py", 1, "main", 61, None)]
    (tmp_path / "benchmarks" / "b.py").write_text(f"# long: a table of cases\ndef main():\n{body}")
    assert lengths.long_functions(tmp_path) == [("benchmarks/b.py", 2, "main", 61, "a table of cases")]


def test_the_repository_s_benchmarks_pass_both_gates(monkeypatch):
    text = {p.name: p.read_text() for p in (ROOT / "benchmarks").glob("*.py")}
    assert not [n for n, t in text.items() if "sys.path" in t or "conftest" in t]
    lengths = _gate("lengths")
    monkeypatch.setattr(lengths, "PACKAGES", ("benchmarks",))
    rows = lengths.long_functions(ROOT)
    assert rows and all(why for *_, why in rows)


def test_the_ray_benchmark_runs_the_test_suite_s_tiny_study(tmp_path):
    """One builder of the tiny study (``harness/tiny.py``): the Ray throughput benchmark's protocol
    is the test suite's, with its pairs, steps, budget and description, and it plans."""
    import re

    from conftest import tiny_protocol

    spec = importlib.util.spec_from_file_location("ray_bench", ROOT / "benchmarks" / "ray_throughput.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    repo = bench.make_study(tmp_path, "local", 3, 7, "spawn")
    written = (repo / "protocols" / "tiny.yaml").read_text()
    ours = tiny_protocol(steps=7, launcher="spawn")
    own = r"(?m)^ *(description|budget_device_seconds|seeds|val_every): .*$"  # what the benchmark asks for
    assert re.sub(own, "", written) == re.sub(own, "", ours)
    for line in (
        "description: tiny throughput protocol",
        "budget_device_seconds: 100000",
        "seeds: [1, 2, 3]",
    ):
        assert f"\n{line}\n" in written or f"\n    {line}\n" in written, line
    assert "\n    val_every: 7\n" in written
    assert not hasattr(bench, "PROTOCOL")  # no copy of its own

    from harness.plan import make_plan
    from harness.protocol import load_protocol

    assert len(make_plan(load_protocol(repo / "protocols" / "tiny.yaml"))) == 3 * 2
