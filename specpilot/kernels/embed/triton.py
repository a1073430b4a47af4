"""kernels/embed in one PDL-aware launch: a few programs, each gathering BLOCK columns of the token's row,
writing them, h * g, and their sum of squares (one part of the NormedStream's sums). The first layer's q/k/v
may launch at once and stream its first weight tiles while this runs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import pdl_on
from specpilot.kernels.gemv import NormedStream

BLOCK = 1024


@triton.jit
def _embed_kernel(tok_ptr, table_ptr, g_ptr, h_ptr, hg_ptr, sq_ptr, H, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:  # the next kernel streams weights meanwhile; the token may come from the kernel before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    row = tl.load(tok_ptr).to(tl.int64)
    h = tl.load(table_ptr + row * H + cols, mask=ok, other=0.0)
    tl.store(h_ptr + cols, h, mask=ok)
    hf = h.to(tl.float32)
    tl.store(hg_ptr + cols, (hf * tl.load(g_ptr + cols, mask=ok, other=0.0).to(tl.float32)).to(h.dtype), mask=ok)
    tl.store(sq_ptr + tl.program_id(0), tl.sum(hf * hf, axis=0))


def embed_handoff_triton(tokens: torch.Tensor, table: torch.Tensor, norm_weight: torch.Tensor,
                         plan: KernelPlan) -> NormedStream:
    if not table.is_contiguous():
        raise ValueError("the embedding kernel takes a contiguous table")
    hidden = table.shape[1]
    programs = triton.cdiv(hidden, BLOCK)
    h = torch.empty(1, 1, hidden, dtype=table.dtype, device=table.device)
    scaled = torch.empty_like(h)
    sumsq = torch.empty(programs, dtype=torch.float32, device=table.device)
    pdl = pdl_on(table, plan, default=True)  # it runs in the one-row gemv step only
    _embed_kernel[(programs,)](tokens.reshape(-1), table, norm_weight, h, scaled, sumsq, hidden, BLOCK=BLOCK,
                               USE_GDC=pdl, num_warps=4, **({"launch_pdl": True} if pdl else {}))
    return NormedStream(h, scaled, sumsq, norm_weight)
