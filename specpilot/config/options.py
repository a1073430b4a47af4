"""The option registry: every knob a user or the loop may set, with its type, range and default.

Each default reproduces stock (the drafter's released behaviour, run on cuBLAS); a mechanism is added as
an option here and nowhere else. Groups say where an option acts:
  engine      the generation loop (graphs, draft block, host lookahead, the controller's idle pad);
  kernel      which kernel runs and how (the kernel plan, handed to every kernel entry point);
  tuning      what the `gemv` step tuning times (part of the kernel plan);
  audit       deliberately lossy variants, for auditing token forcing;
  diagnostic  timing-only variants whose outputs are wrong: refused by generate, bench, force and compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BASES = ("ar", "stock")
GROUPS = ("engine", "kernel", "tuning", "audit", "diagnostic")
PLAN_GROUPS = ("kernel", "tuning", "diagnostic")  # the options a KernelPlan holds
ATTENTION_ABLATIONS = ("none", "relaxed", "no_merge", "no_partials", "no_kv")
FAULTS = ("none", "logit_bias", "low_head", "skip_layer", "topk_truncate", "norm_eps", "unverified_accept",
          "near_tie", "kv_low", "rare_unverified", "vocab_hole")  # runtime/faults.py implements each


# The acceptance by rank used when `tree_accept` is empty: the real pair's (SmolLM2 + its committed drafter, 60
# dev turns, bench/results/2026-12-03_trees_pair_replay_bf18272_h200.json), first eight ranks. `specpilot replay`
# measures it for any deployment.
DEFAULT_ACCEPT = (0.454, 0.105, 0.048, 0.027, 0.020, 0.017, 0.011, 0.009)


def parse_accept(text: str) -> tuple[float, ...]:
    """`0.6/0.1/0.05` -> (0.6, 0.1, 0.05); empty -> DEFAULT_ACCEPT. ValueError says what is wrong."""
    if not text.strip():
        return DEFAULT_ACCEPT
    try:
        p = tuple(float(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"tree_accept takes probabilities separated by '/', got {text!r}") from None
    if not p or any(not math.isfinite(x) or x < 0 or x > 1 for x in p) or sum(p) > 1 + 1e-6:
        raise ValueError(f"tree_accept must be probabilities in [0, 1] summing to at most 1, got {text!r}")
    return p


@dataclass(frozen=True)
class Option:
    name: str
    kind: type
    default: Any
    help: str
    group: str
    bases: tuple[str, ...] = BASES
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    form: Callable[[Any], Any] | None = None  # a value's own syntax (ValueError says what is wrong)

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.kind.__name__, "default": self.default, "group": self.group,
                "bases": list(self.bases), "choices": list(self.choices) if self.choices else None,
                "minimum": self.minimum, "maximum": self.maximum, "help": self.help}


def _options(*opts: Option) -> dict[str, Option]:
    return {o.name: o for o in opts}


OPTIONS: dict[str, Option] = _options(
    # engine
    Option("graphs", bool, True, "capture decode/verify steps as CUDA graphs (no effect on the CPU)", "engine"),
    Option("block_size", int, 0, "draft block size: 0 = the drafter's own, else 2..its own", "engine",
           bases=("stock",), minimum=0),
    Option("tree", str, "chain", "draft tree builder over the lattice: chain (stock: the drafter's greedy walk; an "
           "EAGLE-3 drafter's stock, nodes=0, is its release's tree: eagle2, 10 a depth, 60 nodes), "
           "ddtree (best paths by marginal log-probs), best_first (best paths by conditional edge scores), "
           "eagle2 (top tree_k per depth, global rerank), sequoia (static shape from tree_accept)", "engine",
           bases=("stock",), choices=("chain", "ddtree", "best_first", "eagle2", "sequoia")),
    Option("nodes", int, 0, "rows verified per step, the anchor included: 0 = the block size; a tree may hold "
           "more than the block (a chain no more)", "engine", bases=("stock",), minimum=0, maximum=512),
    Option("batch_rows", str, "fixed", "with several requests in flight: fixed (stock: every step verifies the "
           "system's rows) or auto (each step verifies, for every request alike, the anchor alone without drafting, "
           "a shorter chain of 4 or 8 rows (chain systems), a budget of 2, 4 or 8 rows a request shared by the "
           "likeliest nodes of all the requests' trees (best_first, ddtree), or the system's rows: whichever the step "
           "costs measured at start-up and the requests' recent acceptance say commits the most tokens a second; the "
           "tokens are the same either way)", "engine", bases=("stock",), choices=("fixed", "auto")),
    Option("batch_budget", int, 0, "with several requests in flight: the rows a step verifies in all (0: each "
           "request its own `nodes`): every request's root, then the likeliest nodes of all the requests' trees "
           "(tree=best_first or ddtree) or chains (stock's chain: each request's draft block its own, chosen each "
           "step from the drafter's confidence); at most the batch's requests x nodes", "engine", bases=("stock",),
           minimum=0, maximum=4096),
    Option("admit", bool, False, "with several requests in flight: a waiting request's prompt rides in the "
           "batch's verify pass, a chunk of the step's rows a request each step, instead of prefill passes of its "
           "own (stock: prefill passes); a step carrying chunks verifies every row (no batch_budget; the full step "
           "under batch_rows=auto; on a hybrid target a chunk is a block at most); not with verify=tlv", "engine",
           bases=("stock",)),
    Option("tree_k", int, 4, "eagle2: nodes kept per depth and children each expands (at most the drafter's "
           "candidates per position)", "engine", bases=("stock",),
           minimum=1, maximum=64),
    Option("tree_accept", str, "", "sequoia: acceptance by child rank, p0/p1/... (specpilot replay measures it); "
           "empty = the default profile (config/options.py)", "engine", bases=("stock",), form=parse_accept),
    Option("verify", str, "exact", "exact: one target pass verifies each draft; tlv (two-level): a pass over "
           "W12's 8-bit view (made at load) picks the first draft's likely path, the drafter drafts a second "
           "round from its end, one exact pass (BF16 or weights=w12) verifies both as one tree (the 8-bit pass "
           "accepts nothing)",
           "engine", bases=("stock",), choices=("exact", "tlv")),
    Option("lookahead", int, 1, "steps the host enqueues ahead of the one whose tokens it reads (CUDA graphs)",
           "engine", minimum=1, maximum=4),
    Option("pad_us", float, 0.0, "an idle kernel of this many microseconds in every decode step: a known, "
           "lossless slowdown for testing the controller", "engine", minimum=0, maximum=100_000),
    # kernel
    Option("gemv", bool, False, "few-row target projections through the Triton weight-streaming GEMV with the "
           "norm, SwiGLU, residual, rope and K/V write fused in, and its step tuning (default: cuBLAS)", "kernel"),
    Option("kernels", str, "auto", "auto: Triton on CUDA, the PyTorch references elsewhere; naive: always the "
           "references; triton: always Triton (the CPU needs TRITON_INTERPRET=1)", "kernel",
           choices=("auto", "naive", "triton")),
    Option("pdl", str, "auto", "programmatic dependent launch (Hopper): auto = in the one-row gemv step only",
           "kernel", choices=("auto", "on", "off")),
    Option("handoff", bool, True, "a one-row GEMV that writes the residual stream hands the next norm its "
           "inputs (h * g and the sums of squares)", "kernel"),
    Option("ahead", bool, True, "one-row kernels request each loop step's tiles one step ahead", "kernel"),
    Option("epilogue_early", bool, True, "one-row kernels request their epilogue's inputs before the weight loop",
           "kernel"),
    Option("l2", str, "weights", "L2 hints of the one-row step: off; weights (stream evict-first); weights_kv "
           "(also the K/V cache evict-last)", "kernel", choices=("off", "weights", "weights_kv")),
    Option("embed_kernel", bool, True, "the one-row step's embedding gather hands the first norm its inputs",
           "kernel"),
    Option("greedy_kernel", bool, True, "the AR step's argmax, token and position in one launch", "kernel"),
    Option("weights", str, "bf16", "the target's projection weights: bf16, w12 (lossless 12 bits a weight, "
           "checked bit for bit at load, decoded in registers by the few-row tensor-core kernel for 1..64 rows; "
           "kernels/fewrow), or fp8 (W8A8 E4M3: the layers' weights quantized per output channel at engine build, "
           "activations per token; torch._scaled_mm on sm_90+, an exact reference elsewhere; a different target "
           "function, lossless only against AR with weights=fp8; weights/fp8.py)", "kernel",
           choices=("bf16", "w12", "fp8")),
    Option("w12_dense", str, "keep", "with weights=w12, the target layers' BF16 copies: keep (beside the W12 "
           "forms; prefill and rows past 64 read them), or drop (freed: the memory W12 saves; those products "
           "decode the W12 form per call, so prefill is slower; the LM head keeps its copy)", "kernel",
           choices=("keep", "drop")),
    Option("fp8_dense", str, "keep", "with weights=fp8, the target layers' BF16 copies: keep (beside the FP8 forms, "
           "for other systems on the same target; weights=fp8 reads only the FP8 forms) or drop (freed: the memory "
           "FP8 saves; the system then runs in a process of its own; the LM head and embedding keep theirs)",
           "kernel", choices=("keep", "drop")),
    Option("fewrow", bool, False, "BF16 target projections of 1..64 rows through the few-row tensor-core kernel "
           "(kernels/fewrow; batch-invariant) in place of cuBLAS and the gemv kernels", "kernel"),
    # tuning (what the gemv step tuning offers and how long it searches)
    Option("staged", bool, True, "offer the shared-memory weight rings (gemv/staged.py) to the step tuning",
           "tuning"),
    Option("attn_late", bool, True, "offer the attention's late release of the next kernel to the step tuning",
           "tuning"),
    Option("cluster", bool, True, "offer the thread-block cluster decode attention (Hopper, cuda-bindings)",
           "tuning"),
    Option("hybrid_tree", str, "snapshot", "a hybrid target's Gated DeltaNet layers under a draft tree: snapshot "
           "(stock's chain way: a state per node, the commit picks one) or recompute (the tree in one pass, no state "
           "per node; the commit re-runs the accepted path)", "kernel", bases=("stock",),
           choices=("snapshot", "recompute")),
    Option("tune_rounds", int, 2, "rounds of the step tuning's coordinate descent", "tuning", minimum=1, maximum=4),
    Option("tune_start", bool, True, "begin the step tuning from the measured start table of this GPU, if any",
           "tuning"),
    Option("tune_store", bool, True, "reuse the step tuning's choices kept on disk for this GPU model, kernels code, "
           "plan and shapes (~/.cache/specpilot/tuning), and keep new ones there", "tuning"),
    # audit
    Option("fault", str, "none", "a deliberately lossy variant, for auditing token forcing", "audit",
           choices=FAULTS),
    # diagnostic
    Option("attn_ablate", str, "none", "the one-row attention with a piece of its work left out, to time that "
           "piece (outputs are wrong)", "diagnostic", choices=ATTENTION_ABLATIONS),
)


def plan_options() -> list[Option]:
    return [o for o in OPTIONS.values() if o.group in PLAN_GROUPS]


KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def convert(opt: Option, raw: str) -> Any:
    """A string value (from a system string or an override) as the option's type, checked; ValueError says why."""
    if opt.kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"option {opt.name} takes true or false, got {raw!r}")
    try:
        value = opt.kind(raw)
    except ValueError:
        raise ValueError(f"option {opt.name} takes {KINDS[opt.kind]}, got {raw!r}") from None
    check(opt, value)
    return value


def check(opt: Option, value: Any) -> None:
    """ValueError unless value is of the option's type and within its choices or range."""
    numeric = opt.kind is float and isinstance(value, int) and not isinstance(value, bool)
    if not (numeric or (isinstance(value, opt.kind) and (opt.kind is bool) == isinstance(value, bool))):
        raise ValueError(f"option {opt.name} takes {KINDS[opt.kind]}, got {value!r}")
    if opt.kind is float and not math.isfinite(value):
        raise ValueError(f"option {opt.name} takes a finite number, got {value!r}")
    if opt.form is not None:
        opt.form(value)
    if opt.choices is not None and value not in opt.choices:
        raise ValueError(f"option {opt.name} must be one of {', '.join(map(str, opt.choices))}, got {value!r}")
    if opt.minimum is not None and value < opt.minimum:
        raise ValueError(f"option {opt.name} must be >= {opt.minimum:g}, got {value!r}")
    if opt.maximum is not None and value > opt.maximum:
        raise ValueError(f"option {opt.name} must be <= {opt.maximum:g}, got {value!r}")
