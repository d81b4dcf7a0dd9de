"""PackedAdamW's modes (cotangent/modes.py): packed, native, and auto, which measures the first
iterations and may step natively from then on. Every mode and every switch between them must give
the bits of native ``AdamW(fused=True)`` + ``clip_grad_norm_``: parameters, gradients, state
(``exp_avg``, ``exp_avg_sq``, ``step``) and the norm, step by step, and state dicts loaded either way."""

from __future__ import annotations

import collections
import copy
import ctypes
import gc
import io
import itertools
import math
import os
import random
import sys
import warnings
import weakref

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from cotangent import PackedAdamW, clip_grad_norm_
from cotangent.modes import BLOCKS, COVERAGE, ENV, LEVEL, PATTERN, RANK, WARMUP, Chooser, bound, order_rank
from cotangent.pack import Pack
from cotangent.verify import bitwise_equal, state_dict_difference

FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shape_st = st.lists(st.integers(1, 24), min_size=1, max_size=3).map(tuple)
hyper_st = st.fixed_dictionaries(
    {
        "lr": st.sampled_from([1e-3, 1e-2, 0.3]),
        "betas": st.sampled_from([(0.9, 0.999), (0.5, 0.9), (0.9, 0.95)]),
        "eps": st.sampled_from([1e-8, 1e-6]),
        "weight_decay": st.sampled_from([0.0, 1e-2, 0.1]),
        "amsgrad": st.booleans(),
        "maximize": st.booleans(),
    }
)


def same(xs, ys):
    return all(bitwise_equal(x.detach(), y.detach()) for x, y in zip(xs, ys))


def same_state(oa, ob, a, b):
    for x, y in zip(a, b):
        assert set(oa.state[x]) == set(ob.state[y])
        for k in oa.state[x]:
            assert bitwise_equal(oa.state[x][k], ob.state[y][k]), k
            assert oa.state[x][k].stride() == ob.state[y][k].stride(), k


