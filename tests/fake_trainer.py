"""A fake trainer for the in-process executor: the runner's state machine (claims, resume, budget,
ledger, interruptions) driven in milliseconds per run, with no model, no torch step and no process.

``FakeTrainer(device_s=1.0, fail={run_id}, crash_at=k)`` ends each run ``ok`` with ``device_s``
device seconds (so a budget test is exact), a deterministic test BPB, and the curves a record
holds; a run in ``fail`` raises after its training steps (a failed run, recorded with its curve),
one in ``fail_early`` before its first step (as a missing package fails it); the ``crash_at``-th call raises
:class:`Crash`, a ``BaseException`` that no executor catches, as if the machine switched off
while the run was in progress (its started entry stays without a record). ``before`` is called
with each job first (a test may start another runner there)."""

from __future__ import annotations

from collections.abc import Callable

from harness.execute.job import Job
from harness.execute.training import CPU_CLOCK, Partial


class Crash(BaseException):
    """The machine switched off mid-run."""


class FakeTrainer:
    def __init__(
        self,
        *,
        device_s: float = 1.0,
        fail: frozenset[str] | set[str] = frozenset(),
        fail_early: frozenset[str] | set[str] = frozenset(),
        crash_at: int | None = None,
        before: Callable[[Job], None] | None = None,
    ) -> None:
        self.device_s = device_s
        self.fail = set(fail)
        self.fail_early = set(fail_early)
        self.crash_at = crash_at
        self.before = before
        self.calls: list[tuple[str, int]] = []

    def __call__(self, job: Job, partial: Partial) -> None:
        spec = job.spec
        self.calls.append((spec.run_id, job.attempt))
        if self.before is not None:
            self.before(job)
        if self.crash_at is not None and len(self.calls) == self.crash_at:
            raise Crash(spec.run_id)
        if spec.run_id in self.fail_early:
            raise RuntimeError(f"deliberate failure of {spec.run_id} at start-up")
        bpb = 5.0 + (spec.seed % 7) / 100
        train_s = self.device_s / 2
        # the training clock after each step, ending at training_s as the trainer's does (the audit
        # checks a curve's last point against it)
        partial.curve = [
            [float(s), 5.5 - s / 100, train_s * s / spec.steps] for s in range(1, spec.steps + 1)
        ]
        partial.val_curve = [[float(spec.steps), bpb, train_s]]
        if spec.run_id in self.fail:
            raise RuntimeError(f"deliberate failure of {spec.run_id}")
        partial.note(
            status="ok",
            timings={  # the keys the worker writes (harness.execute.training.finish)
                "device_s": self.device_s,
                "setup_s": self.device_s / 8,
                "compile_s": 0.0,
                "training_s": train_s,
                "training_cpu_s": train_s,
                "training_cpu_clock": CPU_CLOCK["thread"],
                "time_to_target_s": train_s,  # the target (7.9 bits per byte) met at the one validation
                "validation_s": self.device_s / 16,
                "evaluation_s": self.device_s / 16,
                "checkpoint_s": self.device_s / 32,
                "rescore_s": self.device_s / 32,
                "total_s": self.device_s,
            },
            val_bpb=bpb,
            test_bpb=bpb,
        )
