"""The gradient-phase benchmark runs end to end as a user runs it (reduced size: tiny model)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/<script>.py args...`` as a user runs it, its output captured."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)


@pytest.mark.process
def test_grad_phase_benchmark_runs(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "grad_phase.py"),
            "--configs",
            "tiny_transformer",
            "--reps",
            "3",
            "--memory-steps",
            "1",
            "--memory-repeats",
            "1",
            "--no-compiled",
            "--block-sweep",
            "4",
            "--whole-step-reps",
            "2",
            "--whole-step-models",
            "tiny_transformer",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert (
        "| cotangent |" in r.stdout
        and "| cotangent/torch/4KiB |" in r.stdout
        and "cotangent / native" in r.stdout
    )
    data = json.loads(out.read_text())
    res = data["configs"]["tiny_transformer"]
    assert set(res["timing"]) == {
        "native",
        "bucketed",
        "packed",
        "cotangent",
        "cotangent/torch",
        "cotangent/release",
        "cotangent/backward",
        "cotangent/torch/backward",
        "cotangent/torch/4KiB",
    }
    assert res["timing"]["native"]["ratio"] == 1.0
    assert data["phase_c"] and "phase.c" in r.stdout
    assert data["cpu_capability"] and f"torch dispatches {data['cpu_capability']}" in r.stdout.splitlines()[0]
    assert data["cpu_model"] in r.stdout.splitlines()[0]
    step = data["whole_step"]["tiny_transformer"]  # forward + backward + phase, interleaved
    assert step["native"]["step_ms"] > step["native"]["phase_ms"] > 0
    assert 0 < step["phase_share_of_native_step"] < 1
    assert step["cotangent"]["step_ratio"] == step["cotangent"]["step_ms"] / step["native"]["step_ms"]
    assert "| tiny_transformer |" in r.stdout and "Whole-step ratio" in r.stdout
    assert all(t["phase_ms"] > 0 and t["delivery_ms"] > 0 for t in res["timing"].values())
    assert set(res["peak_rss_bytes"]) == {
        "native",
        "bucketed",
        "packed",
        "cotangent",
        "cotangent/torch",
        "cotangent/release",
        "cotangent/backward",
    }
    assert all(v > 0 for v in res["peak_rss_bytes"].values())
    lim = res["floor"]  # bytes over measured bandwidth: every variant is at or above it
    assert lim["best_GBps"] > 0 and lim["floor_ms"] > 0 and "| floor (bandwidth) |" in r.stdout
    assert all(
        t["floor_ratio"] == t["phase_ms"] / lim["floor_ms"]
        for n, t in res["timing"].items()
        if "/backward" not in n
    )
    back = res["timing"]["cotangent/backward"]  # its floor: the bytes it still moves (no norm read)
    assert back["floor_ratio"] == back["phase_ms"] / lim["one_pass_floor_ms"]
    assert abs(lim["one_pass_floor_ms"] - lim["floor_ms"] * 8 / 9) < 1e-9 * lim["floor_ms"]
    norm_work = back["delivery_ms"] - res["timing"]["cotangent"]["delivery_ms"]
    assert back["norm_work_ms"] == norm_work
    assert back["with_norm_work_floor_ratio"] == (back["phase_ms"] + norm_work) / lim["floor_ms"]
    assert "cotangent/backward: phase / floor of its 8 accesses" in r.stdout
    assert step["cotangent/backward"]["backward_ratio"] > 0 and "| cotangent/backward |" in r.stdout


@pytest.mark.process
def test_clients_benchmark_runs(tmp_path):
    """benchmarks/clients.py as a user runs it: both loops, their table, paired intervals, bits."""
    out = tmp_path / "clients.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "clients.py"),
            "--rounds",
            "4",
            "--warmup",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    for loop in ("nanogpt", "timm"):
        res = data[loop]
        assert res["bitwise"] is True and f"| {loop} |" in r.stdout
        assert f", {res['threads']} threads;" in r.stdout.splitlines()[0]  # beside each figure, as run
        row = next(line for line in r.stdout.splitlines() if line.startswith(f"| {loop} |"))
        assert row.split(" | ")[2:4] == [str(res["threads"]), res["cpu_capability"]]
        for part in ("iteration", "phase"):
            c = res[part]
            assert c["n"] == 4 and c["low"] <= c["ratio"] <= c["high"] and c["native_ms"] > 0
        assert 0 < res["phase_share"] < 1
    assert data["cpu_capability"] in r.stdout.splitlines()[0]


@pytest.mark.process
def test_never_slower_benchmark_runs(tmp_path):
    """benchmarks/never_slower.py at CI size: the design check first, then each loop at each thread
    count with both ratios and their intervals, auto's choice, the bits, the command and the CPU."""
    out = tmp_path / "never.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "never_slower.py"), "--quick", "--rounds", "3"]
    cmd += ["--threads", "1", "2", "--loops", "nanogpt", "small_cnn", "tiny_conv", "--json", str(out)]
    cmd += ["--half-width", "0.41", "--max-builds", "3"]  # the second stage, its cost stop at 3 builds
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("command: ") and "never_slower.py --quick --rounds 3" in lines[0]
    assert lines[1].startswith("CPU: ") and "dispatches" in lines[1] and "ATEN_CPU_CAPABILITY=" in lines[1]
    assert "PackedAdamW(mode='auto') measured" not in r.stderr  # the table says it
    data = json.loads(out.read_text())
    plant = [i for i, line in enumerate(lines) if line.startswith("| A/A, 2% of an iteration planted")]
    rows = [
        i
        for i, line in enumerate(lines)
        if line.startswith(("| nanogpt (", "| small_cnn (", "| tiny_conv ("))
    ]
    assert len(plant) == 2 and len(rows) == 6 and max(plant) < min(rows)  # the design's check comes first
    for threads in (1, 2):
        p = data[f"planted/{threads}"]
        assert (
            p["truth"] > 1
            and p["pilot"] == 2  # --quick: two fresh builds, then Stein's second stage up to the cap
            and p["read"]["n"] == p["builds"] in (2, 3)
            and p["read"]["low"] <= p["read"]["ratio"] <= p["read"]["high"]
        )
        assert p["covered"] == (p["read"]["low"] <= p["truth"] <= p["read"]["high"])
        for loop in ("nanogpt", "small_cnn", "tiny_conv"):
            res = data[f"{loop}/{threads}"]
            assert res["bitwise"] is True
            n = res["builds"]  # a pilot of 2, Stein's rule asking for more, the cost stop at 3
            assert res["pilot"] == 2 and n in (2, 3) and (n == 2) == (res["needed"] == 2)
            for arm in ("packed", "auto", "twin"):
                assert res[arm]["n"] == n and res[arm]["rounds"] == n and len(res[arm]["logs"]) == n
                assert res[arm]["low"] <= res[arm]["ratio"] <= res[arm]["high"]
            # decided in each build's solo warm-up (56 > 52)
            assert set(res["auto_modes"]) <= {"packed", "native"} and sum(res["auto_modes"].values()) == n
            assert res["auto_report"].startswith("PackedAdamW(mode='auto') measured 48 iterations")
            # the promise's criterion (ratio at two decimals, upper bound unrounded), in the JSON and the row
            met = res["auto"]["ratio"] < 1.005 and res["auto"]["high"] <= 1.01
            assert res["at_most_native"] is met
            row = next(
                lines[i] for i in rows if lines[i].startswith(f"| {loop} (") and f"| {threads} |" in lines[i]
            )
            assert row.split(" | ")[7] == ("yes" if met else "NO")
            assert row.split(" | ")[9] == (
                f"{res['twin']['ratio']:.3f} ({res['twin']['low']:.3f}-{res['twin']['high']:.3f})"
            )
            capped = f", capped: {res['needed']} asked for" if res["needed"] > n else ""
            then = f", then {res['second_sd']:.4f}" if res["second_sd"] is not None else ""
            sd = f"; sd {res['pilot_sd']:.4f}{then}"
            assert row.split(" | ")[10].rstrip(" |") == f"{n} (2 + {n - 2}{capped}{sd})"
    assert "auto at most native (ratio <= 1.00, upper <= 1.01)" in lines[plant[-1] + 2]
    met = sum(
        data[f"{loop}/{t}"]["at_most_native"]
        for loop in ("nanogpt", "small_cnn", "tiny_conv")
        for t in (1, 2)
    )
    assert data["table"][-1] == f"auto at most native (ratio <= 1.00, upper <= 1.01): {met} of 6 rows"
    assert data["table"][-1] in r.stdout