def twins(shapes, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    return [t.clone().requires_grad_() for t in init], [t.clone().requires_grad_() for t in init], gen


def backward_both(a, b, gen, missing):
    """The same gradients into both, through backward (a parameter in ``missing`` gets none)."""
    for k, (x, y) in enumerate(zip(a, b)):
        if k in missing:
            continue
        g = torch.randn(x.shape, generator=gen).to(x.dtype)
        torch.autograd.backward(x * 1.0, g)
        torch.autograd.backward(y * 1.0, g)


def grads_equal(a, b):
    for x, y in zip(a, b):
        assert (x.grad is None) == (y.grad is None)
        if x.grad is not None:
            assert bitwise_equal(x.grad, y.grad) and x.grad.stride() == y.grad.stride()


@FEW
@given(
    shapes=st.lists(shape_st, min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    hyper=hyper_st,
    schedule=st.lists(st.sampled_from(["packed", "native"]), min_size=2, max_size=7),
    phase=st.sampled_from(["one_pass", "three_calls"]),
    reload_at=st.integers(-1, 6),
    skip=st.integers(-1, 3),
    seed=st.integers(0, 2**16),
)
def test_every_mode_and_switch_is_bitwise_native(
    shapes, dtype, hyper, schedule, phase, reload_at, skip, seed
):
    """Random shapes, dtypes and hyperparameters; the mode switched between steps as ``schedule``
    says (a switch mid-run), a parameter without a gradient at some steps, a state dict round trip
    into a new optimizer of either mode: native's bits at every step."""
    a, b, gen = twins(shapes, dtype, seed)
    oa = torch.optim.AdamW(a, fused=True, **hyper)
    ob = PackedAdamW(b, **hyper, mode=schedule[0])
    for step, mode in enumerate(schedule):
        ob.set_mode(mode)
        assert ob.mode == mode
        missing = {skip} if step % 3 == 1 else set()
        backward_both(a, b, gen, missing)
        grads_equal(a, b)
        na = torch.nn.utils.clip_grad_norm_(a, 1.0)
        oa.step()
        oa.zero_grad()
        if phase == "one_pass":
            nb = ob.clip_step_zero_grad(1.0)
        else:
            nb = clip_grad_norm_(b, 1.0)
            ob.step()
            ob.zero_grad()
        assert bitwise_equal(na, nb), f"norm at step {step} ({mode})"
        assert same(a, b), f"parameters at step {step} ({mode})"
        same_state(oa, ob, a, b)
        grads_equal(a, b)
        if step == reload_at:  # round trip into a new optimizer of the next step's mode, the old one dropped
            sd = ob.state_dict()
            del ob
            gc.collect()
            ob = PackedAdamW(b, **hyper, mode=schedule[(step + 1) % len(schedule)])
            ob.load_state_dict(sd)
            same_state(oa, ob, a, b)
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sa["state"]:
        assert all(bitwise_equal(sa["state"][k][n], sb["state"][k][n]) for n in sa["state"][k])


@pytest.mark.filterwarnings(r"ignore:PackedAdamW. parameter 0's .grad")  # made natively: said
@pytest.mark.parametrize("first", ["packed", "native"])
def test_switch_with_gradients_present_keeps_their_bits(first):
    """A switch while gradients exist (``zero_grad(set_to_none=False)``, or between two backwards
    that accumulate): each keeps its bits, and the accumulation is native's."""
    a, b, gen = twins([(16, 8), (8,), (3, 5)], torch.float32, 3)
    oa = torch.optim.AdamW(a, fused=True, weight_decay=0.1)
    ob = PackedAdamW(b, weight_decay=0.1, mode=first)
    modes = itertools.cycle(["native", "packed"] if first == "packed" else ["packed", "native"])
    for step in range(6):
        backward_both(a, b, gen, set())
        ob.set_mode(next(modes))  # between two backwards: the second accumulates
        backward_both(a, b, gen, set())
        grads_equal(a, b)
        oa.step()
        ob.step()
        oa.zero_grad(set_to_none=step % 2 == 0)
        ob.zero_grad(set_to_none=step % 2 == 0)
        ob.set_mode(next(modes))  # gradients of +0.0 present after zero_grad(set_to_none=False)
        grads_equal(a, b)
        assert same(a, b), step
        same_state(oa, ob, a, b)


def test_native_mode_delivers_no_gradient_into_the_flat_buffer():
    """Natively stepping, backward stores its own gradient (outside the flat buffer), as native's;
    ``mode="native"`` at construction is native for good: no flat buffer at all, until
    ``set_mode("packed")`` lays the parameters out again."""
    b = [torch.randn(32, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    ob = PackedAdamW(b, mode="native")
    (b[0].sum() + b[1].sum()).backward()
    assert ob.flat_groups == [] and ob._pack is None
    assert ob.phase_kernel().startswith("native")
    assert all(bitwise_equal(p.grad, torch.ones_like(p)) for p in b)
    ob.set_mode("packed")
    assert all(bitwise_equal(p.grad, torch.ones_like(p)) for p in b)  # kept across the layout
    flat = ob.flat_groups[0].grad
    lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
    ob.zero_grad()
    (b[0].sum() + b[1].sum()).backward()
    assert all(lo <= p.grad.data_ptr() < hi for p in b)


class FakeClock:
    """Iteration times chosen by the test: ``packed`` and ``native`` seconds per iteration."""

    def __init__(self, opt, packed, native):
        self.opt, self.cost, self.now = opt, {"packed": packed, "native": native}, 0.0

    def __call__(self):
        self.now += self.cost[self.opt.mode]
        return self.now


@pytest.mark.parametrize("slower", ["packed", "native"])
def test_auto_steps_natively_where_packed_is_slower_and_says_so_once(slower):
    """``mode="auto"``: warm-up packed, ABBA-alternated iterations, then the faster mode for good;
    native's bits throughout, and one warning naming the measurement where it falls back."""
    a, b, gen = twins([(24, 8), (8,)], torch.float32, 5)
    oa = torch.optim.AdamW(a, fused=True, weight_decay=0.1)
    ob = PackedAdamW(b, weight_decay=0.1, mode="auto")
    ob._chooser.clock = FakeClock(ob, 0.012 if slower == "packed" else 0.010, 0.011)
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(WARMUP + 4 * BLOCKS + 6):
            seen.append(ob.mode)
            backward_both(a, b, gen, set())
            na = torch.nn.utils.clip_grad_norm_(a, 1.0)
            oa.step()
            oa.zero_grad()
            if step % 2:
                nb = ob.clip_step_zero_grad(1.0)
            else:  # the three calls: the zero_grad after a step ends the iteration
                nb = clip_grad_norm_(b, 1.0)
                ob.step()
                ob.zero_grad()
                ob.zero_grad()  # a second one, with no step between, is no iteration
            assert bitwise_equal(na, nb) and same(a, b), step
            same_state(oa, ob, a, b)
    assert seen[:WARMUP] == ["packed"] * WARMUP
    assert seen[WARMUP : WARMUP + 4 * BLOCKS] == list(PATTERN) * BLOCKS
    expect = "native" if slower == "packed" else "packed"
    assert set(seen[WARMUP + 4 * BLOCKS :]) == {expect}
    packed_ms = "12.000" if slower == "packed" else "10.000"
    assert ob.mode_report is not None and f"{packed_ms} ms packed, 11.000 ms native" in ob.mode_report
    fallbacks = [w for w in caught if "PackedAdamW(mode='auto') measured" in str(w.message)]
    assert len(fallbacks) == (1 if expect == "native" else 0)
    if fallbacks:
        assert "11.000 ms native" in str(fallbacks[0].message)
        assert fallbacks[0].filename == __file__  # it names the user's line, not the package's


def test_chooser_schedule_and_decision():
    """The schedule by itself: WARMUP packed, then BLOCKS blocks of PATTERN, then the decision."""
    times = iter(range(100))
    c = Chooser(clock=lambda: float(next(times)))  # whole seconds: every iteration exactly 1.0
    modes, mode = [], "packed"
    for _ in range(WARMUP + 4 * BLOCKS + 2):
        mode = c.tick(mode)
        modes.append(mode)
    assert modes[: WARMUP - 1] == ["packed"] * (WARMUP - 1)
    assert modes[WARMUP - 1 : WARMUP - 1 + 4 * BLOCKS] == list(PATTERN) * BLOCKS
    assert c.decided == "native"  # equal times: packed is not clearly faster, so it steps natively
    assert c.ratio == 1.0 and c.upper == 1.0
    assert c.tick("native") == "native" and c.ticks == WARMUP + 4 * BLOCKS  # decided: no more clock
    assert len(c.times["packed"]) == len(c.times["native"]) == 2 * BLOCKS


def test_mode_from_the_environment_and_refused_values(monkeypatch):
    """``mode=None`` takes COTANGENT_MODE; a bad value is refused, naming it, before any parameter moves."""
    p = torch.randn(4, 3, requires_grad=True)
    ptr = p.data_ptr()
    monkeypatch.setenv(ENV, "fast")
    with pytest.raises(ValueError, match="COTANGENT_MODE='fast'"):
        PackedAdamW([p])
    with pytest.raises(ValueError, match="mode must be one of auto, packed, native"):
        PackedAdamW([p], mode="quick")
    assert p.data_ptr() == ptr  # not packed: nothing was modified
    monkeypatch.setenv(ENV, "native")
    opt = PackedAdamW([p])
    assert opt.mode == "native" and opt._chooser is None
    with pytest.raises(ValueError, match="set_mode: mode must be 'packed' or 'native'"):
        opt.set_mode("auto")
    del opt
    gc.collect()
    monkeypatch.delenv(ENV)
    opt = PackedAdamW([p])
    assert opt.mode == "packed" and opt._chooser is not None


def test_native_mode_refuses_what_packed_refuses():
    """Stepping natively over the packed layout (``set_mode("native")``), rebinding a parameter
    and a second optimizer over the same parameters: the same errors, before anything moves."""
    p = torch.randn(6, 2, requires_grad=True)
    opt = PackedAdamW([p], mode="packed")
    opt.set_mode("native")
    with pytest.raises(RuntimeError, match="another PackedAdamW already holds these parameters"):
        PackedAdamW([p], mode="native")
    p.sum().backward()
    before = p.detach().clone()
    p.data = torch.zeros(6, 2)
    with pytest.raises(RuntimeError, match="was rebound"):
        opt.step()
    assert not opt.state
    assert bitwise_equal(before, opt.flat_groups[0].param.view(6, 2))  # the packed weights unmoved


def test_native_for_good_allows_what_native_allows():
    """Native for good (``mode="native"``): the parameters are the user's again, so a second
    optimizer over them and a rebound parameter (``p.data = t``) work as natively, bit for bit."""
    a, b, gen = twins([(6, 2)], torch.float32, 2)
    oa = torch.optim.AdamW(a, fused=True)
    ob = PackedAdamW(b, mode="native")
    other = PackedAdamW(b, mode="native")  # native allows a second optimizer
    assert other.param_groups[0]["params"][0] is b[0]
    del other
    backward_both(a, b, gen, set())
    for x in (a[0], b[0]):
        x.data = torch.full((6, 2), 0.5)
    oa.step()
    ob.step()
    assert same(a, b)
    same_state(oa, ob, a, b)


@pytest.mark.parametrize("switch_at", [None, 2])
def test_clip_in_step_and_closures_natively(switch_at):
    """A loop a framework owns (``clip_in_step``: ``step(closure)`` then ``zero_grad``) stepping
    natively, switched to packed mid-run or not: native's clip, step and zero_grad, bit for bit."""
    a, b, gen = twins([(12, 6), (6,), (5, 3)], torch.float32, 11)
    oa = torch.optim.AdamW(a, fused=True, weight_decay=0.1, lr=0.05)
    ob = PackedAdamW(b, weight_decay=0.1, lr=0.05, mode="native")
    ob.clip_in_step(0.5)
    for step in range(5):
        if step == switch_at:
            ob.set_mode("packed")
        grads = [torch.randn(x.shape, generator=gen) for x in a]

        def closure(ps=b, grads=grads, step=step):
            for y, g in zip(ps, grads):
                torch.autograd.backward(y * 1.0, g)
            return torch.tensor(float(step))

        for x, g in zip(a, grads):
            torch.autograd.backward(x * 1.0, g)
        na = torch.nn.utils.clip_grad_norm_(a, 0.5)
        oa.step()
        oa.zero_grad()
        assert ob.step(closure) == step
        ob.zero_grad()
        assert bitwise_equal(na, ob.last_total_norm) and same(a, b), step
        same_state(oa, ob, a, b)
        grads_equal(a, b)


def test_grad_scaler_steps_natively_and_across_a_switch():
    """``GradScaler`` (enabled: scaled losses, an inf step skipped) with the optimizer stepping
    natively, then packed, then natively: native's bits, the skipped step included."""
    a, b, gen = twins([(10, 4), (4,)], torch.float32, 17)
    oa = torch.optim.AdamW(a, fused=True, weight_decay=0.1)
    ob = PackedAdamW(b, weight_decay=0.1, mode="native")
    sa = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    sb = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    for step, mode in enumerate(["native", "native", "packed", "native", "packed", "native"]):
        ob.set_mode(mode)
        grads = [torch.randn(x.shape, generator=gen) for x in a]
        if step == 3:
            grads[0][0, 0] = float("inf")  # this step is skipped and the scale backs off
        for ps, opt, sc in ((a, oa, sa), (b, ob, sb)):
            for x, g in zip(ps, grads):
                torch.autograd.backward(sc.scale(x * 1.0), g)
            sc.step(opt)
            sc.update()
            opt.zero_grad()
        assert same(a, b) and sa.get_scale() == sb.get_scale(), step
        same_state(oa, ob, a, b)


def test_order_statistic_bound_against_scipy():
    """The bound's rank and confidence are the sign test's: checked against scipy's binomial, and
    against the order statistic's coverage simulated from skewed, heavy-tailed values."""
    binom = pytest.importorskip("scipy.stats").binom
    assert (BLOCKS, RANK) == (12, 10)
    assert COVERAGE == pytest.approx(binom.cdf(RANK - 1, BLOCKS, 0.5), rel=1e-12) and COVERAGE >= LEVEL
    assert binom.cdf(RANK - 2, BLOCKS, 0.5) < LEVEL  # the smallest rank that reaches LEVEL
    for n, level in [(5, 0.9), (20, 0.95), (30, 0.99)]:
        j = order_rank(n, level)
        assert binom.cdf(j - 1, n, 0.5) >= level > binom.cdf(j - 2, n, 0.5)
    rng = random.Random(3)
    below = 0
    for _ in range(4000):  # exp(N(0, 1)) - 1: skewed, heavy-tailed, median 0
        logs = [math.exp(rng.gauss(0, 1)) - 1.0 for _ in range(BLOCKS)]
        _, upper = bound(logs)
        below += math.log(upper) < 0.0
    assert below / 4000 == pytest.approx(1 - COVERAGE, abs=0.008)
    assert bound([0.0] * (BLOCKS - 1))[1] == math.inf  # too few blocks: not clearly faster


class SimClock:
    """Simulated iteration times for :class:`Chooser`: lognormal noise ``sigma`` per iteration, a
    slow random-walk drift, and with probability ``spikes`` an outlier 1.5-3x long (a GC pause,
    another process); packed's iterations ``ratio`` times native's."""

    def __init__(self, rng, ratio, sigma=0.03, drift=0.003, spikes=0.02):
        self.rng, self.ratio, self.sigma, self.drift, self.spikes = rng, ratio, sigma, drift, spikes
        self.now, self.level, self.mode = 0.0, 0.0, "packed"

    def __call__(self):
        self.level += self.rng.gauss(0.0, self.drift)
        t = (
            0.01
            * (self.ratio if self.mode == "packed" else 1.0)
            * math.exp(self.level + self.rng.gauss(0.0, self.sigma))
        )
        if self.rng.random() < self.spikes:
            t *= self.rng.uniform(1.5, 3.0)
        self.now += t
        return self.now


def packed_rate(ratio, n, seed, **noise):
    """How often the rule keeps packed, over ``n`` simulated loops whose packed / native is ``ratio``."""
    rng = random.Random(seed)
    kept = 0
    for _ in range(n):
        clock = SimClock(rng, ratio, **noise)
        c = Chooser(clock=clock)
        while c.decided is None:
            clock.mode = c.tick(clock.mode)
        kept += c.decided == "packed"
    return kept / n


#: (packed / native, noise, the most (or least) often the rule may keep packed): the error rate
#: where packed is no faster (at most 1 - LEVEL at a tie, far less where packed is slower) and the
#: power where it is clearly faster. Printed with ``pytest -s``; docs/method.md quotes them.
SIMULATED = [
    (1.0, {}, "at most", 0.025),
    (1.0, {"sigma": 0.08, "spikes": 0.05}, "at most", 0.025),
    (1.01, {}, "at most", 0.01),
    (1.035, {}, "at most", 0.001),
    (1.056, {"sigma": 0.08, "spikes": 0.05}, "at most", 0.01),
    (0.96, {}, "at least", 0.8),
    (0.985, {}, "at least", 0.1),
]


@pytest.mark.parametrize("ratio,noise,side,rate", SIMULATED)
def test_decision_error_rate_by_simulation(ratio, noise, side, rate):
    """The rule's error rate, simulated (2000 loops, fixed seed; the whole Chooser, not a copy of
    its arithmetic): a wrong "packed" (packed kept where it is no faster) is rare, and packed is
    kept where it is clearly faster."""
    got = packed_rate(ratio, 2000, seed=int(ratio * 1e4) + len(noise), **noise)
    print(
        f"packed / native {ratio}, noise {noise or 'sigma 0.03, drift 0.003, spikes 0.02'}: packed kept {got:.4f}"
    )
    assert got <= rate if side == "at most" else got >= rate


def test_chooser_synchronises_only_while_measuring():
    """``sync`` (``torch.cuda.synchronize`` for CUDA tensors) runs before each clock reading while
    measuring and never after the decision; an optimizer over CPU tensors has none."""
    calls = []
    times = iter(range(1000))
    c = Chooser(clock=lambda: float(next(times)), sync=lambda: calls.append(1))
    mode = "packed"
    for _ in range(WARMUP + 4 * BLOCKS + 10):
        mode = c.tick(mode)
    assert len(calls) == WARMUP + 4 * BLOCKS and c.decided is not None
    opt = PackedAdamW([torch.randn(3, requires_grad=True)], mode="auto")
    assert opt._chooser.sync is None


def resident(t):
    """How many of the pages under ``t``'s storage are resident (Linux ``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    start = t.data_ptr() // page * page
    length = t.data_ptr() + t.numel() * t.element_size() - start
    n = (length + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0
    return sum(v & 1 for v in vec)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore, madvise: Linux")
@pytest.mark.filterwarnings(r"ignore:PackedAdamW\(mode='auto'\) measured")
def test_auto_deciding_native_gives_the_gradient_pages_back():
    """Auto adds no memory once it steps natively: the flat gradient buffer's pages (kept while it
    measures) are given back at the decision, and backward stores its own gradients from then on."""
    p = torch.randn(256, 1024, requires_grad=True)  # 1 MiB of gradients
    opt = PackedAdamW([p], mode="auto")
    opt._chooser.clock = FakeClock(opt, 0.012, 0.010)
    flat = opt.flat_groups[0].grad
    for _ in range(WARMUP + 4 * BLOCKS + 2):
        (p * 1.0).sum().backward()
        opt.clip_step_zero_grad(1.0)
        if opt._chooser is not None:
            assert (
                resident(flat) > flat.numel() * 4 // os.sysconf("SC_PAGE_SIZE") // 2
            )  # kept while measuring
    assert opt.mode == "native" and opt._chooser is None
    assert resident(flat) <= 2  # given back (at most the partial pages at its ends)
    (p * 1.0).sum().backward()
    assert p.grad.data_ptr() != flat.data_ptr() and resident(flat) <= 2


def python_calls(fn):
    """How many Python-level calls ``fn()`` makes (cProfile's count, builtins included)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    return pstats.Stats(prof).total_calls


@pytest.mark.filterwarnings(r"ignore:PackedAdamW\(mode='auto'\) measured")
def test_native_for_good_is_native_s_work():
    """Once auto has chosen native: no hook left on any parameter, no clock read, and
    ``zero_grad`` is native's own call (one Python call more than native's: the method itself)."""
    a, b, gen = twins([(16, 8), (8,), (4, 4)], torch.float32, 23)
    oa = torch.optim.AdamW(a, fused=True)
    ob = PackedAdamW(b, mode="auto")
    ob._chooser.clock = FakeClock(ob, 0.012, 0.010)
    for _ in range(WARMUP + 4 * BLOCKS + 1):
        backward_both(a, b, gen, set())
        torch.nn.utils.clip_grad_norm_(a, 1.0)
        oa.step()
        oa.zero_grad()
        ob.clip_step_zero_grad(1.0)
    assert ob.mode == "native" and ob._chooser is None and ob._pack is None
    assert all(not p._backward_hooks and not getattr(p, "_post_accumulate_grad_hooks", None) for p in b)
    backward_both(a, b, gen, set())
    assert python_calls(lambda: ob.zero_grad()) <= python_calls(lambda: oa.zero_grad()) + 1
    assert all(p.grad is None for p in b) and same(a, b)


class Scripted:
    """A chooser that runs the modes ``modes`` (one per iteration), then decides ``final``: the
    switch to native for good at an iteration the test picks, without timing anything."""

    def __init__(self, modes, final="native"):
        self.modes, self.final = list(modes), final
        self.decided = self.report = self.sync = None

    def tick(self, current):
        if self.modes:
            return self.modes.pop(0)
        self.decided, self.report = self.final, f"scripted: {self.final} for good"
        return self.final


def storages_of(tensors):
    """``{data_ptr: nbytes}`` of the distinct storages under ``tensors``."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def held_by(opt, params):
    """The tensors an optimizer keeps for ``params``: the parameters, gradients and state."""
    out = [p.detach() for p in params] + [p.grad for p in params if p.grad is not None]
    return out + [t for p in params for t in opt.state.get(p, {}).values() if isinstance(t, torch.Tensor)]


def conv_twins(shapes, dtype, seed, channels_last):
    """``twins``, plus a 4-d convolution weight, channels_last where asked (native's strides kept)."""
    a, b, gen = twins(shapes, dtype, seed)
    w = torch.randn(6, 3, 3, 3, generator=gen).to(dtype)
    if channels_last:
        w = w.contiguous(memory_format=torch.channels_last)
    return a + [w.clone().requires_grad_()], b + [w.clone().requires_grad_()], gen


@pytest.mark.filterwarnings("ignore:scripted")
@FEW
@given(
    shapes=st.lists(shape_st, min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    hyper=hyper_st,
    start=st.sampled_from(["auto", "native"]),
    before=st.lists(st.sampled_from(["packed", "native"]), max_size=4),
    phase=st.sampled_from(["one_pass", "three_calls"]),
    set_to_none=st.booleans(),
    channels_last=st.booleans(),
    threads=st.sampled_from([1, 2]),
    skip=st.integers(-1, 3),
    seed=st.integers(0, 2**16),
)
def test_native_for_good_over_the_switch_is_bitwise_native(
    shapes, dtype, hyper, start, before, phase, set_to_none, channels_last, threads, skip, seed
):
    """Against native ``AdamW(fused=True)`` + ``clip_grad_norm_``, with an LR scheduler on each:
    ``mode="native"`` from the start, or ``"auto"`` running ``before`` and then choosing native at
    that point. Every step, across the switch: the norm, the parameters, the gradients, the state
    (strides included) bit for bit; after it the parameters, gradients and state have storage of
    their own in native's layout, and what the user held (``param_groups``, ``state``, a state
    entry's tensors, the scheduler) is still the optimizer's."""
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b, gen = conv_twins(shapes, dtype, seed, channels_last)
        oa = torch.optim.AdamW(a, fused=True, **hyper)
        ob = PackedAdamW(b, **hyper, mode=start)
        if start == "auto":
            ob._chooser = Scripted(before)
        sa = torch.optim.lr_scheduler.StepLR(oa, step_size=2, gamma=0.5)
        sb = torch.optim.lr_scheduler.StepLR(ob, step_size=2, gamma=0.5)
        groups, state, kept = ob.param_groups, ob.state, None
        for step in range(len(before) + 4):
            missing = {skip} if step % 3 == 1 else set()
            backward_both(a, b, gen, missing)
            grads_equal(a, b)
            na = torch.nn.utils.clip_grad_norm_(a, 1.0)
            oa.step()
            oa.zero_grad(set_to_none)
            if phase == "one_pass":
                nb = ob.clip_step_zero_grad(1.0, set_to_none=set_to_none)
            else:
                nb = clip_grad_norm_(b, 1.0)
                ob.step()
                ob.zero_grad(set_to_none)
            sa.step()
            sb.step()
            assert bitwise_equal(na, nb), f"norm at step {step}"
            assert same(a, b) and [x.stride() for x in a] == [y.stride() for y in b], step
            same_state(oa, ob, a, b)
            grads_equal(a, b)
            if kept is None and ob.state.get(b[-1]):
                kept = dict(ob.state[b[-1]])  # the user holds an entry's tensors across the switch
        assert ob._own and ob._pack is None and ob.flat_groups == []
        assert ob.param_groups is groups and ob.state is state
        assert all(ob.state[b[-1]][k] is t for k, t in kept.items())
        # each tensor its own storage, of its own size, as native's
        assert sorted(storages_of(held_by(ob, b)).values()) == sorted(storages_of(held_by(oa, a)).values())
        da, db = oa.state_dict(), ob.state_dict()
        assert da["param_groups"] == db["param_groups"]
        for k in da["state"]:
            assert all(bitwise_equal(da["state"][k][n], db["state"][k][n]) for n in da["state"][k])
    finally:
        torch.set_num_threads(saved_threads)


def packed_storages(opt):
    """Handles on the storages of every packed buffer, and weak references to the buffers."""
    tensors = [
        t
        for g in opt.flat_groups
        for t in (g.param, g.grad, g.exp_avg, g.exp_avg_sq, g.steps, g.max_exp_avg_sq)
        if t is not None
    ]
    return [t.untyped_storage() for t in tensors], [weakref.ref(t) for t in tensors]


def assert_freed(handles, refs, params):
    """No tensor keeps a packed buffer alive (each storage's only holder is the test's handle), no
    hook is left on a parameter, and no layout has them in its registry."""
    gc.collect()
    assert [torch._C._storage_Use_Count(s._cdata) for s in handles] == [1] * len(handles)
    assert all(r() is None for r in refs)
    assert all(not p._backward_hooks and not getattr(p, "_post_accumulate_grad_hooks", None) for p in params)
    assert not any(id(p) in Pack._registry for p in params)


@pytest.mark.filterwarnings("ignore:scripted")
@pytest.mark.parametrize("backward_norms", [False, True])
def test_auto_choosing_native_frees_the_packed_buffers(backward_norms):
    """Once ``"auto"`` chose native: the packed buffers are freed, and the memory the optimizer
    keeps (parameters, gradients, state) is native's, tensor for tensor, in native's strides."""
    a, b, gen = conv_twins([(64, 32), (32,)], torch.float32, 7, channels_last=True)
    oa = torch.optim.AdamW(a, fused=True, amsgrad=True)
    ob = PackedAdamW(b, mode="auto", amsgrad=True, backward_norms=backward_norms)
    ob._chooser = Scripted(["native", "packed"])
    handles, refs = packed_storages(ob)
    for _ in range(4):
        backward_both(a, b, gen, set())
        torch.nn.utils.clip_grad_norm_(a, 1.0)
        oa.step()
        oa.zero_grad()
        ob.clip_step_zero_grad(1.0)
    assert same(a, b)
    same_state(oa, ob, a, b)
    assert_freed(handles, refs, b)
    backward_both(a, b, gen, set())
    assert sorted(storages_of(held_by(ob, b)).values()) == sorted(storages_of(held_by(oa, a)).values())
    assert [x.stride() for x in a] == [y.stride() for y in b]
    assert [x.grad.stride() for x in a] == [y.grad.stride() for y in b]


def test_native_from_construction_frees_the_packed_buffers(monkeypatch):
    """``mode="native"``: the buffers laid out at construction are freed before it returns."""
    seen = []
    pack_all = PackedAdamW._pack_all

    def spy(self, *args):
        pack_all(self, *args)
        seen.append(packed_storages(self))

    monkeypatch.setattr(PackedAdamW, "_pack_all", spy)
    a, b, gen = conv_twins([(16, 8), (8,)], torch.float64, 3, channels_last=True)
    ob = PackedAdamW(b, mode="native")
    assert len(seen) == 1 and ob._pack is None
    assert_freed(*seen[0], b)
    assert [x.stride() for x in a] == [y.stride() for y in b] and same(a, b)


def test_a_view_taken_while_packed_keeps_the_layout_and_says_why():
    """The rule at the switch: a tensor sharing a parameter's packed memory (a view taken after
    the optimizer was built) would keep stale bytes if the parameter moved, so nothing moves: the
    optimizer steps natively over the packed layout (native's bits, the view follows every step)
    and the one warning names the parameter and the reason."""
    a, b, gen = twins([(12, 5), (5,)], torch.float32, 13)
    oa = torch.optim.AdamW(a, fused=True)
    ob = PackedAdamW(b, mode="auto")
    ob._chooser = Scripted(["packed"])
    view = b[0].detach().t()  # taken after construction: it (and the detached tensor it views) share it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            backward_both(a, b, gen, set())
            torch.nn.utils.clip_grad_norm_(a, 1.0)
            oa.step()
            oa.zero_grad()
            ob.clip_step_zero_grad(1.0)
            assert same(a, b) and bitwise_equal(view, b[0].detach().t())
    said = [str(w.message) for w in caught if "scripted" in str(w.message)]
    assert (
        len(said) == 1 and "parameter 0 (shape (12, 5)) shares its memory with 2 other tensor(s)" in said[0]
    )
    assert ob.mode == "native" and not ob._own and ob._pack is not None
    same_state(oa, ob, a, b)


def test_never_slower_default_builds_against_statsmodels():
    """benchmarks/never_slower.py's default builds: the one-sided t-test power of statsmodels
    (``TTestPower``, the noncentral t: ``solve_power(effect_size=log(1.01)/sd, alpha=0.025,
    power=0.9, alternative="larger")``, 16.8 builds at sd 0.0118) agrees with ``builds_needed``
    within one build, its power at 20 builds with ``upper_power`` within 0.02 (the normal
    approximation is 0.013 low at the widest spread, 0.0225), and the default builds are at least
    that, 100 rounds in each."""
    from conftest import benchmark_module
    from statsmodels.stats.power import TTestPower

    mod = benchmark_module("never_slower")
    for sd in (mod.BUILD_SD, mod.BUILD_SD_WIDEST, 0.008, 0.02):
        effect = math.log(mod.UPPER_MAX) / sd
        ref = TTestPower().solve_power(effect_size=effect, alpha=0.025, power=mod.POWER, alternative="larger")
        assert abs(mod.builds_needed(sd) - ref) < 1, (sd, ref)
        power = TTestPower().power(effect_size=effect, nobs=20, alpha=0.025, alternative="larger")
        assert abs(mod.upper_power(20, sd) - power) < 0.02, (sd, power)
    args = mod.parse([])
    assert mod.BUILDS >= mod.builds_needed() and args.builds == mod.BUILDS
    assert args.rounds == mod.ROUNDS == mod.BUILDS * mod.ROUNDS_PER_BUILD


#: The draws of :func:`native_and_packed`'s twins: shapes, dtype, hyperparameters, one group or two,
#: and how ours starts (packed, native for good, auto deciding either way).
TWINS_ST = dict(
    shapes=st.lists(shape_st, min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    hyper=hyper_st,
    two_groups=st.booleans(),
    start=st.sampled_from(["packed", "native", "auto_native", "auto_packed"]),
)


def native_and_packed(a, b, two_groups, hyper, start):
    """Native ``AdamW(fused=True)`` over ``a`` and ``PackedAdamW`` over ``b``, in one group or two
    (every other parameter, the second with its own lr and no weight decay), ours starting
    ``packed``, ``native``, or ``auto_packed``/``auto_native`` (auto deciding that way); and the grouping, for more optimizers alike."""

    def groups(ps):
        if not two_groups:
            return ps
        return [{"params": ps[::2]}, {"params": ps[1::2], "lr": 0.02, "weight_decay": 0.0}]

    oa = torch.optim.AdamW(groups(a), fused=True, **hyper)
    ob = PackedAdamW(groups(b), **hyper, mode={"packed": "packed", "native": "native"}.get(start, "auto"))
    if start.startswith("auto"):
        ob._chooser = Scripted(["native", "packed"], final=start[5:])
    return oa, ob, groups


def both_steps(pairs, x, order, clip=True):
    """One iteration on each side (``pairs``: (model, optimizer), native's first), in the loop
    ``order``: ``"tutorial"`` (forward, zero_grad, backward, step) or ``"after"`` (forward,
    backward, step, zero_grad(set_to_none=False)), or ``"onepass"`` (as ``"after"``, the
    optimizer's side through ``clip_step_zero_grad``); returns the norms."""
    norms = []
    for k, (m, o) in enumerate(pairs):
        loss = m(x).square().mean()
        if order == "onepass" and k == 1:
            loss.backward()
            norms.append(o.clip_step_zero_grad(1.0, set_to_none=False))
            continue
        if order == "tutorial":
            o.zero_grad()
        loss.backward()
        if clip:
            clipper = torch.nn.utils.clip_grad_norm_ if k == 0 else clip_grad_norm_
            norms.append(clipper(m.parameters(), 1.0))
        o.step()
        if order in ("after", "onepass"):
            o.zero_grad(set_to_none=False)
    return norms


def mlp_twins(seed):
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    b = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    b.load_state_dict(a.state_dict())
    return a, b


def assert_native(ma, mb, oa, ob, norms):
    a, b = list(ma.parameters()), list(mb.parameters())
    assert bitwise_equal(norms[0], norms[1])
    assert same(a, b)
    grads_equal(a, b)
    same_state(oa, ob, a, b)


@pytest.mark.parametrize("auto", [False, True])
def test_the_tutorial_loop_order_leaves_the_packed_buffers(auto):
    """``loss = model(x); opt.zero_grad(); loss.backward(); opt.step()``: the decision comes in
    ``zero_grad`` while autograd holds saved tensors of the parameters (``weight.t()``), so the
    move waits for the step (after backward, autograd holds none): native's layout, the packed
    buffers freed, one warning (the decision's, naming no view the user never took), and
    native's bits every step across it."""
    ma, mb = mlp_twins(3)
    oa = torch.optim.AdamW(ma.parameters(), fused=True)
    ob = PackedAdamW(mb.parameters(), mode="auto")
    ob._chooser = Scripted(["packed", "native", "packed"] if auto else [])
    x = torch.randn(8, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(7):
            norms = both_steps([(ma, oa), (mb, ob)], x * (s + 1), "tutorial")
            assert_native(ma, mb, oa, ob, norms)
    said = [str(w.message) for w in caught if "scripted" in str(w.message)]
    assert said == ["scripted: native for good"]
    assert ob._own and ob._pack is None and ob.flat_groups == []
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in held_by(ob, list(mb.parameters())))


def test_a_view_of_a_state_tensor_keeps_the_layout_until_dropped():
    """A view of a state tensor (``state[p]["exp_avg_sq"].view(-1)``) taken while packed follows
    every step natively: the move to native's layout would leave it on the packed bytes, so the
    storage stays (one warning naming the parameter, the state key and the reason) and the view
    follows, bitwise native; once the view is dropped, the next step moves."""
    ma, mb = mlp_twins(4)
    oa = torch.optim.AdamW(ma.parameters(), fused=True)
    ob = PackedAdamW(mb.parameters(), mode="auto")
    ob._chooser = Scripted(["packed"])
    x = torch.randn(8, 6)
    pa, pb = ma[2].weight, mb[2].weight
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(5):
            norms = both_steps([(ma, oa), (mb, ob)], x * (s + 1), "after")
            if s == 0:
                va, vb = oa.state[pa]["exp_avg_sq"].view(-1), ob.state[pb]["exp_avg_sq"].view(-1)
            assert_native(ma, mb, oa, ob, norms)
            assert bitwise_equal(va, vb)
    said = [str(w.message) for w in caught if "scripted" in str(w.message)]
    assert (
        len(said) == 1 and "state[p]['exp_avg_sq'] of parameter 2 (shape (1, 5)) shares its memory" in said[0]
    )
    assert not ob._own and ob._pack is not None
    del va, vb
    for s in range(2):
        norms = both_steps([(ma, oa), (mb, ob)], x * (s + 7), "after")
        assert_native(ma, mb, oa, ob, norms)
    assert ob._own and ob._pack is None


def test_packing_again_names_a_handle_held_now():
    """``set_mode("packed")`` after native for good with a ``p.detach()`` handle taken after it:
    refused, naming a handle held now (not a view taken before the optimizer was built), nothing
    changed; once it is dropped, packing again works and the steps stay native's bits."""
    ma, mb = mlp_twins(5)
    oa = torch.optim.AdamW(ma.parameters(), fused=True)
    ob = PackedAdamW(mb.parameters(), mode="native")
    x = torch.randn(8, 6)
    norms = both_steps([(ma, oa), (mb, ob)], x, "after")
    handle = mb[0].weight.detach()
    before = [p.detach().clone() for p in mb.parameters()]
    with pytest.raises(ValueError) as raised:
        ob.set_mode("packed")
    said = str(raised.value)
    assert (
        "parameter 0 (shape (5, 6)) shares its memory with 1 other tensor(s): a view or p.detach() handle held now"
        in said
    )
    assert "before the optimizer was built" not in said and "build PackedAdamW first" not in said
    assert ob._own and ob.mode == "native" and same(before, list(mb.parameters()))
    del handle
    ob.set_mode("packed")
    assert not ob._own and ob.flat_groups
    for s in range(3):
        norms = both_steps([(ma, oa), (mb, ob)], x * (s + 2), "after")
        assert_native(ma, mb, oa, ob, norms)


@pytest.mark.filterwarnings("ignore:scripted")
@pytest.mark.parametrize(
    "modes", [["packed"], ["packed", "native"], ["packed", "native", "packed", "native"]]
)
@pytest.mark.parametrize("order", ["after", "onepass"])
def test_a_kept_grad_stays_the_grad_across_every_switch(modes, order):
    """``zero_grad(set_to_none=False)``: natively ``p.grad`` is the same tensor for good and a
    reference kept to it (a gradient bucket, a logger) sees every backward. So here, across the
    chooser's measuring switches both ways and the move to native's layout: ``g is p.grad`` and
    ``g`` holds native's bits after every backward, norms, parameters and state native's too, and
    the packed buffers are freed at the end."""
    ma, mb = mlp_twins(6)
    oa = torch.optim.AdamW(ma.parameters(), fused=True)
    ob = PackedAdamW(mb.parameters(), mode="auto")
    ob._chooser = Scripted(list(modes))
    x = torch.randn(8, 6)
    for s in range(7):
        norms = both_steps([(ma, oa), (mb, ob)], x * (s + 1), order)
        if s == 0:
            ga, gb = [p.grad for p in ma.parameters()], [p.grad for p in mb.parameters()]
        assert_native(ma, mb, oa, ob, norms)
        for m in (ma, mb):
            m(x * (s + 2)).square().mean().backward()  # accumulated into the kept tensors
        assert all(g is p.grad for g, p in zip(gb, mb.parameters()))
        assert same(ga, gb)
        oa.zero_grad(set_to_none=False)
        ob.zero_grad(set_to_none=False)
    assert ob._own and ob._pack is None


@pytest.mark.parametrize("set_to_none", [False, True])
def test_a_natively_made_grad_stays_the_grad_stepping_packed_again(set_to_none):
    """A gradient backward made while stepping natively (``p.grad`` None before it), kept, then
    ``set_mode("packed")`` between backward and step: natively it is ``.grad`` for good, so here
    it becomes its slot: ``g is p.grad``, no warning, and over the steps after it (a second
    backward accumulating into it, ``zero_grad`` either way) ``g`` is or is no longer ``.grad``
    exactly where native's is, with native's bits, as are norms, parameters and state."""
    a, b, gen = twins([(6, 2), (3,), (16,)], torch.float32, 7)
    oa = torch.optim.AdamW(a, fused=True)
    ob = PackedAdamW(b, mode="packed")
    ob.set_mode("native")
    backward_both(a, b, gen, set())
    kept = kept_of(oa, a), kept_of(ob, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ob.set_mode("packed")
    assert all(g is p.grad for g, p in zip(kept[1][0].values(), b))
    for s in range(3):
        backward_both(a, b, gen, set())  # accumulates into the kept tensors
        grads_equal(a, b)
        one_step(oa, ob, a, b, "one_pass" if s % 2 else "three_calls", set_to_none)
        mirrors_native(oa, ob, a, b, *kept)


def test_a_natively_made_grad_moved_into_the_buffer_is_said():
    """The one case a kept ``.grad`` stops being ``.grad``: a gradient backward made while
    stepping natively, a view of it held, then ``set_mode("packed")``: the view would keep the old
    bytes if the tensor moved, so it is copied into the packed buffer at the next step; one
    warning names it, and the bits stay native's."""
    a, b, gen = twins([(6, 2), (3,)], torch.float32, 7)
    oa = torch.optim.AdamW(a, fused=True)
    ob = PackedAdamW(b, mode="packed")
    ob.set_mode("native")
    backward_both(a, b, gen, set())
    views = [p.grad.view(-1) for p in b]
    with pytest.warns(
        UserWarning,
        match=r"parameter 0's \.grad \(and 1 more\) was made by a backward that ran natively.*a view",
    ):
        ob.set_mode("packed")
    del views
    oa.step()
    ob.step()
    assert same(a, b)
    grads_equal(a, b)
    same_state(oa, ob, a, b)


def kept_of(opt, params):
    """What a logger holds: each parameter's ``.grad`` and each state tensor (by position and key)."""
    grads = {i: p.grad for i, p in enumerate(params) if p.grad is not None}
    state = {(i, k): t for i, p in enumerate(params) for k, t in opt.state.get(p, {}).items()}
    return grads, state


def mirrors_native(oa, ob, a, b, kept_a, kept_b, state_identity=True):
    """Each tensor held on our side is what native's held one is, bit for bit, and is (or is no
    longer) ``.grad`` or the state exactly where native's is."""
    (ga, sa), (gb, sb) = kept_a, kept_b
    assert set(ga) == set(gb) and set(sa) == set(sb)
    for i in ga:
        assert bitwise_equal(ga[i], gb[i]), f"kept grad {i}"
        assert (ga[i] is a[i].grad) == (gb[i] is b[i].grad), f"kept grad {i} is .grad"
    for (i, k), t in sa.items():
        assert bitwise_equal(t, sb[i, k]), f"kept state {i} {k}"
        if state_identity:
            assert (oa.state[a[i]].get(k) is t) == (ob.state[b[i]].get(k) is sb[i, k]), f"kept state {i} {k}"


def phase_both(oa, ob, a, b, phase, set_to_none):
    """Clip, step and zero_grad on both sides (native's three calls on ``oa``; ``phase`` on
    ``ob``); the norm and the parameters (values and strides) compared bit for bit."""
    na = torch.nn.utils.clip_grad_norm_(a, 1.0)
    oa.step()
    oa.zero_grad(set_to_none)
    if phase == "one_pass":
        nb = ob.clip_step_zero_grad(1.0, parameters=b, set_to_none=set_to_none)
    else:
        nb = clip_grad_norm_(b, 1.0)
        ob.step()
        ob.zero_grad(set_to_none)
    assert bitwise_equal(na, nb)
    assert same(a, b) and [x.stride() for x in a] == [y.stride() for y in b]


def one_step(oa, ob, a, b, phase, set_to_none):
    """Clip, step and zero_grad on both sides, compared bit for bit, the state too."""
    phase_both(oa, ob, a, b, phase, set_to_none)
    same_state(oa, ob, a, b)
    grads_equal(a, b)


def pack_again(oa, ob, a, b):
    """``set_mode("packed")`` after native for good; what a logger held just before it (native's
    side and ours). ``state`` and its entries stay the same objects."""
    kept = kept_of(oa, a), kept_of(ob, b)
    assert ob._own
    state, entries = ob.state, dict(ob.state)
    ob.set_mode("packed")
    assert not ob._own and ob.flat_groups and ob.state is state
    assert all(ob.state[p] is e for p, e in entries.items())
    return kept


@pytest.mark.filterwarnings("ignore:scripted")
@FEW
@given(
    shapes=st.lists(shape_st, min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    hyper=hyper_st,
    start=st.sampled_from(["auto", "native"]),
    at=st.integers(1, 3),
    mid=st.booleans(),
    after=st.lists(st.sampled_from(["packed", "native"]), max_size=3),
    phase=st.sampled_from(["one_pass", "three_calls"]),
    set_to_none=st.booleans(),
    channels_last=st.booleans(),
    backward_norms=st.booleans(),
    skip=st.integers(-1, 3),
    seed=st.integers(0, 2**16),
)
def test_packing_again_keeps_what_the_user_holds(
    shapes, dtype, hyper, start, at, mid, after, phase, set_to_none, channels_last, backward_norms, skip, seed
):
    """``set_mode("packed")`` after native for good (between steps, or after backward with the
    gradients present: ``mid``), then more switches: natively the state tensors, the ``.grad``
    tensors, ``state`` and its entries are the same objects for good. So here: each tensor a
    logger held before the switch is (or is no longer) ``.grad`` or the state exactly where
    native's is and holds native's bits every step after; ``state`` and its entries are the same
    objects; norms, parameters, gradients and state bitwise native's."""
    a, b, gen = conv_twins(shapes, dtype, seed, channels_last)
    oa = torch.optim.AdamW(a, fused=True, **hyper)
    ob = PackedAdamW(b, **hyper, mode=start, backward_norms=backward_norms)
    if start == "auto":
        ob._chooser = Scripted([])
    kept = None
    for step in range(at + len(after) + 2):
        if step == at and not mid:  # between steps (after zero_grad)
            kept = pack_again(oa, ob, a, b)
        elif at < step <= at + len(after):
            ob.set_mode(after[step - at - 1])
        backward_both(a, b, gen, {skip} if step % 3 == 1 else set())
        if step == at and mid:  # the gradients present
            kept = pack_again(oa, ob, a, b)
        one_step(oa, ob, a, b, phase, set_to_none)
        if kept is not None:
            mirrors_native(oa, ob, a, b, *kept)


def test_packing_again_refuses_a_view_of_a_gradient_or_state_tensor():
    """A view of a ``.grad`` or of a state tensor held at ``set_mode("packed")`` would keep the
    current values (natively it follows every step): refused, naming it, nothing changed; once
    dropped, packing again works and the steps stay native's."""
    ma, mb = mlp_twins(8)
    oa = torch.optim.AdamW(ma.parameters(), fused=True)
    ob = PackedAdamW(mb.parameters(), mode="native")
    x = torch.randn(8, 6)
    assert_native(ma, mb, oa, ob, both_steps([(ma, oa), (mb, ob)], x, "after"))
    for view, said in (
        (lambda: mb[2].weight.grad.view(-1), r"p.grad of parameter 2 \(shape \(1, 5\)\) shares its memory"),
        (
            lambda: ob.state[mb[0].bias]["exp_avg"][1:],
            r"state\[p\]\['exp_avg'\] of parameter 1 \(shape \(5,\)\)",
        ),
    ):
        held = view()
        before = [t.clone() for t in held_by(ob, list(mb.parameters()))]
        with pytest.raises(ValueError, match=said + ".*nothing was changed"):
            ob.set_mode("packed")
        assert ob._own and ob.mode == "native" and same(before, held_by(ob, list(mb.parameters())))
        del held
    ob.set_mode("packed")
    for s in range(3):
        assert_native(ma, mb, oa, ob, both_steps([(ma, oa), (mb, ob)], x * (s + 2), "after"))


@FEW
@given(
    shapes=st.lists(shape_st, min_size=1, max_size=3),
    hyper=hyper_st,
    op=st.sampled_from(["add_param_group", "append", "load_state_dict"]),
    mode=st.sampled_from(["packed", "native"]),
    at=st.integers(0, 2),
    phase=st.sampled_from(["one_pass", "three_calls"]),
    backward_norms=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_laying_out_again_keeps_a_kept_grad(shapes, hyper, op, mode, at, phase, backward_norms, seed):
    """``add_param_group``, a parameter appended to ``param_groups`` in place, or
    ``load_state_dict`` over the packed layout (stepping packed, or natively over it), with
    ``zero_grad(set_to_none=False)``: natively each ``p.grad`` is the same tensor for good, so a
    ``g = p.grad`` kept is still ``p.grad`` and follows every backward. So here, bit for bit, and
    the state tensors a logger held are still the state after ``add_param_group`` (loading
    replaces them natively). Native ``AdamW(fused=True)`` + ``clip_grad_norm_`` on the other side."""
    a, b, gen = twins(shapes, torch.float32, seed)
    extra = torch.randn(5, 2, generator=gen)
    qa, qb = extra.clone().requires_grad_(), extra.clone().requires_grad_()
    oa = torch.optim.AdamW(a, fused=True, **hyper)
    ob = PackedAdamW(b, **hyper, mode="packed", backward_norms=backward_norms)
    ob.set_mode(mode)
    kept = None
    for step in range(at + 3):
        backward_both(a, b, gen, set())
        if step == 0:
            kept = kept_of(oa, a), kept_of(ob, b)
        if step == at:
            if op != "load_state_dict":  # the new parameter has a gradient already
                backward_both([qa], [qb], gen, set())
                a, b = a + [qa], b + [qb]
            kept = kept_of(oa, a), kept_of(ob, b)  # grads and state (step 0: grads only)
            if op == "add_param_group":
                oa.add_param_group({"params": [qa], "lr": 0.02})
                ob.add_param_group({"params": [qb], "lr": 0.02})
            elif op == "append":
                oa.param_groups[0]["params"].append(qa)
                ob.param_groups[0]["params"].append(qb)
            else:
                sd = oa.state_dict()
                oa.load_state_dict(copy.deepcopy(sd))
                ob.load_state_dict(copy.deepcopy(sd))
        one_step(oa, ob, a, b, phase, set_to_none=False)
        mirrors_native(oa, ob, a, b, *kept, state_identity=op != "load_state_dict")


# -- the state reset, removed or replaced while the user holds its tensors (issue 61) ------------
STATE_OPS = [
    "clear",
    "del",
    "pop",
    "reinsert",
    "empty",
    "new_state",
    "exp_avg",
    "exp_avg_sq",
    "max_exp_avg_sq",
]
STATE_OPS += [
    "step",
    "entry",
    "load",
    "load_ours",
    "state_dict",
    "native",
    "packed",
    "step_in_place",
    "halved",
]
STATE_OPS += ["add_param_group", "append"]


def state_values(p, gen, amsgrad):
    """Values a user puts into a parameter's state (the same on either side): moments in the
    parameter's layout (squares non-negative), a float32 0-dim ``step``."""
    keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
    out = {"step": torch.tensor(float(torch.randint(0, 5, (), generator=gen)))}
    for key in keys:
        v = torch.randn(p.shape, generator=gen).to(p.dtype)
        out[key] = v if key == "exp_avg" else v.abs()
    return out


def laid_as(p, values):
    """``values`` as new tensors, the moments in ``p``'s memory order (``torch.empty_like``)."""
    return {k: v.clone() if k == "step" else torch.empty_like(p).copy_(v) for k, v in values.items()}


def state_op(opt, params, i, op, values, popped):
    """One thing a user does to ``optimizer.state``, the same on either side (``values``: what an
    assignment puts in; ``popped``: entries taken out with ``pop``, by position)."""
    p, entry = params[i], opt.state.get(params[i])
    if op == "clear":
        opt.state.clear()
    elif op == "del" and entry is not None:
        del opt.state[p]
    elif op == "pop":
        popped[i] = opt.state.pop(p, None)
    elif op == "reinsert" and popped.get(i) is not None:
        opt.state[p] = popped.pop(i)
    elif op == "empty":
        opt.state[p] = {}
    elif op == "new_state":
        opt.state = collections.defaultdict(dict)
    elif op in values and entry and op in entry:
        opt.state[p][op] = laid_as(p, values)[op]
    elif op == "entry":
        opt.state[p] = laid_as(p, values)
    elif op == "step_in_place" and entry:  # written in place, not replaced
        entry["step"].fill_(values["step"])
    elif op == "halved" and entry:
        entry["exp_avg"].mul_(0.5)


def held_state(opt, params):
    """What a logger holds: ``state``, each entry and each state tensor (by position and key)."""
    entries = {i: opt.state.get(p) for i, p in enumerate(params)}
    tensors = {(i, k): t for i, e in entries.items() for k, t in (e or {}).items()}
    return opt.state, {i: e for i, e in entries.items() if e is not None}, tensors


def holds_as_native(oa, ob, a, b, held_a, held_b):
    """Each object held on our side is what native's held one is: the same bits, and the state (or
    no longer) exactly where native's is."""
    (sa, ea, ta), (sb, eb, tb) = held_a, held_b
    assert (oa.state is sa) == (ob.state is sb), "state is the held object"
    assert set(ea) == set(eb) and set(ta) == set(tb)
    for i in ea:
        assert (oa.state.get(a[i]) is ea[i]) == (ob.state.get(b[i]) is eb[i]), f"entry {i} is the state"
    for (i, k), t in ta.items():
        u = tb[i, k]
        assert bitwise_equal(t, u) and t.stride() == u.stride(), f"held state {i} {k}"
        assert ((oa.state.get(a[i]) or {}).get(k) is t) == ((ob.state.get(b[i]) or {}).get(k) is u), (
            f"{i} {k}"
        )


def live_state_dicts(oa, ob, a, b, held):
    """``state_dict()`` taken earlier on either side: natively it holds the state tensors themselves,
    so each is (or is no longer) the state exactly where native's is, with native's bits."""
    in_a = {id(t) for e in oa.state.values() for t in e.values()}
    in_b = {id(t) for e in ob.state.values() for t in e.values()}
    for sa, sb in held:  # sa: native's entries as they were when it was taken (ours are plain dicts)
        assert list(sa) == list(sb["state"])
        for k, entry in sa.items():
            assert list(entry) == list(sb["state"][k])
            for key, t in entry.items():
                u = sb["state"][k][key]
                assert bitwise_equal(t, u) and (id(t) in in_a) == (id(u) in in_b), f"state_dict {k} {key}"


def same_mapping(oa, ob, a, b):
    """``optimizer.state`` as a mapping, read without writing to it: the same parameters in the same
    order (``len``, ``in``, iteration), each entry's keys in order, each tensor's bits and strides;
    ``state_dict()`` alike."""
    pos_a, pos_b = {id(x): i for i, x in enumerate(a)}, {id(y): i for i, y in enumerate(b)}
    assert [pos_a.get(id(k)) for k in oa.state] == [pos_b.get(id(k)) for k in ob.state], "state's order"
    assert len(oa.state) == len(ob.state) and all((x in oa.state) == (y in ob.state) for x, y in zip(a, b))
    for x, y in zip(a, b):
        ea, eb = oa.state.get(x), ob.state.get(y)
        assert (ea is None) == (eb is None)
        if ea is not None:
            assert list(ea) == list(eb), "an entry's keys"
            for k in ea:
                assert bitwise_equal(ea[k], eb[k]) and ea[k].stride() == eb[k].stride(), k
    assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None


def step_both(oa, ob, a, b, phase, set_to_none):
    """Clip, step and zero_grad on both sides; the norm, parameters and gradients compared bitwise."""
    phase_both(oa, ob, a, b, phase, set_to_none)
    grads_equal(a, b)


def both_do(oa, ob, a, b, i, op, gen, amsgrad, popped):
    """``op`` on both sides: a state pattern (:func:`state_op`), a state dict of native's loaded into
    both (after whatever came before it: ``clear`` then ``load``), a parameter added (a group, or
    appended to the first group in place), or our mode switched."""
    if op in ("native", "packed"):
        ob.set_mode(op)
    elif op in ("add_param_group", "append"):  # a new parameter, laid out again after what came before
        extra = torch.randn(3, 2, generator=gen).to(a[0].dtype)
        for opt, ps in ((oa, a), (ob, b)):
            ps.append(extra.clone().requires_grad_())
            if op == "add_param_group":
                opt.add_param_group({"params": [ps[-1]], "lr": 0.02})
            else:
                opt.param_groups[0]["params"].append(ps[-1])
    elif op in ("load", "load_ours"):  # native's state dict, or ours, loaded into both
        sd = copy.deepcopy((oa if op == "load" else ob).state_dict())
        oa.load_state_dict(copy.deepcopy(sd))
        ob.load_state_dict(sd)
    else:
        values = state_values(a[i], gen, amsgrad)
        state_op(oa, a, i, op, values, popped[0])
        state_op(ob, b, i, op, values, popped[1])


@pytest.mark.filterwarnings("ignore:scripted")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **TWINS_ST,
    events=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(STATE_OPS), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=5,
    ),
    phase=st.sampled_from(["one_pass", "three_calls"]),
    set_to_none=st.booleans(),
    channels_last=st.booleans(),
    skip=st.integers(-1, 3),
    seed=st.integers(0, 2**16),
)
def test_state_reset_or_replaced_while_held_is_native(
    shapes, dtype, hyper, two_groups, start, events, phase, set_to_none, channels_last, skip, seed
):
    """``optimizer.state`` cleared, an entry deleted, popped and put back, emptied, a new ``state``,
    a state tensor or a whole entry assigned (before a parameter's first step too), native's state
    dict loaded after any of them, and the mode switched, at drawn steps (between steps or with the
    gradients present), while a logger holds ``state``, its entries and its tensors from before:
    natively a tensor that stops being the state keeps its values and no longer moves, an assigned
    one is the state from then on, a removed entry starts again from zero moments and step 0. So
    here, against native ``AdamW(fused=True)`` + ``clip_grad_norm_``: every step the norm,
    parameters, gradients and the state as a mapping (order, ``len``, ``in``, keys, bits, strides,
    ``state_dict()``) bitwise, and every held object is (or is no longer) the state exactly where
    native's is, with native's bits."""
    a, b, gen = conv_twins(shapes, dtype, seed, channels_last)

    oa, ob, groups = native_and_packed(a, b, two_groups, hyper, start)
    popped: tuple[dict, dict] = ({}, {})
    held, dicts = [], []
    for step in range(7):
        for mid in (False, True):
            for at, op, i, when in events:
                if (
                    at == step
                    and when == mid
                    and not (start.startswith("auto") and op in ("native", "packed"))
                ):
                    held.append((held_state(oa, a), held_state(ob, b)))
                    if op == "state_dict":
                        dicts.append(
                            ({k: dict(e) for k, e in oa.state_dict()["state"].items()}, ob.state_dict())
                        )
                    else:
                        both_do(oa, ob, a, b, i % len(a), op, gen, hyper["amsgrad"], popped)
                    same_mapping(oa, ob, a, b)
            if not mid:
                backward_both(a, b, gen, {skip} if step % 3 == 1 else set())
        step_both(oa, ob, a, b, phase, set_to_none)
        same_mapping(oa, ob, a, b)
        for held_a, held_b in held:
            holds_as_native(oa, ob, a, b, held_a, held_b)
        live_state_dicts(oa, ob, a, b, dicts)


def stepped_twins():
    """Native and ours over two (4, 3) weights, a bias and a channels_last conv weight, two steps taken."""
    a, b, gen = conv_twins([(4, 3), (4, 3), (5,)], torch.float32, 0, True)
    oa, ob = torch.optim.AdamW(a, fused=True), PackedAdamW(b, mode="packed")
    for _ in range(2):
        backward_both(a, b, gen, set())
        step_both(oa, ob, a, b, "three_calls", True)
    return a, b, oa, ob, gen


def packed_now(ob, b):
    """Copies of the parameters and of every packed buffer: what a refused step leaves as it was."""
    out = [p.detach().clone() for p in b]
    for g in ob.flat_groups:
        out += [t.clone() for t in (g.param, g.exp_avg, g.exp_avg_sq, g.steps)]
    return out


@pytest.mark.parametrize("how", ["clear", "del", "assign", "entry"])
def test_a_state_tensor_leaving_with_a_view_of_it_held_is_refused_until_dropped(how):
    """A view of a state tensor held while that tensor stops being the state (its entry removed, or
    itself replaced): natively the view keeps its values; here it views the packed buffer, which the
    parameter's new state takes. Refused at the step, naming it, before anything moves; once the view
    is dropped, the step is native's."""
    a, b, oa, ob, gen = stepped_twins()
    views = [o.state[ps[0]]["exp_avg"].view(-1) for o, ps in ((oa, a), (ob, b))]
    for opt, ps in ((oa, a), (ob, b)):
        if how == "clear":
            opt.state.clear()
        elif how == "del":
            del opt.state[ps[0]]
        elif how == "assign":
            opt.state[ps[0]]["exp_avg"] = torch.zeros_like(ps[0])
        else:
            opt.state[ps[0]] = {k: torch.zeros_like(t) for k, t in opt.state[ps[0]].items()}
    backward_both(a, b, gen, set())
    before = packed_now(ob, b)
    said = r"state\[p\]\['exp_avg'\] of parameter 0 \(shape \(4, 3\)\) stops being the state .*1 other tensor"
    with pytest.raises(RuntimeError, match=said):
        ob.step()
    assert same(before, packed_now(ob, b)) and bitwise_equal(*views)
    del views[1]
    step_both(oa, ob, a, b, "three_calls", True)
    same_mapping(oa, ob, a, b)


def _assign(opt, ps, how):
    st = opt.state[ps[0]]
    if how == "number_step":
        st["step"] = 3
    elif how == "strides":
        opt.state[ps[3]]["exp_avg"] = torch.zeros(ps[3].shape)  # contiguous, the weight channels_last
    elif how == "twice":
        st["exp_avg"] = st["exp_avg_sq"] = torch.zeros_like(ps[0])
    elif how == "another_parameter_s":
        st["exp_avg"] = opt.state[ps[1]]["exp_avg"]
    elif how == "gradient":
        st["exp_avg"] = ps[1].grad
    elif how == "a_view":
        whole = torch.zeros(2, 4, 3)
        st["exp_avg"] = whole[0]
        return whole
    elif how == "plain_dict":
        opt.state = {}
    return None


REFUSED = {
    "number_step": r"replaced by the number 3; native's step raises 'API has changed",
    "strides": r"'exp_avg'\] of parameter 3 \(shape \(6, 3, 3, 3\)\) was replaced by a tensor with strides "
    r"\(27, 9, 3, 1\), the parameter \(27, 1, 9, 3\)",
    "twice": r"put at another place of the state too",
    "another_parameter_s": r"parameter 0 \(shape \(4, 3\)\) was replaced by a state tensor of this optimizer",
    "gradient": r"was replaced by a gradient of this optimizer",
    "a_view": r"whose memory 1 other tensor\(s\) share",
    "plain_dict": r"replaced by a dict, not a defaultdict\(dict\), without an entry for parameter 0",
}


@pytest.mark.parametrize("how", sorted(REFUSED))
def test_a_state_tensor_assigned_that_cannot_be_native_s_is_refused_before_anything_moves(how):
    """What a user may put into ``optimizer.state`` that native's step reads otherwise than a packed
    slot can be: refused at the step, naming the parameter, the key and why, before anything moves
    (where native's step fails too, a Python-number ``step`` or a plain dict without the entry, it
    says native's error)."""
    a, b, oa, ob, gen = stepped_twins()
    backward_both(a, b, gen, set())
    keep = _assign(ob, b, how)
    before = packed_now(ob, b)
    with pytest.raises(RuntimeError, match=REFUSED[how]):
        ob.step()
    assert same(before, packed_now(ob, b)) and all(p.grad is not None for p in b)
    if how in ("number_step", "plain_dict"):  # native's step fails there too
        _assign(oa, a, how)
        with pytest.raises((RuntimeError, KeyError)):
            oa.step()
    del keep


# -- a loaded state dict's tensors are the state, as natively (issue 61) --------------------------
LOAD_SOURCES = ["native", "native_deepcopy", "ours_dropped", "ours_deepcopy", "saved"]


def source_dicts(source, params, hyper, gen, groups):
    """Twin state dicts to load, each side's from a source optimizer stepped twice with the same
    gradients (a parameter without one at the second step): native's side from native
    ``AdamW(fused=True)``; ours from a native twin (``native*``, ``saved``) or a ``PackedAdamW``
    (``ours*``). ``source`` says how: ``state_dict()`` itself (native's sources kept alive, whose
    state natively is then the loader's too; ours dropped first), a deep copy, or a
    ``torch.save``/``torch.load(weights_only=True)`` round trip. Returns the dicts and the sources."""
    ca, cb = params
    sa = torch.optim.AdamW(groups(ca), fused=True, **hyper)
    if source.startswith("ours"):
        sb = PackedAdamW(groups(cb), **hyper, mode="packed")
    else:
        sb = torch.optim.AdamW(groups(cb), fused=True, **hyper)
    for step in range(2):
        backward_both(ca, cb, gen, {0} if step == 1 else set())
        sa.step()
        sb.step()
        sa.zero_grad()
        sb.zero_grad()
    da, db = sa.state_dict(), sb.state_dict()
    if source.endswith("deepcopy"):
        da, db = copy.deepcopy(da), copy.deepcopy(db)
    elif source == "saved":
        da, db = (torch.load(io.BytesIO(saved_bytes(d)), weights_only=True) for d in (da, db))
    if source == "ours_dropped":
        del sb
        gc.collect()
        return da, db, None
    return da, db, (sa, sb)


def saved_bytes(d):
    out = io.BytesIO()
    torch.save(d, out)
    return out.getvalue()


def cast_both(da, db, casts, dtype):
    """The same casts in both dicts, position by position: ``dtype``, a moment of the other float
    dtype or a float64 ``step`` (native's load casts it: a copy); ``number``, a Python-number
    ``step``; ``keep``, as it is (native's load keeps the tensor itself). Entries are replaced, not
    written: a native source's own entries stay as they are."""
    other = torch.float64 if dtype == torch.float32 else torch.float32
    spots = [(k, key) for k in sorted(da["state"]) for key in da["state"][k]]
    for (k, key), how in zip(spots, casts):
        for d in (da, db):
            t = d["state"][k][key]
            if how == "dtype":
                t = t.to(torch.float64 if key == "step" else other)
            elif how == "number" and key == "step":
                t = t.item()
            d["state"][k] = {**d["state"][k], key: t}


def loaded_as_native(oa, ob, da, db):
    """The loaded dicts' values: native's bits and strides, each tensor the state (or not) exactly
    where native's is."""
    in_a = {id(t) for e in oa.state.values() for t in e.values()}
    in_b = {id(t) for e in ob.state.values() for t in e.values()}
    assert list(da["state"]) == list(db["state"])
    for k, entry in da["state"].items():
        assert list(entry) == list(db["state"][k])
        for key, t in entry.items():
            u = db["state"][k][key]
            if not isinstance(t, torch.Tensor):
                assert t == u and type(t) is type(u), f"loaded {k} {key}"
                continue
            assert bitwise_equal(t, u) and t.stride() == u.stride(), f"loaded {k} {key}"
            assert (id(t) in in_a) == (id(u) in in_b), f"loaded {k} {key} is the state"


@pytest.mark.filterwarnings("ignore:scripted")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **TWINS_ST,
    source=st.sampled_from(LOAD_SOURCES),
    casts=st.lists(st.sampled_from(["keep", "keep", "keep", "dtype", "number"]), min_size=24, max_size=24),
    load_at=st.integers(0, 2),
    switch=st.booleans(),
    phase=st.sampled_from(["one_pass", "three_calls"]),
    set_to_none=st.booleans(),
    channels_last=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_loaded_state_dict_s_tensors_are_the_state_as_natively(
    shapes,
    dtype,
    hyper,
    two_groups,
    start,
    source,
    casts,
    load_at,
    switch,
    phase,
    set_to_none,
    channels_last,
    seed,
):
    """Natively ``load_state_dict`` makes each loaded tensor it keeps as it is (the parameter's dtype
    and device; a float32 ``step``) the state itself, so the loaded dict's tensors follow every later
    step (and a native source's state, the same tensors, with them); one it casts is a copy and keeps
    its values. Drawn: shapes, dtypes, one or two groups, hyperparameters, the start (packed, native
    for good, auto deciding either way), a state dict from native's or our optimizer (alive or
    dropped), deep-copied or through ``torch.save``, with casts at drawn places, loaded after 0-2
    steps, a ``set_mode`` switch after, the three calls or the one pass. Against native
    ``AdamW(fused=True)`` + ``clip_grad_norm_``: every step the norm, parameters, gradients, the
    state as a mapping, the loaded dicts' values (bits, strides, and whether each is the state) and
    the sources' state, bitwise."""
    a, b, gen = conv_twins(shapes, dtype, seed, channels_last)
    ca, cb, _ = conv_twins(shapes, dtype, seed + 1, channels_last)

    oa, ob, groups = native_and_packed(a, b, two_groups, hyper, start)
    for _ in range(load_at):
        backward_both(a, b, gen, set())
        step_both(oa, ob, a, b, phase, set_to_none)
    da, db, sources = source_dicts(source, (ca, cb), hyper, gen, groups)
    cast_both(da, db, casts, dtype)
    oa.load_state_dict(da)
    ob.load_state_dict(db)
    same_mapping(oa, ob, a, b)
    loaded_as_native(oa, ob, da, db)
    for step in range(3):
        backward_both(a, b, gen, {0} if step == 1 else set())
        step_both(oa, ob, a, b, phase, set_to_none)
        if switch and step == 0 and not start.startswith("auto"):
            ob.set_mode("native" if ob.mode == "packed" else "packed")
        same_mapping(oa, ob, a, b)
        loaded_as_native(oa, ob, da, db)
        if sources is not None:
            same_state(sources[0], sources[1], ca, cb)


LOAD_REFUSED = {
    "strides": r"state_dict\['state'\]\[3\]\['exp_avg'\] \(group 0, parameter 3, shape \(6, 3, 3, 3\)\) is a "
    r"tensor with strides \(27, 9, 3, 1\), the parameter \(27, 1, 9, 3\)",
    "twice": r"\['exp_avg'\] \(group 0, parameter 0, shape \(4, 3\)\) and .*\['exp_avg_sq'\] .* are one tensor",
    "overlap": r"\(group 0, parameter 0, shape \(4, 3\)\) and .* are one tensor or share memory",
    "parameter": r"state_dict\['state'\]\[1\]\['exp_avg'\] .* is a parameter of this optimizer",
    "a_view": r"state_dict\['state'\]\[0\]\['exp_avg'\] .* shares its memory with 1 other tensor",
}


def _misload(sd, b, how):
    """``sd`` (a deep copy of native's) made into a state dict whose kept tensors cannot be slots."""
    if how == "strides":
        sd["state"][3]["exp_avg"] = torch.zeros(b[3].shape)  # contiguous, the weight channels_last
    elif how == "twice":
        sd["state"][0]["exp_avg_sq"] = sd["state"][0]["exp_avg"]
    elif how == "overlap":
        sd["state"][0]["exp_avg_sq"] = sd["state"][0]["exp_avg"][:]
    elif how == "parameter":
        sd["state"][1]["exp_avg"] = b[1]
    else:
        whole = torch.zeros(2, 4, 3)
        sd["state"][0]["exp_avg"] = whole[0]
        return whole
    return None


@pytest.mark.parametrize("how", sorted(LOAD_REFUSED))
def test_a_loaded_tensor_that_cannot_be_the_state_is_refused_before_anything_moves(how):
    """A tensor native's load keeps as the state that cannot become its packed slot as natively it is
    the state (another memory order than its parameter's, one tensor or one memory at two places, a
    parameter, a tensor a view shares): refused by ``load_state_dict``, naming it, before anything
    moves: the optimizer (parameters, buffers, state as a mapping, the next steps) and the state
    dict (the same tensors, bits and memory) exactly as they were."""
    a, b, oa, ob, gen = stepped_twins()
    sd = copy.deepcopy(oa.state_dict())
    keep = _misload(sd, b, how)
    tensors = [(t, t.data_ptr(), t.detach().clone()) for e in sd["state"].values() for t in e.values()]
    before, state = packed_now(ob, b), [(p, e, dict(e)) for p, e in ob.state.items()]
    with pytest.raises(ValueError, match=LOAD_REFUSED[how] + ".*nothing was loaded"):
        ob.load_state_dict(sd)
    assert same(before, packed_now(ob, b))
    assert [id(p) for p, _, _ in state] == [id(p) for p in ob.state]
    assert all(ob.state[p] is e and list(e) == list(was) for p, e, was in state)
    assert all(e[k] is t for _, e, was in state for k, t in was.items())
    assert all(t.data_ptr() == ptr and bitwise_equal(t.detach(), was) for t, ptr, was in tensors)
    same_mapping(oa, ob, a, b)
    backward_both(a, b, gen, set())
    step_both(oa, ob, a, b, "three_calls", True)
    same_mapping(oa, ob, a, b)
    del keep


def test_a_state_dict_of_another_live_packed_optimizer_is_copied():
    """The documented difference: ``opt2.load_state_dict(opt1.state_dict())`` with both
    ``PackedAdamW`` alive. Natively the two optimizers would share the loaded tensors; here they stay
    the first one's packed state (which it goes on stepping, as native's own) and are copied into the
    second, whose steps are native's (against native loading a copy)."""
    a, b, oa, ob, gen = stepped_twins()
    c, d, _ = conv_twins([(4, 3), (4, 3), (5,)], torch.float32, 1, True)
    oc, od = torch.optim.AdamW(c, fused=True), PackedAdamW(d, mode="packed")
    sd = ob.state_dict()
    oc.load_state_dict(copy.deepcopy(oa.state_dict()))
    od.load_state_dict(sd)
    assert all(sd["state"][k][key] is ob.state[p][key] for k, p in enumerate(b) for key in sd["state"][k])
    for _ in range(2):
        backward_both(a, b, gen, set())
        backward_both(c, d, gen, set())
        step_both(oa, ob, a, b, "three_calls", True)
        step_both(oc, od, c, d, "three_calls", True)
        same_mapping(oa, ob, a, b)
        same_mapping(oc, od, c, d)
