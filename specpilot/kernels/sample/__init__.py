"""Sampling a request's next token so that speculative decoding is exactly AR sampling, token for token.

Each token is drawn by inverse transform from one uniform number, and that number is a hash of the request's seed
and the token's position (a counter-based generator): whichever pass computes the target's distribution at a
position (AR's decode row, or a verify row of a chain or a tree), the same seed and position give the same draw.
Verification then walks the drafted tree along the sampled tokens as greedy verification walks it along the
argmax (speculative/accept.py): a drafted child is taken where it is the token the target samples there. With
deterministic drafts this is recursive rejection over the siblings (accept child c_i with probability
p(c_i | not c_1..c_{i-1})), so every emitted token follows the target's distribution; and since the draws are
AR's own, a sampled speculative run returns AR's sampled output for the same seed (tests/test_sampling.py).

The distribution: logits / temperature, then the top_k most likely tokens (0: all), then the smallest set of
them whose probability reaches top_p, renormalised. Temperature 0 is greedy (the argmax, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.core.contracts import Sampling

M32 = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (int64 tensors holding values below 2**32; no product passes 2**63)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & M32
    return (x >> 16) ^ x


def uniform(seed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A number in (0, 1) per (seed [B], position [B, R]): float64, 32 bits of it random."""
    h = _mix((_mix(seed[:, None] & M32) + positions * 0x9E3779B9) & M32)
    return (h.double() + 0.5) / 2.0**32


@dataclass
class SamplerRows:
    """Each row's (request's) sampling: temperature, top_p, top_k and seed, [B] tensors that a captured step
    reads in place (set per request: `set`)."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    seed: torch.Tensor

    @classmethod
    def zeros(cls, rows: int, device) -> SamplerRows:
        f = lambda: torch.zeros(rows, dtype=torch.float32, device=device)  # noqa: E731
        i = lambda: torch.zeros(rows, dtype=torch.int64, device=device)  # noqa: E731
        return cls(f(), f() + 1.0, i(), i())

    def set(self, row: int, sampling: Sampling | None) -> None:
        """Row `row` samples as `sampling` says (None: greedy)."""
        s = sampling or Sampling()
        for name in ("temperature", "top_p", "top_k", "seed"):
            getattr(self, name)[row] = getattr(s, name)

    def row(self, i: int) -> SamplerRows:
        """Row i alone (views: what is set here is set there)."""
        return self.rows(i, i + 1)

    def rows(self, first: int, last: int) -> SamplerRows:
        """Rows first..last-1 (views)."""
        return SamplerRows(self.temperature[first:last], self.top_p[first:last], self.top_k[first:last],
                           self.seed[first:last])


def pick(logits: torch.Tensor, positions: torch.Tensor, rows: SamplerRows) -> torch.Tensor:
    """logits [B, R, V] of rows whose next token sits at `positions` [B, R] -> tokens [B, R]: sampled where the
    row's temperature is positive, the argmax where it is 0. No host sync (a captured step may run it)."""
    greedy = logits.argmax(-1)
    v = logits.shape[-1]
    temp = rows.temperature.clamp(min=1e-6)[:, None, None]
    scores, order = (logits.float() / temp).sort(dim=-1, descending=True, stable=True)
    probs = torch.softmax(scores, -1)
    rank = torch.arange(v, device=logits.device)
    top_k = torch.where(rows.top_k > 0, rows.top_k, v)[:, None, None]
    before = probs.cumsum(-1) - probs  # the mass of the more likely tokens
    keep = (rank < top_k) & (before < rows.top_p[:, None, None])  # the most likely token is always kept
    probs = probs * keep
    cdf = probs.double().cumsum(-1)
    u = uniform(rows.seed, positions) * cdf[..., -1]
    index = torch.searchsorted(cdf, u[..., None]).clamp(max=v - 1)
    sampled = order.gather(-1, index)[..., 0]
    return torch.where(rows.temperature[:, None] > 0, sampled, greedy)
