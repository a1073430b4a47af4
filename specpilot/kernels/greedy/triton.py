"""One launch for the AR step's tail (kernels/greedy): the argmax of a row of logits written as the next
token, and the position advanced. PyTorch takes three launches (its reduction, the copy into the token,
the increment), each waiting for the one before to drain; this one, launched with programmatic dependent
launch, sits resident while the LM head streams and waits only for its logits.

One program walks the row in chunks of BLOCK (a few loop steps for a 128k vocabulary): per chunk the
maximum and the first index holding it; a later chunk replaces the running best only when strictly
greater, so ties resolve to the first index, as torch.argmax does (NaN logits are out of scope)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import pdl_on

BLOCK = 16384
WARPS = 16


@triton.jit
def _greedy_kernel(logits_ptr, token_ptr, pos_ptr, V, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:  # the logits come from the kernel before
        tl.extra.cuda.gdc_wait()
    offs = tl.arange(0, BLOCK)
    # The running best as 0-d tensors (what tl.max / tl.argmax return), so the loop carries one type.
    best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    best_i = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
    for start in range(0, V, BLOCK):
        x = tl.load(logits_ptr + start + offs, mask=start + offs < V, other=float("-inf")).to(tl.float32)
        v = tl.max(x, axis=0)
        i = tl.argmax(x, axis=0, tie_break_left=True)
        take = v > best
        best = tl.where(take, v, best)
        best_i = tl.where(take, start + i, best_i)
    tl.store(token_ptr, best_i.to(tl.int64))
    tl.store(pos_ptr, tl.load(pos_ptr) + 1)


def greedy_advance_triton(logits: torch.Tensor, token: torch.Tensor, pos: torch.Tensor,
                          plan: KernelPlan) -> None:
    if logits.dim() != 1 or token.numel() != 1 or pos.numel() != 1:
        raise ValueError(f"greedy_advance takes one row of logits and one token / position, got logits "
                         f"{tuple(logits.shape)}, token {tuple(token.shape)}, pos {tuple(pos.shape)}")
    row = logits if logits.stride(0) == 1 else logits.contiguous()
    pdl = pdl_on(row, plan, default=plan.gemv)
    _greedy_kernel[(1,)](row, token, pos, row.numel(), BLOCK=BLOCK, USE_GDC=pdl, num_warps=WARPS,
                         **({"launch_pdl": True} if pdl else {}))
