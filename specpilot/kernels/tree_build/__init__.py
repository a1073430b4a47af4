"""Tree building in one launch: best_first and ddtree (the N - 1 best lattice paths by summed scores) and eagle2,
their rows, tokens and ancestor matrix. The reference is speculative/tree.best_paths (depth by depth
in PyTorch: ~8 launches per depth, plus the ancestors' rounds; 0.40-0.52 ms a step on the H200 for N = 16-64,
bench/results/2026-12-03_tree_step_pair_bf18272_h200.json, half of SmolLM2's AR step)."""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton

MAX_NODES = 64  # the kernels keep the [N, N] ancestor matrix in registers
MAX_POOL = 1024  # eagle2's candidates (k + (D - 1) k^2) held in registers for the final selection


def applies(scores: torch.Tensor, nodes: int, plan: KernelPlan | None, pool: int = 0) -> bool:
    return plan is not None and nodes <= MAX_NODES and pool <= MAX_POOL and use_triton(scores, plan)


def best_first_rows(scores: torch.Tensor, tokens: torch.Tensor, anchor: torch.Tensor, nodes: int):
    """scores [B, D, K, K] (log p(child | parent)), tokens [B, D, K], anchor [B] -> (parents, depth, cand,
    tokens) [B, N] int64 and ancestors [B, N, N] bool, rows in the order the best-first search takes them."""
    from specpilot.kernels.tree_build.triton import best_first_triton

    return best_first_triton(scores, tokens, anchor, nodes)


def eagle2_rows(scores: torch.Tensor, tokens: torch.Tensor, anchor: torch.Tensor, nodes: int, keep: int):
    """EAGLE-2's tree (each depth's best `keep` expand their `keep` best children; the N - 1 best of them all) in
    one launch, as best_first_rows returns it."""
    from specpilot.kernels.tree_build.triton import eagle2_triton

    return eagle2_triton(scores, tokens, anchor, nodes, keep)
