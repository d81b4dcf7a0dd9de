"""A result carries its level (issue 60): the renderers take a result (its estimate, its interval's
ends and the level that interval was taken at), never a level passed beside it, and the only
``level`` parameters left in the core are the level's source (the protocol reader) or a
statistic's explicit argument, each named here with its reason."""

from __future__ import annotations

import ast
import json
import math
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from prereg.descriptive import Ends, reduction
from prereg.render.answer import answer_lines
from prereg.render.result import points, sentence
from prereg.results import Descriptive, FactorialResult, Summary

ROOT = Path(__file__).resolve().parent.parent

#: Every function of the core with a parameter named for an interval level, and why it takes one.
SOURCE = "the level's source: the protocol reader resolves each study's level from the protocol's"
STATISTIC = (
    "a statistic's explicit argument (as scipy's functions take confidence_level): it computes an "
    "interval at the level it is given, and its result carries that level"
)
RESULT = "a result's own API: the same estimate at another level (scipy's confidence_interval)"
LEVEL_PARAMETERS = {
    "prereg/protocol/read.py:_studies.level": SOURCE,
    "prereg/protocol/read.py:_study.level": SOURCE,
    "prereg/plan.py:study_level.top_level": SOURCE + " (the default rule, its one home)",
    "prereg/descriptive.py:PairedInterval.interval.level": RESULT,
    "prereg/descriptive.py:TResult.interval.level": RESULT,
    "prereg/descriptive.py:_check_level.level": RESULT + ": the argument's range",
    "prereg/descriptive.py:t_interval.level": STATISTIC,
    "prereg/descriptive.py:mean_interval.level": STATISTIC,
    "prereg/descriptive.py:paired_interval.level": STATISTIC,
    "prereg/descriptive.py:two_stage_size.level": STATISTIC + " (the level of the interval it sizes)",
    "prereg/descriptive.py:two_stage_interval.level": STATISTIC,
    "prereg/descriptive.py:stein_size.level": STATISTIC + " (the level of the interval it sizes)",
    "prereg/descriptive.py:descriptive_interval.level": STATISTIC,
    "prereg/descriptive.py:endpoint.level": STATISTIC + " (called through Rows.endpoint, at the rows' level)",
    "prereg/designs/difference.py:welch_difference.level": STATISTIC,
    "prereg/planted.py:bias_of.level": STATISTIC,
    "prereg/planted.py:coverage.level": STATISTIC,
    "prereg/replicates.py:random_effects.level": STATISTIC,
    "prereg/replicates.py:replicates_interval.level": STATISTIC,
    "prereg/replicates.py:replicate_rows.level": STATISTIC + " (the protocol's level, not a study's)",
    "prereg/render/model.py:level_pct.level": "the formatter of a level itself, as num formats a number",
}


def _level_parameters() -> set[str]:
    found = set()
    for path in sorted((ROOT / "prereg").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                        if "level" in arg.arg:
                            found.add(f"{rel}:{prefix}{child.name}.{arg.arg}")
                    stack.append((child, f"{prefix}{child.name}."))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, f"{prefix}{child.name}."))
                else:
                    stack.append((child, prefix))
    return found


def test_only_a_level_s_source_or_a_statistic_takes_a_level() -> None:
    """No renderer or summary step takes a level beside its result: each ``level`` parameter of the
    core is the level's source or a statistic's argument, named in :data:`LEVEL_PARAMETERS`."""
    found = _level_parameters()
    assert not found - set(LEVEL_PARAMETERS), "a level threaded through, not carried by its result"
    assert not set(LEVEL_PARAMETERS) - found, "a listed parameter that no longer exists"


def test_no_renderer_takes_a_level_beside_its_result() -> None:
    render = {k for k in _level_parameters() if k.startswith("prereg/render/")}
    assert render == {"prereg/render/model.py:level_pct.level"}


def _summary(name: str) -> Summary:
    return Summary.read(json.loads((ROOT / "records" / name / "summary.json").read_text()))


def _points_throughout(s: Summary) -> Summary:
    """The same summary as a study that is not among those published before: points throughout."""
    return replace(s, protocol={**s.protocol, "sha256": "0" * 64})


