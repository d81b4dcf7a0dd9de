"""The one-pass gradient phase in C (``phase.c``): built on first use, used only where verified.

:meth:`cotangent.PackedAdamW.clip_step_zero_grad` can run the whole float32 gradient
phase on CPU as two calls into ``phase.c``: the per-tensor norms, the total norm and the clip
coefficient; then, in one loop over the flat buffers, scale, AdamW update and zeroing. That is
exact only if every rounding is the one PyTorch's own kernels make, and some of those depend on
how the wheel's compiler contracted ``a * b + c`` into fused multiply-adds. So:

* ``phase.c`` is compiled with ``-ffp-contract=off`` (every rounding in it is written out) and
  takes each contraction-dependent form as a parameter;
* :func:`kernel` builds it (once per source, compiler and flags; cached under
  ``$COTANGENT_NATIVE_CACHE`` or ``~/.cache/cotangent-harness``), loads it and runs a self-check
  against the running torch: per-tensor norms against ``torch.linalg.vector_norm``, the total and
  the coefficient against native clipping's expressions, 12 update steps against
  ``mul_`` + ``torch._fused_adamw_`` + ``fill_(-0.0)``, over several hyperparameter sets, with
  ``-0.0``, zero and large gradients. It keeps the first form of each that matches bit for bit;
* the lane width is the one of the ATen kernels that actually run, not of the CPU: ATen registers
  ``norm_stub`` and ``fused_adam_stub`` with ``REGISTER_DISPATCH``, which leaves their AVX-512 slot
  empty, and ``DispatchStub`` then runs their AVX2 build (``ReduceOpsKernel.cpp``,
  ``FusedAdamKernel.cpp``, ``DispatchStub.cpp``). So under torch's ``AVX512`` capability the self-check
  tries 8 lanes (the AVX2 kernels) first and 16 (an AVX-512 registration) second;
  :attr:`Kernel.isa` names the instruction set of the kernels it reproduces;
* when anything is missing (not x86-64 with AVX2 and FMA, no C compiler, ``COTANGENT_NATIVE=0``,
  torch's ``DEFAULT`` capability, whose scalar kernels round ``fmadd`` in two steps)
  or no form matches, :func:`kernel` returns ``None``, :func:`unavailable_reason` says why, and
  the phase runs on PyTorch's kernels (exact by construction).

Only the standard library and torch; no pickle; the compiled file is keyed by a hash of the
source, the flags and the compiler's version, written to a temporary name and renamed into
place, so a crashed build leaves nothing that would be loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from cotangent.kernel import selfcheck
from cotangent.kernel.binding import MAX_ROWS, UPDATE_CHUNK, VP, Hyper, Kernel, tasks_for

SOURCE = Path(__file__).with_name("phase.c")
FLAGS = [
    "-O2",
    "-std=c11",
    "-mavx2",
    "-mfma",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fopenmp",
    "-shared",
    "-fPIC",
]

__all__ = [
    "MAX_ROWS",
    "UPDATE_CHUNK",
    "Hyper",
    "Kernel",
    "kernel",
    "release_pages",
    "tasks_for",
    "unavailable_reason",
]

_PAGE = 4096
_MADV_DONTNEED = 4
_libc: ctypes.CDLL | None = None


def release_pages(t: torch.Tensor) -> tuple[int, int] | None:
    """Give the whole memory pages inside contiguous CPU tensor ``t`` back to the OS (Linux
    ``madvise(MADV_DONTNEED)``: they read as +0.0 until written, and count in RSS again only when
    touched). Returns the element range ``[lo, hi)`` released, or ``None`` where that is not
    possible (another OS, too small a tensor)."""
    global _libc
    if platform.system() != "Linux" or t.device.type != "cpu" or not t.is_contiguous():
        return None
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [VP, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    lo, hi = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if hi <= lo:
        return None
    if _libc.madvise(lo, hi - lo, _MADV_DONTNEED) != 0:
        return None
    size = t.element_size()
    return (lo - start) // size, (hi - start) // size


# --------------------------------------------------------------------------------------------
# Build and load
# --------------------------------------------------------------------------------------------


def lane_widths(capability: str) -> list[int]:
    """The lane widths of the ATen kernels torch may run under ``capability``, likeliest first
    (see the module docstring: AVX-512 CPUs run the AVX2 build of the stubs phase.c reproduces);
    empty where phase.c cannot reproduce them (``DEFAULT``, other architectures)."""
    cap = capability.upper()
    if cap.startswith("AVX512") or cap.startswith("AMX"):
        return [8, 16]
    if cap.startswith("AVX2"):
        return [8]
    return []


def compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def cache_dir() -> Path:
    env = os.environ.get("COTANGENT_NATIVE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cotangent-harness"


def verified_source() -> bytes:
    """``phase.c``'s bytes, read once; where the runner verified the worker's sources
    (``$HARNESS_SOURCES``, :mod:`harness.execute.launchers`), they must be the verified ones."""
    data = SOURCE.read_bytes()
    sources = os.environ.get("HARNESS_SOURCES")
    if sources:
        import json

        here = os.path.realpath(SOURCE)
        want = next(
            (
                h
                for root, files in json.loads(sources).items()
                for rel, h in files.items()
                if os.path.join(root, rel) == here
            ),
            None,
        )
        if want != hashlib.sha256(data).hexdigest():
            raise RuntimeError(
                f"{SOURCE}: its bytes are not the ones the runner verified before the run "
                "(changed while the run started)"
            )
    return data


def build(cc: str) -> Path:
    """Compile ``phase.c`` (or reuse the cached build once verified); returns the shared object's path.

    The cache is keyed by source, flags and compiler, but a file found there is loaded only when its
    sha256 is the one the runner verified for this run (``$COTANGENT_PHASE_SHA256``), or when a fresh
    compile of the source with this compiler gives the same bytes (the build is reproducible: it
    compiles a private copy of the source's bytes, read once, on the name ``phase.c``, and gives
    the same bytes in any folder); otherwise the fresh build replaces it, so a planted or stale
    library is never loaded. :func:`loaded_sha256` says what was."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    src = verified_source()
    key = hashlib.sha256(b"\0".join([src, " ".join(FLAGS).encode(), version.encode()]))
    out_dir = cache_dir()
    target = out_dir / f"phase-{key.hexdigest()[:16]}.so"
    verified = os.environ.get("COTANGENT_PHASE_SHA256")
    if verified and target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == verified:
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".phase-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(prefix="cotangent-phase-src-") as private:
            (Path(private) / SOURCE.name).write_bytes(src)  # the compiler reads these bytes, not the path
            proc = subprocess.run(
                [cc, *FLAGS, SOURCE.name, "-o", tmp, "-lm"], capture_output=True, text=True, cwd=private
            )
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE.name}: {proc.stderr.strip()[-400:]}")
        fresh = Path(tmp).read_bytes()
        if not (target.is_file() and target.read_bytes() == fresh):
            os.replace(tmp, target)  # a missing, stale or planted cached file gives way to the fresh build
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def sealed_copy(data: bytes) -> str:
    """A path from which ``dlopen`` reads exactly ``data``: a sealed memory file (Linux: no process,
    this one included, can change its bytes once sealed), else a private copy in a fresh folder of
    mode 0700. Loading from the cache path after hashing it would load whatever lies there by then."""
    if hasattr(os, "memfd_create") and hasattr(os, "MFD_ALLOW_SEALING"):
        import fcntl

        fd = os.memfd_create("cotangent-phase.so", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        _SEALED.append(fd)  # kept open for the process's life, like the library it holds
        return f"/proc/self/fd/{fd}"
    folder = tempfile.mkdtemp(prefix="cotangent-phase-")
    path = os.path.join(folder, "phase.so")
    with open(path, "xb") as f:
        f.write(data)
    os.chmod(path, 0o500)
    return path


def _load(path: Path) -> ctypes.CDLL:
    data = path.read_bytes()  # read once: hashed, and the very bytes loaded
    lib = ctypes.CDLL(sealed_copy(data))
    _state["so_sha256"] = hashlib.sha256(data).hexdigest()
    i64, i32, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.cot_row_norms.argtypes = [VP, VP, VP, VP, VP, i64, VP, i32, i32, i32]
    lib.cot_row_norms.restype = None
    lib.cot_total_coef.argtypes = [VP, VP, i64, VP, f32, i32, i32, i32, VP, VP]
    lib.cot_total_coef.restype = None
    lib.cot_update.argtypes = [VP, VP, VP, VP, VP, i64, ctypes.POINTER(Hyper)]
    lib.cot_update.restype = None
    return lib


def loaded_sha256() -> str | None:
    """The sha256 of the ``phase.c`` library this process loaded (None when it loaded none)."""
    return _state.get("so_sha256")  # type: ignore[return-value]


_state: dict[str, object] = {}
_SEALED: list[int] = []


def kernel() -> Kernel | None:
    """The verified kernel for this process at its current thread count, or ``None`` (then
    :func:`unavailable_reason` says why). The forms are checked per thread count: at one thread
    ATen's kernels may round where they do not at two (the self-check found a different form)."""
    key = f"kernel@{torch.get_num_threads()}"
    if key not in _state:
        try:
            _state[key] = _make()
            _state[key + ":reason"] = None
        except _Unavailable as exc:
            _state[key] = None
            _state[key + ":reason"] = str(exc)
    return _state[key]  # type: ignore[return-value]


def unavailable_reason() -> str | None:
    return _state.get(f"kernel@{torch.get_num_threads()}:reason")  # type: ignore[return-value]


def reset() -> None:
    """Forget the decision (tests: after changing ``COTANGENT_NATIVE`` or ``CC``)."""
    _state.clear()


class _Unavailable(Exception):
    pass


def _make() -> Kernel:
    if os.environ.get("COTANGENT_NATIVE", "1") == "0":
        raise _Unavailable("disabled by COTANGENT_NATIVE=0")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise _Unavailable(f"phase.c is x86-64 code; this machine is {platform.machine()}")
    capability = torch.backends.cpu.get_cpu_capability()
    lanes = lane_widths(capability)
    if not lanes:
        raise _Unavailable(
            f"torch's CPU capability is {capability}, not AVX2/AVX512 (its kernels are not phase.c's forms)"
        )
    cc = compiler()
    if cc is None:
        raise _Unavailable("no C compiler (set CC, or install cc/gcc/clang)")
    try:
        path = build(cc)
        lib = _load(path)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        raise _Unavailable(f"build failed: {exc}") from exc

    forms = selfcheck.find_forms(lib, path, lanes, capability)
    if isinstance(forms, str):
        raise _Unavailable(forms)
    return forms
