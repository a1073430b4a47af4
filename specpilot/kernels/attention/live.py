"""The CPU's attention: the reference's arithmetic over the live slots only.

The static cache is as long as the whole context (4096 slots for the smollm2 preset) while a request fills a
few hundred; every slot past max(cache_len, start + T) is invisible to every row by definition, so leaving it
out changes no visible term. On the CPU (never inside a CUDA graph) the host reads that bound once per
forward, builds the additive mask once (every layer of the forward shares its Visibility) and drops it where
every row sees every live slot. Against the full-length reference (attention/naive.py) the outputs agree to
float rounding (the softmax sums over fewer exact zeros): tests/test_attention_kernel.py. On the smollm2 pair
(context 2048) it made the CPU's AR step 26-29% and its stock step 29-34% faster, timed in turn against the
commit before, tokens identical (bench/results/2026-12-02_cpu_step_smollm2_08ab557_cpu.json).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specpilot.kernels.attention.naive import attention, fold_mask

if TYPE_CHECKING:  # type hints only: Visibility is the step's type (speculative/, a layer up)
    from specpilot.core.contracts import Visibility


def live_slots(vis: Visibility, rows: int, length: int) -> int:
    """One past the last slot any row can see (a host read of two [B] tensors)."""
    return min(length, int(torch.maximum(vis.cache_len, vis.start + rows).max()))


def attend_live(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, vis: Visibility,
                scale: float) -> torch.Tensor:
    """q [B, T, Hq, D]; k_cache, v_cache [B, Hkv, L, D]. Returns [B, T, Hq, D]; rows that see nothing are zeros."""
    t, length = q.shape[1], k_cache.shape[2]
    g = q.shape[2] // k_cache.shape[1]
    key = ("live", t, length, g, q.dtype)
    if key not in vis.memo:
        n = live_slots(vis, t, length)
        mask = vis.dense(t, n)
        seen = mask.any(-1)
        bias = None
        if not bool(mask.all()):
            folded = fold_mask(mask, g)
            bias = torch.zeros(folded.shape, dtype=q.dtype, device=q.device).masked_fill_(~folded, float("-inf"))
        vis.memo[key] = (n, bias, None if bool(seen.all()) else seen)
    n, bias, seen = vis.memo[key]
    out = attention(q, k_cache[:, :, :n], v_cache[:, :, :n], bias, scale)
    if seen is None:
        return out
    return torch.where(seen[:, :, None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
