"""Bring your own change: a plug-in arm from a protocol to an audited report, frozen like the harness,
and compare-arms telling an exact change from one that drifts.

``harness plan``'s refusals and plans call the command line's ``main`` in this process
(tests/in_process.py: the same parser, messages and exit status); the tag, run and family tests
start ``python -m harness.cli`` as a user does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, git, harness, init_study, record_dicts
from in_process import harness_here

from audit.cli import NOT_VERIFIED

EXAMPLE = "examples/foreach.yaml"


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    return init_study(tmp_path / "study", ("configs", "examples", "protocols"))


@pytest.mark.process
@pytest.mark.long
def test_example_plugin_end_to_end_reduced(clone):
    p = clone / EXAMPLE
    p.write_text(
        p.read_text()
        .replace("seeds: {count: 8, base: 7000}", "seeds: {count: 5, base: 7000}")
        .replace("steps: 60", "steps: 20")
        .replace("val_every: 20", "val_every: 10")
    )
    r = harness(clone, "run", EXAMPLE, "--quiet")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "## Decisions" in r.stdout and "H1-speed" in r.stdout
    recs = record_dicts(clone / "runs" / "example-foreach" / "records")
    assert len(recs) == 10 and all(x["status"] == "ok" for x in recs)
    plugin = recs[0]["protocol"]["plugins"]["examples.foreach_arm:build"]
    assert plugin["path"] == "examples/foreach_arm.py"
    manifest = json.loads((clone / "runs" / "example-foreach" / "records" / "MANIFEST").read_text())
    assert "examples/foreach_arm.py" in manifest["sources"]  # the audit re-hashes the plug-in's source
    a = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(ROOT / "analysis" / "public_audit.py"),
            "runs/example-foreach/records",
        ],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert a.returncode == NOT_VERIFIED, a.stdout
    (clone / "examples" / "foreach_arm.py").write_text(
        (clone / "examples" / "foreach_arm.py").read_text() + "\n# edit\n"
    )
    a = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(ROOT / "analysis" / "public_audit.py"),
            "runs/example-foreach/records",
        ],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert a.returncode == 1 and "examples/foreach_arm.py: source sha256" in a.stdout


def test_plugin_is_frozen_with_the_protocol(clone):
    p = clone / "protocols" / "mine.yaml"
    p.write_text(
        (clone / EXAMPLE)
        .read_text()
        .replace("id: example-foreach", "id: mine")
        .replace("preregistered: false", "preregistered: true")
        .replace("records_dir: runs/example-foreach/records\n", "")
    )
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", "preregister my change")
    t = harness(clone, "tag", "protocols/mine.yaml")
    assert t.returncode == 0, t.stderr
    msg = git(clone, "cat-file", "tag", "protocol-mine")
    assert '"examples.foreach_arm:build"' in msg and '"examples"' in msg  # the plug-in and its folder
    arm = clone / "examples" / "foreach_arm.py"
    arm.write_text(arm.read_text().replace("foreach=True)\n", "foreach=True, amsgrad=True)\n", 1))
    git(clone, "commit", "-qam", "tweak the arm after the tag")
    r = harness(clone, "run", "protocols/mine.yaml", "--quiet")
    assert r.returncode == 2 and "has drifted" in r.stderr
    assert (
        "plug-in examples.foreach_arm:build" in r.stderr
        and "examples/foreach_arm.py: changed after the tag" in r.stderr
    )
    assert not (clone / "records" / "mine").exists()


def test_unknown_plugin_is_refused_with_file_key_line(clone):
    p = clone / "protocols" / "bad.yaml"
    p.write_text(
        (clone / EXAMPLE).read_text().replace("examples.foreach_arm:build", "examples.nowhere:build")
    )
    r = harness_here(clone, "plan", "protocols/bad.yaml")
    assert (
        r.returncode == 2
        and "module examples.nowhere not found" in r.stderr
        and "key studies[0].arms[1]" in r.stderr
    )


@pytest.mark.process
def test_compare_arms_exact_and_drifting(clone):
    r = harness(
        clone, "compare-arms", "native", "cotangent", "--config", "tiny_conv", "--steps", "4", "--json"
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["bitwise_equal"] and s["max_ulp"] == 0 and s["first_divergent_step"] is None
    r = harness(
        clone,
        "compare-arms",
        "native",
        "examples.foreach_arm:build",
        "--config",
        "tiny_conv",
        "--steps",
        "4",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["summary"]["first_divergent_step"] == 1 and out["summary"]["max_ulp"] > 0
    assert out["steps"][0]["loss_equal"]  # same weights and batch before the first update
    r = harness(
        clone, "compare-arms", "native", "examples.foreach_arm:build", "--config", "tiny_conv", "--steps", "2"
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr  # the table, as the README runs it
    assert "loss (baseline)" in r.stdout and "weights bits" in r.stdout and "differ" in r.stdout


def mlp_study(clone: Path) -> str:
    """A plug-in model family (``examples/tiny_mlp.py``: an embedding and one linear layer) named by
    a configuration, and a protocol of the foreach plug-in arm on it (3 pairs of 6 steps)."""
    (clone / "examples" / "tiny_mlp.py").write_text(
        '"""A plug-in model family: an embedding and one linear layer, built from the generator it is given."""\n'
        "import torch\n\n\n"
        "class TinyMLP(torch.nn.Module):\n"
        "    def __init__(self, cfg, gen):\n"
        "        super().__init__()\n"
        "        self.emb = torch.nn.Embedding(cfg.vocab, cfg.d_model)\n"
        "        self.out = torch.nn.Linear(cfg.d_model, cfg.vocab)\n"
        "        with torch.no_grad():\n"
        "            for p in self.parameters():\n"
        "                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)\n\n"
        "    def forward(self, x):\n"
        "        return self.out(self.emb(x))\n"
    )
    cfg = (clone / "configs" / "tiny_conv.yaml").read_text()
    cfg = cfg.replace("name: tiny_conv", "name: tiny_mlp").replace(
        "family: conv", "family: examples.tiny_mlp:TinyMLP"
    )
    (clone / "configs" / "tiny_mlp.yaml").write_text(cfg)
    p = clone / "protocols" / "mlp.yaml"
    p.write_text(
        (clone / EXAMPLE)
        .read_text()
        .replace("id: example-foreach", "id: mlp")
        .replace("configs: [tiny_transformer]", "configs: [tiny_mlp]")
        .replace("val_target_bpb: 4.69", "val_target_bpb: 7.9")
        .replace("seeds: {count: 8, base: 7000}", "seeds: {count: 3, base: 1}")
        .replace("steps: 60", "steps: 6")
        .replace("val_every: 20", "val_every: 3")
        .replace("records_dir: runs/example-foreach/records", "records_dir: runs/mlp/records")
    )
    return "protocols/mlp.yaml"


def family_checked(clone: Path, recs: list[dict], cli) -> None:
    """Six ok runs whose protocol names both plug-ins; then a family that is neither built in nor a
    plug-in ``module:Class`` is refused by ``harness plan`` (through ``cli``)."""
    assert len(recs) == 6 and all(x["status"] == "ok" for x in recs)
    assert set(recs[0]["protocol"]["plugins"]) == {"examples.foreach_arm:build", "examples.tiny_mlp:TinyMLP"}
    bad = clone / "configs" / "tiny_mlp.yaml"
    bad.write_text(bad.read_text().replace("examples.tiny_mlp:TinyMLP", "perceptron"))
    r = cli(clone, "plan", "protocols/mlp.yaml")
    assert r.returncode == 2 and "must be one of transformer, conv or a plug-in module:Class" in r.stderr


@pytest.mark.process
def test_model_family_plugin_and_registry(clone):
    r = harness(clone, "run", mlp_study(clone), "--quiet", "--no-report")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    family_checked(clone, record_dicts(clone / "runs" / "mlp" / "records"), harness)


def test_a_model_family_plug_in_trains_in_process_and_a_bad_one_is_refused(clone, monkeypatch):
    """test_model_family_plugin_and_registry's study (in the process tier: its runs train in
    worker processes) run by the runner in this process, the real trainer building the plug-in
    family from the study's root as the worker does (the root after every installed package); the
    same checks of the records and of the refused family."""
    from harness.execute.inprocess import InProcessExecutor
    from harness.execute.runner import Runner
    from harness.protocol import load_protocol

    path = mlp_study(clone)
    for name in [n for n in sys.modules if n == "examples" or n.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)  # another study's plug-ins: this one imports its own
    monkeypatch.setattr(sys, "path", [*sys.path, str(clone)])
    monkeypatch.chdir(clone)  # the worker runs in the study's folder
    try:
        end = Runner(load_protocol(clone / path), echo=lambda _: None, executor=InProcessExecutor()).run()
    finally:
        for name in [n for n in sys.modules if n == "examples" or n.startswith("examples.")]:
            del sys.modules[name]  # the study's own, imported by the run
    assert end.left == 0
    family_checked(clone, record_dicts(clone / "runs" / "mlp" / "records"), harness_here)


FACTORIAL = """\
studies:
  - name: paths
    design: factorial
    factors:
      adamw: [fused, foreach]
    cells:
      fused: {arm: native, adamw: fused}
      foreach: {arm: "examples.foreach_arm:build", adamw: foreach}
    configs: [tiny_transformer]
    seeds: {count: 4, base: 7100}
    steps: 20
    val_every: 10
    val_target_bpb: 4.69
