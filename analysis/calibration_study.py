"""A calibration study written from a pilot: planted effects of known sizes through every design the
harness offers, interleaved in one time window (``harness calibration-study``).

The pilot gives one number, the median CPU time of a training step of the configuration's
baseline arm (each ok baseline run's ``training_cpu_s`` over its timed steps). A spin of
``size`` percent is ``round(size / 100 x that step)`` microseconds per step; the cache-heavy plant
is an ``n`` x ``n`` matrix product (its truth is measured: ``prereg/planted.py``). Every
design runs every plant on fresh seeds; ``schedule: interleaved`` puts all units in one seeded
order, so each design meets the machine's load of the same minutes. The cells at
``coverage_sizes`` run ``coverage_pairs`` pairs in designs named by ``coverage_designs``, cut into
replicate studies of ``replicate_pairs`` pairs each for the coverage of the nominal interval. With
``matmul_pairs`` 0 the study plants spins only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prereg.designs import LOCKSTEP, PAIRED
from prereg.formats.record import RunRecord
from prereg.planted import CLASS_CLOCK, CLASSES, KINDS, Verdict, verdicts

__all__ = ["CalibrationPlan", "Verdict", "pilot_step_cpu_us", "protocol_text", "verdict_lines", "verdicts"]


def pilot_step_cpu_us(records: Sequence[RunRecord], config: str) -> tuple[float, int]:
    """The median CPU time of one timed training step (microseconds) over the pilot's ok baseline
    runs of ``config``, and how many runs it is the median of."""
    per_step = []
    for r in records:
        s = r.spec
        cpu = (r.timings or {}).get("training_cpu_s")
        if (
            r.status != "ok"
            or s.config != config
            or s.role != "baseline"
            or not isinstance(cpu, (int, float))
        ):
            continue
        per_step.append(1e6 * float(cpu) / (s.steps - (s.warmup_steps or 0)))
    if not per_step:
        raise ValueError(f"the pilot has no ok baseline run of {config} with a training CPU time")
    return statistics.median(per_step), len(per_step)


@dataclass(frozen=True)
class CalibrationPlan:
    """What the written protocol runs (the command's options)."""

    id: str
    config: str
    pilot: str  # the pilot protocol's path
    pilot_command: str
    step_cpu_us: float
    pilot_runs: int
    sizes: tuple[float, ...]  # percent of a step
    designs: tuple[int, ...]  # block sizes; 0 is a process per arm
    pairs: int
    steps: int
    warmup_steps: int
    matmul_n: int
    matmul_pairs: int
    coverage_sizes: tuple[float, ...]
    coverage_designs: tuple[int, ...]
    coverage_pairs: int
    replicate_pairs: int
    seed_base: int
    order_seed: int
    threads: int
    flags: str = ""  # the command's other flags, as given, for the header (" --designs 1 ...")
    plants: tuple[tuple[str, int], ...] = ()  # other plants (kind, size), one of each effect class
    plant_pairs: int = 12  # pairs per design for each of them
    truth_runs: int = 0  # runs of each plant's truth study (0: none)
    toggle_steps: int = 2  # a truth study's blocks with and without the plant
    truth_steps: int = 600  # a truth study's steps
    load: str = ""  # the load the machine is kept under while it runs (a command), or "" (quiet)


def _design(b: int) -> str:
    return PAIRED.name if b == 0 else f"{LOCKSTEP.name}{b}"


def _study(
    name: str, block: int, plant: str, pairs: int, base: int, p: CalibrationPlan, steps: int = 0
) -> list[str]:
    head = ["  - name: " + name]
    head += (
        [f"    design: {PAIRED.name}"]
        if block == 0
        else [f"    design: {LOCKSTEP.name}", f"    block_steps: {block}"]
    )
    return head + [
        "    arms: [native, native]",
        f"    planted: {plant}",
        f"    configs: [{p.config}]",
        f"    seeds: {{count: {pairs}, base: {base}}}",
        f"    steps: {steps or p.steps}",
        *([f"    warmup_steps: {p.warmup_steps}"] if p.warmup_steps else []),
        f"    val_every: {steps or p.steps}",
        "    val_target_bpb: 8.0",
    ]


def spin_us(size: float, step_cpu_us: float) -> int:
    """The spin of ``size`` percent of a step of ``step_cpu_us`` microseconds (at least 1)."""
    return max(1, round(size / 100 * step_cpu_us))


def _studies(p: CalibrationPlan) -> tuple[list[str], dict[str, int]]:
    """Every study's YAML lines (spins, then the matmul), and the pairs per design."""
    lines: list[str] = []
    base = p.seed_base
    counts: dict[str, int] = {}
    for size in p.sizes:
        us = spin_us(size, p.step_cpu_us)
        for block in p.designs:
            cover = size in p.coverage_sizes and block in p.coverage_designs
            n = p.coverage_pairs if cover else p.pairs
            group = f", replicate_pairs: {p.replicate_pairs}" if cover else ""
            name = f"spin{str(size).replace('.', 'p')}_{_design(block)}"
            lines += _study(name, block, f"{{kind: spin, us: {us}{group}}}", n, base, p)
            counts[_design(block)] = counts.get(_design(block), 0) + n
            base += 1000
    for kind, size in p.plants:
        for block in p.designs:
            lines += _study(
                f"{_plant_name(kind, size)}_{_design(block)}",
                block,
                _plant(kind, size),
                p.plant_pairs,
                base,
                p,
            )
            counts[_design(block)] = counts.get(_design(block), 0) + p.plant_pairs
            base += 1000
    for name, plant in _truths(p) if p.truth_runs else ():
        lines += _study(name, 0, plant, p.truth_runs, base, p, p.truth_steps)
        counts["truth"] = counts.get("truth", 0) + p.truth_runs
        base += 1000
    for block in p.designs if p.matmul_pairs else ():
        n = p.matmul_pairs
        lines += _study(
            f"matmul{p.matmul_n}_{_design(block)}", block, f"{{kind: matmul, n: {p.matmul_n}}}", n, base, p
        )
        counts[_design(block)] = counts.get(_design(block), 0) + n
        base += 1000
    return lines, counts


def _plant_name(kind: str, size: int) -> str:
    """A plant in a study's name: ``gather4m``, ``copy512k``, ``sleep50us``, ``matmul200``."""
    if KINDS[kind][0] == "bytes":
        return f"{kind}{size >> 20}m" if size % (1 << 20) == 0 else f"{kind}{size >> 10}k"
    return f"{kind}{size}us" if KINDS[kind][0] == "us" else f"{kind}{size}"


def _plant(kind: str, size: int, toggle: int | None = None) -> str:
    """A plant's flow mapping in the protocol."""
    tail = f", toggle_steps: {toggle}" if toggle else ""
    return f"{{kind: {kind}, {KINDS[kind][0]}: {size}{tail}}}"


def _truths(p: CalibrationPlan) -> list[tuple[str, str]]:
    """Each plant's truth study (its name and plant): the spins, the matmul and the other plants,
    each on and off in blocks of ``toggle_steps`` in a process of its own."""
    plants = [("spin", spin_us(s, p.step_cpu_us)) for s in p.sizes]
    plants += [("matmul", p.matmul_n)] if p.matmul_pairs else []
    named = {("spin", spin_us(s, p.step_cpu_us)): f"spin{str(s).replace('.', 'p')}" for s in p.sizes}
    return [
        (f"{named.get((k, n)) or _plant_name(k, n)}_truth", _plant(k, n, p.toggle_steps))
        for k, n in plants + list(p.plants)
    ]


def _matmul_parts(p: CalibrationPlan) -> tuple[str, str, str]:
    """The cache-heavy plant's words in the description, its origin line and its seeds' clause
    (all empty when the study plants spins only)."""
    if not p.matmul_pairs:
        return "", "", ""
    return (
        f", and a cache-heavy\n  {p.matmul_n}x{p.matmul_n} matrix product (true effect measured"
        " by the longest blocks)",
        f'  matmul: "{p.matmul_n}x{p.matmul_n} float32: the cache-heavy plant of the user report this'
        ' calibration answers (a 288x288 matmul per step cost 4-5% of a tiny step)"\n',
        f"{p.matmul_pairs} per design for the matmul; ",
    )


def protocol_text(p: CalibrationPlan) -> tuple[str, dict[str, Any]]:
    """The calibration protocol's YAML text, and its studies' count of pairs per design."""
    lines, counts = _studies(p)
    sizes = ", ".join(f"{s:g}% = {spin_us(s, p.step_cpu_us)} us" for s in p.sizes)
    designs = ", ".join("a process per arm" if b == 0 else f"lockstep blocks of {b}" for b in p.designs)
    through = f"every design the harness offers ({designs})" if len(p.designs) > 1 else designs
    coverage = ", ".join(f"{s:g}" for s in p.coverage_sizes)
    matmul_text, matmul_origin, matmul_seeds = _matmul_parts(p)
    header = f"""# {p.id}: the bias of every design against planted effects of known size (docs/decisions.md,
# "The design chosen by its bias"). Written by: harness calibration-study {p.pilot} --config {p.config}{p.flags}
# (analysis/calibration_study.py); edit the options, not this file, and write it again.
id: {p.id}
version: 1
description: >-
  Planted effects of known size on {p.config} through {through},
  all units interleaved in one seeded order so every design meets the same load. Each study is an
  A/A pair of the native arm whose candidate also runs the plant in each timed step: a spin of
  fixed CPU microseconds (true effect by arithmetic) at {sizes} of a step{matmul_text}.{_classes_text(p)} Descriptive:
  it decides nothing; its bias table chooses the design.
preregistered: false
corpus: pydoc-topics
device: cpu
compile: false
threads: {p.threads}
launcher: forkserver
budget_device_seconds: {_budget(p, counts)}
interval_level: 0.95
hypotheses: {{descriptive: "a calibration study: the bias and coverage of each design against planted effects"}}
order_seed: {p.order_seed}
records_dir: records/{p.id}
schedule: interleaved
origins:
  planted: "the pilot ({p.pilot}: {p.pilot_command}) gave a median training step of {p.step_cpu_us:.0f} us of CPU time on {p.config} over {p.pilot_runs} baseline runs; each spin is that times its size, rounded ({sizes})"
{matmul_origin}  seeds: "{p.pairs} pairs per design and size; {p.coverage_pairs} at {coverage}% in {", ".join(_design(b) for b in p.coverage_designs)}, cut into replicate studies of {p.replicate_pairs} pairs for the coverage of the nominal interval; {matmul_seeds}fresh seeds from {p.seed_base}, 1000 apart per study"
  steps: "{p.steps} steps ({p.warmup_steps} warm-up steps timed apart): enough for {p.steps // max(p.designs)} blocks of the longest design"
  budget_device_seconds: "about 3 s per pair on a 2-core machine, times the pairs{" (a truth study's by its steps)" if p.truth_runs else ""}, times 2{", times 2 again under load" if p.load else ""}"
studies:
"""
    head, _, _ = header.rpartition("studies:\n")
    return head + _plant_origins(p) + "studies:\n" + "\n".join(lines) + "\n", counts


def _classes_text(p: CalibrationPlan) -> str:
    """The description's words for the other plants, the truth studies and the load (empty
    without them)."""
    out = ""
    if p.plants:
        out += (
            " Then one plant of each effect class: "
            + ", ".join(f"{_plant_name(k, n)} ({CLASSES[k]})" for k, n in p.plants)
            + "."
        )
    if p.truth_runs:
        out += (
            " Each plant's true effect is measured outside the designs: a truth study toggles it in a"
            " process of its own."
        )
    if p.load:
        out += f" Run under a known load: {p.load}."
    return out


def _plant_origins(p: CalibrationPlan) -> str:
    """The origins of the other plants and of the truth studies (empty without them)."""
    out = ""
    if p.plants:
        listed = ", ".join(f"{_plant_name(k, n)} ({CLASSES[k]})" for k, n in p.plants)
        out += (
            f"  plants: \"one plant of each effect class ({listed}), each sized near 2-5% of the pilot's "
            f'step by timing it alone, python benchmarks/plant_cost.py; {p.plant_pairs} pairs per design"\n'
        )
    if p.load:
        out += f'  load: "the machine kept busy while it ran: {p.load}"\n'
    if p.truth_runs:
        out += (
            f"  truth: \"each plant's truth study: {p.truth_runs} runs of {p.truth_steps} steps in a process "
            f"of their own whose candidate runs the plant in ABBA blocks of {p.toggle_steps} steps "
            "(prereg/planted.py, toggle_truth): its cost with no partner anywhere, the first step after "
            'each change left out"\n'
        )
    return out


def _budget(p: CalibrationPlan, counts: dict[str, int]) -> int:
    pairs = sum(v for k, v in counts.items() if k != "truth")
    truth = counts.get("truth", 0) * p.truth_steps / p.steps  # a truth run is truth_steps long
    slower = 2 if p.load else 1  # a loaded machine's runs take longer
    return 60 * (int((pairs + truth) * 3 * 2 * slower * max(1, p.steps / 200)) // 60 + 1)


def _state(loads: Sequence[float], cores: int) -> str:
    """``quiet`` when the median 1-minute load as the runs started left a core free beyond the run
    itself (below the core count), else ``loaded``; ``load unknown`` without loads."""
    if not loads:
        return "load unknown"
    return "quiet" if statistics.median(loads) < cores else "loaded"


def verdict_lines(
    runs: Sequence[tuple[str, Sequence[dict[str, Any]], Sequence[float]]], cores: int
) -> list[str]:
    """The one-screen verdict of one calibration or several (``runs``: each folder's name, planted
    rows and load averages; the same plants quiet and loaded, say): per class its best design over
    all of them (a design's worst bound over every condition), with each plant's bias, the
    runner-up, and each machine's load as the runs started (quiet or loaded)."""
    rows = [{**r, "condition": _state(loads, cores)} for _, rs, loads in runs for r in rs]
    vs = verdicts(rows)
    lines = []
    for name, _, loads in runs:
        if loads:
            med = statistics.median(loads)
            state = _state(loads, cores)
            lines.append(
                f"{name}: {state} as it ran (1-minute load average as each run started: median {med:.2f}, "
                f"{min(loads):.2f} to {max(loads):.2f}, on {cores} cores)"
            )
        else:
            lines.append(f"{name}: its load is not in these records (records before env.loadavg)")
    for cls in CLASS_CLOCK:
        ranked = [v for v in vs if v.effect_class == cls]
        if not ranked:
            continue
        best = ranked[0]
        each = "; ".join(
            f"{r['plant']} {r['condition']} {r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})"
            for r in best.rows
        )
        lines.append(
            f"{cls} ({best.clock} clock): use {best.design}: bias {each}, within +-{best.worst:.2f} points"
        )
        if len(ranked) > 1:
            lines.append(f"  next: {ranked[1].design}, within +-{ranked[1].worst:.2f}")
    lines.append(
        "Bias: the design's estimate less the truth, points of 100 x ln(T_candidate / T_baseline) (positive: "
        "read as costing more); 'within' is the far end of its 95% interval over the class's plants."
    )
    return lines
