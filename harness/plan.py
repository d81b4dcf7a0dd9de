"""The deterministic run list: balanced pair orders and Williams-balanced factorial blocks.

Units (a pair or a block) run their arms back to back. Units are listed study by study, seed by
seed, configuration by configuration. Orders are decided before any run, from the protocol's
``order_seed``:

* paired: within each (study, configuration), half of the pairs run baseline first and half
  candidate first (one more baseline-first pair when the count is odd), assigned by a seeded
  shuffle;
* lockstep: which role is built first crossed with which arm takes the first block, the four
  combinations in a seeded order in each group of four pairs;
* factorial: blocks use the rows of a Williams square of the design's cells (4 x 4 for the 2x2),
  each group of as many consecutive blocks as there are cells using all the rows in a seeded
  order, so every cell appears once in each position and immediately after every other cell once
  per group.

The rule's one home is the standard-library core, :func:`prereg.plan.plan_from_protocol`, which
the public audit runs too (:func:`audit.folder.audit_dir`): the harness plans by it from the
typed protocol the core's reader gives (:mod:`prereg.protocol`), and the audit recomputes the
plan by it from the tagged file, read by the same reader.
"""

from __future__ import annotations

from harness.protocol import Protocol
from prereg.formats.record import RunSpec, canonical, sha256_bytes
from prereg.plan import plan_from_protocol


def make_plan(proto: Protocol) -> list[RunSpec]:
    """The protocol's runs in plan order (:func:`prereg.plan.plan_from_protocol` on its typed
    protocol, ``proto.spec``, each run a :class:`~prereg.formats.record.RunSpec`)."""
    shas = {name: cfg.sha256 for name, cfg in proto.configs.items()}
    return [RunSpec.from_json(d, "plan") for d in plan_from_protocol(proto.spec, proto.sha256, shas)]


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
