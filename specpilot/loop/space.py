"""The loop's search space: the engine's typed configuration (config/options.py), nothing beside it.

Each option the loop may set has a finite set of values to try from a system: the other choices of an enum, the
other value of a bool, a grid of an int. Left out, with the reason: options that change outputs on purpose
(audit, diagnostic), the controller's test pad, and on a CPU the options that only act on CUDA (graphs, the
GPU step tuning, launch hints) and the values that only run under the Triton interpreter.
"""

from __future__ import annotations

from specpilot.config import System
from specpilot.config.options import OPTIONS
from specpilot.config.system import with_options

EXCLUDED = {"pad_us": "a deliberate slowdown for testing the controller",
            "tree_accept": "measured by replay, not searched",
            "w12_dense": "trades prefill time for memory, and frees copies the reference beside it reads"}
EXCLUDED_GROUPS = {"audit": "changes outputs on purpose", "diagnostic": "outputs are wrong by design"}
# options that act on CUDA kernels, graphs or the GPU step tuning only: on a CPU every value runs the same code
# (weights=w12 and fewrow: the CPU reads the BF16 weights the W12 forms were checked against)
CUDA_ONLY = {"graphs", "lookahead", "pdl", "ahead", "epilogue_early", "l2", "staged", "attn_late", "cluster",
             "tune_rounds", "tune_start", "weights", "fewrow"}
# options of the few-row GEMV step and its step tuning: with gemv off (cuBLAS) every value runs the same code
GEMV_ONLY = {"pdl", "handoff", "ahead", "epilogue_early", "l2", "embed_kernel", "staged", "attn_late", "cluster",
             "tune_rounds", "tune_start"}
# int grids: node budgets and block sizes cover the range the cost model can predict; the rest their range
GRIDS = {"nodes": (4, 8, 12, 16, 24, 32, 48, 64), "block_size": (2, 3, 4, 6, 8, 12, 16), "tree_k": (2, 4, 8),
         "lookahead": (1, 2, 3, 4), "tune_rounds": (1, 2, 3, 4)}


def searchable(name: str) -> str | None:
    """None if the loop may set the option, else why not."""
    opt = OPTIONS[name]
    return EXCLUDED.get(name) or EXCLUDED_GROUPS.get(opt.group)


def values(name: str, system: System, device: str = "cpu", block: int | None = None) -> list:
    """The values to try for one option from `system` (its current value left out)."""
    opt = OPTIONS[name]
    if searchable(name) or system.base not in opt.bases or (device == "cpu" and name in CUDA_ONLY):
        return []
    if name in GEMV_ONLY and not system.get("gemv"):
        return []  # nothing of it runs without the GEMV step
    if name == "tree_k" and system.get("tree") != "eagle2":
        return []  # only eagle2 reads it
    current = system.get(name)
    if opt.kind is bool:
        out = [not current]
    elif opt.choices:
        out = [c for c in opt.choices if c != current]
        if name == "kernels" and device == "cpu":
            out = [c for c in out if c != "triton"]  # the Triton interpreter: correct, and minutes per step
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
