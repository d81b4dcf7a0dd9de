"""Cotangent gradient handling: exact bucketed clipping and a packed fused AdamW.

The work between ``loss.backward()`` and the next parameter update, made cheaper while every
bit stays what native PyTorch computes:

* :func:`clip_grad_norm_` is a drop-in for :func:`torch.nn.utils.clip_grad_norm_`. Per-parameter
  norms are computed in batches (parameters with equal element count ``K`` form a bucket reduced
  as one ``B x (K/2) x 2`` view), the scalar norms are put back in the order native clipping stacks
  them, and the final reduction and the clip coefficient are native's.
* :class:`PackedAdamW` lays parameters, gradients and both moments out as flat buffers in one
  coordinate order and applies ``torch._fused_adamw_``, the kernel behind
  ``torch.optim.AdamW(fused=True)``, over views of them.
* :meth:`PackedAdamW.clip_step_zero_grad` runs clip + step + zero_grad as one pass over memory
  (per-parameter norms first, then block by block: scale, fused update, zero, while the block
  is in cache), bit for bit the three calls. The candidate arm uses it. For float32 on x86-64
  CPUs it runs as two calls into C (:mod:`cotangent.kernel`, ``phase.c``: the bucketed norms, then one loop that
  scales, updates and zeroes), used only after a self-check shows it bitwise the running torch.

Exactness is a property of (device type, dtype, kernel). :data:`EXACT_PATHS` lists what is known
to be bitwise native; everything else takes the native path. ``harness verify --device D`` checks
every path on a device and prints what matched.

Why the CPU entries are exact (PyTorch 2.6 - 2.14 CPU kernels):

* 2-norm of a contiguous float32/float64/bfloat16 tensor reduced over its last dimension takes the
  vectorised "reduce last dim" kernel, one output row at a time, and a full reduction of one
  tensor coalesces to the same kernel with one row; so row ``b`` of a ``B x K`` reduction is the
  bits of ``vector_norm(t_b)``.
* The fused AdamW CPU kernel splits a tensor into per-thread chunks of whole cache lines and runs
  a vectorised body over each chunk with a scalar (double-promoted) tail. Only the last
  ``numel % vector_width`` elements of each tensor take the tail, whatever the thread count. A
  flat run of parameters whose sizes are all multiples of one cache line therefore has no tail
  element in either layout, and the coordinatewise update is identical (``aligned`` update mode).
  Parameters of other sizes are updated through their own views in the same kernel call.

Modules: :mod:`~cotangent.norms` (native and batched per-parameter norms),
:mod:`~cotangent.clip` (``clip_grad_norm_``), :mod:`~cotangent.pack` (the flat
layout), :mod:`~cotangent.adamw` (``PackedAdamW``), :mod:`~cotangent.exactness`
(which paths are bitwise native where), :mod:`~cotangent.kernel` (the C phase) and
:mod:`~cotangent.verify` (``harness verify``). Nothing here imports the harness; the
study's arms live in :mod:`harness.arms`.
"""

from cotangent.adamw import PackedAdamW
from cotangent.clip import clip_grad_norm_
from cotangent.exactness import EXACT_PATHS, ExactPaths, exact_paths
from cotangent.pack import CPU_BLOCK_BYTES

__all__ = ["CPU_BLOCK_BYTES", "EXACT_PATHS", "ExactPaths", "PackedAdamW", "clip_grad_norm_", "exact_paths"]
