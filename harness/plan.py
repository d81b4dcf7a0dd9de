"""The deterministic run list: balanced pair orders and Williams-balanced factorial blocks.

Units (a pair or a block) run their arms back to back. Units are listed study by study, seed by
seed, configuration by configuration. Orders are decided here, before any run, from the
protocol's ``order_seed``:

* paired: within each (study, configuration), half of the pairs run baseline first and half
  candidate first (one more baseline-first pair when the count is odd), assigned by a seeded
  shuffle;
* lockstep: as paired, and crossed with which arm takes the first block
  (:func:`lockstep_orders`), balanced in each group of four pairs;
* factorial: blocks use the rows of a Williams square of the design's cells (4 x 4 for the 2x2;
  :func:`harness.factorial.williams`), each group of as many consecutive blocks as there are cells
  using all the rows in a seeded order, so every cell appears once in each position and
  immediately after every other cell once per group.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from harness.data.corpora import corpus_name
from harness.factorial import williams
from harness.protocol import Protocol
from harness.records import RunSpec, canonical, sha256_bytes


def _rng(proto: Protocol, *parts: object) -> random.Random:
    return random.Random(":".join(str(p) for p in (proto.order_seed, *parts)))


def make_plan(proto: Protocol) -> list[RunSpec]:
    runs: list[RunSpec] = []
    for study in proto.studies:
        orders: dict[str, list[tuple[str, ...]]] = {}
        for config in study.configs:
            n = len(study.seeds)
            seq: list[tuple[str, ...]]  # one order of the unit's roles per seed
            if study.lockstep:
                seq = lockstep_orders(_rng, proto, study.name, config, n)
            elif study.design == "paired":
                ab: tuple[str, ...] = ("baseline", "candidate")
                ba: tuple[str, ...] = ("candidate", "baseline")
                seq = [ab] * ((n + 1) // 2) + [ba] * (n // 2)
                _rng(proto, study.name, config).shuffle(seq)
            else:
                assert study.factorial is not None
                cells = study.factorial.cells
                seq = []
                for g in range(0, n, len(cells)):
                    rows = list(williams(len(cells)))
                    _rng(proto, study.name, config, g).shuffle(rows)
                    seq.extend(tuple(cells[i] for i in row) for row in rows[: min(len(cells), n - g)])
            orders[config] = seq
        for si, seed in enumerate(study.seeds):
            for config in study.configs:
                cfg = proto.configs[config]
                kind = "pair" if study.design == "paired" else "block"
                unit = f"{study.name}.{config}.{kind}{si:03d}"
                roles = [r for r in orders[config][si] if r != FIRST_BUILT_STEPS_SECOND]
                second = FIRST_BUILT_STEPS_SECOND in orders[config][si]
                for pos, role in enumerate(roles):
                    arm = (
                        study.factorial.arm_of(role)
                        if study.factorial is not None
                        else study.arms[0 if role == "baseline" else 1]
                    )
                    runs.append(
                        RunSpec(
                            run_id=f"{unit}.{role}",
                            protocol_id=proto.id,
                            protocol_sha256=proto.sha256,
                            study=study.name,
                            design=study.design,
                            config=config,
                            config_sha256=cfg.sha256,
                            arm=arm,
                            role=role,
                            seed=seed,
                            unit=unit,
                            position=pos,
                            order=len(runs),
                            steps=study.steps,
                            val_every=study.val_every,
                            val_target_bpb=study.val_target_bpb[config],
                            corpus=corpus_name(proto.corpus),
                            data_dir=proto.data_dir,
                            device=proto.device,
                            compile=proto.compile,
                            threads=proto.threads,
                            block_steps=study.block_steps,
                            partner=f"{unit}.{roles[1 - pos]}" if study.lockstep else None,
                            steps_first=(pos == (1 if second else 0)) if study.lockstep else None,
                        )
                    )
    return runs


#: In a lockstep pair's order, after its two roles: the arm built first takes the second block.
FIRST_BUILT_STEPS_SECOND = "steps-second"


def lockstep_orders(
    rng: Callable[..., random.Random], proto: Protocol, study: str, config: str, n: int
) -> list[tuple[str, ...]]:
    """Each lockstep pair's order: which role is built first (its run's ``position`` 0) crossed with
    whether the arm built first also takes the first block, the four combinations in a seeded order
    in each group of four consecutive pairs, so both are balanced and not confounded."""
    ab: tuple[str, ...] = ("baseline", "candidate")
    ba: tuple[str, ...] = ("candidate", "baseline")
    combos = [ab, ab + (FIRST_BUILT_STEPS_SECOND,), ba, ba + (FIRST_BUILT_STEPS_SECOND,)]
    seq: list[tuple[str, ...]] = []
    for g in range(0, n, 4):
        group = list(combos)
        rng(proto, study, config, "lockstep", g).shuffle(group)
        seq.extend(group[: min(4, n - g)])
    return seq


def plan_sha256(runs: list[RunSpec]) -> str:
    return sha256_bytes(canonical([r.to_json() for r in runs]))


def units(runs: list[RunSpec]) -> list[list[RunSpec]]:
    """Runs grouped by unit, in plan order."""
    out: list[list[RunSpec]] = []
    for r in runs:
        if out and out[-1][0].unit == r.unit:
            out[-1].append(r)
        else:
            out.append([r])
    return out
