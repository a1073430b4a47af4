"""The layer halves: a decode layer's attention hidden behind weight streaming (`gemv` one-row step).

In the one-row step the attention is a chain of dependent round trips (q/k/v done, K/V read, softmax,
merge) during which the DRAM idles: 0.23 ms of the 8B step (BENCHMARKS.md). Split by halves of the K/V
heads, A and B (each with its q heads), the layer's attention part runs as six kernels. Order 1
(SPECPILOT_HEAD_HALVES=1):

  1. q/k/v + rope of A      PDL wait; each block arrives on A's counter when done (kernels/sync.py)
  2. q/k/v + rope of B      no wait (its input was complete before 1 passed its wait); lets 3 start
  3. attention of A         spins on A's counter instead of waiting for 2: runs beside 2's weight stream
  4. o projection, A's columns    PDL wait for 3; lets 5 start at once; a float32 partial sum
  5. attention of B         spins on B's counter (arrivals of 2): runs beside 4's stream; waits for 4
                            at its end, so that 6's wait covers both
  6. o projection, B's columns    PDL wait for 5; adds 4's partial, the bias and the residual, rounds
                            once, hands over to the next norm like the one-launch projection

A dependent launch starts only once every block of the kernel before it has started, so in order 1 the
attention of B waits for all of 4's blocks to be resident. Order 2 (=2) launches both attentions first:
3 as above but also arriving on a third counter, 4 the attention of B (spins on B's counter), 5 the o
projection over A's columns (spins on 3's arrivals, lets 6 start at once, waits for 4 at its end), 6 as
above.

The sums of the output projection are the same products added in another order (two float32 halves),
so tokens may differ from the one-launch path after a near-tie. Off by default: on the H200 order 1 made
the 8B step 0.15 ms slower (4.207 against 4.058 ms, `bench/gpu/ablate_step.py --options`, BENCHMARKS.md
2026-12-01); order 2 has not run on a GPU yet.
"""

from __future__ import annotations

import os

import torch

from specpilot.kernels.gemv import stream_of
from specpilot.kernels.qkv_rope import qkv_rope_applies


def halves_mode() -> int:
    """SPECPILOT_HEAD_HALVES: 1 or 2 (the order, see above), unset or 0 off (the default)."""
    mode = os.environ.get("SPECPILOT_HEAD_HALVES", "").strip()
    if mode not in ("", "0", "1", "2"):
        raise ValueError(f"SPECPILOT_HEAD_HALVES={mode!r}: expected 1 or 2 (on, in that order) or 0 (off, the "
                         "default)")
    return int(mode or 0)


def halves_apply(attn, x, vis) -> bool:
    """Whether `attn` (models/layers.Attention) can run its one row as halves."""
    cfg = attn.cfg
    return (attn.gemv and halves_mode() > 0 and qkv_rope_applies(x, attn.gemv, cfg.qk_norm, cfg.head_dim)
            and cfg.num_kv_heads % 2 == 0 and vis.tree is None and not vis.window)


def _sync(attn, device: torch.device) -> torch.Tensor | None:
    """The layer's three arrival counters (each with its consumers' count), zeros, allocated outside graph
    capture (a graph keeps the pointer)."""
    buf = getattr(attn, "_halves_sync", None)
    if buf is None or buf.device != device:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = attn._halves_sync = torch.zeros(6, dtype=torch.int32, device=device)
    return buf


def attention_halves(attn, x, positions, rope, k_cache, v_cache, slots, vis, norm_weight=None, residual=None,
                     next_norm=None):
    """models/layers.Attention.forward for one row as the six kernels above; None where it cannot run
    (no counters yet inside a graph capture): the caller takes the one-launch path."""
    from specpilot.kernels.attention.triton import MAX_FUSED_TILES, attend_triton
    from specpilot.kernels.gemv.triton import gemv_triton
    from specpilot.kernels.qkv_rope.triton import qkv_rope_triton

    cfg = attn.cfg
    sync = _sync(attn, stream_of(x).device)
    if sync is None:
        return None
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = torch.empty(1, 1, hq, d, dtype=k_cache.dtype, device=sync.device)
    o = torch.empty_like(q)
    blocks = []
    for part in (0, 1):
        _, n = qkv_rope_triton(x, attn.wqkv.weight, attn.wqkv.bias, norm_weight, cfg.rms_norm_eps, positions,
                               rope.cos, rope.sin, k_cache, v_cache, slots, hq, hkv, d, part=(part, 2),
                               wait=part == 0, sync=sync[2 * part:2 * part + 2], q_out=q)
        blocks.append(n)
    a, b = slice(0, hq // 2), slice(hq // 2, hq)
    ka, kb = slice(0, hkv // 2), slice(hkv // 2, hkv)
    scale, cols, flat = d ** -0.5, hq // 2 * d, o.view(1, 1, hq * d)

    def attend_half(half, kv, counter, label, **kw):
        return attend_triton(q[:, :, half], k_cache[:, kv], v_cache[:, kv], vis, scale, fuse_combine=True,
                             out=o[:, :, half], sync=(sync[2 * counter:2 * counter + 2], blocks[counter]),
                             label=label, **kw)

    def first_columns(**kw):  # the o projection over A's columns: a float32 partial sum
        return gemv_triton(flat[..., :cols], attn.wo.weight[:, :cols], out_dtype=torch.float32, early=True, **kw)

    if halves_mode() == 1:
        attend_half(a, ka, 0, "attention 1/2")
        partial = first_columns()
        attend_half(b, kb, 1, "attention 2/2", wait_at_end=True, counter_base=MAX_FUSED_TILES // 2)
    else:
        _, n = attend_half(a, ka, 0, "attention 1/2", arrive_on=sync[4:6])
        attend_half(b, kb, 1, "attention 2/2", counter_base=MAX_FUSED_TILES // 2)
        partial = first_columns(sync=(sync[4:6], n), wait_at_end=True)
    return gemv_triton(flat[..., cols:], attn.wo.weight[:, cols:], attn.wo.bias, residual=stream_of(residual),
                       next_norm=next_norm, add=partial.view(-1))
