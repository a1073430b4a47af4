"""The deployment's own reduction-order noise, measured: how far an exact-equivalent recomputation moves a margin.

The same output of the exact target is scored twice with the target's own forward: as one verify pass over
all its rows, and as passes of one row each (the decode's shape). Both compute the same function; their
top-1/top-2 log-prob gaps differ only by the order of reductions. That difference, position by position, is the
noise a lossless system's margins carry; its maximum bounds how far a legitimate near-tie can be from zero.
"""

from __future__ import annotations

import torch

from specpilot.models.dense import DenseTarget, Mode
from specpilot.speculative.visibility import Visibility


@torch.inference_mode()
def _gaps(target: DenseTarget, prompt: list[int], output: list[int], rows: int) -> torch.Tensor:
    """[len(output)] float32: log p(top-1) - log p(top-2) before each output token, the output fed `rows` at a
    time after the prompt's prefill."""
    device = target.embed.weight.device
    cache = target.new_cache(1, len(prompt) + len(output))
    ids = torch.tensor([prompt], device=device)
    logits, _ = target(ids, torch.arange(len(prompt), device=device)[None], cache, Mode.PREFILL)
    out = [logits[0, -1:]]
    seq = torch.tensor(output, device=device)
    for s in range(0, len(output) - 1, rows):
        chunk = seq[s : min(s + rows, len(output) - 1)]
        start = torch.tensor([len(prompt) + s], device=device)
        pos = start[:, None] + torch.arange(len(chunk), device=device)
        logits, _ = target(chunk[None], pos, cache, Mode.VERIFY, slots=pos, vis=Visibility(start, start))
        out.append(logits[0])
    logp = torch.log_softmax(torch.cat(out).float(), -1)
    top = logp.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).cpu()


def margin_noise(target: DenseTarget, pairs: list[tuple[list[int], list[int]]], max_tokens: int = 64) -> dict:
    """pairs: (prompt, output) of the exact target's own greedy runs. Returns the per-position changes of the
    top-2 gap between a one-pass and a row-by-row recomputation: their maximum (the noise bound), a high
    quantile and how many positions were measured."""
    diffs = []
    for prompt, output in pairs:
        out = output[:max_tokens]
        if len(out) < 2:
            continue
        diffs.append((_gaps(target, prompt, out, len(out)) - _gaps(target, prompt, out, 1)).abs())
    if not diffs:
        return {"positions": 0, "max": 0.0, "q99": 0.0}
    d = torch.cat(diffs)
    return {"positions": d.numel(), "max": float(d.max()), "q99": float(d.quantile(0.99))}
