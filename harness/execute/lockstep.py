"""A lockstep pair's run, in the one process that trains both arms (``design: lockstep``).

The two arms are built in plan order (the run at ``position`` 0 first), each exactly as a process
of its own builds it (seeded, its own model, arm, batch stream and clocks), and then trained in
alternating blocks of ``block_steps`` steps in ABBA order, the arm whose spec says ``steps_first``
taking the first block. Each arm's trajectory is bitwise the one its seed gives in a process of its
own: each arm keeps its own global random state (swapped in and out at block boundaries, outside
the clocks), and nothing else is shared but the corpus bytes, which nothing writes.

Nothing may leak between the arms: their parameters must not share storage, and the arm that waits
must come out of the other's block untouched (the version counters of its parameters, gradients and
optimizer state, which every in-place write bumps); otherwise the pair fails, the arm named. One arm
failing fails the pair: both results say why. Then each arm is evaluated, checkpointed and re-scored
in build order.

What a lockstep pair cannot measure per arm (its memory peak, its whole-process times) is refused at
plan time (:data:`harness.protocol.LOCKSTEP_UNMEASURABLE`); each result's ``memory`` names no
``primary`` peak, and its ``lockstep`` environment says with whom and in which order it ran.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from harness.execute.job import LockstepJob
from harness.execute.training import Partial, Prepared, RunFailure, failure, finish, prepare
from harness.records import WorkerResult

__all__ = ["PairFailed", "blocks", "execute_pair"]


def blocks(steps: int, block_steps: int) -> Iterator[tuple[int, int]]:
    """The pair's blocks in order: ``(arm, steps)``, arm 0 the one that steps first, in ABBA order
    (0, 1, 1, 0, 0, 1, ...) until each arm has taken ``steps`` steps (the last block of each arm
    may be shorter)."""
    done = [0, 0]
    k = 0
    while done[0] < steps or done[1] < steps:
        arm = (0, 1, 1, 0)[k % 4]
        k += 1
        n = min(block_steps, steps - done[arm])
        if n > 0:
            done[arm] += n
            yield arm, n


class _Slot:
    """One arm's own global random state (CPU and the device's), swapped in for its blocks."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.state = self._get()

    def _get(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.device.type == "cuda":
            return torch.get_rng_state(), torch.cuda.get_rng_state(self.device)
        if self.device.type == "mps":
            return torch.get_rng_state(), torch.mps.get_rng_state()
        return torch.get_rng_state(), None

    def enter(self) -> None:
        cpu, dev = self.state
        torch.set_rng_state(cpu)
        if dev is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(dev, self.device)
        elif dev is not None:
            torch.mps.set_rng_state(dev)

    def leave(self) -> None:
        self.state = self._get()


def _tensors(p: Prepared) -> list[torch.Tensor]:
    """An arm's tensors that training writes: parameters, their gradients, the optimizer's state."""
    params = list(dict.fromkeys(p.model.parameters()))
    out = params + [q.grad for q in params if q.grad is not None]
    opt = getattr(p.arm, "optimizer", None)
    for st in getattr(opt, "state", {}).values():
        if isinstance(st, dict):
            out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return out


def _versions(p: Prepared) -> tuple[tuple[int, int], ...]:
    return tuple((id(t), t._version) for t in _tensors(p))


def _disjoint(a: Prepared, b: Prepared) -> None:
    """The two arms' parameters share no storage (else RunFailure naming the second arm)."""
    mine = {q.untyped_storage().data_ptr() for q in a.model.parameters()}
    shared = [n for n, q in b.model.named_parameters() if q.untyped_storage().data_ptr() in mine]
    if shared:
        raise RunFailure(
            f"arm {b.run.spec.arm} ({b.run.spec.run_id}) shares storage with its partner's parameters "
            f"({', '.join(shared[:3])}): a lockstep pair's arms must hold their own tensors"
        )


class PairFailed(RuntimeError):
    """The pair failed; both partials say why (the failing arm its reason, its partner whose)."""


def execute_pair(job: LockstepJob, partials: tuple[Partial, Partial]) -> tuple[WorkerResult, WorkerResult]:
    """Run the pair, each arm noting in its ``partial`` what it measured as it goes. A failure of
    either arm fails both (:class:`PairFailed`): the partials keep what each measured, the failing
    arm's says its reason and its partner's names it."""
    active: list[int | None] = [None]  # the arm being built, trained or evaluated (job order)
    try:
        return _pair(job, partials, active)
    except Exception as e:  # as a worker process reports a failure, for each arm
        noted = failure(e)
        culprit = active[0]
        for i, partial in enumerate(partials):
            partial.note(**noted)
            if culprit is not None and i != culprit:
                name = job.jobs[culprit].spec.run_id
                partial.note(reason=f"its lockstep partner {name} failed: {noted['reason']}")
        raise PairFailed(noted["reason"]) from e


def _pair(
    job: LockstepJob, partials: tuple[Partial, Partial], active: list[int | None]
) -> tuple[WorkerResult, WorkerResult]:
    t_start = time.perf_counter()
    built: list[Prepared] = []
    slots: list[_Slot] = []
    for i, (j, partial) in enumerate(zip(job.jobs, partials)):
        active[0] = i
        p = prepare(j, partial)
        if built:
            _disjoint(built[0], p)
        built.append(p)
        slots.append(_Slot(p.run.device))  # the state its build left, as in a process of its own
        partial.note(
            env={
                **(partial.result.env or {}),
                "lockstep": {
                    "partner": j.spec.partner,
                    "block_steps": j.spec.block_steps,
                    "built": "first" if j.spec.position == 0 else "second",
                    "steps": "first" if j.spec.steps_first else "second",
                },
            }
        )
    first = 0 if job.jobs[0].spec.steps_first else 1
    order = (first, 1 - first)  # arm 0 of blocks() is the one that steps first
    spec = job.jobs[0].spec
    assert spec.block_steps is not None
    for k, n in blocks(spec.steps, spec.block_steps):
        i = active[0] = order[k]
        me, other = built[i], built[1 - i]
        idle = _versions(other)
        slots[i].enter()
        for _ in range(n):
            me.trainer.step()
        slots[i].leave()
        if _versions(other) != idle:
            raise RunFailure(
                f"arm {me.run.spec.arm} ({me.run.spec.run_id}) wrote its partner's tensors during its "
                "block: a lockstep pair's arms must not touch each other's parameters, gradients or "
                "optimizer state"
            )
    results = []
    for i, (p, partial, slot) in enumerate(zip(built, partials, slots)):
        active[0] = i
        slot.enter()
        r = finish(p, partial, total_s=time.perf_counter() - t_start)
        slot.leave()
        memory = {k: v for k, v in (r.memory or {}).items() if k != "primary"}
        memory["shared"] = "both arms of a lockstep pair in one process: the peaks are the pair's"
        partial.note(memory=memory)
        results.append(partial.result)
    return results[0], results[1]
