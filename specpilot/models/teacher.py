"""Teacher-forced passes over whole sequences, shared by drafter training and the acceptance oracle
(bench/oracle.py): the target's features at the drafter's taps, the drafter's blocks drafted at many anchors at
once against them, and the walk that turns per-anchor accept lengths into the steps a run would take."""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Forward
from specpilot.models.cache import AttentionState, Cache
from specpilot.models.dense import DenseTarget, Mode
from specpilot.models.dflash import DFlashDrafter
from specpilot.weights import DenseWeight

NAIVE = KernelPlan.stock(kernels="naive")  # the PyTorch references: training's and the oracle's plan


def cover(target: DenseTarget, length: int) -> None:
    """Rotary tables for `length` positions (a deployment sizes them for its own context)."""
    if target.rope.length < length:
        target.set_rope_length(length, device=target.device)


@torch.no_grad()
def target_features(target: DenseTarget, sequences: list[list[int]], layers: tuple[int, ...],
                    pad_id: int = 0, plan: KernelPlan | None = None, length: int = 0) -> torch.Tensor:
    """Hidden states of `layers` (concatenated) at every position: [N, S, len(layers) * H]. Sequences
    are right-padded to a common length S (at least `length`); padding never influences earlier positions
    (causal). plan: None = stock's (as serving computes them). Not under inference mode: training feeds them
    to autograd."""
    device = target.device
    length = max(length, *(len(s) for s in sequences))
    cover(target, length)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.int64)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
    ids = ids.to(device)
    positions = torch.arange(length, device=device)[None].expand(len(sequences), -1)
    cache = target.new_cache(len(sequences), length)
    _, hidden = target(ids, Forward.consecutive(positions), cache, Mode.PREFILL, plan, layers)
    return hidden


def block_inputs(picks: list[tuple[list[int], list[int]]], block: int, mask_id: int, device):
    """For each (sequence, anchors) and each anchor: the block's tokens [anchor token, mask...], the anchor, and
    the labels (the sequence's next block - 1 tokens, -100 past its end). Tensors [M, B], [M], [M, B - 1]."""
    tokens, anchors, labels = [], [], []
    for seq, anchor_list in picks:
        for a in anchor_list:
            tokens.append([seq[a]] + [mask_id] * (block - 1))
            anchors.append(a)
            labels.append([seq[a + k] if a + k < len(seq) else -100 for k in range(1, block)])
    as_tensor = lambda x: torch.tensor(x, device=device)  # noqa: E731
    return as_tensor(tokens), as_tensor(anchors), as_tensor(labels)


def draft_hidden(drafter: DFlashDrafter, embed: DenseWeight, feats: torch.Tensor, tokens: torch.Tensor,
                 anchors: torch.Tensor, blocks_per_seq: int, plan: KernelPlan = NAIVE,
                 cache_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The inference path on many blocks: context K/V of each sequence written once, repeated for each
    of its blocks, then every block drafted against its own anchor. Returns [N*nb, B, H]. The caches are
    per-layer tensors, so autograd sees each layer's writes as separate in-place ops. cache_dtype: the
    drafter's own by default (bf16 when serving)."""
    n, length, _ = feats.shape
    if drafter.rope.length <= length:  # padded lengths (Features) can pass the longest sequence
        drafter.set_rope_length(length + 1, device=feats.device)
    dtype = cache_dtype or drafter.norm.dtype
    ctx = drafter.new_cache(n, length, dtype=dtype, device=feats.device, stacked=False)
    positions = torch.arange(length, device=feats.device)[None].expand(n, -1)
    drafter.write_context(feats, positions, positions, ctx, plan)
    per_block = Cache([_repeated(s, blocks_per_seq) for s in ctx.layers])
    return drafter.draft_block(embed, tokens, anchors, per_block, plan)


def _repeated(state: AttentionState, times: int) -> AttentionState:
    """Each sequence's K/V repeated for each of its blocks."""
    return AttentionState.of(state.k.repeat_interleave(times, 0), state.v.repeat_interleave(times, 0))


def walk(lengths: list[int], steps_from: int = 0) -> list[int]:
    """Tokens committed per step when each step commits lengths[position] and moves on by as much."""
    out, i = [], steps_from
    while i < len(lengths):
        out.append(lengths[i])
        i += lengths[i]
    return out
