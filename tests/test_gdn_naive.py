"""Gated DeltaNet CPU references (specpilot/kernels/gdn/naive.py) against transformers and against their definitions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    causal_conv1d_update,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from specpilot.core.contracts import DraftTree
from specpilot.kernels import gdn

F32_TOL = {"rtol": 1e-5, "atol": 1e-5}  # float32 WY/UT form against the token loop (measured max ~1e-6 here)


def inputs(seed: int, b: int, t: int, hk: int = 2, rep: int = 2, dk: int = 8, dv: int = 6,
           dtype: torch.dtype = torch.float32):
    """Fresh random q, k, v, g, beta, state (never zeros): g in [-3, -0.001) spans slow to fast decay."""
    gen = torch.Generator().manual_seed(seed)
    hv = hk * rep
    q = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    k = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    v = torch.randn(b, t, hv, dv, generator=gen).to(dtype)
    g = -(torch.rand(b, t, hv, generator=gen) * 3 + 1e-3)
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen)).to(dtype)
    state = torch.randn(b, hv, dk, dv, generator=gen)
    return q, k, v, g, beta, state


def hf_recurrent(q, k, v, g, beta, state, normalize=True):
    rep = v.shape[2] // q.shape[2]
    return torch_recurrent_gated_delta_rule(q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2), v, g, beta,
                                            initial_state=state, output_final_state=True,
                                            use_qk_l2norm_in_kernel=normalize)


@st.composite
def trees(draw):
    """Random trees in topological order: B in 1..3, N in 1..24, root's parent -1 or 0 (both conventions)."""
    b, n = draw(st.integers(1, 3)), draw(st.integers(1, 24))
    rows = [[draw(st.sampled_from([-1, 0]))] + [draw(st.integers(0, i - 1)) for i in range(1, n)] for _ in range(b)]
    return torch.tensor(rows)


# ---------------------------------------------------------------------------------------------------------------
# chain


@pytest.mark.parametrize("normalize", [True, False])
def test_recurrent_is_transformers_bit_for_bit(normalize):
    args = inputs(0, 2, 19)
    o, s = gdn.recurrent(*args, normalize=normalize)
    o_hf, s_hf = hf_recurrent(*args, normalize=normalize)
    assert o.shape == (2, 19, 4, 6) and s.shape == (2, 4, 8, 6)
    assert torch.equal(o, o_hf) and torch.equal(s, s_hf)


def test_recurrent_bf16_inputs_match_transformers():
    args = inputs(1, 2, 11, dtype=torch.bfloat16)
    o, s = gdn.recurrent(*args)
    o_hf, s_hf = hf_recurrent(*args)  # transformers casts its output back to bf16
    assert o.dtype == torch.float32 and torch.equal(o.to(torch.bfloat16), o_hf) and torch.equal(s, s_hf)


def test_functions_leave_their_inputs_alone():
    args = inputs(2, 2, 9)
    kept = [a.clone() for a in args]
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 3, 7]] * 2)
    gdn.recurrent(*args)
    gdn.chunked(*args, chunk=4)
    gdn.chain_snapshots(*args)
    gdn.tree(*args, parents)
    q, k, v, g, beta, state = args
    gdn.commit(k, v, g, beta, state, torch.tensor([[0, 1, 3, 7], [0, 2, 5, -1]]), torch.tensor([3, 2]))
    assert all(torch.equal(a, b) for a, b in zip(args, kept, strict=True))


@pytest.mark.parametrize("t,chunk", [(77, 16), (77, 64), (5, 64), (64, 64)])
def test_chunked_equals_recurrent_and_transformers_chunk(t, chunk):
    args = inputs(3, 2, t)
    o, s = gdn.chunked(*args, chunk=chunk)
    o_ref, s_ref = gdn.recurrent(*args)
    torch.testing.assert_close(o, o_ref, **F32_TOL)
    torch.testing.assert_close(s, s_ref, **F32_TOL)
    q, k, v, g, beta, state = args
    o_hf, s_hf = torch_chunk_gated_delta_rule(q.repeat_interleave(2, 2), k.repeat_interleave(2, 2), v, g, beta,
                                              chunk_size=chunk, initial_state=state, output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(o, o_hf, **F32_TOL)
    torch.testing.assert_close(s, s_hf, **F32_TOL)


def test_chain_snapshots_keep_every_prefix_state():
    args = inputs(4, 2, 7)
    o, states = gdn.chain_snapshots(*args)
    o_ref, _ = gdn.recurrent(*args)
    assert states.shape == (2, 7, 4, 8, 6) and torch.equal(o, o_ref)
    q, k, v, g, beta, state = args
    for a in range(7):  # committing a + 1 rows is states[:, a]
        _, s = gdn.recurrent(q[:, :a + 1], k[:, :a + 1], v[:, :a + 1], g[:, :a + 1], beta[:, :a + 1], state)
        assert torch.equal(states[:, a], s)


# ---------------------------------------------------------------------------------------------------------------
# trees


def test_ancestors_match_the_draft_tree_contract():
    parents = torch.tensor([[0, 0, 0, 1, 1, 2, 3, 6], [0, 0, 1, 2, 3, 4, 5, 6]])
    tree = DraftTree(parents=parents, depth=parents, cand=parents, tokens=parents)
    assert torch.equal(gdn.ancestors(parents), tree.ancestors(max_depth=8))
    assert torch.equal(gdn.ancestors(gdn.chain_parents(2, 8)), torch.ones(2, 8, 8, dtype=torch.bool).tril())


@pytest.mark.parametrize("bad", [[[-1, 1]], [[-1, 0, 3, 1]], [[0, -1]]])
def test_parents_out_of_order_are_refused(bad):
    with pytest.raises(ValueError, match="topological"):
        gdn.ancestors(torch.tensor(bad))


@settings(max_examples=40, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**16), hk=st.integers(1, 2), rep=st.integers(1, 2),
       dk=st.integers(2, 8), dv=st.integers(2, 8))
