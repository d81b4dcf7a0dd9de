"""The audit's plan-order check (prereg.plan.tally): runs out of plan order within their replicate."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prereg.plan import tally


def _plan(reps: list[int | None]) -> list[dict]:
    return [
        {
            "run_id": f"r{i}",
            "order": i,
            "study": "s",
            "config": "c",
            "arm": "a",
            **({"replicate": k} if k else {}),
        }
        for i, k in enumerate(reps)
    ]


def _records(run_ids: list[str]) -> list[dict]:
    return [
        {"spec": {"run_id": rid, "unit": rid}, "attempt": 1, "status": "ok", "ledger": {"seq": seq}}
        for seq, rid in enumerate(run_ids)
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=30), st.randoms(use_true_random=False))
def test_replicates_run_one_after_another_in_any_order_are_in_plan_order(reps, rnd):
    """Each replicate's runs in plan order among themselves, the replicates in any order (as
    ``harness run --replicate K`` runs them): nothing is out of order, though the plan interleaves."""
    plan = _plan(reps)
    keys = sorted(set(reps))
    rnd.shuffle(keys)
    ran = [p["run_id"] for k in keys for p in plan if p["replicate"] == k]
    assert tally(plan, _records(ran))[2] == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=2, max_size=30), st.data())
def test_two_runs_of_one_replicate_swapped_are_named_with_their_replicate(reps, data):
    plan = _plan(reps)
    k = data.draw(st.sampled_from(sorted(set(reps))))
    mine = [p["run_id"] for p in plan if p["replicate"] == k]
    if len(mine) < 2:
        return
    i = data.draw(st.integers(0, len(mine) - 2))
    j = data.draw(st.integers(i + 1, len(mine) - 1))
    order = {rid: n for n, rid in enumerate(mine)}
    mine[i], mine[j] = mine[j], mine[i]
    others = [p["run_id"] for p in plan if p["replicate"] != k]
    flagged = tally(plan, _records(others + mine))[2]
    # the runs placed after a later one of the same replicate, and only they
    expected = []
    top = -1
    for rid in mine:
        if order[rid] < top:
            expected.append(rid)
        top = max(top, order[rid])
    assert [f.split(" ")[0] for f in flagged] == expected and expected
    assert all(f.endswith(f"of replicate {k}") for f in flagged)


def test_without_replicates_the_whole_plan_is_one_order():
    plan = _plan([None] * 4)
    flagged = tally(plan, _records(["r0", "r2", "r1", "r3"]))[2]
    assert flagged == ["r1 (plan position 1) ran after plan position 2"]
