"""Every Triton kernel the decode step can launch compiles for the H200 (sm_90), here, without a GPU.

Triton's NVIDIA backend and its bundled ptxas build cubins offline, so a kernel that would not build
on the GPU (a type error in a branch the CPU interpreter runs differently, an unsupported atomic or
cache modifier) fails here instead of costing a device run. With USE_GDC the PTX must hold the
programmatic-dependent-launch wait.
"""

import os
import re
import subprocess
import sys
import tempfile

import pytest

triton = pytest.importorskip("triton")
# Other test modules switch Triton's CPU interpreter on (no GPU here), and kernels decorated under it
# cannot be compiled: then the only test of this module reruns the module in a process without it.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # pragma: no cover - older or CPU-only Triton builds
    pytest.skip("this Triton cannot compile offline", allow_module_level=True)

HOPPER = GPUTarget("cuda", 90, 32)


@pytest.mark.slow
@pytest.mark.skipif(not INTERPRETED, reason="the tests below run in this process")
def test_kernels_build_for_hopper_in_a_process_without_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    if " passed" not in proc.stdout:
        pytest.skip("this Triton install cannot build offline: " + proc.stdout.strip().splitlines()[-1])


def hopper(test):
    return pytest.mark.skipif(INTERPRETED, reason="run in a process without the interpreter")(test)
P = "*bf16"
STREAM_TYPES = {**{n: P for n in ("x_ptr", "nw_ptr", "w_ptr", "b_ptr", "r_ptr", "y_ptr", "g_ptr", "xg_ptr")},
                "N": "i32", "K": "i32", "eps": "fp32", "sq_ptr": "*fp32",
                "parts_ptr": "*fp32", "n_parts": "i32"}  # the one-row GEMV's (gemv/triton._stream_kernel) arguments
QKV_TYPES = {**{n: P for n in ("x_ptr", "nw_ptr", "w_ptr", "b_ptr", "q_out", "k_cache", "v_cache")},
             "pos_ptr": "*i64", "slot_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "K": "i32", "L": "i32",
             "eps": "fp32", "parts_ptr": "*fp32", "n_parts": "i32"}  # qkv_rope's
_ATTN_INTS = ("sq_b", "sq_t", "sq_h", "sq_d", "sk_b", "sk_h", "sk_l", "sv_b", "sv_h", "sv_l", "so_b", "so_t", "so_h",
              "tree_sb", "T", "L", "window", "row_tiles")
ATTN_TYPES = {"q_ptr": P, "k_ptr": P, "v_ptr": P, "cache_len_ptr": "*i64", "start_ptr": "*i64", "tree_ptr": "*u8",
              "out_ptr": P, "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32",
              "count_ptr": "*i32", **dict.fromkeys(_ATTN_INTS, "i32"),
              "qk_scale": "fp32"}  # the decode attention's


# GLUON_KEY: Triton 3.6's compile cache keys an ASTSource by its constexprs' values alone, in argument order,
# not by their names, so two builds that name different flags (AHEAD=True vs EPI_EARLY=True, the rest equal)
# share a key and the second gets the first's binary. build() names every flag (the defaults included).


def build(fn, types: dict, constexprs: dict, divisible: tuple = (), **options) -> str:
    """Compile fn for sm_90; pointer arguments, and the integer ones named in `divisible`, get Triton's
    divisibility-by-16 hint (a launch gives it to every integer argument that is a multiple of 16)."""
    names = fn.arg_names
    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
    sig = {n: types.get(n, "constexpr") for n in names}
    assert set(types) | set(constexprs) == set(names), set(names) ^ (set(types) | set(constexprs))
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if types.get(n, "").startswith("*") or n in divisible}
    try:
        kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs), target=HOPPER,
                                options=options)
    except RuntimeError as exc:
        if "ptxas" in str(exc).lower() and "not found" in str(exc).lower():
            pytest.skip("no ptxas in this Triton install")
        raise
    return kernel.asm["ptx"]


