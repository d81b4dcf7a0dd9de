"""``benchmarks/tost_size.py``: the equivalence test's power and sample size (docs/decisions.md,
"Effect classes"), against a simulation of the test itself that shares none of its formula."""

from __future__ import annotations

import importlib.util
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("tost_size", ROOT / "benchmarks" / "tost_size.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _simulated(n: int, sd_p: float, sd_t: float, delta: float, bias: float, studies: int, seed: int) -> float:
    """Share of simulated calibrations whose Welch 90% interval of the bias lies inside +-delta."""
    rng = random.Random(seed)
    shown = 0
    for _ in range(studies):
        p = [rng.gauss(bias, sd_p) for _ in range(n)]
        t = [rng.gauss(0.0, sd_t) for _ in range(n)]
        vp, vt = statistics.variance(p) / n, statistics.variance(t) / n
        se = (vp + vt) ** 0.5
        df = (vp + vt) ** 2 / (vp**2 / (n - 1) + vt**2 / (n - 1))
        d, q = statistics.fmean(p) - statistics.fmean(t), stats.t.ppf(0.95, df)
        shown += -delta < d - q * se and d + q * se < delta
    return shown / studies


@pytest.mark.parametrize(("n", "bias"), [(60, 0.0), (100, 0.1), (100, 0.3)])
def test_power_matches_a_simulated_tost(n: int, bias: float) -> None:
    mod = _module()
    se = ((1.1**2 + 0.9**2) / n) ** 0.5
    want = mod.power(0.5, se, bias)
    got = _simulated(n, 1.1, 0.9, 0.5, bias, 1000, seed=n + int(100 * bias))
    assert abs(got - want) < 0.05, (got, want)


def test_the_size_it_names_reaches_its_power() -> None:
    mod = _module()
    n = mod.needed(0.5, 1.1, 0.9)
    assert _simulated(n, 1.1, 0.9, 0.5, 0.0, 1000, seed=7) >= 0.77
    assert _simulated(max(3, n // 3), 1.1, 0.9, 0.5, 0.0, 1000, seed=8) < 0.6


def test_reads_the_committed_calibration() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "tost_size.py"),
            str(ROOT / "records" / "calibration-classes"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| calibration-classes | matmul200 | 1.12 (8) | 0.93 (8) | 458 |" in out
