"""The Gated DeltaNet Triton kernels (specpilot/kernels/gdn/triton.py) against the CPU references (naive.py), on fresh
random inputs. Without CUDA every kernel runs in Triton's CPU interpreter: nothing here is skipped on the CPU.

Tolerances: the kernels run naive's float32 operations in naive's order, but their sums over Dk reduce in another
order than PyTorch's, so they match naive to float32 rounding (measured max |diff| ~1e-6 on these inputs), not
bitwise. Between kernels the step is the same code: commit == step-by-step decode, chain-shaped tree == chain and
tree snapshots == commits of their paths are checked bit for bit."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specpilot.config.plan import KernelPlan  # noqa: E402
from specpilot.kernels import gdn  # noqa: E402
from specpilot.kernels.gdn import triton as kernels  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32_TOL = {"rtol": 1e-5, "atol": 1e-5}  # kernel against the float32 / float64 references


def inputs(seed: int, b: int, t: int, hk: int = 2, rep: int = 2, dk: int = 8, dv: int = 6,
           dtype: torch.dtype = torch.float32):
    """Fresh random q, k, v, g (< 0), beta (in (0, 1)), state, none zero."""
    gen = torch.Generator().manual_seed(seed)
    hv = hk * rep
    q = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    k = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    v = torch.randn(b, t, hv, dv, generator=gen).to(dtype)
    g = -F.softplus(torch.randn(b, t, hv, generator=gen))
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen))
    state = torch.randn(b, hv, dk, dv, generator=gen)
    return tuple(x.to(DEVICE) for x in (q, k, v, g, beta, state))


def cpu(*xs):
    return tuple(x.cpu() for x in xs)


@st.composite
def trees(draw, max_n: int = 12):
    """Random trees in topological order, parents[n] uniform in [0, n); the root's entry -1 or 0."""
    b, n = draw(st.integers(1, 3)), draw(st.integers(1, max_n))
    rows = [[draw(st.sampled_from([-1, 0]))] + [draw(st.integers(0, i - 1)) for i in range(1, n)] for _ in range(b)]
    return torch.tensor(rows, device=DEVICE)


def padded_paths(parents: torch.Tensor, nodes: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence the root path of nodes[b], padded with -1: (path [B, width], accepted [B])."""
    paths = [gdn.root_path(row.cpu(), n) for row, n in zip(parents, nodes, strict=True)]
    path = torch.tensor([p + [-1] * (width - len(p)) for p in paths], device=DEVICE)
    return path, torch.tensor([len(p) - 1 for p in paths], device=DEVICE)


# ---------------------------------------------------------------------------------------------------------------
# chain: decode, chain verification, final state


@pytest.mark.parametrize("b,t,hk,rep,dk,dv,block_v", [
    (2, 19, 2, 2, 8, 6, None),  # Dv not a power of two, one masked block
    (1, 1, 1, 3, 8, 8, 4),  # AR decode, two column blocks
    (3, 5, 2, 1, 5, 7, 2),  # Dk and Dv odd: masked rows and a masked last block of four
    (1, 3, 1, 2, 128, 128, None),  # Qwen3.5's head dims at the default block
])
@pytest.mark.parametrize("normalize", [True, False])
def test_recurrent_rows_match_the_token_loop(b, t, hk, rep, dk, dv, block_v, normalize):
    args = inputs(b * 100 + t, b, t, hk, rep, dk, dv)
    o, snaps, fin = kernels.recurrent_rows(*args, normalize=normalize, snapshots=True, block_v=block_v)
    o_ref, fin_ref = gdn.recurrent(*cpu(*args), normalize=normalize)
    o_chain, snaps_ref = gdn.chain_snapshots(*cpu(*args), normalize=normalize)
    assert o.shape == (b, t, hk * rep, dv) and snaps.shape == (b, t, hk * rep, dk, dv) and fin.shape == args[5].shape
    assert o.dtype == snaps.dtype == fin.dtype == torch.float32
    torch.testing.assert_close(o.cpu(), o_ref, **F32_TOL)
    torch.testing.assert_close(o.cpu(), o_chain, **F32_TOL)
    torch.testing.assert_close(snaps.cpu(), snaps_ref, **F32_TOL)
    torch.testing.assert_close(fin.cpu(), fin_ref, **F32_TOL)
    assert torch.equal(snaps[:, -1], fin)  # the same tile, stored twice


def test_recurrent_rows_returns_what_is_asked_for():
    args = inputs(1, 2, 4)
    o, fin = kernels.recurrent_rows(*args)  # as naive.recurrent
    o2, snaps = kernels.recurrent_rows(*args, snapshots=True, final=False)  # as naive.chain_snapshots
    o3 = kernels.recurrent_rows(*args, final=False)
    assert torch.equal(o, o2) and torch.equal(o, o3) and torch.equal(snaps[:, -1], fin)


def test_recurrent_rows_float64_reference():
    """Against the float64 loop: the kernel's error is float32 rounding, not an algorithmic one."""
    args = inputs(2, 2, 40)
    o, fin = kernels.recurrent_rows(*args)
    o64, fin64 = gdn.recurrent(*cpu(*args), dtype=torch.float64)
    torch.testing.assert_close(o.cpu().double(), o64, **F32_TOL)
    torch.testing.assert_close(fin.cpu().double(), fin64, **F32_TOL)


def test_bf16_inputs():
    """q, k, v in bfloat16 (the layer's activations): loaded and widened to float32, as the reference does."""
    args = inputs(3, 2, 6, dtype=torch.bfloat16)
    o, snaps, fin = kernels.recurrent_rows(*args, snapshots=True)
    o_ref, snaps_ref = gdn.chain_snapshots(*cpu(*args))
    torch.testing.assert_close(o.cpu(), o_ref, **F32_TOL)
    torch.testing.assert_close(snaps.cpu(), snaps_ref, **F32_TOL)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 2]] * 2, device=DEVICE)
    torch.testing.assert_close(kernels.tree_rows(*args, parents).cpu(), gdn.tree(*cpu(*args), parents.cpu()),
                               **F32_TOL)
    path, accepted = padded_paths(parents, [4, 5], 4)
    q, k, v, g, beta, state = args
    torch.testing.assert_close(kernels.commit_rows(k, v, g, beta, state, path, accepted).cpu(),
                               gdn.commit(*cpu(k, v, g, beta, state, path, accepted)), **F32_TOL)


