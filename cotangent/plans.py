"""The fused AdamW calls over a flat group: which tensors each call takes, and the blocks of the phase."""

from __future__ import annotations

from torch import Tensor

from cotangent.pack import CACHE_LINE_BYTES, Block, FlatGroup, Pack

#: Tensor lists of one ``torch._fused_adamw_`` call: params, grads, exp_avgs, exp_avg_sqs,
#: max_exp_avg_sqs, steps.
Lists = tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor], list[Tensor], list[Tensor]]


def view_lists(pack: Pack, g: FlatGroup, positions: list[int]) -> Lists:
    """Per-parameter views of the packed positions ``positions`` of ``g``, as native's call takes them."""
    ps, gs, ms, vs, xs, ss = [], [], [], [], [], []
    for j in positions:
        i = g.index[j]
        shape = pack.params[i].shape
        ps.append(pack.params[i].detach())
        gs.append(pack.grad_views[i])
        ms.append(g.slot(g.exp_avg, j, shape))
        vs.append(g.slot(g.exp_avg_sq, j, shape))
        if g.max_exp_avg_sq is not None:
            xs.append(g.slot(g.max_exp_avg_sq, j, shape))
        ss.append(g.steps[j])
    return ps, gs, ms, vs, xs, ss


def lists_for(pack: Pack, g: FlatGroup, mode: str) -> Lists:
    """Tensor lists for the fused call when every parameter of ``g`` has a gradient and all step
    counts are equal: the first ``flat_upto`` parameters as one flat run (``aligned``: the
    cache-line multiples, whose update is elementwise that of their own tensors), the rest as views."""
    n = len(g.index)
    flat_upto = {"views": 0, "aligned": g.aligned_end, "flat": n}[mode]
    if flat_upto <= 1:
        return view_lists(pack, g, list(range(n)))
    end = g.offsets[flat_upto - 1] + g.numels[flat_upto - 1]
    ps, gs, ms, vs, xs, ss = view_lists(pack, g, list(range(flat_upto, n)))
    ps.insert(0, g.param[:end])
    gs.insert(0, g.grad[:end])
    ms.insert(0, g.exp_avg[:end])
    vs.insert(0, g.exp_avg_sq[:end])
    if g.max_exp_avg_sq is not None:
        xs.insert(0, g.max_exp_avg_sq[:end])
    ss.insert(0, g.steps[0])
    return ps, gs, ms, vs, xs, ss


def blocks_for(pack: Pack, g: FlatGroup, mode: str, block_bytes: int) -> list[Block]:
    """Blocks of the fused phase for ``g``, in the order they run.

    On CPU in ``aligned`` mode the cache-line-aligned run is cut into blocks of
    ``block_bytes`` at cache-line boundaries (no block has a scalar-tail element,
    so each block's update is the bits of the whole run's), the other parameters form one
    block of per-parameter views. Blocks run from the end of the buffer back, so the first
    ones find the gradients the norm pass read last still in cache. Elsewhere one block
    covers the buffer (on a GPU one launch beats several).
    """
    if g.device.type != "cpu" or mode != "aligned" or g.aligned_end == 0:
        return [Block(g.grad, lists_for(pack, g, mode))]
    end = g.offsets[g.aligned_end - 1] + g.numels[g.aligned_end - 1]
    size = g.grad.element_size()
    unit = CACHE_LINE_BYTES // size
    step = max(unit, block_bytes // size // unit * unit)
    blocks: list[Block] = []
    for s in range(0, end, step):
        e = min(s + step, end)
        xs = [g.max_exp_avg_sq[s:e]] if g.max_exp_avg_sq is not None else []
        lists = ([g.param[s:e]], [g.grad[s:e]], [g.exp_avg[s:e]], [g.exp_avg_sq[s:e]], xs, [g.steps[0]])
        blocks.append(Block(g.grad[s:e], lists))
    if g.aligned_end < len(g.index):
        blocks.append(Block(g.grad[end:], view_lists(pack, g, list(range(g.aligned_end, len(g.index))))))
    blocks.reverse()
    return blocks