@pytest.mark.process
def test_native_split_benchmark_runs():
    """benchmarks/native_split.py as a user runs it, tiny size: auto decides in the warm-up, and each
    part's ratio reads inside its own interval."""
    r = bench("native_split", "tiny_conv", "--rounds", "4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert (
        lines[0] == "command: python benchmarks/native_split.py tiny_conv --rounds 4 --threads 1 --plant 0.02"
    )
    assert lines[1].startswith("tiny_conv: auto mode ")
    parts = [line.split(" | ") for line in lines if line.startswith(("| whole", "| fwd+bwd", "| phase"))]
    assert [p[0] for p in parts] == ["| whole", "| fwd+bwd", "| phase"]
    for p in parts:
        for cell in (p[3], p[4]):  # auto / native, twin / native
            est, ci = cell.rstrip(" |").split(" (")
            low, high = (float(x) for x in ci.rstrip(")").split("-"))
            assert low <= float(est) <= high
    check = next(line for line in lines if line.startswith("design check: a spin of 2%"))
    assert "truth inside yes" in check or "truth inside NO" in check


def _never_slower():
    from conftest import benchmark_module

    return benchmark_module("never_slower")


def test_never_slower_interval_is_scipys_t_over_the_builds():
    """``over_builds``: each build's mean log ratio, then scipy's Student-t interval over the builds
    (``scipy.stats.t.interval(0.95, n - 1, mean, sem)``), exponentiated; on random times whose
    builds differ (a placement offset each) that the rounds alone would not cover."""
    import math
    import random

    import numpy as np
    from scipy import stats

    mod = _never_slower()
    rng = random.Random(7)
    for _ in range(20):
        builds, rounds = rng.randint(2, 9), rng.randint(1, 30)
        native = [[rng.uniform(5, 6) for _ in range(rounds)] for _ in range(builds)]
        cand = [
            [x * math.exp(rng.gauss(0.01, 0.02)) * (1 + 0.03 * b) for x in nb] for b, nb in enumerate(native)
        ]
        got = mod.over_builds(native, cand)
        logs = [sum(math.log(c / n) for n, c in zip(nb, cb)) / rounds for nb, cb in zip(native, cand)]
        m = sum(logs) / builds
        low, high = stats.t.interval(0.95, builds - 1, loc=m, scale=stats.sem(logs))
        assert math.isclose(got["ratio"], math.exp(m), rel_tol=1e-12)
        assert math.isclose(got["low"], math.exp(low), rel_tol=1e-9)
        assert math.isclose(got["high"], math.exp(high), rel_tol=1e-9)
        assert got["n"] == builds and got["rounds"] == builds * rounds
        # the pooled within-build sd of the per-round log ratios: numpy's, build by build
        per = [np.log(np.array(cb) / np.array(nb)) for nb, cb in zip(native, cand)]
        pooled = math.sqrt(np.mean([np.var(x, ddof=1) for x in per])) if rounds >= 2 else None
        assert (
            (got["round_sd"] is None)
            if pooled is None
            else math.isclose(got["round_sd"], pooled, rel_tol=1e-9)
        )