def registers(ptx: str) -> tuple[int, int]:
    """(registers a thread, spill-store bytes) ptxas reports for the kernel in ptx (Triton targets sm_90a)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return int(regs.group(1)), int(spills.group(1))


def _candidates(kind: str) -> list[dict]:
    """The candidates the Triton kernels take (the staged ones, tuning/candidates.STAGED, go to gemv/staged.py)."""
    from specpilot.kernels.tuning.candidates import GEMV, QKV_ROPE

    return {"gemv": GEMV, "qkv_rope": QKV_ROPE}[kind]


def _deep(kind: str) -> list[dict]:
    return [c for c in _candidates(kind) if c["PRE"] > 1]


@hopper
@pytest.mark.parametrize("gate_up", [False, True])
@pytest.mark.parametrize("config", _deep("gemv"), ids=str)
def test_weight_tiles_before_the_wait_do_not_spill(config, gate_up):
    """PRE weight tiles held across the PDL wait cost registers: every step-tuning candidate that uses
    them builds without spills, and a plain projection (the output projection after the attention, the
    one they are for) keeps two or more blocks an SM (<= 128 registers a thread at 8 warps)."""
    from specpilot.kernels.gemv.triton import _stream_kernel

    flags = dict(HAS_NORM=gate_up, GATE_UP=gate_up, HAS_RES=not gate_up, HAS_BIAS=False)
    ptx = build(_stream_kernel, STREAM_TYPES, dict(**flags, USE_GDC=True, BLOCK_N=config["BLOCK_N"],
                                                   BLOCK_K=config["BLOCK_K"], EVEN_N=True, EVEN_K=True,
                                                   PRE=config["PRE"], AHEAD=True),
                num_warps=config["num_warps"], num_stages=config["num_stages"])
    regs, spills = registers(ptx)
    assert spills == 0, (regs, spills)
    assert gate_up or regs <= 128 * 8 // config["num_warps"], regs


@hopper
@pytest.mark.parametrize("config", _deep("qkv_rope"), ids=str)
def test_qkv_rope_tiles_before_the_wait_do_not_spill(config):
    """As the layers after the first run it: the norm handed over (with the in-loop norm and the loads one
    step ahead, (8, 512, 8 warps, PRE 2) takes 167 registers)."""
    from specpilot.kernels.qkv_rope.triton import _qkv_rope_kernel

    ptx = build(_qkv_rope_kernel, QKV_TYPES, dict(HQ=32, HKV=8, HALF=64, PAIRS=config["PAIRS"], HAS_NORM=False,
                                                  NPARTS=512, HAS_BIAS=False, USE_GDC=True, BLOCK_K=config["BLOCK_K"],
                                                  EVEN_K=True, PRE=config["PRE"], AHEAD=True),
                num_warps=config["num_warps"], num_stages=config["num_stages"])
    regs, spills = registers(ptx)
    assert spills == 0 and regs <= 128 * 8 // config["num_warps"], (regs, spills)


@hopper
@pytest.mark.parametrize("gdc", [False, True])
@pytest.mark.parametrize("fusion", [dict(HAS_NORM=True, GATE_UP=True, HAS_RES=False, HAS_BIAS=False),
                                    dict(HAS_NORM=False, GATE_UP=False, HAS_RES=True, HAS_BIAS=True)])
@pytest.mark.parametrize("even", [True, False])
def test_stream_gemv_builds(gdc, fusion, even):
    from specpilot.kernels.gemv.triton import _stream_kernel

    ptx = build(_stream_kernel, STREAM_TYPES, dict(**fusion, USE_GDC=gdc, BLOCK_N=16, BLOCK_K=512, EVEN_N=even,
                                                   EVEN_K=even, PRE=1), num_warps=8, num_stages=2)
    assert ("griddepcontrol.wait" in ptx) == gdc and ("griddepcontrol.launch_dependents" in ptx) == gdc


def build_staged(constexprs: dict, num_warps: int):
    """gemv/staged.py's Gluon kernel compiled for sm_90 (pointers and K with the divisibility-by-16 hint)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from specpilot.kernels.gemv.staged import _staged_kernel

    types = {**{n: P for n in ("x_ptr", "w_ptr", "r_ptr", "y_ptr", "g_ptr", "xg_ptr")}, "sq_ptr": "*fp32", "K": "i32"}
    names = _staged_kernel.arg_names
    sig = {n: types.get(n, "constexpr") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if types.get(n, "").startswith("*") or n == "K"}
    return triton.compile(GluonASTSource(fn=_staged_kernel, signature=sig, constexprs=constexprs, attrs=attrs),
                          target=HOPPER, options=dict(num_warps=num_warps))


