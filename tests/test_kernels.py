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

from specpilot.config.plan import KernelPlan  # noqa: E402
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
    q1 = rope_qkv_triton(qkv, positions, cos, sin, qn, kn, 1e-6, caches[0], caches[1], slots, hq, hkv, d, want_q,
                         KernelPlan.stock())
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
    if pre > 1 and hidden > 96 and device == "cpu":
        pytest.skip("the interpreter is slow: the chosen-config path is run at the smaller shape on the CPU")
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
    plan = KernelPlan.stock()
    if pre == 1:
        q1 = qkv_rope_triton(x, w, bias, nw, 1e-5, positions, cos, sin, caches[0], caches[1], slots, hq, hkv, d,
                             plan=plan, tune=False, pairs=pairs)
    else:  # a config chosen in the step, with PRE tiles before the PDL wait (3: cut to a power of two)
        key = ("qkv_rope", hidden, hq, hkv, d // 2, nw is not None, bias is not None, False)
        plan.table.chosen[key] = {"PAIRS": pairs, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "PRE": pre}
        out = []
        launched = plan.table.record(lambda: out.append(qkv_rope_triton(
            x, w, bias, nw, 1e-5, positions, cos, sin, caches[0], caches[1], slots, hq, hkv, d, plan=plan)))
        assert launched == [key]  # the launch looked up the chosen config's key
        q1 = out[0]
    q2 = qkv_rope_naive(x, w, bias, nw, 1e-5, positions, cos, sin, caches[2], caches[3], slots, hq, hkv, d)
    bound = 1e-2 if tol == 0 else max(tol, 1e-5)
    assert q1.shape == q2.shape and rel(q1, q2) <= bound
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        written = ~torch.isnan(want)
        assert torch.equal(~torch.isnan(got), written) and written.sum() == hkv * d  # the slot, nothing else
        assert rel(got[written], want[written]) <= bound


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
    plan = KernelPlan.stock()
    handed = gemv_triton(a, w_o, plan=plan, residual=r, next_norm=nw, tune=False, config=config)
    assert isinstance(handed, NormedStream) and handed.norm_weight is nw
    h = handed.stream
    assert torch.equal(h, gemv_triton(a, w_o, plan=plan, residual=r, tune=False, config=config))
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
        assert rel(gemv_triton(x, w, plan=plan, tune=False, config=config, **kw), want) <= bound


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
                              plan=KernelPlan.stock(), tune=False, pairs=8)
        assert rel(got, want) <= bound
        assert all(rel(a, b) <= bound for a, b in zip(got_caches, caches, strict=True))


def test_norm_handoff_follows_the_plan():
    """handoff=False: a residual-writing one-row GEMV given next_norm returns the plain stream; by default
    (on) a NormedStream of the same stream."""
    from specpilot.kernels.gemv import NormedStream
    from specpilot.kernels.gemv.triton import gemv_triton

    device, dtype = SETTINGS[0][:2]
    g = torch.Generator().manual_seed(1)
    a, w, r, nw = (torch.randn(*s, generator=g).to(device, dtype) for s in ((1, 64), (32, 64), (1, 32), (32,)))
    config = {"BLOCK_N": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "PRE": 1}
    plain = gemv_triton(a, w, plan=KernelPlan.stock(handoff=False), residual=r, next_norm=nw, tune=False,
                        config=config)
    assert isinstance(plain, torch.Tensor)
    assert KernelPlan.stock().handoff  # the default
    handed = gemv_triton(a, w, plan=KernelPlan.stock(), residual=r, next_norm=nw, tune=False, config=config)
    assert isinstance(handed, NormedStream) and torch.equal(handed.stream, plain)
    assert plain.abs().sum() > 0