def test_views_of_a_fused_projection_give_the_same_bits():
    """q, k, v split off one [B, T, C] tensor (as the layer's conv output) need no copy and change nothing."""
    b, t, hk, rep, dk, dv = 2, 5, 2, 2, 8, 6
    gen = torch.Generator().manual_seed(4)
    y = torch.randn(b, t, 2 * hk * dk + hk * rep * dv, generator=gen).to(DEVICE)
    qf, kf, vf = y.split([hk * dk, hk * dk, hk * rep * dv], -1)
    q, k, v = qf.reshape(b, t, hk, dk), kf.reshape(b, t, hk, dk), vf.reshape(b, t, hk * rep, dv)
    assert not q.is_contiguous()
    _, _, _, g, beta, state = inputs(4, b, t, hk, rep, dk, dv)
    got = kernels.recurrent_rows(q, k, v, g, beta, state, snapshots=True)
    want = kernels.recurrent_rows(q.contiguous(), k.contiguous(), v.contiguous(), g, beta, state, snapshots=True)
    assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))


def test_inputs_are_left_alone():
    args = inputs(5, 2, 6)
    kept = [a.clone() for a in args]
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2]] * 2, device=DEVICE)
    q, k, v, g, beta, state = args
    kernels.recurrent_rows(*args, snapshots=True)
    kernels.tree_rows(*args, parents, snapshots=True)
    kernels.commit_rows(k, v, g, beta, state, torch.tensor([[0, 1, 3], [0, 2, 5]], device=DEVICE),
                        torch.tensor([2, 1], device=DEVICE))
    assert all(torch.equal(a, b) for a, b in zip(args, kept, strict=True))


# ---------------------------------------------------------------------------------------------------------------
# trees


@settings(max_examples=12, deadline=None)
@given(parents=trees())
def test_tree_paths_are_the_root_paths(parents):
    path, lengths = kernels.tree_paths(parents)
    b, n = parents.shape
    assert path.shape == (b, n, n) and lengths.shape == (b, n)
    for i in range(b):
        for j in range(n):
            want = gdn.root_path(parents[i].cpu(), j)
            assert lengths[i, j] == len(want)
            assert path[i, j].tolist() == want + [-1] * (n - len(want))


@settings(max_examples=8, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**16), hk=st.integers(1, 2), rep=st.integers(1, 2),
       dk=st.integers(2, 9), dv=st.integers(2, 9), block_v=st.sampled_from([2, 4, None]))
def test_tree_rows_are_the_token_loop_along_each_root_path(parents, seed, hk, rep, dk, dv, block_v):
    b, n = parents.shape
    args = inputs(seed, b, n, hk, rep, dk, dv)
    o, states = kernels.tree_rows(*args, parents, snapshots=True, block_v=block_v)
    assert o.shape == (b, n, hk * rep, dv) and states.shape == (b, n, hk * rep, dk, dv)
    ref_args = (*cpu(*args), parents.cpu())
    torch.testing.assert_close(o.cpu().double(), gdn.tree_by_paths(*ref_args), **F32_TOL)  # float64 definition
    torch.testing.assert_close(o.cpu(), gdn.tree(*ref_args), **F32_TOL)
    _, states_ref = gdn.tree_snapshots(*ref_args)
    torch.testing.assert_close(states.cpu(), states_ref, **F32_TOL)
    assert torch.equal(kernels.tree_rows(*args, parents, block_v=block_v), o)  # snapshots change nothing