@hopper
def test_embed_kernel_releases_the_next_one_then_waits():
    from specpilot.kernels.embed.triton import BLOCK, _embed_kernel

    ptx = build(_embed_kernel, {"tok_ptr": "*i64", "table_ptr": P, "g_ptr": P, "h_ptr": P, "hg_ptr": P,
                                "sq_ptr": "*fp32", "H": "i32"}, dict(BLOCK=BLOCK, USE_GDC=True), num_warps=4)
    release, wait = ptx.index("griddepcontrol.launch_dependents"), ptx.index("griddepcontrol.wait")
    assert release < wait < ptx.index("ld.global") and registers(ptx)[1] == 0


@hopper
def test_greedy_kernel_builds_waits_and_does_not_spill():
    from specpilot.kernels.greedy.triton import BLOCK, WARPS, _greedy_kernel

    ptx = build(_greedy_kernel, {"logits_ptr": P, "token_ptr": "*i64", "pos_ptr": "*i64", "V": "i32"},
                dict(BLOCK=BLOCK, USE_GDC=True), num_warps=WARPS)
    assert "griddepcontrol.wait" in ptx and registers(ptx)[1] == 0


@hopper
@pytest.mark.parametrize("block", [16, 64])
def test_tree_build_kernel_builds_without_spilling(block):
    """The best-first search keeps its [N, N] ancestor matrix in registers: no spill at the largest N it takes."""
    from specpilot.kernels.tree_build.triton import _best_first_kernel

    types = {"top_s_ptr": "*fp32", "top_c_ptr": "*i64", "tokens_ptr": "*i64", "anchor_ptr": "*i64",
             **dict.fromkeys(("parents_ptr", "depth_ptr", "cand_ptr", "tok_ptr"), "*i64"), "anc_ptr": "*i8",
             "N": "i32"}
    ptx = build(_best_first_kernel, types, dict(D=15, K=16, BLOCK=block), num_warps=4)
    assert registers(ptx)[1] == 0


@hopper
def test_eagle2_kernel_builds_without_spilling():
    from specpilot.kernels.tree_build.triton import _eagle2_kernel

    types = {"top_s_ptr": "*fp32", "top_c_ptr": "*i64", "tokens_ptr": "*i64", "anchor_ptr": "*i64",
             "pool_s_ptr": "*fp32", **dict.fromkeys(("pool_c_ptr", "pool_d_ptr", "pool_p_ptr"), "*i32"),
             **dict.fromkeys(("parents_ptr", "depth_ptr", "cand_ptr", "tok_ptr"), "*i64"), "anc_ptr": "*i8",
             "N": "i32"}
    ptx = build(_eagle2_kernel, types, dict(D=15, K=16, KEEP=4, KPAD=4, POOL=228, BLOCK=64, BLOCK_P=256), num_warps=4)
    assert registers(ptx)[1] == 0


def loop_bodies(ptx: str) -> list[str]:
    """The PTX of each loop: from a label to the backward branch to it."""
    lines = ptx.splitlines()
    labels = {ln.split(":")[0].strip(): i for i, ln in enumerate(lines) if re.match(r"^\$L__BB\d+_\d+:", ln.strip())}
    bodies = []
    for i, ln in enumerate(lines):
        m = re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", ln)
        if m and labels.get(m.group(1), i) < i:
            bodies.append("\n".join(lines[labels[m.group(1)]:i + 1]))
    return bodies