def test_tree_equals_the_recurrence_along_each_root_path(parents, seed, hk, rep, dk, dv):
    b, n = parents.shape
    args = inputs(seed, b, n, hk, rep, dk, dv)
    want = gdn.tree_by_paths(*args, parents)  # float64 token loops, one per node
    exact = gdn.tree(*args, parents, dtype=torch.float64)
    assert exact.shape == (b, n, hk * rep, dv)
    torch.testing.assert_close(exact, want, rtol=0, atol=1e-12)  # the algorithm is exact up to rounding
    torch.testing.assert_close(gdn.tree(*args, parents), want.float(), **F32_TOL)


@pytest.mark.parametrize("n", [1, 2, 24, 64])
def test_tree_of_a_chain_is_recurrent(n):
    args = inputs(5, 3, n)
    parents = gdn.chain_parents(3, n)
    o32, _ = gdn.recurrent(*args)
    o64, _ = gdn.recurrent(*args, dtype=torch.float64)
    torch.testing.assert_close(gdn.tree(*args, parents), o32, **F32_TOL)
    torch.testing.assert_close(gdn.tree(*args, parents, dtype=torch.float64), o64, rtol=0, atol=1e-12)


def _random_paths(parents: torch.Tensor, gen: torch.Generator, width: int):
    """Per sequence a random node's root path, padded to `width` with -1: (path [B, P], accepted [B])."""
    paths, accepted = [], []
    for row in parents:
        p = gdn.root_path(row, int(torch.randint(row.shape[0], (1,), generator=gen)))
        paths.append(p + [-1] * (width - len(p)))
        accepted.append(len(p) - 1)
    return torch.tensor(paths), torch.tensor(accepted)


@settings(max_examples=25, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**16))
def test_commit_is_the_token_loop_over_the_accepted_path_bit_for_bit(parents, seed):
    b, n = parents.shape
    q, k, v, g, beta, state = inputs(seed, b, n)
    path, accepted = _random_paths(parents, torch.Generator().manual_seed(seed), n + 2)
    got = gdn.commit(k, v, g, beta, state, path, accepted)
    for i in range(b):  # each sequence alone through `recurrent` (hence through transformers' loop)
        rows = path[i, :accepted[i] + 1]
        _, want = gdn.recurrent(q[i:i + 1, rows], k[i:i + 1, rows], v[i:i + 1, rows], g[i:i + 1, rows],
                                beta[i:i + 1, rows], state[i:i + 1])
        assert torch.equal(got[i:i + 1], want)


@settings(max_examples=25, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**16))
def test_tree_snapshots_hold_each_nodes_state_as_the_commit_of_its_path(parents, seed):
    b, n = parents.shape
    args = inputs(seed, b, n)
    o, states = gdn.tree_snapshots(*args, parents)
    torch.testing.assert_close(o, gdn.tree_by_paths(*args, parents).float(), **F32_TOL)
    q, k, v, g, beta, state = args
    for node in range(n):  # each node's state: the commit of its root path, bit for bit
        paths = [gdn.root_path(row, node) for row in parents]
        width = max(map(len, paths))
        path = torch.tensor([p + [-1] * (width - len(p)) for p in paths])
        accepted = torch.tensor([len(p) - 1 for p in paths])
        assert torch.equal(states[:, node], gdn.commit(k, v, g, beta, state, path, accepted))


