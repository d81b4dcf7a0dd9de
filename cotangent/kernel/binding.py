"""The ctypes binding of ``phase.c``: its argument structure, the loaded kernel's calls, its norm tasks."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

#: Elements of the flat buffers one task of the update loop covers (a multiple of 16).
UPDATE_CHUNK = 65536
#: Rows of equal length whose norms one task computes together (``MAX_ROWS`` in phase.c).
MAX_ROWS = 4

_c_float_p = ctypes.POINTER(ctypes.c_float)
VP = ctypes.c_void_p


class Hyper(ctypes.Structure):
    """``cot_hyper`` in phase.c."""

    _fields_ = [
        ("coef", VP),
        ("steps", VP),
        ("count", ctypes.c_int64),
        ("lr", ctypes.c_double),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("amsgrad", ctypes.c_int),
        ("maximize", ctypes.c_int),
        ("sq_form", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("chunk", ctypes.c_int64),
        ("zero", ctypes.c_int),
        ("grad_scale", VP),
        ("found_inf", VP),  # float32 scalars, or NULL (the AMP protocol)
    ]


@dataclass(frozen=True)
class Kernel:
    """A loaded, self-checked ``phase.c`` and the arithmetic forms that reproduce this torch."""

    lib: ctypes.CDLL
    path: Path
    lanes: int  # float lanes of the ATen kernels that run: 8 (their AVX2 build) or 16 (AVX-512)
    acc_fma: int  # norm accumulation: 0 acc + x*x, 1 fma(x, x, acc)
    tail_form: int  # scalar tail of a norm: 0 s + x*x, 1 fma, 2 fours as s + x*x then fma
    sq_form: int  # second moment: bit 0 fma(c*g, g, v*b2) for v*b2 + (c*g)*g; bit 1 g before maximize;
    #                 bit 2 the same under grad_scale
    capability: str = ""  # torch.backends.cpu.get_cpu_capability() when the self-check ran

    @property
    def isa(self) -> str:
        """The instruction set of the ATen kernels this kernel reproduces (AVX2 or AVX512)."""
        return "AVX2" if self.lanes == 8 else "AVX512"

    def describe(self) -> str:
        return (
            f"{self.path.name}: torch capability {self.capability or '?'}, reproduces its {self.isa} "
            f"kernels; lanes={self.lanes} acc_fma={self.acc_fma} tail_form={self.tail_form} "
            f"sq_form={self.sq_form}"
        )

    # -- calls -------------------------------------------------------------------------------
    def row_norms(
        self,
        base: torch.Tensor,
        offsets: torch.Tensor,
        numels: torch.Tensor,
        first: torch.Tensor,
        rows: torch.Tensor,
        out: torch.Tensor,
        threads: int,
        acc_fma: int | None = None,
    ) -> None:
        self.lib.cot_row_norms(
            base.data_ptr(),
            offsets.data_ptr(),
            numels.data_ptr(),
            first.data_ptr(),
            rows.data_ptr(),
            first.numel(),
            out.data_ptr(),
            self.lanes,
            self.acc_fma if acc_fma is None else acc_fma,
            threads,
        )

    def total_coef(
        self,
        norms: torch.Tensor,
        perm: torch.Tensor,
        scratch: torch.Tensor,
        max_norm: float,
        total: torch.Tensor,
        coef: torch.Tensor,
        tail_form: int | None = None,
        acc_fma: int | None = None,
    ) -> None:
        self.lib.cot_total_coef(
            norms.data_ptr(),
            perm.data_ptr(),
            perm.numel(),
            scratch.data_ptr(),
            max_norm,
            self.lanes,
            self.acc_fma if acc_fma is None else acc_fma,
            self.tail_form if tail_form is None else tail_form,
            total.data_ptr(),
            coef.data_ptr(),
        )

    def update(
        self,
        p: torch.Tensor,
        g: torch.Tensor,
        m: torch.Tensor,
        v: torch.Tensor,
        mx: torch.Tensor | None,
        hyper: Hyper,
    ) -> None:
        self.lib.cot_update(
            p.data_ptr(),
            g.data_ptr(),
            m.data_ptr(),
            v.data_ptr(),
            None if mx is None else mx.data_ptr(),
            p.numel(),
            ctypes.byref(hyper),
        )


def tasks_for(numels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Norm tasks: runs of at most :data:`MAX_ROWS` consecutive tensors of equal length."""
    first: list[int] = []
    rows: list[int] = []
    i = 0
    while i < len(numels):
        j = i
        while j < len(numels) and j - i < MAX_ROWS and numels[j] == numels[i]:
            j += 1
        first.append(i)
        rows.append(j - i)
        i = j
    return torch.tensor(first, dtype=torch.int64), torch.tensor(rows, dtype=torch.int64)
