"""Packed rows (Forward.packed): a verify pass that computes only some rows of [B, T] (a shared row budget) gives
those rows the logits, taps, K/V and recurrent outputs of the full pass in float32 on the CPU (to rounding: a GEMM of
another row count may round differently), on a dense and a hybrid target, for a chain and a tree; the rows left out
come back as zeros."""

from __future__ import annotations

import pytest
import torch

from specpilot.core.contracts import Forward, Visibility
from specpilot.fixtures.random_models import random_target, tiny_hybrid_config, tiny_target_config
from specpilot.models.dense import Mode

B, T, VOCAB = 3, 6, 48
COUNTS = [6, 2, 4]  # rows computed per sequence: a prefix of each (a tree's rows are in topological order)
TOL = {"rtol": 1e-5, "atol": 1e-5}
PARENTS = [[-1, 0, 0, 1, 2, 3], [-1, 0, 1, 2, 3, 4], [-1, 0, 0, 0, 1, 1]]


def _target(kind: str):
    cfg = (tiny_hybrid_config(vocab=VOCAB) if kind == "hybrid" else
           tiny_target_config(vocab=VOCAB, num_layers=2, max_position_embeddings=64, num_kv_heads=2))
    return random_target(cfg, seed=5)


def _prefilled(target, gen):
    """A cache whose sequences hold prompts of different lengths; their lengths."""
    cache = target.new_cache(B, 48)
    lengths = [5, 9, 3]
    for b, n in enumerate(lengths):
        ids = torch.randint(VOCAB, (1, n), generator=gen)
        target(ids, Forward.consecutive(torch.arange(n)[None]), cache.rows(b, b + 1), Mode.PREFILL)
    return cache, torch.tensor(lengths)


def _meta(start: torch.Tensor, tree: bool, packed=None) -> Forward:
    index = torch.arange(T)
    parents = torch.tensor(PARENTS) if tree else (index - 1).expand(B, T)
    if not tree:
        return Forward(start[:, None] + index, start[:, None] + index, Visibility(start, start), None, packed=packed)
    depth = torch.zeros(B, T, dtype=torch.int64)
    seen = torch.eye(T, dtype=torch.bool).repeat(B, 1, 1)
    for r in range(1, T):
        depth[:, r] = depth.gather(1, parents[:, r : r + 1].clamp(min=0))[:, 0] + 1
        seen[:, r] |= seen[torch.arange(B), parents[:, r]]
    return Forward(start[:, None] + depth, start[:, None] + index, Visibility(start, start, tree=seen), parents,
                   packed=packed)


def _packed_index() -> torch.Tensor:
    return torch.tensor([b * T + r for b in range(B) for r in range(COUNTS[b])])


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("tree", [False, True])
def test_packed_rows_get_the_full_pass_values(kind, tree):
    target = _target(kind)
    gen = torch.Generator().manual_seed(1)
    cache, start = _prefilled(target, gen)
    twin = target.new_cache(B, 48)
    for a, b in zip(twin.layers, cache.layers, strict=True):  # the same prefilled state, twice
        for name in ("k", "v", "ssm", "conv"):
            if hasattr(b, name):
                getattr(a, name).copy_(getattr(b, name))
    tokens = torch.randint(VOCAB, (B, T), generator=gen)
    taps = (0, 1)
    with torch.inference_mode():
        full, full_h = target(tokens, _meta(start, tree), cache, Mode.VERIFY, None, taps)
        some, some_h = target(tokens, _meta(start, tree, _packed_index()), twin, Mode.VERIFY, None, taps)
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(COUNTS):
        valid[b, :n] = True
    assert some.shape == full.shape and some_h.shape == full_h.shape
    torch.testing.assert_close(some[valid], full[valid], **TOL)
    torch.testing.assert_close(some_h[valid], full_h[valid], **TOL)
    assert not some[~valid].any() and not some_h[~valid].any()
    for a, b in zip(twin.layers, cache.layers, strict=True):
        if hasattr(a, "k"):  # the computed rows' K/V at their slots
            for s in range(B):
                rows = (start[s] + torch.arange(COUNTS[s])).tolist()
                torch.testing.assert_close(a.k[s][:, rows], b.k[s][:, rows], **TOL)
                torch.testing.assert_close(a.v[s][:, rows], b.v[s][:, rows], **TOL)
        else:  # a recurrent layer: what its commit will read, for the computed rows
            for key in a.pending:
                if isinstance(a.pending[key], torch.Tensor) and a.pending[key].dim() >= 2:
                    torch.testing.assert_close(a.pending[key][valid], b.pending[key][valid], **TOL)


def test_a_prefill_is_never_packed():
    target = _target("dense")
    meta = Forward.consecutive(torch.arange(4)[None])
    meta.packed = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="prefill runs every row"):
        target(torch.zeros(1, 4, dtype=torch.int64), meta, target.new_cache(1, 8), Mode.PREFILL)