"""


def _declared(clone: Path, studies: str, name: str = "paths") -> str:
    text = (clone / EXAMPLE).read_text()
    head = (
        text[: text.index("studies:\n")]
        .replace("id: example-foreach", f"id: {name}")
        .replace("records_dir: runs/example-foreach/records\n", f"records_dir: runs/{name}/records\n")
    )
    head = (
        head[: head.index("hypotheses:\n")]
        + "hypotheses: {descriptive: an example of a declared factorial}\n"
        + head[head.index("order_seed:") :]
    )
    (clone / "protocols" / f"{name}.yaml").write_text(head + studies)
    return f"protocols/{name}.yaml"


@pytest.mark.process
@pytest.mark.long
def test_declared_factorial_with_a_plugin_cell_end_to_end(clone):
    """A one-factor factorial (fused against foreach AdamW, the second a plug-in): planned in
    Williams order, run, its effect named after the declared factor, and audited."""
    path = _declared(clone, FACTORIAL)
    r = harness(clone, "run", path, "--quiet")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = record_dicts(clone / "runs" / "paths" / "records")
    assert len(recs) == 8 and {x["spec"]["role"] for x in recs} == {"fused", "foreach"}
    assert {x["spec"]["arm"] for x in recs} == {"native", "examples.foreach_arm:build"}
    orders = {}
    for x in recs:
        orders.setdefault(x["spec"]["unit"], {})[x["spec"]["position"]] = x["spec"]["role"]
    assert (
        sorted(tuple(o[i] for i in range(2)) for o in orders.values())
        == [("foreach", "fused")] * 2 + [("fused", "foreach")] * 2
    )  # each row of the 2x2 Williams square twice
    st = recs[0]["protocol"]["studies"][0]
    assert st["factors"] == [["adamw", ["fused", "foreach"]]] and st["cells"] == ["fused", "foreach"]
    summary = json.loads((clone / "runs" / "paths" / "records" / "summary.json").read_text())
    entry = summary["studies"][0]["configs"][0]
    assert set(entry["effects"]) == {"foreach_adamw"} and entry["blocks_used"] == 4
    assert (
        "## Study paths: 2 factorial (adamw)"
        in (clone / "runs" / "paths" / "records" / "report.md").read_text()
    )
    a = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), "runs/paths/records"],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert a.returncode == NOT_VERIFIED, a.stdout[-3000:]
    summary["studies"][0]["configs"][0]["effects"]["foreach_adamw"]["estimate"] += 0.01
    (clone / "runs" / "paths" / "records" / "summary.json").write_text(json.dumps(summary))
    a = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), "runs/paths/records"],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert a.returncode == 1 and "foreach_adamw" in a.stdout


def test_three_factor_plan_is_williams_balanced(clone):
    """Eight cells: every group of eight blocks runs each cell once in each position, and each cell
    right after each other cell once (the Williams property); the audit's own plan agrees."""
    cells = "\n".join(
        f"      c{i}: {{arm: {'native' if i % 2 == 0 else 'cotangent'}, a: {'a1' if i & 1 else 'a0'}, "
        f"b: {'b1' if i & 2 else 'b0'}, c: {'c1' if i & 4 else 'c0'}}}"
        for i in range(8)
    )
    studies = (
        "studies:\n  - name: three\n    design: factorial\n    factors: {a: [a0, a1], b: [b0, b1], c: [c0, c1]}\n"
        f"    cells:\n{cells}\n    configs: [tiny_transformer]\n    seeds: {{count: 8, base: 1}}\n"
        "    steps: 10\n    val_every: 5\n    val_target_bpb: 4.69\n"
    )
    path = _declared(clone, studies, "three")
    r = harness_here(clone, "plan", path, "--json")
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["runs"] if r.stdout.lstrip().startswith("{") else json.loads(r.stdout)
    by_unit: dict[str, list[str]] = {}
    for s in sorted(runs, key=lambda s: s["order"]):
        by_unit.setdefault(s["unit"], []).append(s["role"])
    rows = list(by_unit.values())
    assert len(rows) == 8 and all(sorted(r) == [f"c{i}" for i in range(8)] for r in rows)
    assert all(sorted(r[pos] for r in rows) == [f"c{i}" for i in range(8)] for pos in range(8))
    follows = [(r[k], r[k + 1]) for r in rows for k in range(7)]
    assert len(follows) == len(set(follows)) == 56
    assert {s["arm"] for s in runs if s["role"] == "c1"} == {"cotangent"}