def one_row_run(fusion: str, n: int, k: int, pre: int, device, dtype):
    """A one-row call of the streaming GEMV (`plain`, `norm_gate_up`, `residual`, `residual_next`: also the next
    norm's hand-over) or of q/k/v + rope (with a bias) on fresh random inputs (a config chosen for it in the
    plan's table, PRE tiles before the wait): a function of the kernel plan returning its outputs."""
    from specpilot.kernels.gemv.triton import gemv_triton
    from specpilot.kernels.qkv_rope.triton import qkv_rope_triton

    g = torch.Generator().manual_seed(n + k + pre)
    x = torch.randn(1, k, generator=g).to(device, dtype)
    if fusion == "qkv_rope":  # k is the hidden size; two q heads and one K/V head of 32
        w = (torch.randn(4 * 32, k, generator=g) / k ** 0.5).to(device, dtype)
        bias = torch.randn(4 * 32, generator=g).to(device, dtype)
        cos, sin = rope_table(16, 32, 10000.0, None, device=device)
        key = ("qkv_rope", k, 2, 1, 16, False, True, False)

        def run(plan):
            plan.table.chosen[key] = {"PAIRS": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "PRE": pre}
            caches = [torch.zeros(1, 1, 8, 32, dtype=dtype, device=device) for _ in range(2)]
            q = qkv_rope_triton(x.view(1, 1, k), w, bias, None, 1e-5, torch.tensor([[5]], device=device), cos, sin,
                                *caches, torch.tensor([[3]], device=device), 2, 1, 32, plan=plan)
            return [q, *caches]
        return run
    w = (torch.randn(2 * n if "gate_up" in fusion else n, k, generator=g) / k ** 0.5).to(device, dtype)
    kw = {"residual": torch.randn(1, n, generator=g).to(device, dtype)} if "residual" in fusion else {}
    if fusion == "residual_next":
        kw["next_norm"] = (1 + 0.1 * torch.randn(n, generator=g)).to(device, dtype)
    if "norm" in fusion:
        kw.update(norm_weight=(1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype), eps=1e-5, gate_up=True)
    config = {"BLOCK_N": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "PRE": pre}

    def run(plan):
        out = gemv_triton(x, w, plan=plan, tune=False, config=config, **kw)
        return [out.stream, out.scaled, out.sumsq] if fusion == "residual_next" else [out]
    return run


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("n,k", [(40, 300), (24, 100), (64, 512)])
@pytest.mark.parametrize("fusion", ["plain", "norm_gate_up", "residual", "qkv_rope"])
@pytest.mark.parametrize("pre", [1, 2])
def test_weight_loop_one_step_ahead_computes_the_same(device, dtype, tol, n, k, fusion, pre):
    """The plan's `ahead` only moves loads earlier (each loop step asks for the next step's tiles; the
    first ones before anything waits on x): bit for bit the output without it, for K of one tile, of
    several, and not a multiple of the tile, with PRE tiles before the wait, and in q/k/v + rope."""
    from specpilot.kernels.gemv.triton import ahead_fits

    run = one_row_run(fusion, n, k, pre, device, dtype)
    plan = KernelPlan.stock()
    tile = {"BLOCK_N": 8, "BLOCK_K": 64, "num_warps": 4}  # the configs one_row_run launches: ahead by default
    assert plan.ahead and ahead_fits(16, tile, False, plan)
    assert not ahead_fits(16, tile, False, plan.but(ahead=False))
    behind = run(plan.but(ahead=False))
    ahead = run(plan)
    assert all(torch.equal(a, b) for a, b in zip(ahead, behind, strict=True))
    assert all(a.abs().sum() > 0 for a in ahead)


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("kernel", ["norm_gate_up", "residual_next", "qkv_rope", "attention"])
def test_l2_hints_and_early_epilogue_inputs_compute_the_same(device, dtype, tol, kernel):
    """The plan's `l2` only marks loads (weights evict-first, the K/V cache evict-last), and its
    `epilogue_early` only moves the epilogue's loads (bias, residual, the next norm's weight, rope's
    cos / sin) before the weight loop: the one-row GEMV, q/k/v + rope (its K/V cache writes) and the decode
    attention (its K/V loads) compute what they compute without them, bit for bit under the interpreter.
    A GPU build may differ in the last bit: Triton's PTX leaves ptxas free to fuse a multiply and an add
    into one FMA, and it chose differently for q/k/v + rope once the loads moved (1-2 float32 ulps in 9 of
    64 q values, one bfloat16 ulp in 6, on the H200). (Values outside l2's choices are refused:
    test_plan_options_refuse_invalid_values.)"""
    from specpilot.core.contracts import Visibility
    from specpilot.kernels.attention.triton import attend_triton
    from specpilot.kernels.gemv import kv_eviction, weight_eviction

    if kernel == "attention":  # the `gemv` step's attention: the partials merged in the same launch
        g = torch.Generator().manual_seed(11)
        q = torch.randn(1, 1, 4, 32, generator=g).to(device, dtype)
        kv = [torch.randn(1, 2, 128, 32, generator=g).to(device, dtype) for _ in range(2)]
        vis = Visibility(torch.tensor([90], device=device), torch.tensor([90], device=device))
        run = lambda plan: [attend_triton(q, *kv, vis, 32 ** -0.5, plan, num_splits=2)]  # noqa: E731
    else:
        run = one_row_run(kernel, 40, 300, 1, device, dtype)
    outs = {}
    for mode, evict in (("off", ("", "")), ("weights", ("evict_first", "")),
                        ("weights_kv", ("evict_first", "evict_last"))):
        plan = KernelPlan.stock(gemv=True, l2=mode)
        assert (weight_eviction(plan), kv_eviction(plan)) == evict
        outs[mode] = run(plan)
    late = KernelPlan.stock(gemv=True, epilogue_early=False)
    assert not late.epilogue_early
    outs["late epilogue"] = run(late)
    ulps = 0.0 if device == "cpu" else 1e-6 if dtype == torch.float32 else 1e-2
    for mode in ("weights", "weights_kv", "late epilogue"):
        assert all(rel(a, b) <= ulps for a, b in zip(outs[mode], outs["off"], strict=True)), mode
    assert all(a.abs().sum() > 0 for a in outs["off"])
    stock = KernelPlan.stock()
    assert stock.l2 == "weights" and stock.epilogue_early  # the defaults


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("vocab", [1000, 16384, 40000, 128256])
@pytest.mark.parametrize("ties", ["none", "in_chunk", "across_chunks"])
def test_greedy_advance_is_torch_argmax_and_moves_the_position(device, dtype, tol, vocab, ties):
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
    kernel = KernelPlan.stock(kernels="triton")
    for plan in (kernel, kernel.but(greedy_kernel=False)):  # the kernel, then PyTorch's three launches
        token = torch.full((1,), -1, dtype=torch.int64, device=device)
        pos = torch.tensor([41], device=device)
        greedy_advance(row, token, pos, plan)
        assert token.item() == row.argmax().item() and pos.item() == 42
        if ties != "none":
            assert token.item() == first


