"""A hybrid distilled student of a dense teacher: most attention layers replaced by Gated DeltaNet layers.

No trained hybrid checkpoint is reachable here, so the project makes one: SmolLM2-135M-Instruct with three of every
four attention layers replaced by GDN layers (Qwen3.5's pattern: layer i is attention where (i + 1) % 4 == 0),
distilled from SmolLM2 itself. It is a distilled student, not a released model: its quality is what the
distillation reached (training.json says how far).

Layout: family qwen3_5 (models/config.py), but the kept attention layers are the teacher's own, unchanged: no
output gate, no q/k norm, rotary over the whole head (config fields attn_output_gate, qk_norm, rotary_dim). The GDN
shape (`default_shape`) is sized so that a GDN layer has about the parameters of the attention layer it replaces:
key heads = the teacher's K/V heads, key and value dims = its head dim, two value heads per key head (SmolLM2:
3, 6, 64, 64: 894,796 parameters for attention's 884,736).

Init (`init_student`): every shared tensor copied (embeddings, norms, every MLP, the kept attention layers, the
head). A GDN layer takes q from the first query head of each K/V group of the attention it replaces, k and v from
its k/v projections (v repeated onto each key head's value heads), its out-projection from the o_proj columns of
those groups' query heads; the short conv starts as the identity (the current token only); A_log and dt_bias at
FLA / Mamba2's defaults (decay time scales from ~1 to ~1000 tokens); b and a projections zero (beta 0.5, decay at
its bias); z zero: the gate SiLU(z) starts closed, so the branch adds nothing until training opens it (a
zero-initialised residual branch: no random noise in the start).

Loss (`train`): KL(teacher || student) of the next-token distributions at every position of the sequences
(the teacher's own answers from `specpilot distill`, or any token sequences), optionally plus the relative MSE of
each layer's residual stream. Stage 1 trains only the GDN layers (the rest is the teacher's, frozen), stage 2
everything; bf16 autocast on CUDA; time-bounded, with a learning curve (KL and teacher-vs-student greedy next-token
agreement on held-out sequences). Training runs the serving forward on the PyTorch references (as the drafter's
training does), so training and serving cannot drift apart.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.core.contracts import Forward
from specpilot.errors import UserError
from specpilot.models.config import DenseConfig, GDNShape
from specpilot.models.dense import DenseTarget
from specpilot.models.gdn import GatedDeltaNet
from specpilot.models.layers import Attention
from specpilot.models.teacher import NAIVE, cover

# ---------------------------------------------------------------------------------------------------------------
# config and init


def default_shape(teacher: DenseConfig) -> GDNShape:
    """Key heads = the teacher's K/V heads, dims = its head dim, two value heads per key head."""
    return GDNShape(k_heads=teacher.num_kv_heads, v_heads=2 * teacher.num_kv_heads, k_dim=teacher.head_dim,
                    v_dim=teacher.head_dim)


def student_config(teacher: DenseConfig, attention_every: int = 4, gdn_shape: GDNShape | None = None) -> DenseConfig:
    """The student's config: the teacher's sizes, layer i attention where (i + 1) % attention_every == 0, else GDN;
    the attention layers exactly the teacher's (no output gate, its own q/k norm and rotary)."""
    if teacher.attention_bias or teacher.mlp_bias or teacher.attn_output_gate or "gdn" in teacher.kinds:
        raise UserError("a hybrid student needs a dense teacher without biases (Qwen3.5's layout has none)")
    if attention_every < 1:
        raise UserError(f"attention_every must be at least 1, got {attention_every}")
    kinds = ["attention" if (i + 1) % attention_every == 0 else "gdn" for i in range(teacher.num_layers)]
    cfg = dataclasses.replace(teacher, family="qwen3_5", layer_types=kinds, gdn=gdn_shape or default_shape(teacher),
                              attn_output_gate=False, qk_norm=teacher.qk_norm, rotary_dim=teacher.rotated)
    cfg.validate()
    return cfg


def param_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@torch.no_grad()
def init_student(teacher: DenseTarget, attention_every: int = 4, gdn_shape: GDNShape | None = None,
                 seed: int = 0) -> DenseTarget:
    """The student in float32 on the teacher's device: shared tensors copied, GDN layers from the attention they
    replace (module docstring). Deterministic for a given teacher and seed."""
    cfg = student_config(teacher.cfg, attention_every, gdn_shape)
    device = teacher.device
    with torch.device("meta"):
        student = DenseTarget(cfg, rope_length=1)
    student = student.to_empty(device=device).float()
    student.set_rope_length(teacher.rope.length, device=device)
    theirs = teacher.state_dict()
    for name, p in student.state_dict().items():
        if name in theirs:
            p.copy_(theirs[name])
    gen = torch.Generator().manual_seed(seed)
    for i, kind in enumerate(cfg.kinds):
        if kind == "gdn":
            _init_gdn(student.layers[i].mixer, teacher.layers[i].attn, teacher.cfg, gen)
    return student.eval()


