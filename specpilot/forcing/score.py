"""Token forcing: score every output token under the exact-weight target with a float32 LM head.

The target runs over prompt + output at once (teacher forcing); the hidden state before each output
token goes through the LM head in float32. A token is correct when it is that distribution's argmax;
otherwise its margin is log p(argmax) - log p(token), in nats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.models.dense import DenseTarget


@dataclass
class TokenScores:
    is_argmax: list[bool]
    margin: list[float]  # 0 where the token is the argmax
    gap_to: dict[int, float]  # position -> log p(token) - log p(other) for a requested other token

    @property
    def mismatches(self) -> int:
        return sum(not ok for ok in self.is_argmax)


@torch.inference_mode()
def score_output(target: DenseTarget, prompt: list[int], output: list[int],
                 others: dict[int, int] | None = None) -> TokenScores:
    """others: {position in output: another token} whose log-prob gap to the emitted token is wanted
    (used to calibrate delta where two systems first diverge)."""
    if not output:
        return TokenScores([], [], {})
    device = target.embed.weight.device
    ids = torch.tensor([prompt + output], device=device)
    h = target.normed_hidden(ids)[0, len(prompt) - 1 : len(prompt) + len(output) - 1]
    logp = torch.log_softmax(h.float() @ target.head_weight.float().t(), dim=-1)
    emitted = torch.tensor(output, device=device)
    best = logp.max(-1).values
    own = logp.gather(1, emitted[:, None])[:, 0]
    is_argmax = (logp.argmax(-1) == emitted).tolist()
    margin = torch.where(logp.argmax(-1) == emitted, torch.zeros_like(best), best - own).tolist()
    gaps = {i: (own[i] - logp[i, tok]).item() for i, tok in (others or {}).items()}
    return TokenScores(is_argmax, margin, gaps)