def test_never_slower_reference_of_two_natives_and_steins_interval():
    """``over_builds`` with the twin: each round's ratio to the geometric mean of native's two
    builds; with a pilot, Stein's interval (``mean -/+ t(0.975, n0 - 1) s0 / sqrt(n)``, ``s0`` the
    first ``n0`` builds' standard deviation), from scipy and the statistics module."""
    import math
    import random
    import statistics

    from scipy import stats

    mod = _never_slower()
    rng = random.Random(11)
    for _ in range(20):
        builds, rounds = rng.randint(4, 12), rng.randint(1, 20)
        pilot = rng.randint(2, builds)
        native, twin, cand = (
            [[rng.uniform(5, 6) * (1 + 0.02 * rng.random()) for _ in range(rounds)] for _ in range(builds)]
            for _ in range(3)
        )
        got = mod.over_builds(native, cand, twin, pilot=pilot)
        logs = [
            sum(math.log(c) - (math.log(n) + math.log(t)) / 2 for n, t, c in zip(nb, tb, cb)) / rounds
            for nb, tb, cb in zip(native, twin, cand)
        ]
        m = sum(logs) / builds
        half = stats.t.ppf(0.975, pilot - 1) * statistics.stdev(logs[:pilot]) / math.sqrt(builds)
        assert math.isclose(got["ratio"], math.exp(m), rel_tol=1e-12)
        assert math.isclose(got["low"], math.exp(m - half), rel_tol=1e-9)
        assert math.isclose(got["high"], math.exp(m + half), rel_tol=1e-9)
        assert got["n"] == builds and all(
            math.isclose(a, b, abs_tol=1e-12) for a, b in zip(got["logs"], logs)
        )