PLUGIN_CELL = '      foreach: {arm: "examples.foreach_arm:build", adamw: foreach}\n'


@pytest.mark.parametrize(
    "bad, says, key",
    [
        (FACTORIAL.replace(PLUGIN_CELL, ""), "2 cells, one per combination of levels", "studies[0].cells"),
        (
            FACTORIAL.replace("adamw: foreach}", "adamw: fast}"),
            "'fast' is not a level of adamw",
            "studies[0].cells.foreach.adamw",
        ),
        (
            FACTORIAL.replace("adamw: [fused, foreach]", "adamw: [fused, fused]"),
            "two different level names",
            "studies[0].factors.adamw",
        ),
        (
            FACTORIAL.replace("adamw: foreach}", "adamw: fused}"),
            "cells fused and foreach have the same levels",
            "studies[0].cells.foreach",
        ),
        (
            FACTORIAL.replace("    factors:\n", "    arms: [native, cotangent]\n    factors:\n"),
            "a study with declared factors names each cell's arm under 'cells'",
            "studies[0].arms",
        ),
        (
            FACTORIAL.replace("design: factorial", "design: paired"),
            "'factors' belongs to a factorial study",
            "studies[0].factors",
        ),
    ],
)
def test_bad_factorial_declarations_name_file_key_and_line(clone, bad, says, key):
    path = _declared(clone, bad, "bad")
    r = harness_here(clone, "plan", path)
    assert r.returncode == 2 and says in r.stderr and f"key {key}:" in r.stderr, r.stderr
    assert re.search(r"protocols/bad\.yaml:\d+, key ", r.stderr) and "Traceback" not in r.stderr


@pytest.mark.process
def test_a_committed_plug_in_at_the_repository_root_runs(tmp_path):
    """A plug-in module committed at the repository's top level is a frozen entry of its own: the
    worker compiles it from the bytes the runner read and hashed, as a module of a frozen folder
    (it used to fail every run with "not among the sources the runner verified", because only
    folders were hashed)."""
    from conftest import tiny_protocol

    arm = (ROOT / "examples" / "foreach_arm.py").read_text()
    r = tmp_path / "study"
    r.mkdir()
    (r / "mine_arm.py").write_text(arm)
    protocol = tiny_protocol(steps=6).replace("arms: [native, cotangent]", 'arms: [native, "mine_arm:build"]')
    init_study(r, ("configs",), protocol=protocol)
    run = harness(r, "run", "protocols/tiny.yaml", "--quiet", "--no-report")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    records = record_dicts(r / "records" / "tiny")
    assert records and all(x["status"] == "ok" for x in records)
    assert {x["spec"]["arm"] for x in records} == {"native", "mine_arm:build"}
