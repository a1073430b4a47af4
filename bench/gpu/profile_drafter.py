"""Where issue 24's GPU time goes, on a random-weight model of SmolLM2-135M's shape (no staging needed).

Usage: PYTHONPATH=. python bench/gpu/profile_drafter.py [--rows 1024,2048] [--max-new 48] [--eager] [--tiny]
1. generation (training/distill.generate): eager decode steps against CUDA-graph replays, tokens compared;
2. a drafter training step (training/train_drafter, drafter.sh's shape: 3 layers, rank 32, 64 sequences x 16 blocks,
   bf16 autocast): steps per second, each phase timed apart (synchronised), and torch.profiler's kernels by
   CUDA time. Prints a short table last and writes $OUT/profile_drafter.json. --tiny: a CPU dry run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specpilot.fixtures.random_models import random_target
from specpilot.models.config import DenseConfig
from specpilot.results import environment
from specpilot.training import distill
from specpilot.training import train_drafter as td

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
               head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
               tie_word_embeddings=True)
TINY = dict(SMOLLM2, vocab_size=2048, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
            num_kv_heads=2, head_dim=16)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def generation(target, rows: int, max_new: int, rng: random.Random, eager: bool) -> dict:
    """Greedy answers to random prompts (no stop token: every row runs max_new steps), graphed (and eager)."""
    device, vocab = target.device, target.cfg.vocab_size
    prompts = sorted([[rng.randrange(vocab) for _ in range(rng.randint(20, 300))] for _ in range(rows)], key=len)
    out, answers = {}, {}
    for name, graph in (("eager", False), ("graph", True)) if eager else (("graph", True),):
        _sync(device)
        began = time.perf_counter()
        answers[name] = distill.generate(target, prompts, max_new, (), graph=graph)
        _sync(device)
        seconds = time.perf_counter() - began
        out[name] = {"seconds": round(seconds, 3), "tokens_per_s": round(rows * max_new / seconds)}
    if eager:
        out["graph_equals_eager"] = answers["graph"] == answers["eager"]
        out["rows_differing"] = sum(a != b for a, b in zip(answers["graph"], answers["eager"], strict=True))
    out["rows"], out["max_new"] = rows, max_new
    return out


def random_data(vocab: int, count: int, rng: random.Random, lo: int, hi: int) -> distill.Dataset:
    seqs, prompt_lens = [], []
    for _ in range(count):
        n = rng.randint(lo, hi)
        seqs.append([rng.randrange(vocab - 1) for _ in range(n)])
        prompt_lens.append(rng.randint(20, n // 3))
    return distill.Dataset(seqs, prompt_lens)


def training(target, tc: td.TrainConfig, ds: distill.Dataset, steps: int, profile_steps: int) -> dict:
    """The inner step of td.train, phase by phase (each phase synchronised, so their sum exceeds a free step)."""
    device = target.device
    drafter = td.random_drafter(td.drafter_config(target.cfg, tc), seed=0, dtype=torch.float32, device=device,
                                rope_length=max(len(s) for s in ds.sequences) + tc.block_size + 1)
    drafter.train()
    amp = tc.amp and device.type == "cuda"
    features = td.Features(target, tuple(drafter.cfg.target_layer_ids), torch.bfloat16 if amp else torch.float32)
    embed, head = td._float_weights(target)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4, betas=(0.9, 0.95))
    rng = random.Random(0)
    mask_id = drafter.cfg.mask_token_id
    phases = {k: 0.0 for k in ("batch", "forward", "loss", "backward", "optimizer")}

    def step(timed: bool) -> None:
        marks = [time.perf_counter()]

        def mark():
            if timed:
                _sync(device)
                marks.append(time.perf_counter())

        picks = [(i, td._anchors(ds, i, tc.blocks_per_seq, tc.block_size, rng, full=False))
                 for i in rng.sample(range(len(ds.sequences)), tc.seqs_per_step)]
        feats, tokens, anchors, labels = td.block_batch(ds, picks, tc.block_size, mask_id, device, features)
        mark()
        with td._autocast(amp, device):
            hidden = td.draft_hidden(drafter, embed, feats, tokens, anchors, tc.blocks_per_seq,
                                     cache_dtype=torch.bfloat16 if amp else None)
            mark()
            loss, _ = td.block_loss(drafter, hidden, head, tokens, labels, tc.loss_decay)
            mark()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        mark()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        mark()
        if timed:
            for name, a, b in zip(phases, marks[:-1], marks[1:], strict=True):
                phases[name] += b - a

    for _ in range(3):
        step(False)
    _sync(device)
    began = time.perf_counter()
    for _ in range(steps):
        step(False)
    _sync(device)
    free = (time.perf_counter() - began) / steps
    for _ in range(steps):
        step(True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(profile_steps):
            step(False)
        _sync(device)
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / profile_steps / 1e3 if device.type == "cuda" else None
    table = events.table(sort_by="cuda_time_total" if device.type == "cuda" else "cpu_time_total", row_limit=30,
                         max_name_column_width=70)
    launches = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / profile_steps
    return {"step_ms": round(free * 1e3, 2), "steps_per_s": round(1 / free, 2),
            "phases_ms": {k: round(v / steps * 1e3, 2) for k, v in phases.items()},
            "kernels_busy_ms_per_step": None if busy is None else round(busy, 2),
            "kernels_per_step": round(launches), "table": table}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1024", help="generation batch sizes, comma-separated")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--eager", action="store_true", help="also time eager decoding and compare the tokens")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="a small model on the CPU (a dry run of the script)")
    args = ap.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    cfg = DenseConfig(**(TINY if args.tiny else SMOLLM2))
    dtype = torch.float32 if args.tiny else torch.bfloat16
    target = random_target(cfg, seed=0, dtype=dtype, device=device, rope_length=1024)
    rng = random.Random(0)
    gen = [generation(target, 16 if args.tiny else int(r), 8 if args.tiny else args.max_new, rng, args.eager)
           for r in args.rows.split(",")]
    tc = td.TrainConfig(layers=3, selector_rank=32, seqs_per_step=4 if args.tiny else 64,
                        blocks_per_seq=4 if args.tiny else 16, amp=True)
    ds = random_data(cfg.vocab_size, 64 if args.tiny else 2000, rng, 60, 120 if args.tiny else 500)
    train = training(target, tc, ds, 2 if args.tiny else args.steps, 1 if args.tiny else 3)
    table = train.pop("table")
    record = {"environment": environment(), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
              "command": "python bench/gpu/profile_drafter.py " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                                        for k, v in vars(args).items()),
              "generation": gen, "training": train, "train_config": vars(tc), "profile_table": table}
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "profile_drafter.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(table)
    print(f"generation: {json.dumps(gen)}")
    print(f"training: {json.dumps(train)}")


if __name__ == "__main__":
    main()
