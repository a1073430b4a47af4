"""The loop's search space: the engine's typed configuration (config/options.py), nothing beside it.

Each option the loop may set has a finite set of values to try from a system: the other choices of an enum, the
other value of a bool, a grid of an int. Left out, with the reason: options that change outputs on purpose
(audit, diagnostic), the controller's test pad, on a CPU the options that do nothing there (CUDA_ONLY: every
value runs the same code) and the values that only run under the Triton interpreter, and on a model without BF16
weights the values that need them (NEEDS_BF16: the engine refuses them there). weights=fp8 is never a move
(NOT_MOVES): it changes the target function itself (weights/fp8.py), which the loop's judges hold every candidate
to; a system that starts from it keeps it.
"""

from __future__ import annotations

from specpilot.config import System
from specpilot.config.options import OPTIONS
from specpilot.config.system import with_options

EXCLUDED = {"pad_us": "a deliberate slowdown for testing the controller",
            "tree_accept": "measured by replay, not searched",
            "w12_dense": "trades prefill time for memory, and frees copies the reference beside it reads",
            "fp8_dense": "a memory choice that frees copies the reference beside it reads",
            "tune_store": "changes how long a warm-up takes, not what the step runs"}
EXCLUDED_GROUPS = {"audit": "changes outputs on purpose", "diagnostic": "outputs are wrong by design"}
# options that do nothing on a CPU, why: every value runs the same code there (read from the engine and kernels)
_TRITON = "a Triton kernel's choice: on a CPU kernels=auto runs the PyTorch references (kernels/dispatch.use_triton)"
CUDA_ONLY = {
    "graphs": "CUDA graphs: a CPU runs each step eagerly (Engine.use_graphs)",
    "lookahead": "steps enqueued ahead of the host's read: with CUDA graphs only",
    "pdl": "programmatic dependent launch: CUDA only (kernels/dispatch.pdl_on)",
    **dict.fromkeys(("ahead", "epilogue_early", "l2", "handoff", "embed_kernel", "greedy_kernel", "gemv"), _TRITON),
    **dict.fromkeys(("staged", "attn_late", "cluster", "tune_rounds", "tune_start"),
                    "the gemv step tuning: with CUDA graphs only (Engine's tuning)"),
    "kernels": "auto and naive both run the PyTorch references on a CPU (triton there: its interpreter, minutes "
               "a step)",
    **dict.fromkeys(("weights", "fewrow"), "the few-row kernel: a CPU's products read the dense weights, which the "
                                           "W12 forms were checked to hold (weights/dense.py); weights=fp8 is no "
                                           "move anywhere (NOT_MOVES)"),
}
# values that read the projections' W12 forms, which only BF16 weights get (w12/attach.py): on a model served in
# another dtype (the CPU's float32) the engine refuses them, as they would silently run the exact weights
NEEDS_BF16 = {("weights", "w12"): "W12 forms hold BF16 weights", ("verify", "tlv"): "its 8-bit pass reads the "
              "W12 forms' 8-bit view, which BF16 weights get"}
# values that change the target function rather than how it is computed: a deployment's choice, not a search move
# (the judges hold a candidate to the reference's target; an FP8 candidate would be judged lossy against BF16 within
# the statistical tolerance, not lossless against the FP8 target it is)
NOT_MOVES = {("weights", "fp8"): "the FP8 model is another target function (weights/fp8.py): a deployment's choice, "
             "judged against AR with weights=fp8, not a move from a BF16 system"}
# options of the few-row GEMV step and its step tuning: with gemv off (cuBLAS) every value runs the same code
GEMV_ONLY = {"pdl", "handoff", "ahead", "epilogue_early", "l2", "embed_kernel", "staged", "attn_late", "cluster",
             "tune_rounds", "tune_start"}
# int grids: node budgets and block sizes cover the range the cost model can predict; the rest their range
GRIDS = {"nodes": (4, 8, 12, 16, 24, 32, 48, 64), "block_size": (2, 3, 4, 6, 8, 12, 16), "tree_k": (2, 4, 8),
         "lookahead": (1, 2, 3, 4), "tune_rounds": (1, 2, 3, 4)}