def _init_gdn(mixer: GatedDeltaNet, attn: Attention, tc: DenseConfig, gen: torch.Generator) -> None:
    s, hidden = mixer.shape, tc.hidden_size
    q, k, v = (w.float().cpu() for w in attn.wqkv.weight.split([tc.q_dim, tc.kv_dim, tc.kv_dim]))
    group, per_key = tc.num_heads // tc.num_kv_heads, s.v_heads // s.k_heads
    heads_fit = s.k_heads == tc.num_kv_heads and s.k_dim == tc.head_dim
    values_fit = heads_fit and s.v_dim == tc.head_dim and per_key <= group
    rand = lambda rows, cols: torch.randn(rows, cols, generator=gen) / math.sqrt(cols)  # noqa: E731
    by_head = lambda w, heads: w.view(heads, tc.head_dim, hidden)  # noqa: E731
    if heads_fit:  # key head g: the first query head of K/V group g, and that group's key
        wq, wk = by_head(q, tc.num_heads)[::group].reshape(-1, hidden), k
    else:
        wq, wk = rand(s.key_dim, hidden), rand(s.key_dim, hidden)
    wv = by_head(v, tc.num_kv_heads).repeat_interleave(per_key, 0).reshape(-1, hidden) if values_fit else \
        rand(s.value_dim, hidden)
    if values_fit:  # value head j of key head g writes through the o_proj columns of group g's query head j % per_key
        heads = [g * group + j for g in range(s.k_heads) for j in range(per_key)]
        wo = attn.wo.weight.float().cpu().view(hidden, tc.num_heads, tc.head_dim)[:, heads].reshape(hidden, -1)
    else:
        wo = rand(hidden, s.value_dim)
    z = torch.zeros(s.value_dim, hidden)  # the gate starts closed
    mixer.w_qkvz.weight.copy_(torch.cat([wq, wk, wv, z]))
    mixer.w_ba.weight.zero_()
    mixer.wo.weight.copy_(wo)
    mixer.conv.zero_()
    mixer.conv[:, -1] = 1.0  # the current token's input only: q, k, v = SiLU(projections) at the start
    mixer.norm.fill_(1.0)
    a = torch.empty(s.v_heads).uniform_(1.0, 16.0, generator=gen)
    dt = torch.exp(torch.empty(s.v_heads).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    mixer.A_log.copy_(a.log())
    mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt


# ---------------------------------------------------------------------------------------------------------------
# the training forward and loss


def batch_tokens(sequences: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [N, S] and the mask of real positions whose next token is real too [N, S]."""
    length = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), length, dtype=torch.int64)
    mask = torch.zeros(len(sequences), length, dtype=torch.bool)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s) - 1] = True  # the last token predicts nothing in the data
    return ids.to(device), mask.to(device)


def forward(model: DenseTarget, ids: torch.Tensor, taps: tuple[int, ...] = ()):
    """Teacher-forced pass over whole sequences, the serving code on the references: (logits [N, S, V] float32,
    {layer: residual stream after it})."""
    cover(model, ids.shape[1])
    positions = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
    cache = model.new_cache(ids.shape[0], ids.shape[1], stacked=False)  # per-layer states: autograd sees each write
    eps = model.cfg.rms_norm_eps
    h, hidden, fused = model._trunk(ids, Forward.consecutive(positions), cache, taps, NAIVE, None, eps)
    assert not fused  # the reference plan never fuses
    kept = dict(zip(taps, hidden.split(model.cfg.hidden_size, -1), strict=True)) if taps else {}
    return (h @ model.head_weight.t()).float(), kept


def distill_loss(student: DenseTarget, teacher: DenseTarget, ids: torch.Tensor, mask: torch.Tensor,
                 hidden_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """KL(teacher || student) per position, averaged over real positions; plus hidden_weight x the relative MSE
    of each layer's residual stream (mean over layers)."""
    taps = tuple(range(student.cfg.num_layers)) if hidden_weight else ()
    with torch.no_grad():
        t_logits, t_kept = forward(teacher, ids, taps)
        t_logp = F.log_softmax(t_logits, -1)
    s_logits, s_kept = forward(student, ids, taps)
    s_logp = F.log_softmax(s_logits, -1)
    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)
    kl = (kl * mask).sum() / mask.sum().clamp(min=1)
    agree = ((s_logits.argmax(-1) == t_logits.argmax(-1)) & mask).sum() / mask.sum().clamp(min=1)
    loss, stats = kl, {"kl": kl.item(), "agreement": agree.item()}
    if hidden_weight:
        m = mask[..., None]
        rel = [((s_kept[i].float() - t_kept[i].float()).pow(2) * m).sum() / (t_kept[i].float().pow(2) * m).sum()
               for i in taps]
        mse = torch.stack(rel).mean()
        loss = loss + hidden_weight * mse
        stats["hidden_mse"] = mse.item()
    stats["loss"] = loss.item()
    return loss, stats


# ---------------------------------------------------------------------------------------------------------------
# training


@dataclass
class StudentTrainConfig:
    minutes: float = 1.0  # the time budget (evaluation and saving come after it)
    steps: int = 1_000_000  # a step budget too (whichever ends first)
    seqs_per_step: int = 16
    max_len: int = 512  # longer sequences are cut (the start kept)
    lr: float = 1e-3  # stage 1 (GDN layers only)
    lr_all: float = 1e-4  # stage 2 (everything)
    stage1_fraction: float = 1.0  # the share of the run that trains only the GDN layers; 1.0: no stage 2
    hidden_weight: float = 0.0  # the per-layer residual-stream MSE beside the KL; 0: KL only
    warmup_steps: int = 20
    eval_every_s: float = 60.0  # a learning-curve point this often (and at the start and the end)
    eval_seqs: int = 64
    seed: int = 0
    amp: bool = True  # bf16 autocast on CUDA (float32 elsewhere)


def gdn_parameters(student: DenseTarget) -> list[torch.nn.Parameter]:
    layers = [layer for layer, kind in zip(student.layers, student.cfg.kinds, strict=True) if kind == "gdn"]
    return [p for layer in layers for p in layer.mixer.parameters()]


def _autocast(amp: bool, device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp and device.type == "cuda")


@torch.no_grad()
def evaluate(student: DenseTarget, teacher: DenseTarget, sequences: list[list[int]], tc: StudentTrainConfig) -> dict:
    """KL and greedy next-token agreement (teacher's argmax = student's) over held-out sequences, weighted by
    their positions."""
    kl = agree = count = 0.0
    for first in range(0, len(sequences), tc.seqs_per_step):
        ids, mask = batch_tokens(sequences[first : first + tc.seqs_per_step], student.device)
        with _autocast(tc.amp, student.device):
            _, stats = distill_loss(student, teacher, ids, mask)
        n = int(mask.sum())
        kl, agree, count = kl + stats["kl"] * n, agree + stats["agreement"] * n, count + n
    return {"kl": kl / max(count, 1), "agreement": agree / max(count, 1), "positions": int(count)}


class _Stages:
    """The optimiser of the stage the run is in: stage 1 (GDN layers, the rest frozen), then stage 2 (all)."""

    def __init__(self, student: DenseTarget, tc: StudentTrainConfig):
        self.student, self.tc, self.stage, self.opt = student, tc, 0, None

    def at(self, done: float) -> torch.optim.Optimizer:
        stage = 1 if done < self.tc.stage1_fraction else 2
        if stage != self.stage:
            self.stage = stage
            train = set(map(id, gdn_parameters(self.student))) if stage == 1 else None
            for p in self.student.parameters():
                p.requires_grad_(train is None or id(p) in train)
            params = [p for p in self.student.parameters() if p.requires_grad]
            lr = self.tc.lr if stage == 1 else self.tc.lr_all
            self.opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
            self.base_lr, self.began_at = lr, done
        return self.opt

    def lr(self, step_in_stage: int, done: float) -> float:
        """Warmup, then cosine to zero over the stage's share of the run."""
        end = self.tc.stage1_fraction if self.stage == 1 else 1.0
        frac = (done - self.began_at) / max(end - self.began_at, 1e-9)
        warm = min(1.0, (step_in_stage + 1) / max(self.tc.warmup_steps, 1))
        return self.base_lr * warm * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))