def test_commit_of_a_chain_prefix_is_the_snapshot():
    q, k, v, g, beta, state = inputs(6, 3, 8)
    _, states = gdn.chain_snapshots(q, k, v, g, beta, state)
    accepted = torch.tensor([0, 4, 7])
    got = gdn.commit(k, v, g, beta, state, torch.arange(8).expand(3, 8), accepted)
    assert torch.equal(got, states[torch.arange(3), accepted])


# ---------------------------------------------------------------------------------------------------------------
# the short conv


def conv_inputs(seed: int, b: int, n: int, c: int = 5, width: int = 4):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n, c, generator=gen), torch.randn(c, width, generator=gen),
            torch.randn(b, c, width - 1, generator=gen))


def hf_conv_steps(x, weight, conv_state):
    """transformers' causal_conv1d_update one token at a time: (y [B, T, C], the conv state it leaves)."""
    held = conv_state.clone()
    ys = [causal_conv1d_update(x[:, t, :, None], held, weight, None, "silu")[..., 0] for t in range(x.shape[1])]
    return torch.stack(ys, dim=1), held


def test_conv_chain_equals_transformers_update_token_by_token():
    x, weight, conv_state = conv_inputs(7, 2, 9)
    y_hf, held = hf_conv_steps(x, weight, conv_state)
    torch.testing.assert_close(gdn.conv_chain(x, weight, conv_state), y_hf, rtol=1e-6, atol=1e-6)
    assert torch.equal(gdn.conv_state_after(x, conv_state, torch.arange(9).expand(2, 9), torch.tensor([8, 8])), held)
    for a in range(3):  # paths shorter than K - 1 keep the older inputs of the old conv state
        _, held = hf_conv_steps(x[:, :a + 1], weight, conv_state)
        assert torch.equal(gdn.conv_state_after(x, conv_state, torch.arange(9).expand(2, 9), torch.tensor([a, a])),
                           held)


@settings(max_examples=25, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**16), width=st.integers(2, 5))
def test_conv_tree_and_its_commit_follow_each_root_path(parents, seed, width):
    b, n = parents.shape
    x, weight, conv_state = conv_inputs(seed, b, n, width=width)
    y = gdn.conv_tree(x, weight, conv_state, parents)
    path, accepted = _random_paths(parents, torch.Generator().manual_seed(seed), n)
    after = gdn.conv_state_after(x, conv_state, path, accepted)
    for i in range(b):
        for j in range(n):  # node j's output: the conv's last output along root..j (F.conv1d: ~6 ms on this CPU)
            seq = torch.cat([conv_state[i], x[i, gdn.root_path(parents[i], j)].t()], dim=1)
            want = F.silu((seq[:, -width:] * weight).sum(-1))
            torch.testing.assert_close(y[i, j], want, rtol=1e-6, atol=1e-6)
        # transformers' update keeps the last K - 1 columns of cat(conv_state, inputs); short paths keep old ones
        seq = torch.cat([conv_state[i], x[i, path[i, :accepted[i] + 1]].t()], dim=1)
        assert torch.equal(after[i], seq[:, -(width - 1):])


# ---------------------------------------------------------------------------------------------------------------
# FP32 -> 3 x BF16

EXACT_FROM = 2.0**-110  # below, lo would need bits finer than a bf16 subnormal (2^-133)


def check_split(x: torch.Tensor) -> None:
    hi, mid, lo = gdn.split3(x)
    assert hi.dtype == mid.dtype == lo.dtype == torch.bfloat16
    back = gdn.join3(hi, mid, lo)
    exact = (x.abs() >= EXACT_FROM) | (x == 0)
    assert torch.equal(back[exact], x[exact])
    assert bool(((back - x)[~exact].abs() <= 2.0**-134).all())  # half a bf16 subnormal


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True),
                min_size=1, max_size=64))
def test_split3_is_exact_for_any_float32(values):
    check_split(torch.tensor(values, dtype=torch.float32))


def test_split3_over_random_bit_patterns_and_the_edges():
    words = torch.randint(-2**31, 2**31, (1_000_000,), generator=torch.Generator().manual_seed(8), dtype=torch.int64)
    x = words.to(torch.int32).view(torch.float32)
    check_split(x[torch.isfinite(x)])
    f32 = torch.finfo(torch.float32)
    edges = [f32.max, -f32.max, 2.0**128 - 2.0**119, f32.tiny, f32.smallest_normal * (1 - 2**-23), 2.0**-149,
             EXACT_FROM, EXACT_FROM * (1 + 2**-23), math.pi, -1 / 3, 0.0, -0.0]
    check_split(torch.tensor(edges, dtype=torch.float32))
    hi, _, _ = gdn.split3(torch.tensor([f32.max]))
    assert torch.isfinite(hi.float()).all()  # truncation: round-to-nearest would give inf here
