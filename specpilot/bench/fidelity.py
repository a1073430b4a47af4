"""How closely one target reproduces another (a widened twin against its source, bf16 against float32).

Two readings. Free-running: both decode greedily on their own; once they pick different tokens at a
near-tie their inputs differ and every later token may too, so the share of equal tokens measures
where the first divergence falls more than how often the models disagree. Teacher-forced: both models
read the same token sequence (the reference's own output) and we count the positions where their
argmax agrees; this is the per-token agreement, free of compounding.
"""

from __future__ import annotations

import torch

from specpilot.models.dense import DenseTarget


def free_running(a: list[list[int]], b: list[list[int]]) -> dict:
    """Share of equal tokens (over the longer output of each pair) and each pair's first divergence."""
    same = sum(x == y for s, t in zip(a, b, strict=True) for x, y in zip(s, t, strict=False))
    total = sum(max(len(s), len(t)) for s, t in zip(a, b, strict=True))
    first = [next((i for i, (x, y) in enumerate(zip(s, t, strict=False)) if x != y),
                  None if len(s) == len(t) else min(len(s), len(t))) for s, t in zip(a, b, strict=True)]
    return {"token_agreement": same / total if total else 1.0, "first_divergence": first}


@torch.inference_mode()
def forced_argmax(target: DenseTarget, prompt: list[int], output: list[int]) -> list[int]:
    """The target's greedy choice at each output position, reading prompt + output[:i] (serving precision)."""
    if not output:
        return []
    ids = torch.tensor([prompt + output], device=target.embed.weight.device)
    h = target.normed_hidden(ids)[0, len(prompt) - 1 : len(prompt) + len(output) - 1]
    return (h @ target.head_weight.t()).argmax(-1).tolist()


def forced_agreement(a: DenseTarget, b: DenseTarget, prompts: list[list[int]], outputs: list[list[int]]) -> dict:
    """Per-token argmax agreement of two targets teacher-forced along the same outputs."""
    agree = total = 0
    per_request = []
    for prompt, output in zip(prompts, outputs, strict=True):
        x, y = forced_argmax(a, prompt, output), forced_argmax(b, prompt, output)
        same = sum(p == q for p, q in zip(x, y, strict=True))
        agree, total = agree + same, total + len(x)
        per_request.append(same / len(x) if x else 1.0)
    return {"token_agreement": agree / total if total else 1.0, "tokens": total, "per_request": per_request}
