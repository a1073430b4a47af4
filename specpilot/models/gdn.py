"""Gated DeltaNet, the recurrent layer kind of hybrid targets (Qwen3.5's `linear_attention` layers).

Per value head a fixed-size state S [Dk, Dv] (float32) follows the gated delta rule,
S_t = exp(g_t) S_{t-1} + k_t beta_t (v_t - (exp(g_t) S_{t-1})^T k_t)^T and o_t = S_t^T q_t, after a depthwise causal
conv (width 4) over q, k and v and L2-normalised q and k; beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias);
the output is RMS-normed per head, gated by SiLU(z), and projected out.

A prefill chunk runs the chunked form and moves the layer's state at once (a request's first chunk starts from a
zero state). Decode and verify rows only read the state: a chain's rows keep each position's state (stock's
snapshots); a tree's rows keep a state per node too (`hybrid_tree=snapshot`), or only their inputs
(`recompute`: the tree form recomputes along each node's root path); the cache's commit (models/cache.GDNState)
moves the state to the accepted path's end, so parked rows of a batch and rejected drafts never touch it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Forward
from specpilot.kernels import gdn
from specpilot.kernels.gdn.prefill import prefill
from specpilot.kernels.gemv import stream_of
from specpilot.models.cache import GDNState
from specpilot.models.config import DenseConfig
from specpilot.models.layers import SwiGLU
from specpilot.weights import DenseWeight


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: DenseConfig):
        super().__init__()
        s = cfg.gdn
        self.cfg, self.shape = cfg, s
        self.w_qkvz = DenseWeight(cfg.hidden_size, s.conv_dim + s.value_dim)  # q, k, v (to the conv), then z
        self.w_ba = DenseWeight(cfg.hidden_size, 2 * s.v_heads)  # b, then a
        self.conv = nn.Parameter(torch.empty(s.conv_dim, s.conv).uniform_(-0.5, 0.5))
        self.dt_bias = nn.Parameter(torch.ones(s.v_heads))
        self.A_log = nn.Parameter(torch.empty(s.v_heads).uniform_(0.01, 16).log())
        self.norm = nn.Parameter(torch.ones(s.v_dim))
        self.wo = DenseWeight(s.value_dim, cfg.hidden_size)

    def forward(self, x, meta: Forward, state: GDNState, prefill: bool, plan: KernelPlan, norm_weight=None,
                residual=None, next_norm=None):
        """The layer's output for rows x [B, T, H] (normed, or un-normed with norm_weight: see run_layers); with
        packed rows (meta.packed) x holds those rows alone, [1, P, H], and the conv and recurrence run on the padded
        [B, T] layout."""
        s = self.shape
        b, t = stream_of(x).shape[:2]
        qkvz = self.w_qkvz.project(x, plan, norm_weight=norm_weight, eps=self.cfg.rms_norm_eps)
        ba = self.w_ba.project(x, plan, norm_weight=norm_weight, eps=self.cfg.rms_norm_eps).float()
        mixed, z = qkvz.split([s.conv_dim, s.value_dim], -1)
        beta = torch.sigmoid(ba[..., : s.v_heads])
        g = -self.A_log.float().exp() * F.softplus(ba[..., s.v_heads :] + self.dt_bias.float())
        if prefill:
            o = self._prefill(mixed, g, beta, meta, state, plan)
        elif meta.packed is not None:
            o = meta.pack(self._rows(meta.unpack(mixed), meta.unpack(g), meta.unpack(beta), meta, state, plan))
        else:
            o = self._rows(mixed, g, beta, meta, state, plan)
        o = gated_norm(o.to(qkvz.dtype), z.view(b, t, s.v_heads, s.v_dim), self.norm, self.cfg.rms_norm_eps)
        return self.wo.project(o.reshape(b, t, s.value_dim), plan, residual=residual, next_norm=next_norm)

    def _heads(self, y: torch.Tensor):
        """The conv's output [B, T, C] -> q, k [B, T, Hk, Dk], v [B, T, Hv, Dv]."""
        s = self.shape
        q, k, v = y.split([s.key_dim, s.key_dim, s.value_dim], -1)
        return (q.reshape(*q.shape[:2], s.k_heads, s.k_dim), k.reshape(*k.shape[:2], s.k_heads, s.k_dim),
                v.reshape(*v.shape[:2], s.v_heads, s.v_dim))

    def _prefill(self, mixed, g, beta, meta: Forward, state: GDNState, plan: KernelPlan) -> torch.Tensor:
        """A prompt chunk (one request): the chunked form (fla-core's on CUDA: kernels/gdn/prefill.py), the state
        moved past it."""
        if int(meta.positions[0, 0]) == 0:  # a request's first chunk: nothing before it
            state.reset()
        y = gdn.conv_chain(mixed, self.conv, state.conv)
        # a copy of the state goes in: it moves in place below, and a training pass's autograd keeps what went in
        o, after = prefill(*self._heads(y), g, beta, state.ssm.clone(), plan)
        state.ssm.copy_(after)
        b, t = mixed.shape[:2]
        whole = torch.arange(t, device=mixed.device).expand(b, t)  # the chunk is the path, all of it kept
        state.conv.copy_(gdn.conv_state_after(mixed, state.conv, whole, torch.full((b,), t - 1, device=mixed.device)))
        return o

    def _rows(self, mixed, g, beta, meta: Forward, state: GDNState, plan: KernelPlan) -> torch.Tensor:
        """Decode or verify rows (a chain, or a tree by meta.parents): outputs, and what the commit needs (a state
        per row; for a tree under hybrid_tree=recompute, the rows' inputs). The Triton kernels on CUDA
        (kernels/gdn/triton.py), the references elsewhere."""
        if meta.visibility.tree is None:
            y = gdn.conv_chain(mixed, self.conv, state.conv, meta.derived)
            o, snaps = gdn.rows_chain(*self._heads(y), g, beta, state.ssm, plan)
            state.pending = {"mixed": mixed, "snapshots": snaps}
            return o
        y = gdn.conv_tree(mixed, self.conv, state.conv, meta.parents, meta.derived)
        q, k, v = self._heads(y)
        if plan.hybrid_tree == "snapshot":
            o, snaps = gdn.rows_tree(q, k, v, g, beta, state.ssm, meta.parents, plan, snapshots=True,
                                     memo=meta.derived)
            state.pending = {"mixed": mixed, "snapshots": snaps}
            return o
        state.pending = {"mixed": mixed, "k": k, "v": v, "g": g, "beta": beta, "plan": plan}
        return gdn.rows_tree(q, k, v, g, beta, state.ssm, meta.parents, plan, memo=meta.derived)


def gated_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Each head's output RMS-normed (in float32), scaled, gated by SiLU(z), in the order and precision of
    Qwen3.5's RMSNormGated."""
    h = o.float()
    h = (weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(o.dtype)).float()
    return (h * F.silu(z.float())).to(o.dtype)


class GDNBlock(nn.Module):
    """A layer of the gdn kind: Gated DeltaNet and SwiGLU MLP, each after its RMSNorm."""

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.mixer = GatedDeltaNet(cfg)
        self.mlp_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.rms_norm_eps)
