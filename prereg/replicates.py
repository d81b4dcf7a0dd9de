"""Replicates: a study run several times, at different times or on different machines, and the
random-effects meta-analysis of its per-replicate estimates (the one home of the rule and the
arithmetic; the protocol parser, the runner, the summary and the audit all call it).

A protocol may declare ``replicates: {count: K, min_gap_s: S}``. Each study's seeds are cut, in
order, into ``K`` equal consecutive slices; the units of slice ``r`` (1-based) form replicate
``r`` (:func:`replicate_of`), which one ``harness run --replicate r`` runs. Replicate ``r + 1``
may start only when every earlier replicate's last ledger entry on the same machine is at least
``S`` seconds old; on a machine no earlier replicate used it may start at once
(:func:`overlap_problem`). So replicates measure what one stretch on one machine cannot: the
variation of the effect between times (and machines).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from prereg.descriptive import PairedInterval, mean_interval, on_log_scale, valid
from prereg.tdist import t_critical

#: The keys of the ``replicates`` block, and what each means.
KEYS = {
    "count": "how many replicates (separate runs of the runner), at least 2",
    "min_gap_s": "the least seconds between one replicate's last entry and the next one's first, "
    "on the same machine",
}
#: The most replicates a protocol may declare.
MAX_COUNT = 100


def replicates_problems(value: object, seed_counts: Mapping[str, int]) -> list[tuple[tuple[str, ...], str]]:
    """What is wrong with a protocol's ``replicates`` mapping (key path below ``replicates``,
    message); none for a valid one. ``seed_counts``: each study's number of seeds, which ``count``
    must divide into slices of at least 2 (a replicate's estimate needs its own variance)."""
    if not isinstance(value, Mapping):
        return [((), f"expected a mapping {{count: K, min_gap_s: S}}, got {type(value).__name__}")]
    extra = sorted(str(k) for k in value if k not in KEYS)
    if extra:
        return [((extra[0],), f"unknown key {extra[0]!r} in replicates (keys: {', '.join(KEYS)})")]
    for key in KEYS:
        if key not in value:
            return [((), f"replicates names {key!r}: {KEYS[key]}")]
    count, gap = value["count"], value["min_gap_s"]
    if not isinstance(count, int) or isinstance(count, bool) or not 2 <= count <= MAX_COUNT:
        return [(("count",), f"count is an integer from 2 to {MAX_COUNT}, got {count!r}")]
    if not isinstance(gap, int) or isinstance(gap, bool) or gap < 0:
        return [(("min_gap_s",), f"min_gap_s is a whole number of seconds, 0 or more, got {gap!r}")]
    for name, n in seed_counts.items():
        if n % count or n // count < 2:
            return [
                (
                    ("count",),
                    f"study {name!r} has {n} seeds: {count} replicates need a multiple of {count}, "
                    "at least 2 seeds each",
                )
            ]
    return []


def replicate_of(seed_index: int, n_seeds: int, count: int) -> int:
    """The replicate (1-based) of a study's unit of seed index ``seed_index`` (0-based) out of
    ``n_seeds``: consecutive slices of ``n_seeds // count`` seeds."""
    return 1 + seed_index // (n_seeds // count)


def overlap_problem(
    replicate: int,
    spans: Mapping[int, Sequence[tuple[float, float, str]]],
    now: float,
    host: str,
    min_gap_s: int,
) -> str | None:
    """Why replicate ``replicate`` may not run now on ``host``, or ``None``.

    ``spans`` maps each replicate that has ledger entries to its ``(first, last, host)`` spans in
    epoch seconds (one per machine). Refused: a later replicate that has entries already (the
    replicates would interleave in time); an earlier replicate whose last entry on ``host`` is
    fewer than ``min_gap_s`` seconds before ``now``.
    """
    later = sorted(r for r in spans if r > replicate and spans[r])
    if later:
        first = min(s[0] for s in spans[later[0]])
        return (
            f"replicate {later[0]} started at {_utc(first)}: replicate {replicate} cannot run after it "
            "(replicates run in order, each in a time of its own)"
        )
    for r in sorted(spans):
        if r >= replicate:
            continue
        for _first, last, where in spans[r]:
            if _same_machine(where, host) and now - last < min_gap_s:
                return (
                    f"replicate {r} ran on {host} until {_utc(last)}: replicate {replicate} may start there "
                    f"from {_utc(last + min_gap_s)} (min_gap_s {min_gap_s}), not at {_utc(now)}"
                )
    return None


#: A chain entry (a record or a started entry) as its file holds it.
Entry = Mapping[str, object]


def at_path(entry: object, *keys: str) -> object:
    """``entry[k1][k2]...`` of a JSON object, ``None`` where a key is missing or a value on the way
    is not an object."""
    for k in keys:
        entry = entry.get(k) if isinstance(entry, Mapping) else None
    return entry


def replicate_of_run(entries: Sequence[Entry]) -> dict[str, int]:
    """Each run id's replicate, from the entries whose spec names one (the one reading of it)."""
    out: dict[str, int] = {}
    for e in entries:
        r = at_path(e, "spec", "replicate")
        if isinstance(r, int):
            out[str(at_path(e, "spec", "run_id"))] = int(r)
    return out


def spans_of(
    entries: Sequence[Entry], replicate_of_run: Mapping[str, int]
) -> dict[int, list[tuple[float, float, str]]]:
    """Each replicate's time on each machine, from the chain's entries (records and started entries):
    ``{replicate: [(first, last, host), ...]}`` in epoch seconds, from each entry's ``ledger.at``
    (when the ledger sealed it) and machine (a started entry's ``runner.host``, a record's
    ``env.host``). ``replicate_of_run``: each planned run id's replicate."""
    out: dict[tuple[int, str], tuple[float, float]] = {}
    for e in entries:
        run = e.get("run_id") or at_path(e, "spec", "run_id")
        r = replicate_of_run.get(str(run))
        at = at_path(e, "ledger", "at")
        if r is None or not isinstance(at, str):
            continue
        t = _epoch(at)
        where = machine_of(e)
        lo, hi = out.get((r, where), (t, t))
        out[(r, where)] = (min(lo, t), max(hi, t))
    spans: dict[int, list[tuple[float, float, str]]] = {}
    for (r, where), (lo, hi) in sorted(out.items()):
        spans.setdefault(r, []).append((lo, hi, where))
    return spans


def machine_of(entry: Entry) -> str:
    """The machine an entry names: its host, and where the runner recorded it (started entries since
    issue 59), the boot id, which ``unshare --uts`` does not change: ``host (boot 1a2b3c4d)``."""
    host = str(at_path(entry, "runner", "host") or at_path(entry, "env", "host") or "unknown host")
    boot = at_path(entry, "runner", "boot_id")
    return f"{host} (boot {str(boot)[:8]})" if isinstance(boot, str) and boot else host


def _same_machine(a: str, b: str) -> bool:
    """Whether two :func:`machine_of` labels are one machine: one boot id, or one host where either
    has no boot id."""
    ba, bb = a.rpartition(" (boot ")[2], b.rpartition(" (boot ")[2]
    if " (boot " in a and " (boot " in b:
        return ba == bb
    return a.split(" (boot ")[0] == b.split(" (boot ")[0]


def unwitnessed(entries: Sequence[Entry]) -> bool:
    """Whether the machines of a replicated study's runs are told apart by hostname alone: a started
    entry without the runner's boot id (``harness.execute.attempts.machine_witness``; entries
    written before it, or on a system without ``/proc``)."""
    return any(e.get("kind") == "started" and not at_path(e, "runner", "boot_id") for e in entries)


def time_problems(entries: Sequence[Entry], min_gap_s: int) -> list[str]:
    """What the chain shows against the replicates' separation in time (the audit's check of the
    rule ``harness run --replicate`` applies when each replicate starts): on one machine, a
    replicate whose first entry is fewer than ``min_gap_s`` seconds after an earlier replicate's last
    entry there (negative: they overlap). Replicates on different machines may run at once; one
    machine is one boot id where the entries hold one (a hostname changed under ``unshare --uts``
    is the same machine), else one hostname."""
    spans = spans_of(entries, replicate_of_run(entries))
    out = []
    for r in sorted(spans):
        for j in sorted(x for x in spans if x < r):
            for _f, last, host in spans[j]:
                for first, _l, where in spans[r]:
                    if _same_machine(where, host) and first - last < min_gap_s:
                        out.append(
                            f"replicate {r} started on {host} at {_utc(first)}, {first - last:.0f} s after "
                            f"replicate {j}'s last entry there ({_utc(last)}): min_gap_s is {min_gap_s}"
                        )
    return out


def _replicate_seqs(entries: Sequence[Entry]) -> dict[tuple[int, str], list[int]]:
    """Each (replicate, machine)'s ledger seqs, the replicate read from its run's spec."""
    of_run = replicate_of_run(entries)
    seqs: dict[tuple[int, str], list[int]] = {}
    for e in entries:
        r = of_run.get(str(e.get("run_id") or at_path(e, "spec", "run_id")))
        seq = at_path(e, "ledger", "seq")
        if r is not None and isinstance(seq, int):
            seqs.setdefault((r, machine_of(e)), []).append(seq)
    return seqs


def anchored_gap_problems(
    entries: Sequence[Entry], min_gap_s: int, anchored: Sequence[tuple[int, str]]
) -> tuple[list[str], list[str]]:
    """The replicates' separation witnessed by an anchor (``harness run --anchor``): each replicate's
    first and last entry on each machine, by ``ledger.seq``, at the time of the first anchored head
    that holds it (seq at or after the entry's: the anchor commit's time, which the remote's history
    keeps); on one machine a replicate's first entry anchored fewer than ``min_gap_s`` seconds after
    an earlier replicate's last is a problem. Returns the problems and, for an entry no anchored
    head holds, a note that its time is unwitnessed."""
    seqs = _replicate_seqs(entries)
    times = sorted((seq, _epoch(when)) for seq, when in anchored)

    def witness(seq: int) -> float | None:
        return min((t for s, t in times if s >= seq), default=None)

    problems, unwitnessed_ = [], []
    for (r, where), got in sorted(seqs.items()):
        for (j, there), before in sorted(seqs.items()):
            if j >= r or not _same_machine(where, there):
                continue
            first, last = witness(min(got)), witness(max(before))
            if first is None or last is None:
                unwitnessed_.append(
                    f"replicate {r} on {where}: its first entry (seq {min(got)}) or replicate {j}'s last "
                    f"(seq {max(before)}) is in no anchored head: their times are the runner's own"
                )
            elif first - last < min_gap_s:
                problems.append(
                    f"replicate {r}'s first entry (seq {min(got)}) was anchored at {_utc(first)}, "
                    f"{first - last:.0f} s after replicate {j}'s last (seq {max(before)}, {_utc(last)}) on "
                    f"{where}: min_gap_s is {min_gap_s}"
                )
    return problems, unwitnessed_


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _utc(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def random_effects(estimates: Sequence[float], variances: Sequence[float], level: float) -> dict[str, float]:
    """The random-effects mean of per-replicate estimates: DerSimonian-Laird's between-replicate
    variance with the Hartung-Knapp-Sidik-Jonkman interval.

    Parameters
    ----------
    estimates
        Each replicate's estimate ``y_r``: the mean of its pairs' log ratios ``ln(T_c / T_b)``
        (positive: the candidate takes longer), ``k >= 2`` of them.
    variances
        Each one's within-replicate variance ``v_r = s_r^2 / n_r`` (its squared standard error).
    level
        The two-sided interval's level, e.g. 0.99.

    Returns
    -------
    dict
        ``k``; ``mean`` (the random-effects mean ``mu``); ``lo``, ``hi`` (its interval); ``se``
        (the HKSJ standard error); ``df`` (``k - 1``); ``tau`` (the between-replicate standard
        deviation, ``sqrt(tau^2)``); ``q`` (Cochran's Q); ``i2`` (Higgins' ``I^2 = max(0, (Q - (k -
        1)) / Q)``); ``fixed`` (the inverse-variance mean that ignores ``tau``).

    Raises
    ------
    ValueError
        Fewer than 2 replicates, or a variance that is not positive and finite.

    Notes
    -----
    The between-replicate variance is DerSimonian & Laird's (:func:`_dersimonian_laird`); the
    interval is Hartung-Knapp-Sidik-Jonkman's (:func:`_hksj`, which says why not DL's own).
    statsmodels' ``combine_effects(method_re="chi2", use_t=True)`` computes the same (its
    ``conf_int()[3]``; ``tests/test_replicates.py`` compares on fixed data).
    """
    k = len(estimates)
    if k < 2 or len(variances) != k:
        raise ValueError(f"a random-effects mean needs at least 2 replicates with a variance each, got {k}")
    if not all(math.isfinite(v) and v > 0 for v in variances) or not all(map(math.isfinite, estimates)):
        raise ValueError("each replicate needs a finite estimate and a positive, finite variance")
    fixed, q, tau2 = _dersimonian_laird(estimates, variances)
    mu, se = _hksj(estimates, variances, tau2)
    crit = t_critical((1.0 - level) / 2.0, k - 1)
    return {
        "k": k,
        "mean": mu,
        "lo": mu - crit * se,
        "hi": mu + crit * se,
        "se": se,
        "df": k - 1,
        "level": level,
        "tau": math.sqrt(tau2),
        "q": q,
        "i2": max(0.0, (q - (k - 1)) / q) if q > 0 else 0.0,
        "fixed": fixed,
    }


def _dersimonian_laird(estimates: Sequence[float], variances: Sequence[float]) -> tuple[float, float, float]:
    """The fixed (inverse-variance) mean, Cochran's Q and DerSimonian-Laird's ``tau^2``.

    With weights ``w_r = 1 / v_r``, the fixed mean ``y_F = sum w_r y_r / sum w_r`` and Cochran's
    ``Q = sum w_r (y_r - y_F)^2``, DerSimonian & Laird (1986) estimate

    ``tau^2 = max(0, (Q - (k - 1)) / (sum w_r - sum w_r^2 / sum w_r))``.
    """
    k = len(estimates)
    w = [1.0 / v for v in variances]
    sw = math.fsum(w)
    fixed = math.fsum(wi * y for wi, y in zip(w, estimates)) / sw
    q = math.fsum(wi * (y - fixed) ** 2 for wi, y in zip(w, estimates))
    c = sw - math.fsum(wi * wi for wi in w) / sw
    tau2 = max(0.0, (q - (k - 1)) / c) if c > 0 else 0.0
    return fixed, q, tau2


def _hksj(estimates: Sequence[float], variances: Sequence[float], tau2: float) -> tuple[float, float]:
    """The random-effects mean ``mu`` and its Hartung-Knapp-Sidik-Jonkman standard error.

    The random-effects weights ``w*_r = 1 / (v_r + tau^2)`` give ``mu = sum w*_r y_r / sum w*_r``;
    Hartung & Knapp (2001) and Sidik & Jonkman (2002) take its variance from the weighted spread
    of the replicates themselves,

    ``Var_HK(mu) = sum w*_r (y_r - mu)^2 / ((k - 1) sum w*_r)``,

    and the interval ``mu -/+ t_{k-1, (1 + level)/2} sqrt(Var_HK)``.

    Why HKSJ and not DerSimonian-Laird's own interval ``mu -/+ z sqrt(1 / sum w*_r)``: with the 3 to
    5 replicates a study affords, ``tau^2`` is estimated from 2 to 4 degrees of freedom and often
    as 0, so the DL interval treats an estimated variance as known and misses the mean far more
    often than its level says when replicates do differ (IntHout, Ioannidis & Borm 2014, BMC Med.
    Res. Methodol. 14:25). ``benchmarks/replicates.py`` simulates studies of 3 replicates whose
    true effects vary between replicates: the HKSJ interval holds its level within Monte-Carlo
    error while DL's falls short (docs/decisions.md, "Replicates: the between-replicate
    spread"). With no between-replicate variance both keep their level.
    """
    k = len(estimates)
    ws = [1.0 / (v + tau2) for v in variances]
    sws = math.fsum(ws)
    mu = math.fsum(wi * y for wi, y in zip(ws, estimates)) / sws
    var_hk = math.fsum(wi * (y - mu) ** 2 for wi, y in zip(ws, estimates)) / ((k - 1) * sws)
    return mu, math.sqrt(var_hk)


def replicate_estimates(
    values_of: Mapping[int, Sequence[float]],
) -> tuple[list[int], list[float], list[float]]:
    """Each replicate's mean and its variance ``s^2 / n`` from its pairs' values, replicates in
    order; a replicate with fewer than 2 values or no spread is left out (it has no variance)."""
    reps, ys, vs = [], [], []
    for r in sorted(values_of):
        x = [v for v in values_of[r] if math.isfinite(v)]
        if len(x) < 2:
            continue
        m = math.fsum(x) / len(x)
        var = math.fsum((v - m) ** 2 for v in x) / (len(x) - 1) / len(x)
        if var > 0:
            reps.append(r)
            ys.append(m)
            vs.append(var)
    return reps, ys, vs


def replicates_interval(
    values_of: Mapping[int, Sequence[float]], level: float, estimand: str
) -> PairedInterval | None:
    """The interval a replicated protocol decides by, at ``level``: the two-sided Student-t interval
    of the mean of the replicates' estimates (each the mean log ratio of its pairs,
    :func:`replicate_estimates`), ``k - 1`` degrees of freedom, in ``estimand``'s terms
    (``log_ratio`` or ``relative_reduction``: :func:`.descriptive.on_log_scale`).

    Parameters
    ----------
    values_of : mapping of int to sequence of float
        Each replicate's per-pair log ratios ``ln(T_c / T_b)``.
    level : float
        Two-sided confidence level.
    estimand : {"log_ratio", "relative_reduction"}

    Returns
    -------
    PairedInterval or None
        Its ``n`` counts replicates, not pairs; ``None`` under two replicates with a variance.

    Notes
    -----
    The equal-weight t of the decision (:func:`.hypotheses.test_of`, method ``t-replicates``): with
    ``k`` estimates ``y_r`` it is ``mean(y) -/+ t_{k-1, (1+level)/2} sd(y) / sqrt(k)``, which holds
    the spread between replicates, as the pooled paired interval over all pairs does not.
    """
    _, ys, _ = replicate_estimates(values_of)
    if len(ys) < 2:
        return None
    return on_log_scale(mean_interval(ys, level, estimand), estimand)


def replicate_times(records: Sequence[Entry]) -> dict[int, dict[str, object]]:
    """When and where each replicate ran, from its records (:func:`spans_of`): ``from`` and ``to``
    (the first and last record's ``ledger.at``, UTC), ``hosts``, and ``gap_s``, the seconds from the
    previous replicate's last record to this one's first (``None`` for the first)."""
    of_run = replicate_of_run(records)
    spans = spans_of(records, of_run)
    out: dict[int, dict[str, object]] = {}
    last: float | None = None
    for r in sorted(spans):
        lo, hi = min(s[0] for s in spans[r]), max(s[1] for s in spans[r])
        out[r] = {
            "from": _utc(lo),
            "to": _utc(hi),
            "hosts": sorted({s[2] for s in spans[r]}),
            "gap_s": None if last is None else round(lo - last, 3),
            **_cpus_and_load([x for x in records if of_run.get(str(at_path(x, "spec", "run_id"))) == r]),
        }
        last = hi
    return out


def _cpus_and_load(records: Sequence[Entry]) -> dict[str, object]:
    """What a replicate's records say of its machines (issue 58: a replicate on another CPU model
    is a stronger one): ``cpus``, each CPU model with the instruction set torch dispatched
    (``env.device_name``, ``env.cpu_capability``), and ``load``, the least and greatest 1-minute
    load average as its runs started (``env.loadavg[0]``); empty where the records hold neither."""
    cpus: set[str] = set()
    loads: list[float] = []
    for x in records:
        name = at_path(x, "env", "device_name")
        if isinstance(name, str):
            isa = at_path(x, "env", "cpu_capability")
            cpus.add(name + (f" ({isa})" if isinstance(isa, str) and isa else ""))
        avg = at_path(x, "env", "loadavg")
        if isinstance(avg, list) and avg and isinstance(avg[0], (int, float)):
            loads.append(float(avg[0]))
    return {
        **({"cpus": sorted(cpus)} if cpus else {}),
        **({"load": [min(loads), max(loads)]} if loads else {}),
    }


def by_machine(replicates: Sequence[Entry]) -> dict[str, list[float]]:
    """The replicates' estimates grouped by the CPU model(s) each ran on (``cpus`` joined; a
    replicate that names none is under ``"unknown"``): the spread by machine, beside the spread
    between replicates."""
    out: dict[str, list[float]] = {}
    for x in replicates:
        cpus, estimate = x.get("cpus"), x["estimate"]
        key = " + ".join(str(c) for c in cpus) if isinstance(cpus, list) and cpus else "unknown"
        if not isinstance(estimate, (int, float)):
            raise ValueError(f"a replicate's estimate is not a number: {estimate!r}")
        out.setdefault(key, []).append(float(estimate))
    return out


def replicate_rows(
    studies: Sequence[Entry],
    pairs_of: Mapping[tuple[str, str], Sequence[Entry]],
    level: float,
    times: Mapping[int, Mapping[str, object]] | None = None,
) -> list[dict[str, object]]:
    """The summary's ``replicates`` rows: per paired study, configuration and clock (wall and, where
    the pairs carry it, CPU), each replicate's estimate (with when and where it ran: ``times``,
    :func:`replicate_times`) and the random-effects mean, in points of the log ratio
    (``100 ln(T_c / T_b)``), with the between-replicate spread ``tau``."""
    rows: list[dict[str, object]] = []
    for st in studies:
        configs = st.get("configs")
        for config in configs if isinstance(configs, list) else []:
            pairs = pairs_of.get((str(st["name"]), config)) or []
            for clock, b, c in (
                ("wall", "baseline_training_s", "candidate_training_s"),
                ("CPU", "baseline_training_cpu_s", "candidate_training_cpu_s"),
            ):
                values_of: dict[int, list[float]] = {}
                for p in pairs:
                    r, tb, tc = p.get("replicate"), p.get(b), p.get(c)
                    if isinstance(r, int) and valid(tb, True) and valid(tc, True):
                        values_of.setdefault(r, []).append(100.0 * (math.log(tc) - math.log(tb)))
                if not values_of:
                    continue
                reps, ys, vs = replicate_estimates(values_of)
                row: dict[str, object] = {
                    "study": st["name"],
                    "config": config,
                    "clock": clock,
                    "replicates": [
                        {
                            "replicate": r,
                            "pairs": len(values_of[r]),
                            "estimate": y,
                            "se": math.sqrt(v),
                            **dict((times or {}).get(r, {})),
                        }
                        for r, y, v in zip(reps, ys, vs)
                    ],
                }
                if len(reps) >= 2:
                    row.update(random_effects(ys, vs, level))
                else:
                    row["why"] = f"{len(reps)} replicate(s) with a variance: a random-effects mean needs 2"
                rows.append(row)
    return rows
