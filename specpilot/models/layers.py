"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, masked GQA attention, SwiGLU.

Plain PyTorch ops that run on the CPU (the references) and inside CUDA graphs on the GPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Statistics in float32, scale in the input dtype: the order transformers uses.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    # llama3: leave high frequencies, divide low ones by factor, blend in between.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, blended, scaled)


def rope_table(length: int, head_dim: int, theta: float, scaling: dict | None,
               device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32, [length, head_dim], halves duplicated (rotate-half convention)."""
    inv = rope_inv_freq(head_dim, theta, scaling).to(device)
    freqs = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, D] already gathered at the rows' positions."""
    cos = cos[:, :, None].to(x.dtype)
    sin = sin[:, :, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """Masked grouped-query attention over a static cache.

    q [B, T, Hq, D]; k_cache, v_cache [B, Hkv, L, D]; mask [B, T, L] bool (True = visible).
    The query heads that share a KV head are folded into the row axis, so no K/V copy is made.
    Returns [B, T, Hq, D].
    """
    b, t, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    qf = q.view(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    m = mask[:, None, None].expand(b, 1, g, t, mask.shape[-1]).reshape(b, 1, g * t, mask.shape[-1])
    o = F.scaled_dot_product_attention(qf, k_cache, v_cache, attn_mask=m, scale=scale)
    return o.view(b, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, hq, d)


def write_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """cache [B, H, L, D] <- rows [B, T, H, D] at slots [B, T]; graph-safe (no host sync)."""
    batch = torch.arange(cache.shape[0], device=cache.device)[:, None].expand_as(slots)
    cache[batch, :, slots] = rows.to(cache.dtype)


class SwiGLU(nn.Module):
    """gate and up projections fused into one weight (one GEMM), then down."""

    def __init__(self, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.inter = inter
        self.w13 = nn.Linear(hidden, 2 * inter, bias=bias)
        self.w2 = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.inter, dim=-1)
        return self.w2(F.silu(gate) * up)
