"""The floor of each kernel class: the bytes a step must move and the FLOPs it must do, counted from the models'
shapes and dtypes, and the time that takes at the bandwidth and FLOP rate measured on the same machine.

Counted once per step, whatever the engine does today: every weight is read once per pass that needs it (the
drafter's context rows and block rows are one pass; the drafter's LM head and the target's are two, since the
verify waits for the draft), the K/V of every attended slot once per pass, activations once in and once out, the
logits once by whatever reads them (the drafter's top-K in float32, the verify's argmax in the model's dtype).
A kernel class far above its floor is a kernel to fix; one at its floor is a byte count to cut (a smaller
weight format, fewer passes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specpilot.models.config import DenseConfig, DrafterConfig
from specpilot.models.eagle3 import Eagle3Config

CLASSES = ("target_gemm", "drafter_gemm", "lm_head", "attention", "drafter_other", "tree", "elementwise")
WEIGHT_CLASSES = ("target_gemm", "drafter_gemm", "lm_head")  # the weight reads a smaller format shrinks


@dataclass(frozen=True)
class StepShape:
    """One decode step of one request. AR: rows = 1 and no drafter."""

    rows: int  # target rows verified (the anchor included)
    context: float  # slots the step's queries attend over (mean over the measured steps)
    draft_rows: int = 0  # the drafter's block rows (0: AR)
    ctx_rows: float = 0.0  # committed rows the drafter projects into its cache (mean tokens per step)
    depth: int = 0  # lattice depth (draft positions)
    width: int = 0  # lattice width (candidates per position)
    tree: bool = False  # a tree's accepted path moves in every cache (a chain's stays in place)
    dtype_bytes: int = 2


@dataclass(frozen=True)
class Floor:
    bytes: float
    flops: float

    def seconds(self, bandwidth: float, flop_rate: float) -> float:
        """The larger of the byte time and the FLOP time (bytes/s, FLOP/s)."""
        return max(self.bytes / bandwidth, self.flops / flop_rate)


def layer_params(cfg: DenseConfig) -> int:
    """Weights of one attention + SwiGLU layer (biases included)."""
    h, q, kv, inter = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
    n = h * (q + 2 * kv) + q * h + h * 2 * inter + inter * h
    if cfg.attention_bias:
        n += q + 2 * kv + h
    if cfg.mlp_bias:
        n += 2 * inter + h
    return n


def drafter_params(d: DrafterConfig | Eagle3Config) -> dict[str, int]:
    """The drafter's projections: fc (target features -> hidden), its layers, DFlash2's conv and selector (EAGLE-3:
    fc over its three taps, its one layer whose q/k/v read 2H)."""
    lc = d.layer
    h = lc.hidden_size
    if isinstance(d, Eagle3Config):
        return {"fc": len(d.taps) * d.target_hidden * h, "layers": layer_params(lc) + h * (lc.q_dim + 2 * lc.kv_dim)}
    out = {"fc": len(d.target_layer_ids) * h * h, "layers": lc.num_layers * layer_params(lc)}
    if d.conv_kernel_size:
        out["conv"] = lc.num_layers * 2 * h * 2 * d.conv_kernel_size * (h // d.conv_group_size)
    if d.selector_rank:
        out["selector"] = h * d.selector_rank
    return out


def floors(target: DenseConfig, drafter: DrafterConfig | None, s: StepShape) -> dict[str, Floor]:
    """Bytes and FLOPs per kernel class for one step of shape s."""
    b = s.dtype_bytes
    t, v = target, target.vocab_size
    n_t = t.num_layers * layer_params(t)
    out = {
        "target_gemm": Floor(n_t * b + s.rows * t.num_layers * _io(t) * b, 2 * s.rows * n_t),
        "attention": _attention(t, s.rows, s.context, b),
        # the residual stream read and written by each of a layer's two norms (+ the final one), the embedding row
        "elementwise": Floor((4 * t.num_layers + 3) * s.rows * t.hidden_size * b, 0.0),
        "lm_head": Floor(v * t.hidden_size * b + s.rows * v * b, 2 * s.rows * v * t.hidden_size),
        "drafter_gemm": Floor(0.0, 0.0), "drafter_other": Floor(0.0, 0.0), "tree": Floor(0.0, 0.0),
    }
    argmax = Floor(s.rows * v * b, 0.0)  # the target's logits read by the argmax (AR's greedy, a verify's accept)
    if drafter is None or not s.draft_rows:
        out["elementwise"] = _plus(out["elementwise"], argmax)
        return out
    lc = drafter.layer
    # DFlash's anchor row has no draft logits; DSpark's block rows all draft, as EAGLE-3's rows do (its head: its own
    # draft vocabulary)
    eagle = isinstance(drafter, Eagle3Config)
    h, drafts = lc.hidden_size, s.draft_rows - (0 if eagle or drafter.anchor_drafts else 1)
    hv = drafter.draft_vocab if eagle else v
    params = drafter_params(drafter)
    n_d = sum(params.values())
    kv_part = lc.num_layers * h * 2 * lc.kv_dim  # the context rows only need K/V
    flops = 2 * (s.ctx_rows * (params["fc"] + kv_part) + s.draft_rows * (n_d - params["fc"]))
    out["drafter_gemm"] = Floor(n_d * b, flops)
    out["attention"] = _plus(out["attention"], _attention(lc, s.draft_rows, s.context + s.draft_rows, b))
    out["lm_head"] = _plus(out["lm_head"], Floor(hv * h * b + drafts * hv * 4, 2 * drafts * hv * h))
    lattice = s.depth * s.width * (8 + 4) + s.depth * s.width * s.width * 4  # tokens, log-probs, edges
    # the drafter's norms, its float32 logits read once by top-K / logsumexp, the lattice written
    out["drafter_other"] = Floor((4 * lc.num_layers + 2) * s.draft_rows * h * b + drafts * hv * 4 + lattice, 0.0)
    if not eagle and drafter.markov_rank:  # DSpark's Markov head: W2 [V, r] read once a draft position (sequential)
        r = drafter.markov_rank
        out["drafter_other"] = _plus(out["drafter_other"], Floor(drafts * v * (r * b + 2 * 4), 2 * drafts * v * r))
    moved = 2 * 2 * t.num_layers * t.kv_dim * (s.depth + 1) * b if s.tree else 0  # path K/V read + written
    taps = drafter.taps if eagle else drafter.target_layer_ids
    features = 2 * s.rows * len(taps) * t.hidden_size * b  # next context's features kept
    out["tree"] = _plus(argmax, Floor(lattice * (2 if s.tree else 0) + moved + features, 0.0))
    return out


def ar_batch(target: DenseConfig, requests: int, context: float, dtype_bytes: int = 2) -> dict[str, Floor]:
    """One batched AR step of `requests` rows, each attending its own `context` slots: the weights are read once for
    all of them, each request's K/V for its own row."""
    out = floors(target, None, StepShape(rows=requests, context=context, dtype_bytes=dtype_bytes))
    one = _attention(target, 1, context, dtype_bytes)
    out["attention"] = Floor(requests * one.bytes, requests * one.flops)
    return out


def _io(cfg: DenseConfig) -> int:
    """Activation elements in and out of one layer's projections, per row."""
    h, q, kv, inter = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
    return (h + q + 2 * kv) + (q + h) + (h + 2 * inter) + (inter + h)


def _attention(cfg: DenseConfig, rows: int, context: float, b: int) -> Floor:
    """K and V of every attended slot read once, the rows' q in and out, their K/V written."""
    per_layer = 2 * context * cfg.kv_dim * b + rows * (2 * cfg.q_dim + 2 * cfg.kv_dim) * b
    flops = 4 * rows * context * cfg.q_dim
    return Floor(cfg.num_layers * per_layer, cfg.num_layers * flops)


def _plus(a: Floor, c: Floor) -> Floor:
    return Floor(a.bytes + c.bytes, a.flops + c.flops)


def to_json(fl: dict[str, Floor]) -> dict[str, dict]:
    return {k: asdict(v) for k, v in fl.items()}