@pytest.mark.skipif(not CUDA, reason="Gluon kernels run only on a GPU (no interpreter)")
@pytest.mark.parametrize("config", __import__("specpilot.kernels.tuning.candidates", fromlist=["STAGED"]).STAGED,
                         ids=str)
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
    plan = KernelPlan.stock()
    out = gemv_triton(a, w, plan=plan, residual=r, tune=False, config=config, next_norm=nw if next_norm else None)
    want = gemv_naive(a, w, residual=r)
    h = out.stream if next_norm else out
    assert rel(h, want) <= 1e-2
    if next_norm:
        assert isinstance(out, NormedStream) and torch.equal(out.scaled, (h.float() * nw.float()).to(torch.bfloat16))
        assert rel(out.sumsq.sum(), h.float().square().sum()) <= 1e-5
    pair = (torch.randn(2 * n, k, generator=g) / k ** 0.5).to("cuda", torch.bfloat16)
    assert rel(gemv_triton(a, pair, plan=plan, gate_up=True, tune=False, config=config),
               gemv_naive(a, pair, gate_up=True)) <= 1e-2


def test_staged_configs_go_only_where_the_ring_applies_and_fall_back_elsewhere(monkeypatch):
    """The step tuning offers the shared-memory ring (gemv/staged.py) to plain and residual-writing
    projections only, none with the plan's staged=False (and the attention's late release not with
    attn_late=False); where the ring cannot run (the interpreter, a K its tiles do not divide, float32) a STAGE
    config runs the Triton kernel with the same tiles, same result."""
    from specpilot.kernels.gemv.triton import gemv_triton
    from specpilot.kernels.tuning import candidates as cands

    plan = KernelPlan.stock()
    writer = ("gemv", 4096, 4096, ("GATE_UP", False), ("HAS_RES", True), ("NEXT", True), ("PRENORM", False))
    reader = ("gemv", 28672, 4096, ("GATE_UP", True), ("HAS_RES", False), ("NEXT", False), ("PRENORM", True))
    staged = lambda key, plan: [c for c in cands.candidates(key, plan) if "STAGE" in c]  # noqa: E731
    assert staged(writer, plan) == cands.STAGED and staged(reader, plan) == []
    assert cands.candidates(writer, plan) == cands.GEMV + cands.STAGED
    assert cands.candidates(reader, plan) == cands.GEMV
    assert staged(writer, plan.but(staged=False)) == []
    attention = ("attention", 1, 8, 4, 128, 1024)
    monkeypatch.setattr(cands, "_cluster_runs", lambda: False)  # the Triton configs alone (a GPU offers CLUSTER)
    assert any(c.get("LATE") for c in cands.candidates(attention, plan))
    assert cands.candidates(attention, plan.but(attn_late=False)) == [c for c in cands.ATTENTION if not c.get("LATE")]
    g, device = torch.Generator().manual_seed(7), SETTINGS[-1][0]
    x, w = torch.randn(1, 1000, generator=g).to(device), torch.randn(64, 1000, generator=g).to(device)
    r = torch.randn(1, 64, generator=g).to(device)
    ring = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 8, "num_stages": 1, "PRE": 1, "STAGE": 2}
    plain = {key: v for key, v in ring.items() if key != "STAGE"}
    got = gemv_triton(x, w, plan=plan, residual=r, tune=False, config=ring)
    assert torch.equal(got, gemv_triton(x, w, plan=plan, residual=r, tune=False, config=plain))
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
    got = gemv_triton(x, w, plan=KernelPlan.stock(), tune=False, config=config, **kw)
    want = gemv_naive(x, w, **kw)
    assert got.shape == want.shape
    # float32: the kernels sum ~1000 products in another order than cuBLAS (~sqrt(K) ulp apart)
    assert rel(got, want) <= (1e-2 if tol == 0 else max(tol, 1e-5))