def test_never_slower_reread_gives_steins_and_the_plain_interval(tmp_path):
    """``--reread``: runs' JSONs read again, each arm's build values under Stein's interval (the
    pilot's sd, ``pilot - 1`` df) and the plain t over all builds (``scipy.stats.t.interval`` on
    their own sd), with each check under each; where the second stage spreads three times wider
    than the pilot, Stein's twin interval misses 1 and the plain one holds it. The rounds' share of
    a build's variance is ``round_sd^2 / (rounds / builds)`` over the builds' variance, and the A/A
    misses over the runs come with ``scipy.stats.binom.sf(k - 1, n, 0.05)``. Bad input: a clear
    error naming the file, no traceback."""
    import math
    import random
    import statistics

    from scipy import stats

    mod = _never_slower()
    rng = random.Random(5)
    twin = [0.004 * (-1) ** i for i in range(20)] + [-0.003 + 0.012 * (-1) ** i for i in range(40)]
    auto = [rng.gauss(-0.004, 0.004) for _ in range(60)]
    truth = 1.02
    read = [rng.gauss(math.log(truth), 0.005) for _ in range(24)]
    row = {
        "pilot": 20,
        "needed": 60,
        "auto": {"logs": auto, "round_sd": 0.03, "rounds": 60 * 48},
        "twin": {"logs": twin, "round_sd": None, "rounds": 60 * 48},
    }
    data = {
        "header": ["x"],
        "timm/1": row,
        "planted/1": {"pilot": 20, "truth": truth, "read": {"logs": read, "rounds": 24 * 48}},
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    lines = mod.reread([str(path)])
    assert lines[:2] == mod.REREAD_HEAD and len(lines) == 8 and lines[5] == ""
    for line, logs, pilot in ((lines[2], auto, 20), (lines[3], twin, 20), (lines[4], read, 20)):
        cells = line.split(" | ")
        m = statistics.fmean(logs)
        half = stats.t.ppf(0.975, pilot - 1) * statistics.stdev(logs[:pilot]) / math.sqrt(len(logs))
        low, high = stats.t.interval(0.95, len(logs) - 1, loc=m, scale=stats.sem(logs))
        assert cells[0] == "| run"
        assert cells[6] == f"{math.exp(m):.3f} ({math.exp(m - half):.3f}-{math.exp(m + half):.3f})"
        assert cells[7] == f"{math.exp(m):.3f} ({math.exp(low):.3f}-{math.exp(high):.3f})"
        assert cells[3] == f"{len(logs)} ({pilot})"
    assert lines[2].split(" | ")[5] == f"{0.03**2 / 48 / statistics.variance(auto):.2f}"
    assert lines[3].split(" | ")[5] == "-" and lines[4].split(" | ")[5] == "-"
    twin_cells = lines[3].split(" | ")
    assert twin_cells[2] == "twin" and twin_cells[9:11] == ["NO", "yes |"]
    assert lines[4].split(" | ")[8:11] == ["truth inside", "yes", "yes |"]
    # a second run of the same name in another folder: the folder tells them apart; the misses add up
    other = tmp_path / "b" / "run.json"
    other.parent.mkdir()
    off = {"logs": [0.01 + x for x in auto]}  # twin 1% off: both intervals exclude 1
    centred = {"logs": [x - statistics.fmean(auto) for x in auto]}  # holds 1 under both
    other.write_text(json.dumps({"timm/2": {**row, "twin": off}, "timm/3": {**row, "twin": centred}}))
    both = mod.reread([str(path), str(other)])
    assert both[2].startswith(f"| {tmp_path.name}/run | timm/1 |") and both[5].startswith(
        "| b/run | timm/2 |"
    )
    # stems and folder/stem alike: each run goes by its path as given
    twins = [str(tmp_path / side / "b" / "run.json") for side in ("x", "y")]
    assert mod.run_names(twins) == twins
    want = [
        ("twin's interval excluded 1", 3, 2, 1),
        ("the design check's interval excluded its truth", 1, 0, 0),
    ]
    for line, (what, n, stein, plain) in zip(both[-2:], want):
        chance = [stats.binom.sf(k - 1, n, 0.05) for k in (stein, plain)]
        assert line.startswith(f"{what} in {stein} of {n} rows under Stein's")
        assert f"= {chance[0]:.3f}), {plain} under the plain t ({chance[1]:.3f})" in line
    r = bench("never_slower", "--reread", str(path), str(other), timeout=120)
    assert r.returncode == 0 and r.stdout.splitlines() == both
    for bad, text, says in (
        (tmp_path / "none.json", None, "cannot read it"),
        (tmp_path / "bad.json", '{"nanogpt/1": {"pilot": 20}}', "not a never_slower JSON"),
        (tmp_path / "list.json", "[1, 2]", "not a never_slower JSON"),
        (tmp_path / "empty.json", '{"header": ["x"]}', "no rows"),
        (tmp_path / "deep.json", "[" * 100000 + "]" * 100000, "not a never_slower JSON"),
        (
            tmp_path / "flat.json",
            json.dumps({"timm/1": {**row, "auto": {**row["auto"], "rounds": -5}}}),
            "rounds -5",
        ),
    ):
        if text is not None:
            bad.write_text(text)
        r = bench("never_slower", "--reread", str(path), str(bad), timeout=120)
        assert r.returncode == 1 and says in r.stderr and str(bad) in r.stderr and "Traceback" not in r.stderr
    r = bench("never_slower", "--reread", str(path), str(path), timeout=120)
    assert r.returncode == 1 and "given twice" in r.stderr and "Traceback" not in r.stderr


def test_never_slower_rounds_cost_prices_stein_sizes_by_the_rounds_share():
    """``rounds_cost``: a row sized at 40 builds (pilot 20) of 48 rounds, half its builds' variance
    from the rounds: at 96 rounds it needs ``40 (1 - 0.5 + 0.5 / 2) = 30`` builds of ``4 (56 + 2 x
    96)`` steps against 40 of ``4 (56 + 2 x 48)``; at 24, ``40 x 1.5 = 60``; a pilot-sized row stays
    at its pilot; no share, no price."""
    import statistics

    mod = _never_slower()
    logs = [0.01 * (-1) ** i for i in range(40)]
    round_sd = (0.5 * statistics.variance(logs) * 48) ** 0.5  # share 0.5 at 48 rounds a build
    row = {"pilot": 20, "needed": 40, "auto": {"logs": logs, "round_sd": round_sd, "rounds": 40 * 48}}
    assert abs(mod.rounds_share(row["auto"]) - 0.5) < 1e-12
    data = {"header": [], "timm/1": row}
    assert abs(mod.rounds_cost(data, 96) - 30 * (56 + 192) / (40 * (56 + 96))) < 1e-12
    assert abs(mod.rounds_cost(data, 24) - 60 * (56 + 48) / (40 * (56 + 96))) < 1e-12
    assert mod.rounds_cost(data, 48) == 1.0
    small = {"timm/1": {**row, "needed": 12}}  # the pilot settles it: 20 builds at any rounds
    assert abs(mod.rounds_cost(small, 96) - (56 + 192) / (56 + 96)) < 1e-12
    assert mod.rounds_cost({"timm/1": {**row, "auto": {**row["auto"], "round_sd": None}}}, 96) is None


def test_never_slower_second_stage_wider_by_scipys_f_test():
    """``spreads``: the one-sided F test that the second stage spreads wider than the pilot,
    ``scipy.stats.f.sf(s2^2 / s0^2, n2 - 1, n0 - 1)``; the Builds cell says so below 5%, and so
    does ``verdict``, the lines printed under the table, naming the rows."""
    import math
    import random
    import statistics

    from scipy import stats

    mod = _never_slower()
    rng = random.Random(3)
    for _ in range(20):
        pilot, more = rng.randint(3, 30), rng.randint(2, 60)
        logs = [rng.gauss(0, 0.01) for _ in range(pilot)] + [
            rng.gauss(0, rng.choice((0.01, 0.03))) for _ in range(more)
        ]
        got = mod.spreads(logs, pilot)
        f = statistics.variance(logs[pilot:]) / statistics.variance(logs[:pilot])
        assert math.isclose(got["wider_p"], stats.f.sf(f, more - 1, pilot - 1), rel_tol=1e-8, abs_tol=1e-15)
        row = {"builds": pilot + more, "pilot": pilot, "needed": pilot + more, **got}
        assert ("Stein's interval too narrow" in mod.builds_cell(row)) == (got["wider_p"] < 0.05)
    assert mod.spreads([0.0, 0.01, 0.02], 3)["wider_p"] is None  # no second stage
    results = {
        "header": ["x"],
        "planted/1": {"wider_p": 0.01},
        "timm/1": {"at_most_native": True, "wider_p": 0.2},
        "tiny_gqa/1": {"at_most_native": False, "wider_p": 0.0055},
    }
    assert mod.verdict(results) == [
        "second stage wider than the pilot (F test, p < 0.05) in 2 row(s), planted/1, tiny_gqa/1: "
        "Stein's interval too narrow there; --reread gives the plain t over all builds",
        "auto at most native (ratio <= 1.00, upper <= 1.01): 1 of 2 rows",
    ]
    # an F far out underflows to p = 0.0: wider in the Builds cell and under the table alike
    far = {"builds": 24, "pilot": 20, "needed": 24, **mod.spreads([0.0, 1e-20] * 10 + [0.0, 1.0] * 2, 20)}
    assert far["wider_p"] == 0.0 and "Stein's interval too narrow" in mod.builds_cell(far)
    assert "1 row(s), tiny_gqa/1:" in mod.verdict({"tiny_gqa/1": {"at_most_native": True, "wider_p": 0.0}})[0]


def test_never_slower_saves_the_json_whole_after_every_row(tmp_path):
    """``save``: the results so far replace the file whole (no temporary left beside it), and
    nothing is written without ``--json``."""
    import argparse

    mod = _never_slower()
    path = tmp_path / "out" / "run.json"
    for rows in range(1, 4):
        mod.save(argparse.Namespace(json=str(path)), {f"loop{i}/1": {"i": i} for i in range(rows)})
        assert json.loads(path.read_text()) == {f"loop{i}/1": {"i": i} for i in range(rows)}
        assert [p.name for p in path.parent.iterdir()] == ["run.json"]
    mod.save(argparse.Namespace(json=None), {"x": 1})
    assert json.loads(path.read_text())["loop2/1"] == {"i": 2}


def simulated_row(mod, rng, sd: float, cap: int | None) -> bool:
    """One row at a true ratio of 1.00 as the benchmark sizes and reads it: normal build values of
    spread ``sd``, a pilot of ``BUILDS``, ``second_stage`` (rounded to four, at most ``cap``), Stein's
    interval; whether it meets the promise."""
    import math

    from prereg.descriptive import two_stage_interval

    logs = [rng.gauss(0, sd) for _ in range(mod.BUILDS)]
    n, _ = mod.second_stage(logs, mod.BUILDS, mod.HALF_WIDTH, cap or 10**6, 4)
    logs += [rng.gauss(0, sd) for _ in range(n - mod.BUILDS)]
    ci = two_stage_interval(logs, mod.BUILDS, level=0.95)
    return mod.at_most_native({"ratio": math.exp(ci.estimate), "high": math.exp(ci.high)})


def test_never_slower_half_width_meets_the_promise_by_simulation():
    """``HALF_WIDTH``: the widest half-width (to 0.01%) whose ``promise_chance`` is at least 0.99,
    the chance (Student t with the pilot's df) from scipy; and 4,000 simulated rows at a true ratio
    of 1.00 meet the promise (``at_most_native``) at least 0.99 less three binomial standard errors
    of the time: at the widest spread the tables saw against two native builds (0.0195, a second
    stage in nearly every row), with and without the cost stop, and at a narrow one (0.006, the
    pilot alone)."""
    import math
    import random

    from scipy import stats

    mod = _never_slower()
    t = stats.t.ppf(0.975, mod.BUILDS - 1)

    def chance(w):
        h = math.log1p(w)
        return stats.t.cdf(min(math.log(1.01) - h, math.log(1.005)) * t / h, mod.BUILDS - 1)

    for w in (0.002, 0.0041, 0.006):
        assert math.isclose(mod.promise_chance(w), chance(w), rel_tol=1e-9)
    assert mod.HALF_WIDTH == 0.0041 and chance(0.0041) >= 0.99 > chance(0.0042)
    reps = 4000
    for sd, cap in ((0.0195, None), (0.0195, mod.MAX_BUILDS), (0.006, None)):
        met = sum(simulated_row(mod, random.Random(61 + i), sd, cap) for i in range(reps))
        assert met / reps >= 0.99 - 3 * math.sqrt(0.99 * 0.01 / reps), (sd, cap, met / reps)


@pytest.mark.process
def test_twin_check_runs():
    """benchmarks/twin_check.py as a user runs it (8 builds of tiny_conv): a row for each way, its
    builds in blocks of four, twin's and auto's ratios with intervals; too few builds refused."""
    r = bench("twin_check", "tiny_conv", "--builds", "8", "--ways", "lead", "step")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert (
        lines[0]
        == "command: python benchmarks/twin_check.py tiny_conv --threads 1 --builds 8 --ways lead step"
    )
    assert [line.split(" | ")[:2] for line in lines[3:]] == [["| lead", "4"], ["| step", "4"]]
    for line in lines[3:]:
        for cell in line.split(" | ")[2:4]:
            ratio, low, high = (
                float(x) for x in cell.replace("(", "").replace(")", "").replace("-", " ").split()
            )
            assert low <= ratio <= high
    r = bench("twin_check", "tiny_conv", "--builds", "4", "--ways", "lead", "step", timeout=120)
    assert r.returncode == 2 and "--builds must give each way a block of four" in r.stderr
    assert "Traceback" not in r.stderr


def test_never_slower_builds_rotate_and_move():
    """``placed``: each arm is built first in turn over the builds, and the spacers before the builds
    differ from build to build (reproducibly: seeded by the build's number)."""
    mod = _never_slower()
    made: list[list[str]] = []
    sizes: list[list[int]] = []
    for b in range(8):
        order: list[str] = []
        loops, spacers = mod.placed(
            lambda kind, order=order: order.append(kind) or kind, dict.fromkeys("wxyz", "k"), b
        )
        made.append(list(loops))
        sizes.append([t.numel() for t in spacers])
    assert [m[0] for m in made[:4]] == ["w", "x", "y", "z"]
    assert len({tuple(s) for s in sizes}) == 8
    again = [t.numel() for t in mod.placed(lambda kind: kind, dict.fromkeys("wxyz", "k"), 3)[1]]
    assert again == sizes[3]


@pytest.mark.parametrize("name", ["ROUND_ORDERS", "PLANT_ORDERS"])
def test_never_slower_round_orders_balance_place_and_carryover(name):
    """The turns' orders: in one cycle each arm takes each place equally often, and in the cyclic
    stream of turns (each round's last turn before the next's first, the last round's before the
    first's) every ordered pair of arms, an arm after itself included, comes equally often; the
    ``ROUNDS_PER_BUILD`` default is whole cycles of both."""
    import collections

    mod = _never_slower()
    orders = [list(o) for o in getattr(mod, name)]
    k = len(orders[0])
    assert all(sorted(o) == sorted(orders[0]) for o in orders)  # each a permutation of the arms
    place = collections.Counter((a, p) for o in orders for p, a in enumerate(o))
    assert len(place) == k * k and set(place.values()) == {len(orders) // k}
    stream = [a for o in orders for a in o]
    pairs = collections.Counter(zip(stream, stream[1:] + stream[:1]))
    assert len(pairs) == k * k and len(set(pairs.values())) == 1
    assert mod.ROUNDS_PER_BUILD % len(orders) == 0
    square = [list(o) for o in mod.ORDERS]  # the square of the builds, cycled, does not balance it
    sq = [a for o in square for a in o]
    assert len(set(collections.Counter(zip(sq, sq[1:] + sq[:1])).values())) > 1


def test_never_slower_turns_time_the_step_after_the_arms_own(monkeypatch):
    """``one_build``: after the solo warm-ups, each arm's turn is ``lead_in`` untimed iterations and
    one timed, back to back (so the timed step follows the arm's own, as in a user's loop), the
    solo warm-ups in the order the arms were built (``WARM_IN_BUILD_ORDER``), the
    turns in ``ROUND_ORDERS``, every arm takes the same steps, and the time holds the timed
    iteration alone (a fake clock that an iteration moves one tick)."""
    import torch

    mod = _never_slower()
    events: list[tuple[str, int]] = []
    now = [0.0]
    monkeypatch.setattr(mod.time, "perf_counter", lambda: now[0])

    class Loop:
        def __init__(self, name: str) -> None:
            self.name, self.model = name, torch.nn.Linear(2, 2)
            self.opt = type(
                "Opt", (), {"mode": "native", "mode_report": "r", "phase_kernel": lambda s: "k"}
            )()

        def iteration(self, k: int) -> None:  # one tick of the clock
            events.append((self.name, k))
            now[0] += 1.0

    def placed(build, arms, b):  # built in an order of its own: the warm-ups must follow it
        order = [*arms][2:] + [*arms][:2]
        return {arm: torch.manual_seed(0) and Loop(arm) for arm in order}, []

    monkeypatch.setattr(mod, "placed", placed)
    for lead in (0, 1, 3):
        events.clear()
        out = mod.one_build(lambda kind: None, 0, rounds=8, warmup=2, lead_in=lead)
        assert out["bitwise"] and all(len(t) == 8 for t in out["times"].values())
        solo = [e for e in events if e[1] < 2]
        built = [*mod.ARMS[2:], *mod.ARMS[:2]]
        assert solo == [(arm, k) for arm in built for k in (0, 1)]  # warm-ups in the order built
        turns = [events[i : i + lead + 1] for i in range(len(solo), len(events), lead + 1)]
        assert len(turns) == 8 * 4
        for t, turn in enumerate(turns):
            r, place = divmod(t, 4)
            arm = mod.ARMS[mod.ROUND_ORDERS[r % 8][place]]
            assert turn == [(arm, 2 + r * (lead + 1) + j) for j in range(lead + 1)], (lead, t)
        # one tick a timed window: the timed iteration alone, the lead-in outside it
        assert all(x == 1.0 for t in out["times"].values() for x in t)


def test_never_slower_design_check_puts_the_spin_where_asked(monkeypatch):
    """``planted``: the spin of B's timed iteration runs right after it, right before it, or before
    in even rounds and after in odd (``--spin-at``); B's lead-in iterations spin right before
    themselves, so with ``after`` no timed iteration follows a spin; A's and C's never spin. On a
    fake clock (an iteration one tick, each spin a length of its own), B's times hold exactly its
    timed iteration's spin, and the truth is the geometric mean of (reference + that spin) /
    reference."""
    import math
    import statistics

    mod = _never_slower()
    events: list[tuple[str, int]] = []
    now = [0.0]

    class Loop:
        def __init__(self) -> None:
            self.name = "?"

        def iteration(self, k: int) -> None:
            events.append((self.name, k))
            now[0] += 1.0

    def placed(build, arms, b):
        loops = {arm: build(kind) for arm, kind in arms.items()}
        for arm, loop in loops.items():
            loop.name = arm
        return loops, []

    spin_lengths: list[float] = []

    def spin(seconds: float) -> float:
        took = 0.001 * (len(events) % 97 + 1)  # a length of its own, as a real spin's varies
        events.append(("spin", -1))
        spin_lengths.append(took)
        now[0] += took
        return took

    monkeypatch.setattr(mod, "placed", placed)
    monkeypatch.setattr(mod, "spin", spin)
    monkeypatch.setattr(mod.time, "perf_counter", lambda: now[0])
    for at, lead in itertools.product(mod.SPIN_AT, (0, 1, 2)):
        events.clear()
        spin_lengths.clear()
        p = mod.planted(lambda kind: Loop(), rounds=12, warmup=1, share=0.02, builds=2, at=at, lead_in=lead)
        past = [e for e in events if e[1] >= 1 or e[0] == "spin"]  # past each build's warm-up (k = 0)
        timed_spins = []  # the spin each timed B iteration owns, in order
        for i, (name, k) in enumerate(past):
            if name != "b":
                continue
            r, j = divmod(k - 1, lead + 1)  # the round, and the step in the turn
            timed = j == lead
            before = not timed or at == "before" or (at == "alternate" and r % 2 == 0)
            own = i - 1 if before else i + 1
            assert past[own][0] == "spin", (at, lead, r, j)
            if timed:
                timed_spins.append(own)
        spins = [i for i, e in enumerate(past) if e[0] == "spin"]
        assert len(spins) == 12 * (lead + 1)  # one a B iteration, lead-ins included
        if at == "after" and lead:  # no timed iteration of any arm right after a spin
            for i, (name, k) in enumerate(past):
                assert name == "spin" or (k - 1) % (lead + 1) != lead or past[i - 1][0] != "spin", (i, name)
        for arm in "abc":  # each turn: the arm's lead-in and timed iteration, back to back
            ks = [k for name, k in past if name == arm]
            assert ks == [1 + j for j in range(6 * (lead + 1))] * 2, (arm, lead)
        lengths = [spin_lengths[spins.index(i)] for i in timed_spins]  # every spin is past the warm-up
        assert len(set(lengths)) > 1
        truth = math.exp(statistics.fmean(math.log(1.0 + s) for s in lengths))  # the reference ticks 1
        assert math.isclose(p["truth"], truth, rel_tol=1e-12), (at, lead)
        # B's timed window holds its timed iteration and that spin alone (A's and C's one tick)
        assert math.isclose(p["read"]["ratio"], truth, rel_tol=1e-9), (at, lead)
    with pytest.raises(SystemExit):
        mod.parse(["--check-only", "--plant", "0"])
    with pytest.raises(SystemExit):
        mod.parse(["--lead-in", "-1"])