@hopper
@pytest.mark.parametrize("config", _candidates("gemv"), ids=str)
@pytest.mark.parametrize("fusion", ["residual", "norm", "norm_gate_up", "handed_gate_up"])
def test_one_row_loop_has_no_barrier_and_asks_one_step_ahead(config, fusion):
    """x is read as tiles of the weight tile's shape, so the one-row kernel's weight loop holds no barrier
    (x broadcast from a vector put a shared-memory round trip with barriers in every step). Where the
    loads go one step ahead (the default, for tiles ahead_fits) the loop's loads are the next step's
    (predicated on there being one), the first step's are issued after the PDL wait before the first
    barrier (the PRE tile's sum, which waits on x), and the build spills nothing."""
    from specpilot.config.plan import KernelPlan
    from specpilot.kernels.gemv.triton import _stream_kernel, ahead_fits

    flags = dict(HAS_NORM=fusion.startswith("norm"), GATE_UP="gate_up" in fusion, HAS_RES=fusion == "residual",
                 HAS_BIAS=False, NPARTS=512 if fusion.startswith("handed") else 0)
    ahead = ahead_fits(config["BLOCK_N"] * (2 if flags["GATE_UP"] else 1), config, flags["HAS_NORM"],
                       KernelPlan.stock())
    ptx = build(_stream_kernel, STREAM_TYPES, dict(**flags, USE_GDC=True, BLOCK_N=config["BLOCK_N"],
                                                   BLOCK_K=config["BLOCK_K"], EVEN_N=True, EVEN_K=True,
                                                   PRE=config["PRE"], AHEAD=ahead),
                divisible=("N", "K"), num_warps=config["num_warps"], num_stages=config["num_stages"])
    (body,) = loop_bodies(ptx)
    assert "ld.global.v4" in body  # the weight stream itself: 16-byte loads
    assert "bar.sync" not in body
    if ahead:
        assert re.search(r"@%p\d+ ld\.global\.v4", body)
        after_wait = ptx.split("griddepcontrol.wait", 1)[1].split("bar.sync", 1)[0]
        assert re.search(r"@%p\d+ ld\.global\.v4", after_wait)
        assert registers(ptx)[1] == 0


@hopper
@pytest.mark.parametrize("qkv", [False, True])
def test_one_row_kernels_build_without_loads_ahead(qkv):
    """The plan's ahead=False (AHEAD=False) builds the loop that loads each step's tiles in that step."""
    from specpilot.kernels.gemv.triton import _stream_kernel
    from specpilot.kernels.qkv_rope.triton import _qkv_rope_kernel

    if qkv:
        ptx = build(_qkv_rope_kernel, QKV_TYPES, dict(HQ=32, HKV=8, HALF=64, PAIRS=4, HAS_NORM=False, HAS_BIAS=False,
                                                      USE_GDC=True, BLOCK_K=512, EVEN_K=True, PRE=1, NPARTS=512,
                                                      AHEAD=False), num_warps=4, num_stages=2)
    else:
        ptx = build(_stream_kernel, STREAM_TYPES, dict(HAS_NORM=False, GATE_UP=False, HAS_RES=True, HAS_BIAS=False,
                                                       USE_GDC=True, BLOCK_N=16, BLOCK_K=512, EVEN_N=True,
                                                       EVEN_K=True, PRE=1, AHEAD=False),
                    divisible=("N", "K"), num_warps=8, num_stages=2)
    (body,) = loop_bodies(ptx)
    assert "ld.global.v4" in body and not re.search(r"@%p\d+ ld\.global\.v4", body)
    assert registers(ptx)[1] == 0


def opcodes(body: str) -> list[str]:
    """The instructions of a PTX body without operands, labels or debug lines (those number differently
    in otherwise equal code)."""
    ops = []
    for line in body.splitlines():
        words = line.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words and not words[0].startswith(("$", ".", "//", "{", "}")):
            ops.append(words[0])
    return ops


def _loop_and_registers(flags: dict, types: dict, config: dict) -> tuple[str, int, int]:
    from specpilot.kernels.gemv.triton import _stream_kernel

    ptx = build(_stream_kernel, types, dict(**flags, USE_GDC=True, BLOCK_N=config["BLOCK_N"],
                                            BLOCK_K=config["BLOCK_K"], EVEN_N=True, EVEN_K=True, PRE=config["PRE"],
                                            AHEAD=True),
                divisible=("N", "K"), num_warps=config["num_warps"], num_stages=config["num_stages"])
    (body,) = loop_bodies(ptx)
    return (body, *registers(ptx))


