"""The ledger and the runner's claims at scale: append ENTRIES chain entries through the real runner
and print the cost of the last hundred against the first hundred (goal: at most 2x).

A temporary git repository holds a protocol of ENTRIES / 4 pairs (each pair: two started entries
and two records). A fake executor drives the real :class:`~harness.execute.runner.Runner`: for
each unit it claims (the budget rule, the unit's runs to do, its unit attempt), then for each run
asks the attempt number, appends the started entry and appends the record of an ``ok`` result
without training anything. So what is timed is exactly the bookkeeping a study of that many runs
does: claims, the ledger's appends, MANIFEST, the state the runner reads back.

    python benchmarks/ledger_scale.py                # 10,000 entries (about a minute)
    python benchmarks/ledger_scale.py --entries 2000

Prints one line per thousand entries (the seconds per hundred entries there) and the ratio of the
last hundred's cost to the first hundred's.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROTOCOL = """\
id: scale
version: 1
description: ledger scale benchmark (nothing is trained)
preregistered: false
corpus: pydoc-topics
device: cpu
compile: false
threads: 1
launcher: forkserver
budget_device_seconds: 1000000000.0
interval_level: 0.9
hypotheses:
  descriptive: "a benchmark of the bookkeeping; nothing is decided"
order_seed: 1
studies:
  - name: pairs
    design: paired
    arms: [native, native]
    configs: [tiny_conv]
    seeds: {{count: {pairs}, base: 1}}
    steps: 1
    val_every: 1
    val_target_bpb: 7.9
"""


class FakeExecutor:
    """Claims every unit through the runner and ends each run ``ok`` at once; ``marks`` gets the
    clock after each chain entry's append."""

    name = "fake"

    def __init__(self) -> None:
        self.marks: list[float] = []

    def execute(self, runner) -> None:  # noqa: ANN001 - the runner's interface (harness.execute.base)
        from harness.execute.launchers import Outcome

        for claim in runner.claims():
            try:
                for spec in claim.todo:
                    attempt = runner.next_attempt(spec)
                    runner.started(spec, attempt, unit_attempt=claim.unit_attempt)
                    self.marks.append(time.perf_counter())
                    result = {"status": "ok", "timings": {"device_s": 0.01}}
                    runner.finished(
                        spec, attempt, Outcome(code=0, result=result, wall_s=0.01, started_at=time.time())
                    )
                    self.marks.append(time.perf_counter())
            finally:
                claim.release()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=10_000, help="chain entries to append (a multiple of 4)")
    args = ap.parse_args()
    if args.entries < 400 or args.entries % 4:
        ap.error("--entries: a multiple of 4, at least 400")
    from harness.execute.runner import Runner
    from harness.protocol import load_protocol

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "study"
        (repo / "protocols").mkdir(parents=True)
        shutil.copytree(ROOT / "configs", repo / "configs")
        (repo / ".gitignore").write_text("runs/\n")
        (repo / "protocols" / "scale.yaml").write_text(PROTOCOL.format(pairs=args.entries // 4))
        for cmd in (
            ["init", "-q", "-b", "main"],
            ["-c", "user.email=b@example.invalid", "-c", "user.name=B", "add", "-A"],
            ["-c", "user.email=b@example.invalid", "-c", "user.name=B", "commit", "-qm", "scale"],
        ):
            subprocess.run(["git", *cmd], cwd=repo, check=True)
        fake = FakeExecutor()
        runner = Runner(load_protocol(repo / "protocols" / "scale.yaml"), echo=lambda _: None, executor=fake)
        t0 = time.perf_counter()
        end = runner.run()
        marks = [t0, *fake.marks]
    assert end.left == 0 and len(fake.marks) == args.entries, (end, len(fake.marks))
    per_hundred = [marks[i + 100] - marks[i] for i in range(0, len(marks) - 100, 100)]
    for k in range(0, len(per_hundred), 10):
        print(f"entries {k * 100 + 1:>6}-{k * 100 + 100:<6} {per_hundred[k]:.3f} s per hundred")
    first, last = per_hundred[0], per_hundred[-1]
    print(f"\n{args.entries} entries in {marks[-1] - marks[0]:.1f} s")
    print(
        f"first hundred {first:.3f} s, last hundred {last:.3f} s: ratio {last / first:.2f} (goal: at most 2)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