def test_pdl_only_for_cuda_tensors_and_as_the_kernel_or_the_plan_says():
    from specpilot.kernels.dispatch import pdl_on

    for pdl in ("auto", "on"):  # CPU tensors (and the interpreter) never launch with PDL
        assert not pdl_on(torch.ones(2), KernelPlan.stock(pdl=pdl), default=True)
    if CUDA:
        hopper = torch.cuda.get_device_capability()[0] >= 9
        x = torch.ones(2, device="cuda")
        for pdl, default, want in (("auto", False, False), ("auto", True, hopper), ("on", False, hopper),
                                   ("off", True, False)):
            assert pdl_on(x, KernelPlan.stock(pdl=pdl), default=default) == want, (pdl, default)


@pytest.mark.slow  # 23 s under the interpreter on two cores
def test_gemv_option_runs_the_fused_kernels_and_keeps_ar_output(monkeypatch):
    """AR with gemv=true (streaming GEMV, fused q/k/v + rope, norms handed over from the projection that
    writes the stream, the first one from the embedding kernel) equals the default path's AR on a tiny
    float32 model, with and without the hand-over and the embedding kernel, and the fused prologue and the
    hand-overs really ran: after each embedding the first q/k/v + rope reads a NormedStream."""
    import specpilot.kernels.embed as embed
    from specpilot.config import parse_system
    from specpilot.fixtures.random_models import random_target, tiny_target_config
    from specpilot.kernels.gemv import NormedStream
    from specpilot.runtime.engine import Engine
    from specpilot.weights.dense import DenseWeight

    device = "cuda" if CUDA else "cpu"
    kernels = () if CUDA else ("kernels=triton",)  # on the CPU the interpreter runs the Triton kernels
    system = lambda *options: parse_system("ar:" + ",".join(kernels + options))  # noqa: E731
    calls, handed = [], []
    fused_prologue, real_project, real_embed = DenseWeight.qkv_rope, DenseWeight.project, embed.embed_handoff
    monkeypatch.setattr(DenseWeight, "qkv_rope", lambda self, x, *a, **k: calls.append(isinstance(x, NormedStream))
                        or fused_prologue(self, x, *a, **k))
    monkeypatch.setattr(DenseWeight, "project", lambda self, x, *a, **k: handed.append(isinstance(x, NormedStream))
                        or real_project(self, x, *a, **k))
    monkeypatch.setattr(embed, "embed_handoff", lambda *a, **k: calls.append("embed") or real_embed(*a, **k))
    target = random_target(tiny_target_config(num_layers=2), seed=3, device=device)  # two: a hand-over between layers
    prompt = list(range(5, 20))
    plain = Engine(target, None, system(), context=64).generate_one(prompt, 4).tokens
    assert not calls and not any(handed)
    fused = Engine(target, None, system("gemv=true"), context=64).generate_one(prompt, 4).tokens
    assert calls and any(handed) and fused == plain
    embeds = [i for i, c in enumerate(calls) if c == "embed"]
    assert embeds and all(calls[i + 1] is True for i in embeds)
    for switch in ("embed_kernel", "handoff"):  # without the embedding kernel, then without any hand-over
        calls.clear()  # (the embedding kernel's included)
        handed.clear()
        engine = Engine(target, None, system("gemv=true", f"{switch}=false"), context=64)
        assert engine.generate_one(prompt, 2).tokens == plain[:2]
        assert calls and "embed" not in calls and (switch == "embed_kernel" or not any(handed))