@hopper
@pytest.mark.parametrize("config", [c for c in _candidates("gemv") if c["PRE"] == 1], ids=str)
@pytest.mark.parametrize("gate_up", [False, True])
def test_handed_over_norm_leaves_the_plain_weight_loop(config, gate_up):
    """Reading a NormedStream (NPARTS), the normed projection's weight loop is the plain one's (no norm
    weight loaded, no squares, unlike the in-loop norm) and it needs no more registers than the in-loop
    norm (40-50 fewer on most configs). The writer's epilogue (NEXT) leaves its loop as it was."""
    base = dict(GATE_UP=gate_up, HAS_RES=False, HAS_BIAS=False)
    plain, _, _ = _loop_and_registers(dict(**base, HAS_NORM=False), STREAM_TYPES, config)
    in_loop, in_regs, in_spills = _loop_and_registers(dict(**base, HAS_NORM=True), STREAM_TYPES, config)
    handed, regs, spills = _loop_and_registers(dict(**base, HAS_NORM=False, NPARTS=512), STREAM_TYPES, config)
    assert opcodes(handed) == opcodes(plain)
    assert in_loop.count("ld.global") > plain.count("ld.global")
    # (16, 512, 8 warps) with gate/up: ptxas keeps the plain and the handed kernel at 128 registers, and
    # there the sums loaded before the loop and held through it (2 a thread at NPARTS 512) spill, 8 bytes
    assert regs <= in_regs and spills <= max(in_spills, 8), (regs, spills, in_regs, in_spills)
    writer, _, spills = _loop_and_registers(dict(GATE_UP=False, HAS_RES=True, HAS_BIAS=False, HAS_NORM=False,
                                                 NEXT=True), STREAM_TYPES, config)
    residual, _, _ = _loop_and_registers(dict(GATE_UP=False, HAS_RES=True, HAS_BIAS=False, HAS_NORM=False),
                                         STREAM_TYPES, config)
    assert opcodes(writer) == opcodes(residual) and spills == 0


@hopper
@pytest.mark.parametrize("gdc,pairs,handed", [(False, 8, False), (True, 8, False), (True, 4, True)])
def test_qkv_rope_builds(gdc, pairs, handed):
    """handed: the norm's inputs come as a NormedStream (NPARTS sums of squares), no in-loop norm."""
    from specpilot.kernels.qkv_rope.triton import _qkv_rope_kernel

    ptx = build(_qkv_rope_kernel, QKV_TYPES, dict(HQ=32, HKV=8, HALF=64, PAIRS=pairs, HAS_NORM=not handed,
                                                  HAS_BIAS=True, USE_GDC=gdc, BLOCK_K=512, EVEN_K=True,
                                                  PRE=2 if gdc else 1, NPARTS=512 if handed else 0, AHEAD=gdc),
                num_warps=4, num_stages=2)
    assert registers(ptx)[1] == 0
    assert ("griddepcontrol.wait" in ptx) == gdc


@hopper
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("late", [False, True])
def test_split_attention_builds(fuse, causal, late):
    from specpilot.kernels.attention.triton import _split_kernel

    ptx = build(_split_kernel, ATTN_TYPES, dict(HKV=8, G=4, D=128, BLOCK_M=16, BLOCK_N=64, NUM_SPLITS=16, CAUSAL=causal,
                                           HAS_WINDOW=False, PRECISION="tf32", USE_GDC=True, FUSE_COMBINE=fuse,
                                           PRELOAD=fuse and causal, LATE=late),
                num_warps=4, num_stages=3)
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    before_wait = ptx.split("griddepcontrol.wait", 1)[0]
    # LATE: the next kernel is released only after this one's wait (the previous kernel is done)
    assert ("griddepcontrol.launch_dependents" in before_wait) == (not late)
    # PRELOAD (the decode step's): the first block of committed K/V (and cache_len / start) before the wait
    assert (before_wait.count("ld.global") >= 2 * 4) == (fuse and causal), before_wait.count("ld.global")
    if fuse and causal:
        assert registers(ptx)[1] == 0
    assert ("atom" in ptx) == fuse  # the arrival counter only in the fused combine