def test_a_factorial_effect_is_said_at_the_level_its_result_carries() -> None:
    """cpu1's factorial configuration with its result moved to 80%: the answer says 80% and the
    effect's own ends, as a reduction in percent and, in points throughout, as its log contrast."""
    s = _summary("cpu1")
    study = next(st for st in s.studies if st.factorial_configs())
    c = study.factorial_configs()[0]
    assert c.level != 0.8 and c.effects
    moved = replace(c, level=0.8)
    studies = [replace(x, configs=[moved if y is c else y for y in x.configs]) for x in s.studies]
    at80 = replace(s, studies=studies)
    said = "\n".join(answer_lines(at80))
    old = "\n".join(answer_lines(s))
    every = "\n".join(answer_lines(_points_throughout(at80)))
    for name, e in c.effects.items():
        if not e:
            continue
        words = name.replace("_", " ")
        red = f"{e['reduction_pct']:.2f}% (80% interval {e['reduction_low_pct']:.2f} to {e['reduction_high_pct']:.2f}%)"
        assert f"{words} {red}" in said
        assert f"{words} {e['reduction_pct']:.2f}% ({100 * c.level:.4g}% interval" in old
        logs = f"{100 * e['estimate']:+.2f} points (80% interval {100 * e['low']:+.2f} to {100 * e['high']:+.2f}; "
        assert f"{words} {logs}" in every
        assert moved.effect(name) == Ends(e["estimate"], e["low"], e["high"], 0.8)


def _unsaid(s: Summary, estimand: str, values: tuple[float, float, float]) -> Summary:
    """``s`` with its first decision moved to a configuration the answer shows none of, at 80%,
    on ``estimand`` with the estimate and ends ``values``."""
    hyp = s.hypotheses
    assert not isinstance(hyp, Descriptive) and hyp.decisions
    first = hyp.decisions[0]
    d = first.decision
    h = replace(d.hypothesis, config="elsewhere", estimand=estimand, endpoint="training_time")
    est, low, high = values
    moved = replace(d, hypothesis=h, level=0.8, estimate=est, low=low, high=high, estimate_of=None)
    return replace(s, hypotheses=replace(hyp, decisions=[replace(first, decision=moved), *hyp.decisions[1:]]))


def test_a_decision_on_no_shown_configuration_is_said_at_its_own_level() -> None:
    """A decision the answer states on its own line: its effect at the level the decision carries,
    as a reduction (its ends swapped), in points, or a relative reduction's log ratio in points."""
    s = _summary("cpu2")
    m, lo, hi = -0.03, -0.05, -0.01
    line = next(x for x in answer_lines(_unsaid(s, "log_ratio", (m, lo, hi))) if "/ elsewhere:" in x)
    red = f"{reduction(m):.2f}% (80% interval {reduction(hi):.2f} to {reduction(lo):.2f}%)"
    assert f"training_time reduction {red}; decision: " in line
    every = _points_throughout(_unsaid(s, "log_ratio", (m, lo, hi)))
    line = next(x for x in answer_lines(every) if "/ elsewhere:" in x)
    assert (
        f"training_time change {100 * m:+.2f} points (80% interval {100 * lo:+.2f} to {100 * hi:+.2f}; "
        in line
    )
    r, rlo, rhi = 3.0, 1.0, 5.0
    every = _points_throughout(_unsaid(s, "relative_reduction", (r, rlo, rhi)))
    line = next(x for x in answer_lines(every) if "/ elsewhere:" in x)
    pts = [100 * math.log1p(-x / 100) for x in (r, rhi, rlo)]
    assert f"training_time change {pts[0]:+.2f} points (80% interval {pts[1]:+.2f} to {pts[2]:+.2f}; " in line


finite = st.floats(-0.5, 0.5, allow_nan=False)


@given(finite, finite, finite, st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_ends_on_another_scale_keep_their_level(a: float, b: float, c: float, level: float) -> None:
    """A result mapped to another scale keeps its level; a decreasing map swaps the ends."""
    low, est, high = sorted((a, b, c))
    r = Ends(est, low, high, level)
    red = r.mapped(reduction, decreasing=True)
    assert red == Ends(reduction(est), reduction(high), reduction(low), level)
    assert red.low is not None and red.high is not None and red.low <= red.high
    assert Ends(est, None, None, level).mapped(reduction, decreasing=True) == Ends(
        reduction(est), None, None, level
    )
    assert points(r) == (f"{100 * est:+.2f}", f"{100 * low:+.2f} to {100 * high:+.2f} ({100 * level:.4g}%)")
    assert points(r, named=False)[1] == f"{100 * low:+.2f} to {100 * high:+.2f}"
    assert f"{100 * level:.4g}% interval {100 * low:+.2f} to {100 * high:+.2f}" in sentence(r)


def test_a_factorial_result_s_effects_carry_its_level() -> None:
    e = {"estimate": -0.02, "low": -0.03, "high": -0.01, "reduction_pct": 1.98}
    e |= {"reduction_low_pct": 0.99, "reduction_high_pct": 2.96}
    c = FactorialResult("c", "factorial", 0.9, 4, None, None, 4, {}, {"x": e}, [])
    assert c.effect("x") == Ends(-0.02, -0.03, -0.01, 0.9)
    assert c.effect_reduction("x") == Ends(1.98, 0.99, 2.96, 0.9)