@settings(max_examples=6, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**16))
def test_tree_snapshots_are_the_commits_of_their_paths_bit_for_bit(parents, seed):
    b, n = parents.shape
    q, k, v, g, beta, state = args = inputs(seed, b, n, hk=1)
    _, states = kernels.tree_rows(*args, parents, snapshots=True)
    for node in range(n):
        path, accepted = padded_paths(parents, [node] * b, n + 1)
        assert torch.equal(states[:, node], kernels.commit_rows(k, v, g, beta, state, path, accepted))


@pytest.mark.parametrize("n", [1, 2, 9])
@pytest.mark.parametrize("block_v", [4, None])
def test_a_chain_shaped_tree_is_the_chain_bit_for_bit(n, block_v):
    args = inputs(6 + n, 2, n, hk=1)
    parents = gdn.chain_parents(2, n, DEVICE)
    o, snaps = kernels.recurrent_rows(*args, snapshots=True, final=False, block_v=block_v)
    o_tree, states = kernels.tree_rows(*args, parents, snapshots=True, block_v=block_v)
    assert torch.equal(o_tree, o) and torch.equal(states, snaps)


def test_a_64_node_tree():
    """The largest tree a step verifies (N = 64): a random (bushy) tree, and four interleaved 16-long chains (node n's
    parent n - 4) for paths of 17 rows; one head, one column block, to keep the interpreter quick."""
    gen = torch.Generator().manual_seed(7)
    bushy = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, 64)]
    parents = torch.tensor([bushy, [-1, 0, 0, 0] + list(range(60))], device=DEVICE)
    args = inputs(7, 2, 64, hk=1, rep=1)
    o = kernels.tree_rows(*args, parents)
    torch.testing.assert_close(o.cpu().double(), gdn.tree_by_paths(*cpu(*args), parents.cpu()), **F32_TOL)


# ---------------------------------------------------------------------------------------------------------------
# commit


@settings(max_examples=10, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**16), block_v=st.sampled_from([2, None]), data=st.data())
def test_commit_is_step_by_step_decode_bit_for_bit(parents, seed, block_v, data):
    """The committed state of a random accepted path: naive.commit to rounding, and bit for bit the state that
    decoding the path's tokens one at a time (recurrent_rows, T = 1) leaves."""
    b, n = parents.shape
    q, k, v, g, beta, state = inputs(seed, b, n)
    nodes = [data.draw(st.integers(0, n - 1)) for _ in range(b)]
    path, accepted = padded_paths(parents, nodes, n + 2)  # -1 padding past the accepted rows
    got = kernels.commit_rows(k, v, g, beta, state, path, accepted, block_v=block_v)
    torch.testing.assert_close(got.cpu(), gdn.commit(*cpu(k, v, g, beta, state, path, accepted)), **F32_TOL)
    for i in range(b):
        s = state[i:i + 1]
        for row in path[i, :accepted[i] + 1].tolist():
            one = slice(row, row + 1)
            _, s = kernels.recurrent_rows(q[i:i + 1, one], k[i:i + 1, one], v[i:i + 1, one], g[i:i + 1, one],
                                          beta[i:i + 1, one], s, block_v=block_v)
        assert torch.equal(got[i:i + 1], s)


def test_commit_of_a_chain_prefix_is_the_snapshot_bit_for_bit():
    q, k, v, g, beta, state = args = inputs(8, 4, 8)
    _, snaps = kernels.recurrent_rows(*args, snapshots=True, final=False)
    accepted = torch.tensor([0, 3, 7, 5], device=DEVICE)
    path = torch.arange(8, device=DEVICE).expand(4, 8)
    got = kernels.commit_rows(k, v, g, beta, state, path, accepted)
    assert torch.equal(got, snaps[torch.arange(4, device=DEVICE), accepted])


def test_commit_of_nothing_keeps_the_state():
    """accepted = -1 (no row kept, as naive.commit allows) copies the state; padding is never read."""
    _, k, v, g, beta, state = inputs(9, 2, 3)
    path = torch.tensor([[-1, -1], [0, -1]], device=DEVICE)
    got = kernels.commit_rows(k, v, g, beta, state, path, torch.tensor([-1, 0], device=DEVICE))
    assert torch.equal(got[0], state[0])
    torch.testing.assert_close(got.cpu(), gdn.commit(*cpu(k, v, g, beta, state, path), torch.tensor([-1, 0])),
                               **F32_TOL)