def train(student: DenseTarget, teacher: DenseTarget, train_seqs: list[list[int]], eval_seqs: list[list[int]],
          tc: StudentTrainConfig, progress: Callable[[int, dict], None] | None = None) -> dict:
    """Distil the teacher into the student in place (float32 weights; bf16 autocast on CUDA). Returns the metrics:
    the learning curve, the first and last steps' means, steps done and minutes."""
    rng = random.Random(tc.seed)
    torch.manual_seed(tc.seed)
    train_seqs = [s[: tc.max_len] for s in train_seqs if len(s) >= 2]
    eval_seqs = [s[: tc.max_len] for s in eval_seqs if len(s) >= 2][: tc.eval_seqs]
    if not train_seqs:
        raise UserError("no training sequence of two tokens or more")
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    stages, began, history, curve = _Stages(student, tc), time.monotonic(), [], []
    budget = 60.0 * tc.minutes

    def done_at(step: int) -> float:
        return min(1.0, max(step / tc.steps, (time.monotonic() - began) / budget if budget else 0.0))

    def point(step: int) -> None:
        student.eval()
        curve.append({"step": step, "stage": stages.stage, "minutes": round((time.monotonic() - began) / 60, 3),
                      **evaluate(student, teacher, eval_seqs, tc)})
        student.train()
        if progress:
            progress(step, {"eval": curve[-1]})

    point(0)
    next_eval, step, stage_step = tc.eval_every_s, 0, 0
    student.train()
    while (done := done_at(step)) < 1.0:
        before = stages.stage
        opt = stages.at(done)
        stage_step = 0 if stages.stage != before else stage_step
        for group in opt.param_groups:
            group["lr"] = stages.lr(stage_step, done)
        ids, mask = batch_tokens(rng.sample(train_seqs, min(tc.seqs_per_step, len(train_seqs))), student.device)
        with _autocast(tc.amp, student.device):
            loss, stats = distill_loss(student, teacher, ids, mask, tc.hidden_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
        opt.step()
        history.append({**stats, "step": step, "stage": stages.stage})
        if progress:
            progress(step, history[-1])
        step, stage_step = step + 1, stage_step + 1
        if tc.eval_every_s and time.monotonic() - began >= next_eval:
            point(step)
            next_eval += tc.eval_every_s
    for p in student.parameters():
        p.requires_grad_(True)
    if not curve or curve[-1]["step"] != step:
        point(step)
    student.eval()
    window = max(1, min(20, len(history) // 5))
    mean = lambda rows, key: sum(r[key] for r in rows) / max(len(rows), 1)  # noqa: E731
    return {"curve": curve, "steps_done": step, "minutes": round((time.monotonic() - began) / 60, 3),
            "kl_start": mean(history[:window], "kl"), "kl_end": mean(history[-window:], "kl"),
            "train_config": dataclasses.asdict(tc)}


# ---------------------------------------------------------------------------------------------------------------
# saving: the whole student, or only what training changed (what a GPU run can send back)


def save_student(student: DenseTarget, folder, extra: dict[str, str | bytes] | None = None,
                 dtype: torch.dtype = torch.bfloat16, max_shard_bytes: int = 15_000_000) -> None:
    """A Qwen3.5-style folder (config.json + safetensors shards of <= max_shard_bytes) that `load_target` reads."""
    from specpilot.models.loading import save_target

    save_target(_cast(student, dtype), folder, extra, max_shard_bytes)


def changed_tensors(student: DenseTarget, base: DenseTarget, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The checkpoint tensors (Qwen3.5 names, in dtype) of the student that differ from the base's (the init)."""
    from specpilot.models.qwen3_5 import export

    mine, theirs = (export(_state(_cast(m, dtype)), m.cfg) for m in (student, base))
    return {k: v for k, v in mine.items() if not torch.equal(v, theirs[k])}


def assemble(changed: dict[str, torch.Tensor], base: DenseTarget, folder, extra: dict[str, str | bytes] | None = None,
             dtype: torch.dtype = torch.bfloat16, max_shard_bytes: int = 15_000_000) -> None:
    """The whole student's folder from its changed tensors and the init they changed from (`init_student` of the
    same teacher and seed, rebuilt where the teacher is): the same bits as the trained student saved whole."""
    from specpilot.models.qwen3_5 import convert, export

    tensors = export(_state(_cast(base, dtype)), base.cfg)
    unknown = sorted(set(changed) - set(tensors))
    if unknown:
        raise UserError(f"changed tensors that the student does not have: {unknown[:3]}")
    student = copy.deepcopy(base)
    student.load_state_dict(convert({**tensors, **changed}, base.cfg), strict=True)
    save_student(student, folder, extra, dtype, max_shard_bytes)


def _cast(model: DenseTarget, dtype: torch.dtype) -> DenseTarget:
    """The model in dtype (itself when it already is)."""
    return model if model.embed.weight.dtype == dtype else copy.deepcopy(model).to(dtype)


def _state(model: DenseTarget) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}
