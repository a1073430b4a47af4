"""Exact replay of the drafter's lattices along the target's greedy output (no speculative run needed).

Every anchor position of the AR output gets the lattice the drafter would draft there (all anchors in
one batched drafter pass). Then two walks over the output: the stock chain (accept while the greedy
chain equals the output) and an oracle that accepts while the output token is anywhere in the top-K
candidates of its depth. Their mean tokens per step, bonus included, are the chain's tau and the
lattice's ceiling (the paper's 4.25 vs 6.42-8.20).
"""

from __future__ import annotations

import torch

from specpilot.models.dense import DenseTarget
from specpilot.models.dflash import DFlashDrafter
from specpilot.models.teacher import NAIVE, block_inputs, draft_hidden, target_features, walk


@torch.inference_mode()
def accept_lengths(target: DenseTarget, drafter: DFlashDrafter, prompt: list[int], output: list[int],
                   block: int, top_k: int = 16) -> tuple[list[int], list[int]]:
    """Per anchor a in [len(prompt), len(prompt + output) - 1): tokens one step would commit there by
    the greedy chain and by the oracle (each counts the bonus; depths past the output's end never match)."""
    sequence = prompt + output
    anchors = list(range(len(prompt), len(sequence) - 1))
    if not anchors:
        return [], []
    device = target.embed.weight.device
    feats = target_features(target, [sequence], tuple(drafter.cfg.target_layer_ids))
    feats_b = torch.nn.functional.pad(feats.float(), (0, 0, 0, block))  # room for the last anchor's block
    tokens, anchor_t, labels = block_inputs([(sequence, anchors)], block, drafter.cfg.mask_token_id, device)
    hidden = draft_hidden(drafter, target.embed, feats_b.to(target.embed.weight.dtype), tokens, anchor_t,
                          len(anchors))
    lattice = drafter.lattice(hidden, target.head, tokens[:, 0], top_k, NAIVE)
    chain = (lattice.greedy_chain() == labels).long().cumprod(1).sum(1) + 1
    oracle = (lattice.tokens == labels[..., None]).any(-1).long().cumprod(1).sum(1) + 1
    return chain.tolist(), oracle.tolist()


def lattice_taus(target: DenseTarget, drafter: DFlashDrafter, prompt: list[int], output: list[int],
                 block: int, top_k: int = 16) -> dict:
    chain, oracle = accept_lengths(target, drafter, prompt, output, block, top_k)
    c, o = walk(chain), walk(oracle)
    return {"replay_chain_tau": sum(c) / len(c) if c else None, "oracle_tau": sum(o) / len(o) if o else None,
            "oracle_steps": o}
