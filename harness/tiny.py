"""The tiny study: the smallest protocol the harness runs end to end (the tiny convolution model,
native against cotangent, one thread per run, one non-inferiority hypothesis on test BPB), as the
test suite's studies and the Ray throughput benchmark write it (one builder, so both run the same
study)."""

from __future__ import annotations

from collections.abc import Sequence

_TEXT = """\
id: {id}
version: 1
description: {description}
preregistered: {prereg}
corpus: {corpus}
{data_dir}device: cpu
compile: false
threads: 1
launcher: {launcher}
budget_device_seconds: {budget}
interval_level: 0.9
hypotheses:
  procedure: fixed_sequence
  family_alpha: 0.05
  min_pairs: 3
  tests:
    - id: H1
      study: pairs
      endpoint: test_bpb
      estimand: difference
      type: non_inferiority
      margin: 0.01
      better: lower
order_seed: 1
studies:
  - name: pairs
    design: paired
    arms: [native, cotangent]
    configs: [tiny_conv]
    seeds: {seeds}
    steps: {steps}
    val_every: {val_every}
    val_target_bpb: 7.9
"""


def tiny_protocol(
    *,
    id: str = "tiny",
    description: str = "tiny test protocol",
    prereg: str = "false",
    corpus: str = "pydoc-topics",
    data_dir: str = "",
    launcher: str = "forkserver",
    budget: float = 600,
    steps: int = 10,
    seeds: Sequence[int] = (1, 2),
    val_every: int = 5,
) -> str:
    """The tiny study's protocol text. ``prereg``: the ``preregistered`` value as written
    (``"true"`` or ``"false"``); ``data_dir``: a whole ``data_dir: ...`` line (with its newline) or
    nothing; ``corpus``: the ``corpus`` value as written (a name, or a flow mapping)."""
    return _TEXT.format(
        id=id,
        description=description,
        prereg=prereg,
        corpus=corpus,
        data_dir=data_dir,
        launcher=launcher,
        budget=budget,
        steps=steps,
        seeds=list(seeds),
        val_every=val_every,
    )
