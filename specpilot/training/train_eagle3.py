"""Train an EAGLE-3 drafter for a target by self-distillation, with EAGLE-3's training-time test (TTT).

Data: the same distilled sequences as the DFlash drafter's (the target's own greedy answers), and the target's
hidden states at the drafter's three taps. Step 0 is the drafter as it reads the context: row t pairs position t's
fused features with the token at t + 1 and predicts the token at t + 2, each row seeing rows <= t. Step j reads
step j - 1's output at row t (what a drafted row reads from its parent) with the token at t + 1 + j, at position
t + j, and sees step 0's rows <= t and its own row of each step before it: exactly what a chain drafted from the
anchor at t + 1 sees at inference (speculative/eagle3.py), so a chain's accepted length is read off the teacher-
forced steps (a wrong token ends the chain before it could feed a later step).

Loss: each step's cross-entropy over the draft vocabulary, weighted 0.8^j (EAGLE-3's), on answer tokens alone;
a label outside the draft vocabulary is one the drafter can never propose and is left out. The draft vocabulary is
the training answers' most frequent tokens (EAGLE-3's recipe), its head starts as the target's rows for them.
"""

from __future__ import annotations

import random
from collections import Counter

import torch
import torch.nn.functional as F

from specpilot.config.plan import KernelPlan
from specpilot.fixtures.random_models import random_eagle3
from specpilot.models.cache import AttentionState
from specpilot.models.dense import DenseTarget
from specpilot.models.eagle3 import Eagle3Drafter
from specpilot.models.teacher import NAIVE, walk
from specpilot.training.distill import Dataset
from specpilot.weights import DenseWeight

EAGLE3_BLOCK = 7  # the chain's rows (anchor and six drafts): EAGLE-3's TTT length and its depth when drafting
STEP_DECAY = 0.8  # EAGLE-3's weight of TTT step j: 0.8^j
TOP_K = 16  # the oracle's candidates per depth


def draft_vocabulary(ds: Dataset, vocab: int, size: int) -> torch.Tensor:
    """The `size` target ids most frequent among the answers (ties: the lower id), sorted; 0 or >= vocab: all."""
    if size <= 0 or size >= vocab:
        return torch.arange(vocab)
    counts = Counter(t for seq, p in zip(ds.sequences, ds.prompt_lens, strict=True) for t in seq[p:])
    ranked = sorted(range(vocab), key=lambda t: (-counts.get(t, 0), t))
    return torch.tensor(sorted(ranked[:size]))


@torch.no_grad()
def new_eagle3(target: DenseTarget, ids: torch.Tensor, seed: int) -> Eagle3Drafter:
    """A fresh drafter for `target` over the draft vocabulary `ids`: its head the target's rows for them, its
    residual writes small (it starts near the target's own next-token guess from the fused features)."""
    device = target.embed.weight.device
    model = random_eagle3(target.cfg, len(ids), seed, dtype=torch.float32, device=device)
    ids = ids.to(device)
    model.d2t.copy_(ids - torch.arange(len(ids), device=device))
    model.head.weight.copy_(target.head_weight[ids].float())
    for norm in (model.input_norm, model.hidden_norm, model.mlp_norm):
        norm.fill_(1.0)
    model.norm.copy_(target.norm.float())
    model.attn.wo.weight.mul_(0.1)
    model.mlp.w2.weight.mul_(0.1)
    return model.train()


def target_to_draft(model: Eagle3Drafter) -> torch.Tensor:
    """[target vocab] -> the draft id of each target id, -1 where the draft vocabulary lacks it."""
    device = model.d2t.device
    out = torch.full((model.cfg.layer.vocab_size,), -1, dtype=torch.int64, device=device)
    draft = torch.arange(model.cfg.draft_vocab, device=device)
    out[model.target_ids(draft)] = draft
    return out