# ---------------------------------------------------------------------------------------------------------------
# dispatch


@pytest.mark.parametrize("kind", ["naive", "triton"])
def test_rows_dispatch(kind):
    plan = KernelPlan.stock(kernels=kind)
    q, k, v, g, beta, state = args = inputs(10, 2, 5)
    parents = torch.tensor([[-1, 0, 0, 1, 1], [0, 0, 1, 2, 3]], device=DEVICE)
    path, accepted = padded_paths(parents, [3, 4], 5)
    ref = cpu(*args)
    checks = [
        (gdn.rows_chain(*args, plan), gdn.chain_snapshots(*ref)),
        ((gdn.rows_tree(*args, parents, plan),), (gdn.tree(*ref, parents.cpu()),)),
        (gdn.rows_tree(*args, parents, plan, snapshots=True), gdn.tree_snapshots(*ref, parents.cpu())),
        ((gdn.rows_commit(k, v, g, beta, state, path, accepted, plan),),
         (gdn.commit(*cpu(k, v, g, beta, state, path, accepted)),)),
    ]
    for got, want in checks:
        for x, y in zip(got, want, strict=True):
            torch.testing.assert_close(x.cpu(), y, **F32_TOL)


@pytest.mark.slow  # a whole engine under the Triton interpreter: 15-24 s a system on two cores
@pytest.mark.parametrize("system", ["stock", "stock:tree=best_first,nodes=8,hybrid_tree=recompute"])
def test_the_hybrid_engine_on_the_triton_kernels_answers_as_on_the_references(system, monkeypatch):
    """The layer's dispatch end to end (chain snapshots, tree in one pass, the recompute commit): the engine with
    `kernels=triton` (the interpreter here) gives the references' tokens, and the GDN kernels did run."""
    from specpilot.config import parse_system
    from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_hybrid_config
    from specpilot.runtime.engine import Engine

    cfg = tiny_hybrid_config(vocab=64)
    target = random_target(cfg, seed=3)
    drafter = random_drafter(tiny_drafter_config(cfg, target_layer_ids=[0, 3], block_size=4), seed=4)
    ran = []
    for name in ("recurrent_rows", "tree_rows", "commit_rows"):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _f=real, _n=name, **kw: ran.append(_n) or _f(*a, **kw))
    out = {kind: Engine(target, drafter, parse_system(f"{system}{',' if ':' in system else ':'}kernels={kind}"),
                        context=64).generate_one([1, 5, 7, 9, 11], 10, ()).tokens for kind in ("naive", "triton")}
    assert out["triton"] == out["naive"] and len(out["naive"]) == 10
    want = {"tree_rows", "commit_rows"} if "tree=" in system else {"recurrent_rows"}  # a chain: snapshots, no commit
    assert set(ran) == want


@pytest.mark.slow  # 26 s under the interpreter on two cores
def test_a_forward_builds_its_tree_paths_once_for_all_its_gdn_layers(monkeypatch):
    """tree_paths is a few dozen small launches; every GDN layer of a verify pass walks the same tree, so the
    layers share one build (Forward.derived), as the layers of a commit share its walk (Cache.commit's memo), and
    the tokens stay the references'."""
    from specpilot.config import parse_system
    from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_hybrid_config
    from specpilot.runtime.engine import Engine

    cfg = tiny_hybrid_config(vocab=64)
    target = random_target(cfg, seed=3)
    drafter = random_drafter(tiny_drafter_config(cfg, target_layer_ids=[0, 3], block_size=4), seed=4)
    calls = {"tree_paths": 0, "tree_rows": 0, "commit_path": 0, "commit_rows": 0}
    for name in calls:
        real = getattr(kernels, name)

        def counted(*a, _f=real, _n=name, **kw):
            calls[_n] += 1
            return _f(*a, **kw)

        monkeypatch.setattr(kernels, name, counted)
    system = "stock:tree=best_first,nodes=8,hybrid_tree=recompute"
    out = {kind: Engine(target, drafter, parse_system(f"{system},kernels={kind}"), context=64)
           .generate_one([1, 5, 7, 9, 11], 10, ()).tokens for kind in ("naive", "triton")}
    gdn_layers = cfg.layer_types.count("gdn")
    assert out["triton"] == out["naive"]
    assert gdn_layers > 1 and calls["tree_paths"] >= 1
    assert calls["tree_rows"] == gdn_layers * calls["tree_paths"]  # one build a verify pass, used by every layer
    assert calls["commit_path"] >= 1 and calls["commit_rows"] == gdn_layers * calls["commit_path"]
