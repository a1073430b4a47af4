"""Each Triton kernel against its PyTorch reference on fresh random inputs.

On the CPU the kernels run under Triton's interpreter in float32 (it does not model bf16 arithmetic);
on CUDA they also run compiled, in bf16.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from specpilot.kernels.dispatch import fix_triton_interpreter  # noqa: E402
from specpilot.kernels.norm.naive import add_rms_norm_naive, rms_norm_naive  # noqa: E402
from specpilot.kernels.norm.triton import add_rms_norm_triton, rms_norm_triton  # noqa: E402
from specpilot.kernels.rope.naive import rope_qkv_naive  # noqa: E402
from specpilot.kernels.rope.triton import rope_qkv_triton  # noqa: E402
from specpilot.kernels.swiglu.naive import silu_mul_naive  # noqa: E402
from specpilot.kernels.swiglu.triton import silu_mul_triton  # noqa: E402
from specpilot.models.layers import rope_table  # noqa: E402

fix_triton_interpreter()
CUDA = torch.cuda.is_available()
# The interpreter is only on when there is no GPU: compiled kernels cannot take CPU tensors.
SETTINGS = [("cuda", torch.bfloat16, 0.0), ("cuda", torch.float32, 1e-6)] if CUDA else [("cpu", torch.float32, 1e-6)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("rows,hidden", [(1, 64), (3, 200), (5, 2500)])
def test_rms_norm(device, dtype, tol, rows, hidden):
    g = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=g).to(device, dtype)
    d = torch.randn(rows, hidden, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
    assert rel(rms_norm_triton(x, w, 1e-6), rms_norm_naive(x, w, 1e-6)) <= max(tol, 1e-2 if tol == 0 else tol)
    s, y = add_rms_norm_triton(x, d, w, 1e-5)
    s_ref, y_ref = add_rms_norm_naive(x, d, w, 1e-5)
    assert torch.equal(s, s_ref)  # the residual sum is the same rounding of the same two numbers
    assert rel(y, y_ref) <= max(tol, 1e-2 if tol == 0 else tol)


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
def test_silu_mul(device, dtype, tol):
    gu = torch.randn(3, 2, 2 * 1500, generator=torch.Generator().manual_seed(7)).to(device, dtype)
    assert rel(silu_mul_triton(gu), silu_mul_naive(gu)) <= max(tol, 1e-2 if tol == 0 else tol)


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("want_q", [True, False])
def test_rope_qkv(device, dtype, tol, norm, want_q):
    g = torch.Generator().manual_seed(11 + norm)
    b, t, hq, hkv, d, length = 2, 5, 6, 2, 32, 40
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, generator=g).to(device, dtype)
    positions = torch.randint(0, 100, (b, t), generator=g).to(device)
    slots = torch.stack([torch.randperm(length, generator=g)[:t] for _ in range(b)]).to(device)
    cos, sin = rope_table(128, d, 10000.0, None, device=device)
    qn = (1 + 0.1 * torch.randn(d, generator=g)).to(device, dtype) if norm else None
    kn = (1 + 0.1 * torch.randn(d, generator=g)).to(device, dtype) if norm else None
    caches = [torch.full((b, hkv, length, d), float("nan"), dtype=dtype, device=device) for _ in range(4)]
    q1 = rope_qkv_triton(qkv, positions, cos, sin, qn, kn, 1e-6, caches[0], caches[1], slots, hq, hkv, d, want_q)
    q2 = rope_qkv_naive(qkv, positions, cos, sin, qn, kn, 1e-6, caches[2], caches[3], slots, hq, hkv, d, want_q)
    tol = max(tol, 1e-2 if tol == 0 else tol)
    if want_q:
        assert rel(q1, q2) <= tol
    else:
        assert q1 is None and q2 is None
    written = ~torch.isnan(caches[2])
    assert torch.equal(written, ~torch.isnan(caches[0]))  # the same slots written, nothing else
    assert rel(caches[0][written], caches[2][written]) <= tol
    assert torch.equal(caches[1][written], caches[3][written])  # V is copied as is


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("fusion", ["plain", "norm", "bias", "norm_bias"])
@pytest.mark.parametrize("hidden,hq,hkv,d", [(96, 3, 1, 32), (200, 4, 2, 64)])
@pytest.mark.parametrize("pairs,pre", [(8, 1), (4, 1), (8, 2), (4, 3)])
def test_qkv_rope(device, dtype, tol, fusion, hidden, hq, hkv, d, pairs, pre):
    """Projection + rope + K/V write in one kernel against the projection then the rope reference."""
    from specpilot.kernels.qkv_rope.naive import qkv_rope_naive
    from specpilot.kernels.qkv_rope.triton import qkv_rope_triton

    g = torch.Generator().manual_seed(hidden + d + len(fusion))
    length = 24
    x = torch.randn(1, 1, hidden, generator=g).to(device, dtype)
    w = (torch.randn((hq + 2 * hkv) * d, hidden, generator=g) / hidden ** 0.5).to(device, dtype)
    bias = torch.randn(w.shape[0], generator=g).to(device, dtype) if "bias" in fusion else None
    nw = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype) if "norm" in fusion else None
    positions = torch.randint(0, 100, (1, 1), generator=g).to(device)
    slots = torch.randint(0, length, (1, 1), generator=g).to(device)
    cos, sin = rope_table(128, d, 10000.0, None, device=device)
    caches = [torch.full((1, hkv, length, d), float("nan"), dtype=dtype, device=device) for _ in range(4)]
    if pre == 1:
        q1 = qkv_rope_triton(x, w, bias, nw, 1e-5, positions, cos, sin, caches[0], caches[1], slots, hq, hkv, d,
                             tune=False, pairs=pairs)
    else:  # a config chosen in the step, with PRE tiles before the PDL wait (3: cut to a power of two)
        from specpilot.kernels.gemv import choice

        key = ("qkv_rope", hidden, hq, hkv, d // 2, nw is not None, bias is not None)
        choice._CHOSEN[key] = {"PAIRS": pairs, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "PRE": pre}
        try:
            q1 = qkv_rope_triton(x, w, bias, nw, 1e-5, positions, cos, sin, caches[0], caches[1], slots, hq, hkv,
                                 d)
        finally:
            choice.forget()
    q2 = qkv_rope_naive(x, w, bias, nw, 1e-5, positions, cos, sin, caches[2], caches[3], slots, hq, hkv, d)
    bound = 1e-2 if tol == 0 else max(tol, 1e-5)
    assert q1.shape == q2.shape and rel(q1, q2) <= bound
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        written = ~torch.isnan(want)
        assert torch.equal(~torch.isnan(got), written) and written.sum() == hkv * d  # the slot, nothing else
        assert rel(got[written], want[written]) <= bound


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("splits", [1, 2, 3, 8] if CUDA else [1])
@pytest.mark.parametrize("hidden,hq,hkv,d,cache_len", [(96, 4, 2, 32, 0), (200, 8, 2, 64, 70), (128, 4, 1, 32, 129),
                                                       (64, 2, 2, 16, 255)])
def test_qkv_rope_with_the_attention_at_its_tail(device, dtype, tol, splits, hidden, hq, hkv, d, cache_len):
    """ATTN (attention/tail.py): the q/k/v + rope kernel ends with the new row's attention. Its output equals
    the reference projection + rope then attention, the cache gets the new row and nothing else, nothing
    past the visible slots is read (NaN there), the counters are zeros again, and a second launch gives
    the same bits. The interpreter runs one split (its programs run one after another)."""
    from specpilot.kernels.attention.naive import attend_naive
    from specpilot.kernels.attention.triton import attention_counters
    from specpilot.kernels.gemv import choice
    from specpilot.kernels.qkv_rope.naive import qkv_rope_naive
    from specpilot.kernels.qkv_rope.triton import qkv_rope_triton
    from specpilot.speculative.visibility import Visibility

    g = torch.Generator().manual_seed(hidden + cache_len + splits)
    length = 256
    x = torch.randn(1, 1, hidden, generator=g).to(device, dtype)
    w = (torch.randn((hq + 2 * hkv) * d, hidden, generator=g) / hidden ** 0.5).to(device, dtype)
    cos, sin = rope_table(length, d, 10000.0, None, device=device)
    at = torch.tensor([[cache_len]], device=device)
    vis = Visibility(at.view(1), at.view(1))
    committed = torch.randn(2, 1, hkv, length, d, generator=g).to(device, dtype)
    committed[:, :, :, cache_len:] = float("nan")  # the new row goes to slot cache_len; past it nothing is read
    key = ("qkv_rope", hidden, hq, hkv, d // 2, False, False, False)
    choice._CHOSEN[key] = {"PAIRS": 4, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "PRE": 1, "ATTN": splits}
    outs, caches = [], []
    try:
        for _ in range(2):
            k_cache, v_cache = committed.clone()
            out, attended = qkv_rope_triton(x, w, None, None, 1e-5, at, cos, sin, k_cache, v_cache, at, hq, hkv, d,
                                            attention=(vis, d ** -0.5))
            assert attended
            outs.append(out)
            caches.append((k_cache, v_cache))
    finally:
        choice.forget()
    k_ref, v_ref = committed.clone()
    q_ref = qkv_rope_naive(x, w, None, None, 1e-5, at, cos, sin, k_ref, v_ref, at, hq, hkv, d)
    want = attend_naive(q_ref, k_ref.nan_to_num(), v_ref.nan_to_num(), vis, d ** -0.5)
    bound = 2e-2 if tol == 0 else max(tol, 1e-5)
    assert outs[0].shape == want.shape and rel(outs[0], want) <= bound
    assert torch.equal(outs[0], outs[1])
    for got, ref in zip(caches[0], (k_ref, v_ref), strict=True):
        assert torch.equal(got.isnan(), ref.isnan())  # the new row at its slot, nothing else
        assert rel(got[:, :, cache_len], ref[:, :, cache_len]) <= bound
    assert not attention_counters(x.device)[:2 * hkv].any()


def test_attention_tail_applies_only_where_it_can(monkeypatch):
    """Without ATTN chosen, for a tree or a window, or more than 16 query heads a KV head, there is no
    tail (the kernel returns q and the layer runs the attention kernel); the split count is cut to the programs of
    a KV head's group (the splits are those programs), and to 1 under the interpreter."""
    import specpilot.kernels.qkv_rope.triton as qkv_mod
    from specpilot.speculative.visibility import Visibility

    at = torch.tensor([3])
    causal, tree = Visibility(at, at), Visibility(at, at, tree=torch.ones(1, 1, dtype=torch.bool))
    assert qkv_mod.tail_splits({"ATTN": 4, "PAIRS": 8}, causal, 4, 128) == (1 if qkv_mod._INTERPRET else 4)
    monkeypatch.setattr(qkv_mod, "_INTERPRET", False)
    assert qkv_mod.tail_splits({"ATTN": 4, "PAIRS": 8}, causal, 4, 128) == 4
    # no more splits than the group has programs: one q head, K and V, of 16 / 2 / 4 = 2 programs each
    assert qkv_mod.tail_splits({"ATTN": 8, "PAIRS": 4}, causal, 1, 16) == 6
    assert qkv_mod.tail_splits({"PAIRS": 8}, causal, 4, 128) == 0
    assert qkv_mod.tail_splits(None, causal, 4, 128) == 0
    assert qkv_mod.tail_splits({"ATTN": 4}, tree, 4, 128) == 0
    assert qkv_mod.tail_splits({"ATTN": 4}, Visibility(at, at, window=8), 4, 128) == 0
    assert qkv_mod.tail_splits({"ATTN": 4}, causal, 32, 128) == 0
    assert qkv_mod.tail_splits({"ATTN": 4}, causal, 4, 96) == 0
    assert qkv_mod.tail_splits({"ATTN": 4}, Visibility(torch.tensor([3, 4]), torch.tensor([3, 4])), 4, 128) == 0


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("rows", [1, 3, 4])
@pytest.mark.parametrize("n,k", [(40, 300), (96, 1100), (64, 512)])
@pytest.mark.parametrize("fusion", ["plain", "bias", "norm", "gate_up", "norm_gate_up", "residual"])
def test_gemv(device, dtype, tol, rows, n, k, fusion):
    _check_gemv(device, dtype, tol, rows, n, k, fusion, None)


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("n,k", [(40, 300), (64, 512), (24, 100)])
@pytest.mark.parametrize("fusion", ["norm", "norm_gate_up", "residual"])
@pytest.mark.parametrize("pre", [2, 4])
def test_one_row_gemv_streaming_tiles_before_the_wait(device, dtype, tol, n, k, fusion, pre):
    """PRE weight tiles loaded before the PDL wait (one wide tile, cut to what K holds whole): the same
    result; (24, 100): K below one tile, (40, 300): K not a multiple of the tile."""
    _check_gemv(device, dtype, tol, 1, n, k, fusion,
                {"BLOCK_N": 8, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2, "PRE": pre})


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("n,k", [(40, 300), (64, 512)])
@pytest.mark.parametrize("reader", ["norm", "norm_gate_up", "qkv_rope"])
@pytest.mark.parametrize("block_n", [8, 16])
def test_norm_handoff_gives_the_norm_reference(device, dtype, tol, n, k, reader, block_n):
    """A residual-writing one-row GEMV given next_norm returns a NormedStream: the stream the plain call
    writes, h * g, and sums of squares (one per block, BLOCK_N 16 leaves the last block part-full at
    N = 40); the normed projection (or q/k/v + rope) reading it equals the reference on the stream, and
    a NormedStream for another norm is read as its stream."""
    from specpilot.kernels.gemv import NormedStream
    from specpilot.kernels.gemv.naive import gemv_naive
    from specpilot.kernels.gemv.triton import gemv_triton

    g = torch.Generator().manual_seed(n * k + block_n)
    a = torch.randn(1, k, generator=g).to(device, dtype)
    w_o = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    r = torch.randn(1, n, generator=g).to(device, dtype)
    nw = (1 + 0.1 * torch.randn(n, generator=g)).to(device, dtype)
    config = {"BLOCK_N": block_n, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2, "PRE": 1}
    handed = gemv_triton(a, w_o, residual=r, next_norm=nw, tune=False, config=config)
    assert isinstance(handed, NormedStream) and handed.norm_weight is nw
    h = handed.stream
    assert torch.equal(h, gemv_triton(a, w_o, residual=r, tune=False, config=config))
    assert handed.sumsq.shape == (-(-n // block_n),)
    assert rel(handed.sumsq.sum(), h.float().square().sum()) <= 1e-6
    assert torch.equal(handed.scaled, (h.float() * nw.float()).to(dtype))
    other = NormedStream(h, torch.randn(h.shape, generator=g).to(device, dtype), handed.sumsq * 3, nw.clone())
    bound = 1e-2 if tol == 0 else max(tol, 1e-5)
    if reader == "qkv_rope":
        _check_qkv_rope_reads(handed, other, nw, n, device, dtype, bound)
        return
    w = (torch.randn(96, n, generator=g) / n ** 0.5).to(device, dtype)
    kw = dict(norm_weight=nw, eps=1e-5, gate_up=reader == "norm_gate_up")
    want = gemv_naive(h, w, **kw)
    for x in (handed, other):
        assert rel(gemv_triton(x, w, tune=False, config=config, **kw), want) <= bound


def _check_qkv_rope_reads(handed, other, nw, hidden, device, dtype, bound):
    from specpilot.kernels.qkv_rope.naive import qkv_rope_naive
    from specpilot.kernels.qkv_rope.triton import qkv_rope_triton

    g = torch.Generator().manual_seed(hidden)
    hq, hkv, d, length = 2, 1, 32, 8
    w = (torch.randn((hq + 2 * hkv) * d, hidden, generator=g) / hidden ** 0.5).to(device, dtype)
    positions, slots = torch.tensor([[5]], device=device), torch.tensor([[3]], device=device)
    cos, sin = rope_table(16, d, 10000.0, None, device=device)
    caches = [torch.zeros(1, hkv, length, d, dtype=dtype, device=device) for _ in range(2)]
    want = qkv_rope_naive(handed.stream.view(1, 1, -1), w, None, nw, 1e-5, positions, cos, sin, *caches, slots,
                          hq, hkv, d)
    for x in (handed, other):
        got_caches = [torch.zeros_like(c) for c in caches]
        got = qkv_rope_triton(x, w, None, nw, 1e-5, positions, cos, sin, *got_caches, slots, hq, hkv, d,
                              tune=False, pairs=8)
        assert rel(got, want) <= bound
        assert all(rel(a, b) <= bound for a, b in zip(got_caches, caches, strict=True))


def test_norm_handoff_follows_the_environment(monkeypatch):
    from specpilot.kernels.gemv import NormedStream, handoff_on
    from specpilot.kernels.gemv.triton import gemv_triton

    device, dtype = SETTINGS[0][:2]
    g = torch.Generator().manual_seed(1)
    a, w, r, nw = (torch.randn(*s, generator=g).to(device, dtype) for s in ((1, 64), (32, 64), (1, 32), (32,)))
    config = {"BLOCK_N": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "PRE": 1}
    monkeypatch.setenv("SPECPILOT_NORM_HANDOFF", "0")
    assert not handoff_on()
    plain = gemv_triton(a, w, residual=r, next_norm=nw, tune=False, config=config)
    assert isinstance(plain, torch.Tensor)
    monkeypatch.setenv("SPECPILOT_NORM_HANDOFF", "yes")
    with pytest.raises(ValueError, match="SPECPILOT_NORM_HANDOFF"):
        handoff_on()
    monkeypatch.delenv("SPECPILOT_NORM_HANDOFF")
    handed = gemv_triton(a, w, residual=r, next_norm=nw, tune=False, config=config)
    assert isinstance(handed, NormedStream) and torch.equal(handed.stream, plain)


def one_row_run(fusion: str, n: int, k: int, pre: int, device, dtype):
    """A one-row call of the streaming GEMV (`plain`, `norm_gate_up`, `residual`, `residual_next`: also the next
    norm's hand-over) or of q/k/v + rope (with a bias) on fresh random inputs (a config chosen for it, PRE tiles
    before the wait): a function returning its outputs."""
    from specpilot.kernels.gemv.triton import gemv_triton
    from specpilot.kernels.qkv_rope.triton import qkv_rope_triton

    g = torch.Generator().manual_seed(n + k + pre)
    x = torch.randn(1, k, generator=g).to(device, dtype)
    if fusion == "qkv_rope":  # k is the hidden size; two q heads and one K/V head of 32
        w = (torch.randn(4 * 32, k, generator=g) / k ** 0.5).to(device, dtype)
        bias = torch.randn(4 * 32, generator=g).to(device, dtype)
        cos, sin = rope_table(16, 32, 10000.0, None, device=device)
        from specpilot.kernels.gemv import choice

        choice._CHOSEN[("qkv_rope", k, 2, 1, 16, False, True, False)] = {
            "PAIRS": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "PRE": pre}

        def run():
            caches = [torch.zeros(1, 1, 8, 32, dtype=dtype, device=device) for _ in range(2)]
            q = qkv_rope_triton(x.view(1, 1, k), w, bias, None, 1e-5, torch.tensor([[5]], device=device), cos, sin,
                                *caches, torch.tensor([[3]], device=device), 2, 1, 32)
            return [q, *caches]
        return run
    w = (torch.randn(2 * n if "gate_up" in fusion else n, k, generator=g) / k ** 0.5).to(device, dtype)
    kw = {"residual": torch.randn(1, n, generator=g).to(device, dtype)} if "residual" in fusion else {}
    if fusion == "residual_next":
        kw["next_norm"] = (1 + 0.1 * torch.randn(n, generator=g)).to(device, dtype)
    if "norm" in fusion:
        kw.update(norm_weight=(1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype), eps=1e-5, gate_up=True)
    config = {"BLOCK_N": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "PRE": pre}

    def run():
        out = gemv_triton(x, w, tune=False, config=config, **kw)
        return [out.stream, out.scaled, out.sumsq] if fusion == "residual_next" else [out]
    return run


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("n,k", [(40, 300), (24, 100), (64, 512)])
@pytest.mark.parametrize("fusion", ["plain", "norm_gate_up", "residual", "qkv_rope"])
@pytest.mark.parametrize("pre", [1, 2])
def test_weight_loop_one_step_ahead_computes_the_same(monkeypatch, device, dtype, tol, n, k, fusion, pre):
    """SPECPILOT_GEMV_AHEAD only moves loads earlier (each loop step asks for the next step's tiles; the
    first ones before anything waits on x): bit for bit the output without it, for K of one tile, of
    several, and not a multiple of the tile, with PRE tiles before the wait, and in q/k/v + rope."""
    from specpilot.kernels.gemv import ahead_on, choice

    run = one_row_run(fusion, n, k, pre, device, dtype)
    try:
        monkeypatch.setenv("SPECPILOT_GEMV_AHEAD", "0")
        assert not ahead_on()
        behind = run()
        monkeypatch.setenv("SPECPILOT_GEMV_AHEAD", "1")
        ahead = run()
    finally:
        choice.forget()
    assert all(torch.equal(a, b) for a, b in zip(ahead, behind, strict=True))
    assert all(a.abs().sum() > 0 for a in ahead)
    monkeypatch.setenv("SPECPILOT_GEMV_AHEAD", "soon")
    with pytest.raises(ValueError, match="SPECPILOT_GEMV_AHEAD"):
        ahead_on()


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("kernel", ["norm_gate_up", "residual_next", "qkv_rope", "attention"])
def test_l2_hints_and_early_epilogue_inputs_compute_the_same(monkeypatch, device, dtype, tol, kernel):
    """SPECPILOT_L2_HINTS only marks loads (weights evict-first, the K/V cache evict-last), and
    SPECPILOT_EPILOGUE_EARLY only moves the epilogue's loads (bias, residual, the next norm's weight, rope's
    cos / sin) before the weight loop: the one-row GEMV, q/k/v + rope (its K/V cache writes) and the decode
    attention (its K/V loads) compute what they compute without them, bit for bit under the interpreter.
    A GPU build may differ in the last bit: Triton's PTX leaves ptxas free to fuse a multiply and an add
    into one FMA, and it chose differently for q/k/v + rope once the loads moved (1-2 float32 ulps in 9 of
    64 q values, one bfloat16 ulp in 6, on the H200). The L2 switch names its values; anything else is an
    error."""
    from specpilot.kernels.attention.triton import attend_triton
    from specpilot.kernels.gemv import choice, epilogue_early, kv_eviction, l2_hints, weight_eviction
    from specpilot.speculative.visibility import Visibility

    if kernel == "attention":
        g = torch.Generator().manual_seed(11)
        q = torch.randn(1, 1, 4, 32, generator=g).to(device, dtype)
        kv = [torch.randn(1, 2, 128, 32, generator=g).to(device, dtype) for _ in range(2)]
        vis = Visibility(torch.tensor([90], device=device), torch.tensor([90], device=device))
        run = lambda: [attend_triton(q, *kv, vis, 32 ** -0.5, num_splits=2, fuse_combine=True)]  # noqa: E731
    else:
        run = one_row_run(kernel, 40, 300, 1, device, dtype)
    outs = {}
    try:
        for mode, evict in (("off", ("", "")), ("weights", ("evict_first", "")),
                            ("weights_kv", ("evict_first", "evict_last"))):
            monkeypatch.setenv("SPECPILOT_L2_HINTS", mode)
            assert (l2_hints(), weight_eviction(), kv_eviction()) == (mode, *evict)
            outs[mode] = run()
        monkeypatch.setenv("SPECPILOT_EPILOGUE_EARLY", "0")
        assert not epilogue_early()
        outs["late epilogue"] = run()
    finally:
        choice.forget()
    ulps = 0.0 if device == "cpu" else 1e-6 if dtype == torch.float32 else 1e-2
    for mode in ("weights", "weights_kv", "late epilogue"):
        assert all(rel(a, b) <= ulps for a, b in zip(outs[mode], outs["off"], strict=True)), mode
    assert all(a.abs().sum() > 0 for a in outs["off"])
    monkeypatch.delenv("SPECPILOT_L2_HINTS")
    monkeypatch.delenv("SPECPILOT_EPILOGUE_EARLY")
    assert l2_hints() == "weights" and epilogue_early()  # the defaults
    monkeypatch.setenv("SPECPILOT_L2_HINTS", "everything")
    with pytest.raises(ValueError, match="SPECPILOT_L2_HINTS"):
        l2_hints()


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("vocab", [1000, 16384, 40000, 128256])
@pytest.mark.parametrize("ties", ["none", "in_chunk", "across_chunks"])
def test_greedy_advance_is_torch_argmax_and_moves_the_position(monkeypatch, device, dtype, tol, vocab, ties):
    """kernels/greedy: the token is torch.argmax of the row (the first index of the maximum, also when the
    maximum repeats inside one chunk of the kernel's walk or in two chunks), the position one further."""
    from specpilot.kernels.greedy import greedy_advance
    from specpilot.kernels.greedy.triton import BLOCK

    g = torch.Generator().manual_seed(vocab + len(ties))
    row = torch.randn(vocab, generator=g)
    top = row.max() + 1
    first = int(torch.randint(0, vocab // 2, (1,), generator=g))
    if ties == "in_chunk":
        row[first] = row[first + 1 + int(torch.randint(0, 7, (1,), generator=g))] = top
    elif ties == "across_chunks":
        row[first] = row[min(first + BLOCK, vocab - 1)] = top
    row = row.to(device, dtype)
    monkeypatch.setenv("SPECPILOT_KERNELS", "triton")
    for _ in range(2):  # the kernel, then PyTorch's three launches
        token = torch.full((1,), -1, dtype=torch.int64, device=device)
        pos = torch.tensor([41], device=device)
        greedy_advance(row, token, pos)
        assert token.item() == row.argmax().item() and pos.item() == 42
        if ties != "none":
            assert token.item() == first
        monkeypatch.setenv("SPECPILOT_GREEDY_KERNEL", "0")
    monkeypatch.setenv("SPECPILOT_GREEDY_KERNEL", "later")
    with pytest.raises(ValueError, match="SPECPILOT_GREEDY_KERNEL"):
        greedy_advance(row, token, pos)


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("ring", [False, True])
def test_early_release_computes_the_same(device, dtype, tol, ring):
    """EARLY (each block lets the next kernel launch at its start, not after its last weight load) moves
    launches only: a chain of one-row kernels under PDL (residual projection handing over the norm, the
    gate/up pair reading it, the down projection, q/k/v + rope reading the next hand-over) gives bit for bit
    the chain without it. ring: the residual projections take the shared-memory ring (GPU only)."""
    if ring and not CUDA:
        pytest.skip("Gluon kernels run only on a GPU (no interpreter)")
    from specpilot.kernels.gemv import choice
    from specpilot.kernels.gemv.triton import gemv_triton
    from specpilot.kernels.qkv_rope.triton import qkv_rope_triton

    g = torch.Generator().manual_seed(11 + ring)
    h, inter, d = (1024, 1024, 32) if ring else (128, 256, 32)  # the ring takes K of at least 3 tiles of 256
    t = lambda *shape, s=1.0: (s * torch.randn(*shape, generator=g)).to(device, dtype)  # noqa: E731
    x, r = t(1, h), t(1, h)
    wo, w13, w2, wqkv = t(h, h, s=h ** -0.5), t(2 * inter, h, s=h ** -0.5), t(h, inter, s=inter ** -0.5), \
        t(4 * d, h, s=h ** -0.5)
    g1, g2 = 1 + t(h, s=0.1), 1 + t(h, s=0.1)
    cos, sin = rope_table(16, d, 10000.0, None, device=device)
    plain = {"BLOCK_N": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "PRE": 1}
    res = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 8, "num_stages": 1, "PRE": 1, "STAGE": 2} if ring else plain

    def chain(early: bool) -> list[torch.Tensor]:
        e = {"EARLY": True} if early else {}
        choice._CHOSEN[("qkv_rope", h, 2, 1, d // 2, True, False, True)] = {
            "PAIRS": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "PRE": 1, **e}
        a = gemv_triton(x, wo, residual=r, next_norm=g1, tune=False, config={**res, **e})
        act = gemv_triton(a, w13, norm_weight=g1, eps=1e-5, gate_up=True, tune=False, config={**plain, **e})
        b = gemv_triton(act, w2, residual=a.stream, next_norm=g2, tune=False, config={**res, **e})
        caches = [torch.zeros(1, 1, 8, d, dtype=dtype, device=device) for _ in range(2)]
        q = qkv_rope_triton(b, wqkv, None, g2, 1e-5, torch.tensor([[5]], device=device), cos, sin, *caches,
                            torch.tensor([[3]], device=device), 2, 1, d)
        return [a.stream, act, b.stream, b.scaled, b.sumsq, q, *caches]

    try:
        late, early = chain(False), chain(True)
    finally:
        choice.forget()
    assert all(torch.equal(u, v) for u, v in zip(early, late, strict=True))
    assert all(u.abs().sum() > 0 for u in early)


@pytest.mark.skipif(not CUDA, reason="Gluon kernels run only on a GPU (no interpreter)")
@pytest.mark.parametrize("config", __import__("specpilot.kernels.gemv.choice", fromlist=["STAGED"]).STAGED, ids=str)
@pytest.mark.parametrize("k", [4096, 14336])
@pytest.mark.parametrize("next_norm", [False, True])
def test_staged_gemv_matches_the_reference(config, k, next_norm):
    """gemv/staged.py: a config with STAGE takes the shared-memory ring for the residual projection (and
    its hand-over), with the reference's result; a pair falls back to Triton."""
    from specpilot.kernels.gemv import NormedStream
    from specpilot.kernels.gemv.naive import gemv_naive
    from specpilot.kernels.gemv.triton import gemv_triton

    g = torch.Generator().manual_seed(config["STAGE"] + k + next_norm)
    n = 256
    a = torch.randn(1, k, generator=g).to("cuda", torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to("cuda", torch.bfloat16)
    r = torch.randn(1, n, generator=g).to("cuda", torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(n, generator=g)).to("cuda", torch.bfloat16)
    out = gemv_triton(a, w, residual=r, tune=False, config=config, next_norm=nw if next_norm else None)
    want = gemv_naive(a, w, residual=r)
    h = out.stream if next_norm else out
    assert rel(h, want) <= 1e-2
    if next_norm:
        assert isinstance(out, NormedStream) and torch.equal(out.scaled, (h.float() * nw.float()).to(torch.bfloat16))
        assert rel(out.sumsq.sum(), h.float().square().sum()) <= 1e-5
    pair = (torch.randn(2 * n, k, generator=g) / k ** 0.5).to("cuda", torch.bfloat16)
    assert rel(gemv_triton(a, pair, gate_up=True, tune=False, config=config), gemv_naive(a, pair, gate_up=True)) <= 1e-2


def test_staged_configs_go_only_where_the_ring_applies_and_fall_back_elsewhere(monkeypatch):
    """The step tuning offers the shared-memory ring (gemv/staged.py) to plain and residual-writing
    projections only, none with SPECPILOT_GEMV_STAGED=0; where the ring cannot run (the interpreter, a K
    its tiles do not divide, float32) a STAGE config runs the Triton kernel with the same tiles, same result."""
    from specpilot.kernels.gemv import choice
    from specpilot.kernels.gemv.triton import gemv_triton

    writer = ("gemv", 4096, 4096, ("GATE_UP", False), ("HAS_RES", True), ("NEXT", True), ("PRENORM", False))
    reader = ("gemv", 28672, 4096, ("GATE_UP", True), ("HAS_RES", False), ("NEXT", False), ("PRENORM", True))
    staged = lambda key: [c for c in choice.candidates(key) if "STAGE" in c]  # noqa: E731
    assert staged(writer) == choice.STAGED and staged(reader) == []
    assert len(choice.candidates(reader)) == len(choice.CANDIDATES["gemv"]) - len(choice.STAGED)
    monkeypatch.setenv("SPECPILOT_GEMV_STAGED", "0")
    assert staged(writer) == []
    attention = ("attention", 1, 8, 4, 128, 1024)
    monkeypatch.setattr(choice, "_cluster_runs", lambda: False)  # the Triton configs alone (a GPU offers CLUSTER)
    assert any(c.get("LATE") for c in choice.candidates(attention))
    monkeypatch.setenv("SPECPILOT_ATTN_LATE", "0")
    assert choice.candidates(attention) == [c for c in choice.CANDIDATES["attention"] if not c.get("LATE")]
    g, device = torch.Generator().manual_seed(7), SETTINGS[-1][0]
    x, w = torch.randn(1, 1000, generator=g).to(device), torch.randn(64, 1000, generator=g).to(device)
    r = torch.randn(1, 64, generator=g).to(device)
    ring = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 8, "num_stages": 1, "PRE": 1, "STAGE": 2}
    plain = {key: v for key, v in ring.items() if key != "STAGE"}
    got = gemv_triton(x, w, residual=r, tune=False, config=ring)
    assert torch.equal(got, gemv_triton(x, w, residual=r, tune=False, config=plain))
    assert rel(got, x @ w.T + r) <= 1e-5
    from specpilot.kernels.gemv.staged import staged_fits

    flags = dict(HAS_NORM=False, GATE_UP=False, HAS_BIAS=False)
    assert staged_fits(4096, 4096, {**ring, "BLOCK_K": 512}, flags, 0, 2)
    assert not staged_fits(4096, 4096, {**ring, "BLOCK_K": 128}, flags, 0, 2)  # a warp's row is 256 columns


def _check_gemv(device, dtype, tol, rows, n, k, fusion, config):
    from specpilot.kernels.gemv.naive import gemv_naive
    from specpilot.kernels.gemv.triton import gemv_triton

    g = torch.Generator().manual_seed(rows * n + k)
    x = torch.randn(rows, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    kw = {}
    if "bias" in fusion:
        kw["bias"] = torch.randn(n, generator=g).to(device, dtype)
    if "norm" in fusion:
        kw.update(norm_weight=(1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype), eps=1e-5)
    if "gate_up" in fusion:
        kw["gate_up"] = True
    if fusion == "residual":
        kw["residual"] = torch.randn(rows, n, generator=g).to(device, dtype)
    got = gemv_triton(x, w, tune=False, config=config, **kw)
    want = gemv_naive(x, w, **kw)
    assert got.shape == want.shape
    # float32: the kernels sum ~1000 products in another order than cuBLAS (~sqrt(K) ulp apart)
    assert rel(got, want) <= (1e-2 if tol == 0 else max(tol, 1e-5))


def test_pdl_only_for_cuda_tensors_and_as_the_kernel_or_the_environment_says(monkeypatch):
    from specpilot.kernels.dispatch import pdl_on

    monkeypatch.delenv("SPECPILOT_PDL", raising=False)
    assert not pdl_on(torch.ones(2), default=True)  # CPU tensors (and the interpreter) never launch with PDL
    monkeypatch.setenv("SPECPILOT_PDL", "yes")
    with pytest.raises(ValueError, match="SPECPILOT_PDL"):
        pdl_on(torch.ones(2))
    if CUDA:
        hopper = torch.cuda.get_device_capability()[0] >= 9
        x = torch.ones(2, device="cuda")
        for env, default, want in (("", False, False), ("", True, hopper), ("1", False, hopper), ("0", True, False)):
            monkeypatch.setenv("SPECPILOT_PDL", env)
            assert pdl_on(x, default=default) == want, (env, default)


def test_gemv_option_runs_the_fused_kernels_and_keeps_ar_output(monkeypatch):
    """AR with gemv=true (streaming GEMV, fused q/k/v + rope, norms handed over from the projection that
    writes the stream, the first one from the embedding kernel) equals the default path's AR on a tiny
    float32 model, with and without the hand-over and the embedding kernel, and the fused prologue and the
    hand-overs really ran: after each embedding the first q/k/v + rope reads a NormedStream."""
    import specpilot.models.dense as dense
    import specpilot.models.layers as layers
    from specpilot.fixtures.random_models import random_target, tiny_target_config
    from specpilot.kernels.gemv import NormedStream
    from specpilot.runtime.engine import Engine
    from specpilot.config import parse_system

    device = "cuda" if CUDA else "cpu"
    if not CUDA:
        monkeypatch.setenv("SPECPILOT_KERNELS", "triton")  # the interpreter runs the Triton kernels
    calls, handed = [], []
    fused_prologue, real_project, real_embed = layers.qkv_rope, layers.project, dense.embed_handoff
    monkeypatch.setattr(layers, "qkv_rope", lambda x, *a, **k: calls.append(isinstance(x, NormedStream))
                        or fused_prologue(x, *a, **k))
    monkeypatch.setattr(layers, "project", lambda *a, **k: handed.append(isinstance(a[0], NormedStream))
                        or real_project(*a, **k))
    monkeypatch.setattr(dense, "embed_handoff", lambda *a, **k: calls.append("embed") or real_embed(*a, **k))
    target = random_target(tiny_target_config(), seed=3, device=device)
    prompt, ar = list(range(5, 20)), parse_system("ar")
    plain = Engine(target, None, context=64).generate(prompt, 12, (), ar).tokens
    assert not calls and not any(handed)
    fused = Engine(target, None, context=64, gemv=True).generate(prompt, 12, (), ar).tokens
    assert calls and any(handed) and fused == plain
    embeds = [i for i, c in enumerate(calls) if c == "embed"]
    assert embeds and all(calls[i + 1] is True for i in embeds)
    for switch in ("SPECPILOT_EMBED_KERNEL", "SPECPILOT_NORM_HANDOFF"):  # without the embedding kernel,
        monkeypatch.setenv(switch, "0")  # then without any hand-over (the embedding kernel's included)
        calls.clear()
        handed.clear()
        assert Engine(target, None, context=64, gemv=True).generate(prompt, 4, (), ar).tokens == plain[:4]
        assert "embed" not in calls and (switch == "SPECPILOT_EMBED_KERNEL" or not any(handed))


def test_attention_tail_in_the_engine_keeps_ar_output(monkeypatch):
    """With the attention at the q/k/v kernel's tail chosen (ATTN, two splits on a GPU), the tiny float32
    model's AR with gemv=true launches no attention kernel for its one-row steps and gives the default
    path's tokens."""
    import specpilot.kernels.qkv_rope.triton as qkv_mod
    import specpilot.models.layers as layers
    from specpilot.fixtures.random_models import random_target, tiny_target_config
    from specpilot.runtime.engine import Engine
    from specpilot.config import parse_system

    device = "cuda" if CUDA else "cpu"
    if not CUDA:
        monkeypatch.setenv("SPECPILOT_KERNELS", "triton")
    target = random_target(tiny_target_config(), seed=4, device=device)
    prompt, ar = list(range(7, 30)), parse_system("ar")
    plain = Engine(target, None, context=64).generate(prompt, 10, (), ar).tokens
    rows, real_attend = [], layers.attend
    monkeypatch.setattr(layers, "attend", lambda q, *a, **k: rows.append(q.shape[1]) or real_attend(q, *a, **k))
    monkeypatch.setattr(qkv_mod, "step_config", lambda key: {"PAIRS": 8, "BLOCK_K": 32, "num_warps": 4,
                                                              "num_stages": 2, "PRE": 1, "ATTN": 2})
    tail = Engine(target, None, context=64, gemv=True).generate(prompt, 10, (), ar).tokens
    assert tail == plain
    assert rows and 1 not in rows  # the prompt's rows only


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("hidden", [64, 1000, 4096])
def test_embed_handoff_matches_the_reference(monkeypatch, device, dtype, tol, hidden):
    """kernels/embed: the row, h * g and the sums of squares (summed over the kernel's parts) as the
    reference computes them, for a hidden size of one program, of several and not a multiple of one."""
    from specpilot.kernels.embed import embed_handoff
    from specpilot.kernels.embed.naive import embed_handoff_naive

    g = torch.Generator().manual_seed(hidden)
    table = torch.randn(50, hidden, generator=g).to(device, dtype)
    norm = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
    token = torch.tensor([[int(torch.randint(0, 50, (1,), generator=g))]], device=device)
    monkeypatch.setenv("SPECPILOT_KERNELS", "triton")
    got, want = embed_handoff(token, table, norm), embed_handoff_naive(token, table, norm)
    assert torch.equal(got.stream, want.stream) and torch.equal(got.stream[0, 0], table[token.item()])
    assert torch.equal(got.scaled, want.scaled) and got.norm_weight is norm
    assert rel(got.sumsq.sum(), want.sumsq.sum()) <= 1e-5 and got.sumsq.numel() == -(-hidden // 1024)
    with pytest.raises(ValueError, match="one token"):
        embed_handoff(token.repeat(1, 2), table, norm)


def test_hand_over_runs_before_the_tuning_so_the_tuning_sees_its_readers(monkeypatch):
    """Before any config is chosen the hand-over's writer runs the fixed config (its grid sizes the sums),
    not the autotuner, so the step's recording run launches the reader with the hand-over and the
    tuning records the reader's own key (PRENORM, no in-loop norm)."""
    import specpilot.kernels.gemv.triton as gemv_mod
    from specpilot.kernels.gemv import NormedStream, choice
    from specpilot.kernels.gemv.triton import gemv_triton

    launched = []

    class Spy:  # stands in for a compiled kernel: records which launch path ran
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append(self.name)

    monkeypatch.setattr(gemv_mod, "_INTERPRET", False)
    monkeypatch.setattr(gemv_mod, "_STREAM", Spy("fixed"))
    monkeypatch.setattr(gemv_mod, "_STREAM_TUNED", Spy("autotuned"))
    a, w_o, r, nw, w2 = (torch.randn(*shape) for shape in ((1, 64), (32, 64), (1, 32), (32,), (48, 32)))
    handed = []

    def step():
        h = gemv_triton(a, w_o, residual=r, next_norm=nw)
        handed.append(isinstance(h, NormedStream))
        gemv_triton(h, w2, norm_weight=nw, eps=1e-5)

    choice.forget()
    writer, reader = choice.record_keys(step)
    assert handed == [True] and launched == ["fixed", "autotuned"]
    assert dict(writer[3:])["NEXT"] and not dict(writer[3:])["PRENORM"]
    assert dict(reader[3:])["PRENORM"] and not dict(reader[3:])["HAS_NORM"]
    choice.forget()


def test_step_tuning_gives_each_kernel_its_fastest_config_and_the_kernels_use_it(monkeypatch):
    import specpilot.kernels.gemv.triton as gemv_mod
    from specpilot.kernels.gemv import choice
    from specpilot.kernels.gemv.triton import gemv_triton

    choice.forget()
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    launched = []

    class Spy:  # stands in for the compiled kernel: records the config each launch asked for
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append({k: kw[k] for k in ("BLOCK_N", "BLOCK_K", "AHEAD", "EARLY")
                                                        if k in kw})

    monkeypatch.setattr(gemv_mod, "_STREAM", Spy())
    monkeypatch.setattr(gemv_mod, "_STREAM_TUNED", Spy())
    fastest = {"gemv": 2, "qkv_rope": 1}

    def step():
        gemv_triton(x, w)
        choice.step_config(("qkv_rope", 64))

    def measure(_):  # a step's time: how far each key's config is from its fastest candidate; loads ahead
        total = 0.0  # pay on the GEMV (0.5 without), cost on q/k/v + rope (0.5 with); the early release
        for key in choice.record_keys(step):  # pays on the GEMV (0.25 without), costs on q/k/v (0.25 with)
            cfg = choice.step_config(key)
            if cfg is None:
                total += 5.0
                continue
            plain = {k: v for k, v in cfg.items() if k not in ("AHEAD", "EARLY", "ATTN")}
            total += abs(choice.CANDIDATES[key[0]].index(plain) - fastest[key[0]])
            total += 0.5 * (cfg.get("AHEAD", True) == (key[0] == "qkv_rope"))
            total += 0.25 * (cfg.get("EARLY", False) == (key[0] == "qkv_rope"))
            total += {0: 0.0, 4: -0.125}.get(cfg.get("ATTN", 0), 0.0625)  # the attention tail pays in 4 splits
        return total

    monkeypatch.setenv("SPECPILOT_GEMV_EARLY", "1")  # EARLY and ATTN are timed only when asked for
    monkeypatch.setenv("SPECPILOT_QKV_ATTN", "1")
    report = choice.tune_step(step, measure)
    assert len(report) == 2
    for key in choice.record_keys(step):
        plain = choice.CANDIDATES[key[0]][fastest[key[0]]]
        assert choice.step_config(key) == ({**plain, "EARLY": True} if key[0] == "gemv"
                                           else {**plain, "AHEAD": False, "ATTN": 4})
    assert report[repr(("qkv_rope", 64))]["ms_attention_tail"].keys() == set(choice.ATTN_SPLITS)
    launched.clear()
    gemv_triton(x, w)
    want = choice.CANDIDATES["gemv"][2]
    assert launched == [{"BLOCK_N": want["BLOCK_N"], "BLOCK_K": want["BLOCK_K"], "AHEAD": True, "EARLY": True}]
    choice._CHOSEN[choice.record_keys(lambda: gemv_triton(x, w))[0]] = {**want, "AHEAD": False}
    launched.clear()
    gemv_triton(x, w)
    assert launched == [{"BLOCK_N": want["BLOCK_N"], "BLOCK_K": want["BLOCK_K"], "AHEAD": False}]
    monkeypatch.delenv("SPECPILOT_GEMV_EARLY")  # not offered by default: the tuning never times them
    monkeypatch.delenv("SPECPILOT_QKV_ATTN")
    choice.forget()
    report = choice.tune_step(step, measure)
    assert report and all("ms_early" not in e and "ms_attention_tail" not in e for e in report.values())
    assert choice.tune_step(step, measure) == {}  # known keys are not tuned again
    choice.forget()


def test_later_tuning_rounds_retime_each_key_beside_the_others_choices(monkeypatch):
    """The first round tunes key a while b runs its fallback, where a's candidate 0 looks best; with b
    at its choice a's candidate 2 is faster, which the second round finds."""
    from specpilot.kernels.gemv import choice

    choice.forget()
    keys = [("gemv", "a"), ("gemv", "b")]

    def step():
        for key in keys:
            choice.step_config(key)

    def measure(_):  # loads ahead and the early release change nothing here: the tuning keeps the first only
        a, b = ({k: v for k, v in c.items() if k not in ("AHEAD", "EARLY")} if c else c
                for c in map(choice.step_config, keys))
        ia = choice.CANDIDATES["gemv"].index(a)
        if b is None:
            return 10.0 + (0.0 if ia == 0 else 1.0)
        return abs(ia - 2) + abs(choice.CANDIDATES["gemv"].index(b) - 3)

    monkeypatch.setenv("SPECPILOT_TUNE_ROUNDS", "1")
    first = choice.tune_step(step, measure)
    assert first[repr(keys[0])]["config"] == choice.CANDIDATES["gemv"][0]
    choice.forget()
    monkeypatch.delenv("SPECPILOT_TUNE_ROUNDS")
    report = choice.tune_step(step, measure)
    assert [choice.step_config(k) for k in keys] == [choice.CANDIDATES["gemv"][2], choice.CANDIDATES["gemv"][3]]
    assert min(report[repr(keys[0])]["ms_first_round"]) == 10.0 and min(report[repr(keys[0])]["ms"]) == 0.0
    choice.forget()
    monkeypatch.setenv("SPECPILOT_TUNE_ROUNDS", "many")
    with pytest.raises(ValueError, match="SPECPILOT_TUNE_ROUNDS"):
        choice.tune_step(step, measure)


def test_tuning_begins_from_the_start_table_where_its_configs_are_candidates(monkeypatch):
    """With b begun at its best candidate, one round finds a's best (2), where from b's fallback it
    keeps candidate 0; a start config that is no candidate (or whose option is off) is skipped."""
    from specpilot.kernels.gemv import choice

    cands = choice.CANDIDATES["gemv"]
    keys = [("gemv", "a"), ("gemv", "b")]

    def step():
        for key in keys:
            choice.step_config(key)

    def measure(_):
        a, b = ({k: v for k, v in c.items() if k != "AHEAD"} if c else c for c in map(choice.step_config, keys))
        if b is None:
            return 10.0 + (0.0 if cands.index(a) == 0 else 1.0)
        return abs(cands.index(a) - 2) + abs(cands.index(b) - 3)

    monkeypatch.setenv("SPECPILOT_TUNE_ROUNDS", "1")
    choice.forget()
    report = choice.tune_step(step, measure, start={keys[1]: cands[3], ("gemv", "unseen"): cands[5]})
    assert [choice.step_config(k) for k in keys] == [cands[2], cands[3]]
    assert report[repr(keys[1])]["start"] == cands[3] and "start" not in report[repr(keys[0])]
    assert ("gemv", "unseen") not in choice._CHOSEN  # a key the step does not launch is not chosen
    for bad in ({**cands[3], "BLOCK_N": 999}, next(c for c in cands if "STAGE" in c)):
        monkeypatch.setenv("SPECPILOT_GEMV_STAGED", "0")  # the ring's configs are then no candidates
        choice.forget()
        report = choice.tune_step(step, measure, start={keys[1]: bad})
        assert choice.step_config(keys[0]) == cands[0] and "start" not in report[repr(keys[1])]
    choice.forget()


def test_the_h200_start_table_holds_candidates_only(monkeypatch):
    from specpilot.kernels.gemv import choice, starts

    monkeypatch.setattr(choice, "_cluster_runs", lambda: True)  # as on a GPU with cuda-bindings
    table = starts.start_for("NVIDIA H200")
    assert len(table) == 6 and all(choice._startable(k, c) for k, c in table.items())
    assert starts.start_for("NVIDIA A100-SXM4-80GB") == {}
    monkeypatch.setenv("SPECPILOT_TUNE_START", "0")
    assert starts.start_for("NVIDIA H200") == {}
    monkeypatch.setattr(choice, "_cluster_runs", lambda: False)  # no cluster kernel: its start is skipped
    monkeypatch.delenv("SPECPILOT_TUNE_START")
    attention = [k for k in starts.start_for("NVIDIA H200") if k[0] == "attention"]
    assert attention and not choice._startable(attention[0], starts.H200_8B[attention[0]])