def unrolled(model: Eagle3Drafter, embed: DenseWeight, feats: torch.Tensor, seqs: torch.Tensor, steps: int,
             plan: KernelPlan = NAIVE) -> list[torch.Tensor]:
    """Features [N, S, F] and tokens [N, S] (right-padded) -> each TTT step's outputs [N, S, H] before the final
    norm (row t of step j predicts the token at t + 2 + j)."""
    n, s, _ = feats.shape
    lc = model.cfg.layer
    if model.rope.length < s + steps:
        model.set_rope_length(s + steps, device=feats.device)
    positions = torch.arange(s, device=feats.device)[None].expand(n, -1)
    h = model.fuse(feats, plan)
    keys, values, outs = [], [], []
    for j in range(steps):
        tokens = F.pad(seqs[:, 1 + j :], (0, 1 + j))  # row t's token: the one at t + 1 + j
        x = model._rows(embed.rows(tokens).to(h.dtype), h, plan)
        state = AttentionState(n, s, lc.num_kv_heads, lc.head_dim, x.dtype, feats.device)
        q = model.attn._prologue(x, positions + j, model.rope, state, positions, True, plan)
        keys.append(state.k)
        values.append(state.v)
        o = _ttt_attention(q, keys, values, lc.num_heads // lc.num_kv_heads, lc.head_dim ** -0.5)
        h = model._mlp(h + model.attn.wo.project(o, plan), plan)
        outs.append(h)
    return outs


def _ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], rep: int,
                   scale: float) -> torch.Tensor:
    """Row t of the last step sees step 0's rows <= t and row t of every later step. q [N, S, Hq, D], keys and
    values [N, Hkv, S, D] per step -> [N, S, Hq * D]."""
    q = q.transpose(1, 2)
    k0, v0 = (x.repeat_interleave(rep, 1).to(q.dtype) for x in (keys[0], values[0]))
    s = q.shape[2]
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
    scores += [(q * k.repeat_interleave(rep, 1).to(q.dtype)).sum(-1, keepdim=True) * scale for k in keys[1:]]
    p = torch.softmax(torch.cat(scores, -1).float(), -1).to(q.dtype)
    o = p[..., :s] @ v0
    for i, v in enumerate(values[1:]):
        o = o + p[..., s + i : s + i + 1] * v.repeat_interleave(rep, 1).to(q.dtype)
    return o.transpose(1, 2).flatten(2)