@hopper
def test_combine_and_rope_build():
    from specpilot.kernels.attention.triton import _combine_kernel
    from specpilot.kernels.rope.triton import _rope_qkv_kernel

    build(_combine_kernel, {"part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32", "out_ptr": P,
                            "so_b": "i32", "so_t": "i32", "so_h": "i32", "T": "i32"},
          dict(HKV=8, G=4, D=128, NUM_SPLITS=16, ROWS=4, BLOCK_D=32, USE_GDC=True), num_warps=4)
    types = {**{n: P for n in ("qkv_ptr", "qn_ptr", "kn_ptr", "q_out", "k_cache", "v_cache")}, "pos_ptr": "*i64",
             "slot_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "eps": "fp32", "T": "i32", "L": "i32"}
    ptx = build(_rope_qkv_kernel, types, dict(HQ=40, HKV=8, HALF=64, HEAD_OFFSET=0, HAS_NORM=True, USE_GDC=True),
                num_warps=1)
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx


@hopper
@pytest.mark.parametrize("config", __import__("specpilot.kernels.tuning.candidates", fromlist=["STAGED"]).STAGED,
                         ids=str)
@pytest.mark.parametrize("next_norm", [False, True])
def test_staged_gemv_copies_its_tiles_before_the_wait(config, next_norm):
    """gemv/staged.py: the ring's STAGE tiles go to shared memory by cp.async before the PDL wait, one copy
    group each; the loop after it waits for a tile, reads it and refills its slot; nothing spills."""
    warps_k = config["BLOCK_K"] // 256
    constexprs = dict(BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], STAGE=config["STAGE"],
                      WARPS_N=config["num_warps"] // warps_k, WARPS_K=warps_k, HAS_RES=True, NEXT=next_norm,
                      USE_GDC=True)
    kernel = build_staged(constexprs, num_warps=config["num_warps"])
    ptx = kernel.asm["ptx"]
    before, after = ptx.split("griddepcontrol.wait", 1)
    assert before.count("cp.async.commit_group") == config["STAGE"] and "ld.global" not in before
    chunks = config["BLOCK_N"] * config["BLOCK_K"] * 2 // 16 // (32 * config["num_warps"])  # 16 B a copy
    assert before.count("cp.async.cg.shared.global") == config["STAGE"] * chunks
    loop = after.split("launch_dependents", 1)[0]
    wait, read, refill = (loop.index(s) for s in (f"cp.async.wait_group \t{config['STAGE'] - 1};",
                                                   "ld.shared", "cp.async.cg.shared.global"))
    assert wait < read < refill and loop.count("cp.async.cg.shared.global") == chunks
    assert kernel.metadata.shared == config["STAGE"] * config["BLOCK_N"] * config["BLOCK_K"] * 2
    assert registers(ptx)[1] == 0


def _hinted(ptx: str, op: str, policy: str) -> tuple[int, int]:
    """(op instructions carrying the L2 `policy` hint, op instructions in all) in ptx."""
    lines = [line for line in ptx.splitlines() if op in line]
    return sum(f"L1::{policy}.L2::cache_hint" in line for line in lines), len(lines)