# with several requests in flight (loop/agent.batch_moves): a shared budget of rows is this many a request on
# average (the paper's 192 nodes for its batch), over best_first trees of these budgets where the start has none
BATCH_SHARES = (2, 4, 8, 12)
SHARED_NODES = (16, 32)


def searchable(name: str) -> str | None:
    """None if the loop may set the option, else why not."""
    opt = OPTIONS[name]
    return EXCLUDED.get(name) or EXCLUDED_GROUPS.get(opt.group)


def unsearched(name: str, value, device: str = "cpu", dtype: str | None = None) -> str | None:
    """None if the loop may try name=value on this device with weights of this dtype (None: the device's default,
    as a deployment's dtype = auto), else why not."""
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    if searchable(name):
        return searchable(name)
    if device == "cpu" and name in CUDA_ONLY:
        return f"no effect on a CPU ({CUDA_ONLY[name]})"
    if (name, value) in NOT_MOVES:
        return NOT_MOVES[name, value]
    if (name, value) in NEEDS_BF16 and dtype != "bfloat16":
        return f"{name}={value} needs BF16 weights ({NEEDS_BF16[name, value]}); this model's are {dtype}"
    return None


def values(name: str, system: System, device: str = "cpu", block: int | None = None,
           dtype: str | None = None) -> list:
    """The values to try for one option from `system` (its current value left out); dtype: the served weights'
    (None: the device's default)."""
    opt = OPTIONS[name]
    if system.base not in opt.bases or unsearched(name, None, device, dtype):
        return []
    if name in GEMV_ONLY and not system.get("gemv"):
        return []  # nothing of it runs without the GEMV step
    if name == "tree_k" and system.get("tree") != "eagle2":
        return []  # only eagle2 reads it
    if name == "weights" and system.get("weights") == "fp8":
        return []  # the FP8 target is the system's function: moving off it changes the target (NOT_MOVES)
    if name == "hybrid_tree" and system.get("tree") == "chain":
        return []  # only a tree's Gated DeltaNet rows read it (a chain keeps its snapshots)
    current = system.get(name)
    if opt.kind is bool:
        out = [not current]
    elif opt.choices:
        out = [c for c in opt.choices if c != current and not unsearched(name, c, device, dtype)]
    elif opt.kind is int:
        grid = GRIDS.get(name, ())
        out = [v for v in grid if (opt.minimum is None or v >= opt.minimum)
               and (opt.maximum is None or v <= opt.maximum) and v != current]
        if name == "block_size" and block is not None:
            out = [v for v in out if v < block]  # a smaller draft block; the drafter's own is the default
        if name == "nodes" and system.get("tree") == "chain" and block is not None:
            out = [v for v in out if v < (system.get("block_size") or block)]  # a chain verifies its block at most
    else:
        out = []
    return out


def runs_as_named(system: System, block: int, width: int = 0) -> bool:
    """Whether the engine takes the system as it is named: a tree holds the rows its builder can place on the
    lattice (depth: the block, the drafter's `block` or its own block_size, less the anchor; width: the drafter's
    candidates per position, 0 when not known: only a chain's limit is checked), and eagle2 keeps at most `width`
    per depth; the engine refuses the rest."""
    from specpilot.speculative.tree import max_nodes  # torch: only once a loop runs

    tree, nodes, own = system.get("tree"), system.get("nodes"), system.get("block_size") or block
    if tree == "chain" or not width:
        return tree != "chain" or nodes <= own
    k = system.get("tree_k")
    return not (tree == "eagle2" and k > width) and (nodes or own) <= max_nodes(tree, own - 1, width, k)


def variant(system: System, **changes) -> System:
    """`system` with options set (a value equal to the default drops the option, as the parser does)."""
    text = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items())
    return with_options(system, text) if text else system