def padded(ds: Dataset, indices: list[int], length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [N, length] right-padded with 0, and whether each position is an answer token [N, length]."""
    seqs = torch.zeros(len(indices), length, dtype=torch.int64)
    answer = torch.zeros(len(indices), length, dtype=torch.bool)
    for row, i in enumerate(indices):
        seq = ds.sequences[i]
        seqs[row, : len(seq)] = torch.tensor(seq)
        answer[row, ds.prompt_lens[i] : len(seq)] = True
    return seqs.to(device), answer.to(device)


def labels(seqs: torch.Tensor, answer: torch.Tensor, j: int) -> torch.Tensor:
    """Step j's label at row t: the token at t + 2 + j, -1 where that is past the sequence or not an answer token."""
    ahead = F.pad(seqs[:, 2 + j :], (0, 2 + j))
    return torch.where(F.pad(answer[:, 2 + j :], (0, 2 + j)), ahead, -1)


def ttt_loss(model: Eagle3Drafter, embed: DenseWeight, feats: torch.Tensor, seqs: torch.Tensor,
             answer: torch.Tensor, steps: int, to_draft: torch.Tensor) -> tuple[torch.Tensor, dict, int]:
    """The weighted cross-entropy over TTT steps (logits only at rows with a label in the draft vocabulary);
    -> (loss, stats, answer tokens learnt at step 0)."""
    total, weight, stats, learnt = 0.0, 0.0, {}, 0
    for j, out in enumerate(unrolled(model, embed, feats, seqs, steps)):
        target = labels(seqs, answer, j)
        draft = torch.where(target >= 0, to_draft[target.clamp(min=0)], -1)
        keep = draft >= 0
        if j == 0:
            learnt = int((target >= 0).sum())
        if not keep.any():
            continue
        ce = F.cross_entropy(model.logits(out[keep], NAIVE), draft[keep], reduction="sum")
        total = total + STEP_DECAY ** j * ce
        weight += STEP_DECAY ** j * int(keep.sum())
        stats[f"ce{j}"] = ce.item() / int(keep.sum())
    loss = total / max(weight, 1.0) if weight else feats.new_zeros((), requires_grad=True)
    stats["ce"] = float(loss.detach())
    return loss, stats, learnt


@torch.no_grad()
def accept_lengths(model: Eagle3Drafter, embed: DenseWeight, feats: torch.Tensor, seqs: torch.Tensor,
                   answer: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row t (the chain from the anchor at t + 1): tokens the greedy chain and the top-K oracle would commit
    there, bonus included, [N, S] each (depths without a label never match)."""
    greedy, oracle = [], []
    for j, out in enumerate(unrolled(model, embed, feats, seqs, steps)):
        target = labels(seqs, answer, j)
        top = model.target_ids(model.logits(out, NAIVE).topk(min(TOP_K, model.cfg.draft_vocab), -1).indices)
        greedy.append((top[..., 0] == target) & (target >= 0))
        oracle.append((top == target[..., None]).any(-1) & (target >= 0))
    run = lambda hits: torch.stack(hits, -1).long().cumprod(-1).sum(-1) + 1  # noqa: E731
    return run(greedy), run(oracle)


class Eagle3Trainee:
    """What the training loop (train_drafter.train) needs of a drafter kind: its model, a step's loss on a batch,
    and its scores."""

    def __init__(self, target: DenseTarget, tc, init: Eagle3Drafter | None, train_ds: Dataset, longest: int,
                 features_of):
        device = target.embed.weight.device
        if init is None:
            self.model = new_eagle3(target, draft_vocabulary(train_ds, target.cfg.vocab_size, tc.draft_vocab),
                                    tc.seed)
        else:
            self.model = init.to(device=device, dtype=torch.float32).train()
        self.model.set_rope_length(max(self.model.rope.length, longest + tc.block_size + 2), device=device)
        self.steps = tc.block_size - 1  # the chain's rows past its anchor
        self.embed = DenseWeight.of(target.embed.weight.detach().float())
        self.features = features_of(tuple(self.model.cfg.taps))
        self.to_draft = target_to_draft(self.model)
        self.device = device

    def batch_loss(self, ds: Dataset, indices: list[int], rng: random.Random, tc, autocast
                   ) -> tuple[torch.Tensor, dict, int]:
        feats = self.features(ds, indices, self.device)
        seqs, answer = padded(ds, indices, feats.shape[1], self.device)
        with autocast():
            return ttt_loss(self.model, self.embed, feats, seqs, answer, self.steps, self.to_draft)

    @torch.no_grad()
    def score(self, eval_ds: Dataset, dev_ds: Dataset | None, autocast, group: int = 16) -> dict:
        """{"heldout": mean accept length over anchors whose whole chain lies in the answer, "dev": replay tau (a walk
        along each dev answer, each step moving on by what it commits)}, and each oracle's."""
        out = {"heldout": self._score(eval_ds, autocast, group, replay=False)}
        if dev_ds is not None and dev_ds.sequences:
            out["dev"] = self._score(dev_ds, autocast, group, replay=True)
        return out

    def _score(self, ds: Dataset, autocast, group: int, replay: bool) -> dict:
        chain, best = [], []
        for first in range(0, len(ds.sequences), group):
            indices = list(range(first, min(first + group, len(ds.sequences))))
            feats = self.features(ds, indices, self.device)
            seqs, answer = padded(ds, indices, feats.shape[1], self.device)
            with autocast():
                greedy, oracle = accept_lengths(self.model, self.embed, feats, seqs, answer, self.steps)
            for row, i in enumerate(indices):
                lo, n = ds.prompt_lens[i], len(ds.sequences[i])
                # the anchor at a is row a - 1; held-out: whole chains only (a + steps < n)
                anchors = range(lo, n - 1) if replay else range(lo, n - self.steps)
                rows = [a - 1 for a in anchors if a >= 1]
                g, o = greedy[row, rows].tolist(), oracle[row, rows].tolist()
                chain += walk(g) if replay else g
                best += walk(o) if replay else o
        key = "steps" if replay else "blocks"
        return {"tau": sum(chain) / max(len(chain), 1), "oracle_tau_top_k": sum(best) / max(len(best), 1),
                key: len(chain)}
