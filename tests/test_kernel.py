"""The one-pass gradient phase in C (cotangent/kernel/phase.c): exactness, self-check, build, fallback."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from cotangent import PackedAdamW
from cotangent import kernel as phase_kernel
from cotangent.kernel import selfcheck
from cotangent.verify import bitwise_equal
from harness.arms import build_arm

#: Multiples of 16 elements (what phase.c covers): equal sizes (rows reduced together, more than
#: MAX_ROWS of them), one buffer longer than two tasks of the update loop, 0-d-free.
SHAPES = [(64, 64)] * 6 + [(32, 96), (96, 32), (16,), (16,), (48,), (9000, 16), (130000,), (256,)]

CAN_BUILD = (
    platform.machine().lower() in ("x86_64", "amd64")
    and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    and any(shutil.which(c) for c in ("cc", "gcc", "clang"))
)


def test_kernel_builds_and_passes_its_self_check_where_it_can():
    """On an x86-64 machine with AVX2 and a C compiler (CI's) the kernel must be in use; anywhere
    else the reason it is not must be stated."""
    k = phase_kernel.kernel()
    cap = torch.backends.cpu.get_cpu_capability()
    if CAN_BUILD:
        assert k is not None, phase_kernel.unavailable_reason()
        assert k.lanes in phase_kernel.lane_widths(cap)
        assert (
            k.capability == cap and f"torch capability {cap}, reproduces its {k.isa} kernels" in k.describe()
        )
        assert k.path.is_file()
    else:
        assert k is None and phase_kernel.unavailable_reason()


def test_lane_widths_follow_atens_dispatch():
    """AVX-512 CPUs run the AVX2 build of norm_stub and fused_adam_stub (REGISTER_DISPATCH leaves the
    AVX-512 slot empty), so 8 lanes come first there; the scalar build and other ISAs have none."""
    assert phase_kernel.lane_widths("AVX512") == [8, 16]
    assert phase_kernel.lane_widths("AVX2") == [8]
    assert phase_kernel.lane_widths("DEFAULT") == [] and phase_kernel.lane_widths("SVE256") == []


def _dispatch_slots(stubs: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Per ATen stub, the ``nm`` symbol type of each capability slot in libtorch_cpu.so: ``D``
    (initialised data: a kernel registered) or ``B`` (zero-initialised: nullptr, no kernel)."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    nm = shutil.which("nm")
    if nm is None or not lib.is_file():
        pytest.skip("needs binutils' nm and torch's libtorch_cpu.so")
    slots: dict[str, dict[str, str]] = {s: {} for s in stubs}
    with subprocess.Popen([nm, "-C", str(lib)], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "_DECLARE_DISPATCH_type>::" not in line:
                continue
            for stub in stubs:
                if f"at::native::{stub}_DECLARE_DISPATCH_type>::" in line:
                    slots[stub][line.rstrip().rsplit("::", 1)[1]] = line.split()[1]
    return slots


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 dispatch slots")
def test_avx512_cpus_run_the_avx2_build_of_the_kernels_phase_c_reproduces():
    """Why 8 lanes come first under torch's AVX512 capability, read from this torch's own binary: the
    AVX512 slots of norm_stub and fused_adam_stub are zero-initialised (REGISTER_DISPATCH leaves them
    empty), so DispatchStub runs their AVX2 kernels on an AVX-512 CPU; their AVX2 slots hold kernels."""
    slots = _dispatch_slots(("norm_stub", "fused_adam_stub"))
    for stub, kinds in slots.items():
        assert kinds.get("AVX2") in ("D", "d"), (stub, kinds)
        assert kinds.get("AVX512") in ("B", "b"), (
            f"torch {torch.__version__} registers an AVX-512 kernel for {stub}: on AVX-512 CPUs the 16-lane form "
            "runs, so cotangent.kernel.lane_widths should try 16 first",
            kinds,
        )
    assert phase_kernel.lane_widths("AVX512") == [8, 16]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


#: What torch needs of the CPU to dispatch each capability (cpuinfo's checks in ATen).
ISA_FLAGS = {"avx2": {"avx2", "fma"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}

_ISA_PROBE = (
    "import torch\n"
    "from cotangent import kernel as phase_kernel\n"
    "from cotangent.verify import check_fused_phase, check_native_phase\n"
    "k = phase_kernel.kernel()\n"
    "print(torch.backends.cpu.get_cpu_capability())\n"
    "print(k.describe() if k else 'unavailable: ' + str(phase_kernel.unavailable_reason()))\n"
    "print(check_native_phase(steps=6) if k else check_fused_phase(torch.device('cpu'), torch.float32, steps=6))\n"
)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_phase_c_runs_bitwise_under_each_instruction_set(isa, tmp_path):
    """In a fresh process with ``ATEN_CPU_CAPABILITY`` set, torch dispatches that instruction set; the
    C phase must pass its self-check, be used, and match native bit for bit. Skipped only where the
    CPU lacks the instruction set (then torch cannot dispatch it)."""
    if not CAN_BUILD:
        pytest.skip("phase.c needs x86-64, AVX2 and a C compiler")
    missing = ISA_FLAGS[isa] - _cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))}: torch cannot dispatch {isa.upper()} here")
    out = subprocess.run(
        [sys.executable, "-c", _ISA_PROBE],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ATEN_CPU_CAPABILITY": isa},
    )
    assert out.returncode == 0, out.stderr
    cap, describe, bitwise = out.stdout.strip().splitlines()
    assert cap == isa.upper()
    assert describe.startswith("phase-") and f"torch capability {cap}" in describe, describe
    assert bitwise == "True"


def test_scalar_capability_falls_back_honestly():
    """Under torch's DEFAULT (scalar) capability phase.c is not used, the reason names the capability,
    and the PyTorch-kernel phase is still bitwise native."""
    out = subprocess.run(
        [sys.executable, "-c", _ISA_PROBE],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
    )
    assert out.returncode == 0, out.stderr
    cap, describe, bitwise = out.stdout.strip().splitlines()
    assert cap == "DEFAULT"
    assert describe.startswith("unavailable: ") and "DEFAULT" in describe, describe
    assert bitwise == "True"


needs_kernel = pytest.mark.skipif(not CAN_BUILD, reason="phase.c needs x86-64, AVX2 and a C compiler")


@needs_kernel
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"amsgrad": True, "tensor_lr": True},
        {"wd": 0.0, "betas": (0.3, 0.99)},
        {"betas": (0.5, 0.95), "eps": 1e-6, "max_norm": 1e6},
    ],
)
def test_native_phase_bitwise_three_calls(kw):
    """phase.c == native clip_grad_norm_ + AdamW(fused=True) + zero_grad, 100 steps: total norm,
    parameters, both moments, step counters; gradients left all -0.0; clip active and inactive."""
    tensor_lr = kw.pop("tensor_lr", False)
    wd = kw.pop("wd", 0.1)
    max_norm = kw.pop("max_norm", 2.0)
    gen = torch.Generator().manual_seed(21)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa = torch.optim.AdamW(a, lr=1e-2, weight_decay=wd, fused=True, **kw)
    ob = PackedAdamW(b, lr=1e-2, weight_decay=wd, release_grads=False, **kw)  # phase.c writes the -0.0
    assert ob.phase_kernel().startswith("phase.c"), ob.phase_kernel()
    clipped = 0
    for step in range(100):
        if step % 10 == 5:
            lr = 1e-2 / (1 + step)
            for o in (oa, ob):
                o.param_groups[0]["lr"] = torch.tensor(lr) if tensor_lr else lr
        grads = [torch.randn(s, generator=gen) * (3 if step % 2 else 1e-4) for s in SHAPES]
        grads[0][0, :3] = -0.0
        grads[1][5, 7] = 0.0
        torch.autograd.backward(a, grads)
        torch.autograd.backward(b, grads)
        na = torch.nn.utils.clip_grad_norm_(a, max_norm)
        oa.step()
        oa.zero_grad()
        nb = ob.clip_step_zero_grad(max_norm)
        clipped += bool(na > max_norm)
        assert bitwise_equal(na, nb), f"step {step}"
        for x, y in zip(a, b):
            assert bitwise_equal(x, y), f"step {step}"
            for key, val in oa.state[x].items():
                assert bitwise_equal(val, ob.state[y][key]), f"step {step} {key}"
    assert 0 < clipped < 100 or max_norm == 1e6
    g = ob.flat_groups[0].grad
    assert torch.equal(g.view(torch.int32), torch.full_like(g, -0.0).view(torch.int32))
    assert all(y.grad is None for y in b)  # as native's zero_grad() leaves them


@needs_kernel
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    units=st.lists(st.sampled_from([1, 1, 2, 3, 16, 64, 64, 257, 4100]), min_size=1, max_size=12),
    seed=st.integers(0, 10_000),
    max_norm=st.sampled_from([0.5, 1e6]),
)
def test_native_phase_random_shape_lists(units, seed, max_norm):
    """Random lists of sizes phase.c covers (multiples of 16 elements, repeats make buckets),
    20 steps, against the native three calls."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(u, 16) if i % 2 else (16 * u,) for i, u in enumerate(units)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, fused=True)
    ob = PackedAdamW(b, lr=1e-2, weight_decay=0.1)
    assert ob.phase_kernel().startswith("phase.c")
    for step in range(20):
        grads = [torch.randn(s, generator=gen) * 2 for s in shapes]
        torch.autograd.backward(a, grads)
        torch.autograd.backward(b, grads)
        na = torch.nn.utils.clip_grad_norm_(a, max_norm)
        oa.step()
        oa.zero_grad()
        assert bitwise_equal(na, ob.clip_step_zero_grad(max_norm)), f"step {step}"
        assert all(bitwise_equal(x, y) for x, y in zip(a, b)), f"step {step}"


@needs_kernel
def test_native_phase_nonfinite_raises_before_any_update():
    p = [torch.nn.Parameter(torch.randn(64, 64)) for _ in range(3)]
    opt = PackedAdamW(p)
    assert opt.phase_kernel().startswith("phase.c")
    before = [t.detach().clone() for t in p]
    grads = [torch.randn(64, 64) for _ in p]
    grads[1][3, 3] = float("inf")
    torch.autograd.backward(p, grads)
    with pytest.raises(RuntimeError, match="non-finite"):
        opt.clip_step_zero_grad(1.0, error_if_nonfinite=True)
    assert all(torch.equal(x, y) for x, y in zip(p, before))
    assert float(opt.flat_groups[0].steps.sum()) == 0.0


@needs_kernel
def test_self_check_tells_the_forms_apart():
    """Each form the self-check chose passes, and the other forms of the same step fail: the
    check can tell a wrong rounding from the right one (or it would prove nothing)."""
    k = phase_kernel.kernel()
    assert k is not None
    assert selfcheck.check_norms(k, k.acc_fma)
    assert not selfcheck.check_norms(k, 1 - k.acc_fma)
    assert selfcheck.check_total(k, k.acc_fma, k.tail_form)
    assert not any(selfcheck.check_total(k, k.acc_fma, t) for t in (0, 1, 2) if t != k.tail_form)
    assert selfcheck.check_update(k, k.sq_form)
    assert not selfcheck.check_update(k, k.sq_form ^ 1)  # fused vs separate multiply-add


def test_outside_what_phase_c_covers_the_torch_kernels_run():
    odd = PackedAdamW([torch.nn.Parameter(torch.randn(7, 3)), torch.nn.Parameter(torch.randn(16))])
    if phase_kernel.kernel() is not None:  # sizes not multiples of 16 take torch's kernels inside the C phase
        assert odd.phase_kernel().startswith("phase.c")
    f64 = PackedAdamW([torch.nn.Parameter(torch.randn(16, dtype=torch.float64))])
    assert f64.phase_kernel().startswith("torch kernels (phase.c covers float32 on CPU, not float64")
    asked = PackedAdamW([torch.nn.Parameter(torch.randn(16))], kernel="torch")
    assert asked.phase_kernel() == "torch kernels (kernel='torch' was requested)"
    with pytest.raises(ValueError, match="kernel must be auto or torch"):
        PackedAdamW([torch.nn.Parameter(torch.randn(16))], kernel="c")


def test_both_kernels_give_the_same_training_bits():
    """The candidate arm with phase.c (where it can run) and with torch's kernels: same losses and
    weights after 30 steps of a real model on real batches."""
    from harness.config import ModelConfig
    from harness.models import build_model

    results = []
    for kernel in ("auto", "torch"):
        torch.manual_seed(0)
        cfg = ModelConfig(
            family="transformer",
            d_model=64,
            n_layers=2,
            context=32,
            mlp="gelu",
            mlp_hidden=256,
            norm="layernorm",
            n_heads=4,
            n_kv_heads=4,
        )
        model = build_model(cfg, 0)
        arm = build_arm(
            "cotangent", model.parameters(), lr=3e-3, weight_decay=0.1, max_norm=0.5, kernel=kernel
        )
        gen = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(30):
            x = torch.randint(0, 256, (4, 33), generator=gen)
            loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            arm.phase()
            losses.append(loss.detach())
        results.append(
            (
                arm.optimizer.phase_kernel(),
                torch.stack(losses),
                [p.detach().clone() for p in model.parameters()],
            )
        )
    (ka, la, wa), (kb, lb, wb) = results
    assert kb.startswith("torch kernels")
    assert ka.startswith("phase.c") or not CAN_BUILD
    assert bitwise_equal(la, lb)
    assert all(bitwise_equal(x, y) for x, y in zip(wa, wb))


def _probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = (
        "import torch\n"
        "from cotangent import kernel as phase_kernel\n"
        "from cotangent import PackedAdamW\n"
        "opt = PackedAdamW([torch.nn.Parameter(torch.randn(64, 64))])\n"
        "print(opt.phase_kernel())\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}
    )


@pytest.fixture
def decided_here(monkeypatch: pytest.MonkeyPatch):
    """What the probe prints, decided in this process under the environment the test sets: the
    kernel decision forgotten first (:func:`cotangent.kernel.reset`; a fresh process starts without
    one, and :func:`_probe` starts one in test_build_is_cached_by_source_and_compiler), and again
    afterwards, so the next test decides under the suite's own environment."""

    def decide(env: dict[str, str]) -> str:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        phase_kernel.reset()
        return PackedAdamW([torch.nn.Parameter(torch.randn(64, 64))]).phase_kernel()

    yield decide
    phase_kernel.reset()


def test_disabled_by_environment(tmp_path, decided_here):
    said = decided_here({"COTANGENT_NATIVE": "0", "COTANGENT_NATIVE_CACHE": str(tmp_path)})
    assert said == "torch kernels (disabled by COTANGENT_NATIVE=0)"
    assert list(tmp_path.iterdir()) == []


@needs_kernel
def test_failed_build_falls_back_and_leaves_nothing(tmp_path, decided_here):
    said = decided_here(
        {"CC": shutil.which("false") or "/bin/false", "COTANGENT_NATIVE_CACHE": str(tmp_path)}
    )
    assert said.startswith("torch kernels (build failed:"), said
    assert list(tmp_path.iterdir()) == []  # no half-written shared object to load next time


@needs_kernel
def test_build_is_cached_by_source_and_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("COTANGENT_NATIVE_CACHE", str(tmp_path))
    cc = phase_kernel.compiler()
    assert cc is not None
    first = phase_kernel.build(cc)
    stamp = first.stat().st_mtime_ns
    assert phase_kernel.build(cc) == first and first.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
    out = _probe({"COTANGENT_NATIVE_CACHE": str(tmp_path)})
    assert out.stdout.strip().startswith(f"phase.c ({first.name}:"), out.stdout + out.stderr


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_release_grads_mode_is_bitwise_native(kernel):
    """release_grads=True: pages given back after each phase, slots refilled with -0.0 by the hooks
    as backward reaches them; same bits as native over 40 steps, with -0.0 gradients, a parameter
    left without gradient now and then, and zero_grad between steps; gradients read as zeros."""
    gen = torch.Generator().manual_seed(31)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, fused=True)
    ob = PackedAdamW(b, lr=1e-2, weight_decay=0.1, kernel=kernel, release_grads=True)
    for step in range(40):
        grads = [torch.randn(s, generator=gen) * 3 for s in SHAPES]
        for g in grads:
            g.view(-1)[::7] = -0.0
        skip = 2 if step % 10 == 9 else None  # a parameter without gradient this step
        pa = [x for i, x in enumerate(a) if i != skip]
        pb = [y for i, y in enumerate(b) if i != skip]
        gs = [g for i, g in enumerate(grads) if i != skip]
        torch.autograd.backward(pa, gs)
        torch.autograd.backward(pb, gs)
        for x, y in zip(pa, pb):  # -0.0 entries stay -0.0: the hook refilled the released slot
            assert bitwise_equal(x.grad, y.grad), f"step {step}"
        if step % 2:
            na = torch.nn.utils.clip_grad_norm_(pa, 1.0)
            oa.step()
            oa.zero_grad()
            nb = ob.clip_step_zero_grad(1.0)
        else:
            from cotangent import clip_grad_norm_

            na = torch.nn.utils.clip_grad_norm_(pa, 1.0)
            nb = clip_grad_norm_(b, 1.0)
            oa.step()
            ob.step()
            oa.zero_grad()
            ob.zero_grad()
        assert bitwise_equal(na, nb), f"step {step}"
        assert all(bitwise_equal(x, y) for x, y in zip(a, b)), f"step {step}"
        for x, y in zip(a, b):
            if x in oa.state:
                assert all(bitwise_equal(v, ob.state[y][k]) for k, v in oa.state[x].items()), f"step {step}"
        assert all(y.grad is None for y in b)  # as native's zero_grad() leaves them
    assert ob._pack.release_mode and all(ob._pack.dirty)
