"""Masked GQA attention over the static KV cache for decode / verify / draft steps.

`attend` runs the Triton split-K kernel (attention/triton.py) when the plan's `use_triton` says so, else the
plain PyTorch reference (attention/naive.py; on the CPU its arithmetic over the live slots only,
attention/live.py). All follow `Visibility.dense()` exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specpilot.config.plan import KernelPlan
from specpilot.core.regions import region
from specpilot.kernels.attention.naive import attend_naive
from specpilot.kernels.dispatch import use_triton

if TYPE_CHECKING:  # type hints only: Visibility is the step's type (speculative/, a layer up)
    from specpilot.core.contracts import Visibility

__all__ = ["attend", "attend_naive"]


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, vis: Visibility,
           scale: float, plan: KernelPlan) -> torch.Tensor:
    """q [B, T, Hq, D]; k_cache, v_cache [B, Hkv, L, D]. Returns [B, T, Hq, D] in q's dtype. With the plan's
    `gemv` the split-K partials are merged inside the same launch (attention/triton.py). On the CPU the
    reference's arithmetic runs over the live slots only (attention/live.py)."""
    with region("attention"):
        return _attend(q, k_cache, v_cache, vis, scale, plan)


def _attend(q, k_cache, v_cache, vis: Visibility, scale: float, plan: KernelPlan) -> torch.Tensor:
    if use_triton(q, plan):
        # Imported here so that importing this package never imports triton (TRITON_INTERPRET must
        # be set before the first triton import).
        from specpilot.kernels.attention.triton import attend_triton

        return attend_triton(q, k_cache, v_cache, vis, scale, plan)
    if q.device.type == "cpu":
        from specpilot.kernels.attention.live import attend_live

        return attend_live(q, k_cache, v_cache, vis, scale)
    return attend_naive(q, k_cache, v_cache, vis, scale)