@pytest.mark.parametrize("device,dtype,tol", SETTINGS)
@pytest.mark.parametrize("hidden", [64, 1000, 4096])
def test_embed_handoff_matches_the_reference(device, dtype, tol, hidden):
    """kernels/embed: the row, h * g and the sums of squares (summed over the kernel's parts) as the
    reference computes them, for a hidden size of one program, of several and not a multiple of one."""
    from specpilot.kernels.embed import embed_handoff
    from specpilot.kernels.embed.naive import embed_handoff_naive

    g = torch.Generator().manual_seed(hidden)
    table = torch.randn(50, hidden, generator=g).to(device, dtype)
    norm = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
    token = torch.tensor([[int(torch.randint(0, 50, (1,), generator=g))]], device=device)
    plan = KernelPlan.stock(kernels="triton")
    got, want = embed_handoff(token, table, norm, plan), embed_handoff_naive(token, table, norm)
    assert torch.equal(got.stream, want.stream) and torch.equal(got.stream[0, 0], table[token.item()])
    assert torch.equal(got.scaled, want.scaled) and got.norm_weight is norm
    assert rel(got.sumsq.sum(), want.sumsq.sum()) <= 1e-5 and got.sumsq.numel() == -(-hidden // 1024)
    with pytest.raises(ValueError, match="one token"):
        embed_handoff(token.repeat(1, 2), table, norm, plan)


def test_hand_over_runs_before_the_tuning_so_the_tuning_sees_its_readers(monkeypatch):
    """Before any config is chosen the hand-over's writer runs the fixed config (its grid sizes the sums),
    not the autotuner, so the step's recording run launches the reader with the hand-over and the
    tuning records the reader's own key (PRENORM, no in-loop norm)."""
    import specpilot.kernels.gemv.triton as gemv_mod
    from specpilot.kernels.gemv import NormedStream
    from specpilot.kernels.gemv.triton import gemv_triton

    launched = []

    class Spy:  # stands in for a compiled kernel: records which launch path ran
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append(self.name)

    monkeypatch.setattr(gemv_mod, "interpreting", lambda: False)  # as compiled: the autotuner is the fallback
    monkeypatch.setattr(gemv_mod, "_STREAM", Spy("fixed"))
    monkeypatch.setattr(gemv_mod, "_STREAM_TUNED", Spy("autotuned"))
    a, w_o, r, nw, w2 = (torch.randn(*shape) for shape in ((1, 64), (32, 64), (1, 32), (32,), (48, 32)))
    plan = KernelPlan.stock()
    handed = []

    def step():
        h = gemv_triton(a, w_o, plan=plan, residual=r, next_norm=nw)
        handed.append(isinstance(h, NormedStream))
        gemv_triton(h, w2, plan=plan, norm_weight=nw, eps=1e-5)

    writer, reader = plan.table.record(step)
    assert handed == [True] and launched == ["fixed", "autotuned"]
    assert dict(writer[3:])["NEXT"] and not dict(writer[3:])["PRENORM"]
    assert dict(reader[3:])["PRENORM"] and not dict(reader[3:])["HAS_NORM"]
    assert not plan.table.chosen  # recording chooses nothing


def test_step_tuning_gives_each_kernel_its_fastest_config_and_the_kernels_use_it(monkeypatch):
    """Each key gets the candidate under which the step is fastest, and loading ahead is kept per key where
    it pays (the GEMV here) and dropped where it costs (q/k/v + rope); the kernels then launch the chosen
    config. With the plan's ahead=False the tuning never times AHEAD; keys already chosen are not tuned again."""
    import specpilot.kernels.gemv.triton as gemv_mod
    from specpilot.kernels.gemv.triton import gemv_triton
    from specpilot.kernels.tuning.candidates import GEMV, QKV_ROPE, STAGED
    from specpilot.kernels.tuning.descent import tune_step

    x, w = torch.randn(1, 64), torch.randn(32, 64)
    launched = []

    class Spy:  # stands in for the compiled kernel: records the config each launch asked for
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append({k: kw[k] for k in ("BLOCK_N", "BLOCK_K", "AHEAD") if k in kw})

    monkeypatch.setattr(gemv_mod, "_STREAM", Spy())
    monkeypatch.setattr(gemv_mod, "_STREAM_TUNED", Spy())
    cands = {"gemv": GEMV + STAGED, "qkv_rope": QKV_ROPE}  # the candidates of these keys, in order
    fastest = {"gemv": 2, "qkv_rope": 1}

    def tuning(plan):
        def step():
            gemv_triton(x, w, plan=plan)
            plan.table.config(("qkv_rope", 64))

        def measure(_):  # a step's time: how far each key's config is from its fastest candidate; loads ahead
            total = 0.0  # pay on the GEMV (0.5 without), cost on q/k/v + rope (0.5 with)
            for key in plan.table.record(step):
                cfg = plan.table.config(key)
                if cfg is None:
                    total += 5.0
                    continue
                plain = {k: v for k, v in cfg.items() if k != "AHEAD"}
                total += abs(cands[key[0]].index(plain) - fastest[key[0]])
                total += 0.5 * (cfg.get("AHEAD", True) == (key[0] == "qkv_rope"))
            return total
        return step, measure

    plan = KernelPlan.stock()
    step, measure = tuning(plan)
    report = tune_step(step, measure, plan)
    assert len(report) == 2 and all("ms_without_ahead" in e for e in report.values())
    for key in plan.table.record(step):
        plain = cands[key[0]][fastest[key[0]]]
        assert plan.table.config(key) == (plain if key[0] == "gemv" else {**plain, "AHEAD": False})
    launched.clear()
    gemv_triton(x, w, plan=plan)
    want = GEMV[2]
    assert launched == [{"BLOCK_N": want["BLOCK_N"], "BLOCK_K": want["BLOCK_K"], "AHEAD": True}]
    plan.table.chosen[plan.table.record(lambda: gemv_triton(x, w, plan=plan))[0]] = {**want, "AHEAD": False}
    launched.clear()
    gemv_triton(x, w, plan=plan)
    assert launched == [{"BLOCK_N": want["BLOCK_N"], "BLOCK_K": want["BLOCK_K"], "AHEAD": False}]
    assert tune_step(step, measure, plan) == {}  # known keys are not tuned again
    behind = KernelPlan.stock(ahead=False)  # loading ahead off: never timed, never chosen
    step, measure = tuning(behind)
    report = tune_step(step, measure, behind)
    assert report and all("ms_without_ahead" not in e for e in report.values())
    assert all("AHEAD" not in cfg for cfg in behind.table.chosen.values())
    assert plan.table.config(("qkv_rope", 64)) == {**QKV_ROPE[1], "AHEAD": False}  # each plan its own table


def _two_keys(plan):
    """A step of two one-row keys, a and b, and its time: a's best candidate is 2 once b runs its own best (3);
    while b runs its fallback (no config), a's candidate 0 looks best."""
    from specpilot.kernels.tuning.candidates import GEMV, STAGED

    cands = GEMV + STAGED  # the candidates of a flagless gemv key
    keys = [("gemv", "a"), ("gemv", "b")]

    def step():
        for key in keys:
            plan.table.config(key)

    def measure(_):  # loads ahead change nothing here: the tuning keeps the first only
        a, b = ({k: v for k, v in c.items() if k != "AHEAD"} if c else c for c in map(plan.table.config, keys))
        if b is None:
            return 10.0 + (0.0 if cands.index(a) == 0 else 1.0)
        return abs(cands.index(a) - 2) + abs(cands.index(b) - 3)

    return cands, keys, step, measure


def test_later_tuning_rounds_retime_each_key_beside_the_others_choices():
    """The first round tunes key a while b runs its fallback, where a's candidate 0 looks best; with b
    at its choice a's candidate 2 is faster, which the second round finds."""
    from specpilot.kernels.tuning.descent import tune_step

    plan = KernelPlan.stock(tune_rounds=1)
    cands, keys, step, measure = _two_keys(plan)
    first = tune_step(step, measure, plan)
    assert first[repr(keys[0])]["config"] == cands[0]
    plan = KernelPlan.stock()  # two rounds, the default
    assert plan.tune_rounds == 2
    cands, keys, step, measure = _two_keys(plan)
    report = tune_step(step, measure, plan)
    assert [plan.table.config(k) for k in keys] == [cands[2], cands[3]]
    assert min(report[repr(keys[0])]["ms_first_round"]) == 10.0 and min(report[repr(keys[0])]["ms"]) == 0.0


def test_tuning_begins_from_the_start_table_where_its_configs_are_candidates():
    """With b begun at its best candidate, one round finds a's best (2), where from b's fallback it
    keeps candidate 0; a start config that is no candidate (or whose option is off) is skipped."""
    from specpilot.kernels.tuning import descent

    plan = KernelPlan.stock(tune_rounds=1)
    cands, keys, step, measure = _two_keys(plan)
    report = descent.tune_step(step, measure, plan, start={keys[1]: cands[3], ("gemv", "unseen"): cands[5]})
    assert [plan.table.config(k) for k in keys] == [cands[2], cands[3]]
    assert report[repr(keys[1])]["start"] == cands[3] and "start" not in report[repr(keys[0])]
    assert ("gemv", "unseen") not in plan.table.chosen  # a key the step does not launch is not chosen
    ring = next(c for c in cands if "STAGE" in c)
    assert descent._startable(keys[1], ring, plan) and descent._startable(keys[1], {**cands[3], "AHEAD": False}, plan)
    for bad in ({**cands[3], "BLOCK_N": 999}, ring):
        plan = KernelPlan.stock(tune_rounds=1, staged=False)  # the ring's configs are then no candidates
        assert not descent._startable(keys[1], bad, plan)
        cands, keys, step, measure = _two_keys(plan)
        report = descent.tune_step(step, measure, plan, start={keys[1]: bad})
        assert plan.table.config(keys[0]) == cands[0] and "start" not in report[repr(keys[1])]


def test_the_h200_start_table_holds_candidates_only(monkeypatch):
    from specpilot.kernels.tuning import candidates, descent, starts

    monkeypatch.setattr(candidates, "_cluster_runs", lambda: True)  # as on a GPU with cuda-bindings
    plan = KernelPlan.stock()
    table = starts.start_for("NVIDIA H200")
    assert table == starts.H200_8B and table is not starts.H200_8B  # a copy: the descent may not change it
    assert len(table) == 6 and all(descent._startable(k, c, plan) for k, c in table.items())
    assert starts.start_for("NVIDIA A100-SXM4-80GB") == {}
    attention = [k for k in table if k[0] == "attention"]
    assert attention and not descent._startable(attention[0], table[attention[0]], plan.but(cluster=False))
    monkeypatch.setattr(candidates, "_cluster_runs", lambda: False)  # no cluster kernel: its start is skipped
    assert not descent._startable(attention[0], starts.H200_8B[attention[0]], plan)


@pytest.mark.parametrize("tune_start", [True, False])
def test_the_engine_begins_the_tuning_from_the_start_table_unless_the_plan_says_not(monkeypatch, tune_start):
    """Engine._tune_gemv hands the descent this GPU's start table, or none with tune_start=false (the
    descent faked: this checks only what it is given)."""
    from specpilot.config import parse_system
    from specpilot.fixtures.random_models import random_target, tiny_target_config
    from specpilot.kernels.tuning import descent, starts
    from specpilot.runtime.engine import Engine

    given = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(descent, "tune_step", lambda step, measure, plan, start=None: given.append(start) or {})
    target = random_target(tiny_target_config(), seed=3)
    system = parse_system("ar:gemv=true" + ("" if tune_start else ",tune_start=false"))
    Engine(target, None, system, context=64)._tune_gemv()
    assert given == [starts.H200_8B if tune_start else {}]


_BAD = {"kernels": "cuda", "pdl": "yes", "l2": "everything", "tune_rounds": 5, "attn_ablate": "all", "weights": "w8",
        "w12_dense": "free", "fp8_dense": "free", "hybrid_tree": "sometimes"}


@pytest.mark.parametrize("name", [o.name for o in __import__("specpilot.config.options",
                                                              fromlist=["plan_options"]).plan_options()])
def test_plan_options_refuse_invalid_values(name):
    """Every kernel-plan option refuses a value it does not take: a system string (UserError) for all of them,
    KernelPlan.stock (ValueError, via config.options.check) for those with choices or a range."""
    from specpilot.config import OPTIONS, parse_system
    from specpilot.errors import UserError

    kind = OPTIONS[name].kind
    raw = "maybe" if kind is bool else str(_BAD[name])
    with pytest.raises(UserError, match=name):
        parse_system(f"ar:{name}={raw}", diagnostics=True)
    if kind is not bool:
        with pytest.raises(ValueError, match=name):
            KernelPlan.stock(**{name: _BAD[name]})
    with pytest.raises(ValueError, match="not kernel-plan options"):
        KernelPlan.stock(**{name + "_typo": 1})