@hopper
@pytest.mark.parametrize("kernel", ["stream", "qkv_rope", "attention"])
def test_l2_hints_mark_the_weights_and_the_kv_cache(kernel):
    """The plan's l2 (kernels/gemv.weight_eviction, kv_eviction): with weights_kv the weight loads carry an
    evict-first L2 hint (x's do not), q/k/v's K/V cache writes and the attention's preloaded K/V block an
    evict-last one; nothing is hinted with l2=off, and the hints cost at most the registers of their policy
    descriptors."""
    from specpilot.config.plan import KernelPlan
    from specpilot.kernels.attention.triton import _split_kernel
    from specpilot.kernels.gemv import kv_eviction, weight_eviction
    from specpilot.kernels.gemv.triton import _stream_kernel
    from specpilot.kernels.qkv_rope.triton import _qkv_rope_kernel

    builds = {}
    for on in (False, True):
        plan = KernelPlan.stock(l2="weights_kv" if on else "off")
        evict, kv_evict = weight_eviction(plan), kv_eviction(plan)
        assert (evict, kv_evict) == (("evict_first", "evict_last") if on else ("", ""))
        if kernel == "stream":
            builds[on] = build(_stream_kernel, STREAM_TYPES, dict(
                HAS_NORM=False, GATE_UP=True, HAS_RES=False, HAS_BIAS=False, USE_GDC=True, BLOCK_N=8, BLOCK_K=256,
                EVEN_N=True, EVEN_K=True, PRE=1, AHEAD=True, NPARTS=128, EVICT=evict), divisible=("N", "K"),
                num_warps=4, num_stages=4)
        elif kernel == "qkv_rope":
            builds[on] = build(_qkv_rope_kernel, QKV_TYPES, dict(
                HQ=32, HKV=8, HALF=64, PAIRS=8, HAS_NORM=False, HAS_BIAS=False, USE_GDC=True, BLOCK_K=512,
                EVEN_K=True, PRE=1, NPARTS=512, AHEAD=True, EVICT=evict, KV_EVICT=kv_evict),
                divisible=("K", "L"), num_warps=4, num_stages=2)
        else:
            builds[on] = build(_split_kernel, ATTN_TYPES, dict(
                HKV=8, G=4, D=128, BLOCK_M=16, BLOCK_N=64, NUM_SPLITS=8, CAUSAL=True, HAS_WINDOW=False,
                PRECISION="tf32", USE_GDC=True, FUSE_COMBINE=True, PRELOAD=True, LATE=True,
                KV_EVICT=kv_evict), divisible=("sk_l", "sv_l"), num_warps=4, num_stages=3)
    off, on = builds[False], builds[True]
    (regs_on, spills_on), (regs_off, spills_off) = registers(on), registers(off)
    assert "cache_hint" not in off and regs_on <= regs_off + 2 and spills_on == spills_off == 0
    if kernel == "attention":
        hinted, loads = _hinted(on, "ld.global", "evict_last")
        assert hinted >= 2 * 4 and hinted < loads  # both preloaded K/V tiles; not q, cache_len or the partials
        return
    hinted, loads = _hinted(on, "ld.global", "evict_first")
    assert 0 < hinted < loads  # the weight tiles, not x or the sums of squares
    if kernel == "qkv_rope":
        kv, stores = _hinted(on, "st.global", "evict_last")
        assert kv == 4 and stores > kv  # the K and V halves, not q


def _loads_before_the_loop(ptx: str) -> int:
    """ld.global instructions before the first loop's label (the weight loop: the kernels here have one)."""
    return ptx.split(loop_bodies(ptx)[0].splitlines()[0], 1)[0].count("ld.global")


@hopper
@pytest.mark.parametrize("kernel,warps", [("stream", 8), ("stream", 4), ("qkv_rope", 4), ("qkv_rope", 8)])
def test_early_epilogue_inputs_are_requested_before_the_weight_loop(kernel, warps):
    """EPI_EARLY (the plan's epilogue_early): the residual and the next norm's weight (the output and down
    projections), q/k/v + rope's cos / sin, are loaded before the weight loop, no load is added or dropped,
    and the build spills nothing at 4 or 8 warps."""
    from specpilot.kernels.gemv.triton import _stream_kernel
    from specpilot.kernels.qkv_rope.triton import _qkv_rope_kernel

    builds = {}
    for on in (False, True):
        if kernel == "stream":
            builds[on] = build(_stream_kernel, STREAM_TYPES, dict(
                HAS_NORM=False, GATE_UP=False, HAS_RES=True, HAS_BIAS=False, USE_GDC=True, BLOCK_N=16, BLOCK_K=512,
                EVEN_N=True, EVEN_K=True, PRE=1, AHEAD=True, NPARTS=0, NEXT=True,
                EVICT="evict_first", EPI_EARLY=on), divisible=("N", "K"), num_warps=warps, num_stages=2)
        else:
            builds[on] = build(_qkv_rope_kernel, QKV_TYPES, dict(
                HQ=32, HKV=8, HALF=64, PAIRS=8, HAS_NORM=False, HAS_BIAS=False, USE_GDC=True, BLOCK_K=512,
                EVEN_K=True, PRE=1, NPARTS=512, AHEAD=True, EVICT="evict_first",
                KV_EVICT="", EPI_EARLY=on), divisible=("K", "L"), num_warps=warps, num_stages=2)
    off, on = builds[False], builds[True]
    assert on.count("ld.global") == off.count("ld.global")
    # residual and g: a 16-row block's two 16-element vectors; cos and sin: 8 pairs' worth, per thread
    assert _loads_before_the_loop(on) >= _loads_before_the_loop(off) + 2
    assert registers(on)[1] == 0
