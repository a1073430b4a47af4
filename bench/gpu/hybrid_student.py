"""The hybrid distilled student of SmolLM2 (specpilot/training/hybrid_student.py): train, check, assemble.

    train     --out DIR [--changed DIR] [--data .cache/distill] [--minutes M] ...: distil the student from the
              teacher for M minutes, print the learning curve, save the whole student (Qwen3.5-style folder, shards
              <= 15 MB, the teacher's tokenizer beside it) at --out and what training changed (the GDN layers
              after stage 1, ~41 MB in bf16) at --changed: the whole student (270 MB) cannot come back from a run
    check     --student DIR [--prompts N] [--json FILE]: the student loaded as a target and run by the engine (AR):
              greedy agreement with the teacher on dev prompts, and both models' AR tokens/s
    assemble  --changed DIR --out DIR: here, the whole student from what came back and the local teacher
--tiny: a random 8-layer teacher and random sequences instead of SmolLM2 and its distilled data (the CPU dry run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, with or without PYTHONPATH

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from specpilot.config import parse_system  # noqa: E402
from specpilot.fixtures.random_models import random_target, tiny_target_config  # noqa: E402
from specpilot.models.loading import load_target  # noqa: E402
from specpilot.runtime.engine import Engine  # noqa: E402
from specpilot.training import hybrid_student as hs  # noqa: E402

TEACHER = "bench/gpu/smollm2-target.toml"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mtbench")


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def teacher(args) -> tuple[torch.nn.Module, Path | None]:
    """(the teacher in float32, its folder or None for the tiny random one)."""
    if args.tiny:
        return random_target(tiny_target_config(num_layers=8), seed=0, device=device()), None
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import fetch_if_known

    folder = load_deployment(path=args.teacher).target.path
    fetch_if_known(folder)
    return load_target(folder, torch.float32, device(), rope_length=args.context + 1), folder


def sequences(args) -> tuple[list[list[int]], list[list[int]]]:
    """(train, held-out) token sequences: the distilled data's, or random ones (--tiny)."""
    if args.tiny:
        gen = torch.Generator().manual_seed(1)
        seqs = [torch.randint(0, 512, (int(n),), generator=gen).tolist()
                for n in torch.randint(16, 64, (96,), generator=gen)]
        return seqs[:80], seqs[80:]
    from specpilot.training.data import DistilledData

    data = DistilledData.load(args.data)
    return data.split("train").sequences, data.split("heldout").sequences


def train(args) -> None:
    model, folder = teacher(args)
    student = hs.init_student(model, args.attention_every, seed=args.seed)
    print(f"student: {student.cfg.kinds.count('gdn')} GDN + {student.cfg.kinds.count('attention')} attention layers, "
          f"GDN {student.cfg.gdn}, {hs.param_count(student) / 1e6:.1f}M parameters", flush=True)
    train_seqs, eval_seqs = sequences(args)
    tc = hs.StudentTrainConfig(minutes=args.minutes, steps=args.steps, seqs_per_step=args.seqs, max_len=args.max_len,
                               lr=args.lr, lr_all=args.lr_all, stage1_fraction=args.stage1,
                               hidden_weight=args.hidden_weight, eval_every_s=args.eval_every, seed=args.seed)

    def show(step: int, stats: dict) -> None:
        if "eval" in stats:
            e = stats["eval"]
            print(f"curve step {step:6d} stage {e['stage']} {e['minutes']:7.2f} min  held-out KL {e['kl']:.4f}  "
                  f"agreement {e['agreement']:.4f}", flush=True)
        elif step % args.log_every == 0:
            print(f"step {step:6d} stage {stats['stage']} loss {stats['loss']:.4f} KL {stats['kl']:.4f} "
                  f"agreement {stats['agreement']:.3f}", flush=True)

    metrics = hs.train(student, model, train_seqs, eval_seqs, tc, show)
    record = {"what": "a distilled hybrid student (GDN + attention) of " + ("a tiny random teacher" if args.tiny
              else "SmolLM2-135M-Instruct") + "; not a released model", "teacher": str(folder or "tiny random"),
              "attention_every": args.attention_every, "seed": args.seed, "gdn": vars(student.cfg.gdn),
              "train_sequences": len(train_seqs), "heldout_sequences": len(eval_seqs), "metrics": metrics,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    extra = {"training.json": json.dumps(record, indent=1) + "\n"}
    for name in TOKENIZER_FILES if folder else ():
        if (folder / name).is_file():
            extra[name] = (folder / name).read_bytes()
    hs.save_student(student, args.out, extra)
    print(f"saved the student to {args.out}")
    if args.changed:
        base = hs.init_student(model, args.attention_every, seed=args.seed)
        save_changed(hs.changed_tensors(student, base), Path(args.changed), record)


def save_changed(tensors: dict, folder: Path, record: dict, max_bytes: int = 15_000_000) -> None:
    """The changed tensors in shards of <= max_bytes, and the record that says how to rebuild the rest."""
    folder.mkdir(parents=True, exist_ok=True)
    shards, size = [{}], 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards, size = shards + [{}], 0
        shards[-1][name], size = t.contiguous(), size + nbytes
    for i, shard in enumerate(shards):
        save_file(shard, str(folder / f"changed-{i:05d}.safetensors"))
    (folder / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"changed tensors: {len(tensors)}, {total / 1e6:.1f} MB in {len(shards)} shards -> {folder}")


def assemble(args) -> None:
    record = json.loads((Path(args.changed) / "training.json").read_text())
    model, folder = teacher(args)
    base = hs.init_student(model, record["attention_every"], seed=record["seed"])
    changed = {}
    for path in sorted(Path(args.changed).glob("changed-*.safetensors")):
        changed.update(load_file(str(path)))
    extra = {"training.json": json.dumps(record, indent=1) + "\n"}
    for name in TOKENIZER_FILES if folder else ():
        if (folder / name).is_file():
            extra[name] = (folder / name).read_bytes()
    hs.assemble(changed, base, args.out, extra)
    print(f"assembled the student ({len(changed)} changed tensors) at {args.out}")


def prompts(args, tokenizer) -> list[list[int]]:
    if args.tiny:
        gen = torch.Generator().manual_seed(2)
        return [torch.randint(0, 512, (12,), generator=gen).tolist() for _ in range(args.prompts)]
    from specpilot.datasets import load_requests

    per = max(1, args.prompts // len(DATASETS))
    reqs = [r for d in DATASETS for r in load_requests(d, "dev", limit=per)]
    return [tokenizer.chat_prompt([{"role": "user", "content": r.turns[0]}]) for r in reqs]


def check(args) -> None:
    model, folder = teacher(args)
    dtype = torch.bfloat16 if device().type == "cuda" else torch.float32
    student = load_target(args.student, dtype, device(), rope_length=args.context + 1)  # as build_pair loads it
    model = model.to(dtype)
    tokenizer = None
    if folder is not None:
        from specpilot.models.tokenizer import HFTokenizer

        tokenizer = HFTokenizer(args.student)  # the student folder's own copy of the teacher's
    stops = tuple(tokenizer.eos_ids) if tokenizer else ()
    engines = {name: Engine(m, None, parse_system("ar"), context=args.context) for name, m in
               (("teacher", model), ("student", student))}
    rows, speed = [], {}
    for engine in engines.values():
        engine.warmup()
    for ids in prompts(args, tokenizer):
        gens = {name: e.generate_one(ids, args.max_new, stops) for name, e in engines.items()}
        want, got = gens["teacher"].tokens, gens["student"].tokens
        common = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
        rows.append({"prompt_tokens": len(ids), "teacher_tokens": len(want), "common_prefix": common,
                     "forced_agreement": forced_agreement(student, model, ids + want)})
        for name, g in gens.items():
            speed.setdefault(name, [0, 0.0])
            speed[name][0] += g.decode_tokens
            speed[name][1] += g.decode_s
    tps = {name: n / max(s, 1e-9) for name, (n, s) in speed.items()}
    out = {"student": str(args.student), "device": str(device()), "prompts": len(rows),
           "forced_agreement": sum(r["forced_agreement"] for r in rows) / max(len(rows), 1),
           "mean_common_prefix": sum(r["common_prefix"] for r in rows) / max(len(rows), 1),
           "ar_tokens_per_s": tps, "rows": rows}
    print(f"greedy agreement with the teacher along its answers: {out['forced_agreement']:.4f}; mean common prefix of "
          f"the two greedy answers: {out['mean_common_prefix']:.1f} tokens; AR tokens/s: student "
          f"{tps['student']:.1f}, teacher {tps['teacher']:.1f} ({device()})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


@torch.no_grad()
def forced_agreement(student, model, seq: list[int]) -> float:
    """The share of the answer's positions where the student's greedy next token is the teacher's (teacher forced)."""
    ids, mask = hs.batch_tokens([seq], student.device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=student.device.type == "cuda"):
        s, _ = hs.forward(student, ids)
        t, _ = hs.forward(model, ids)
    return float(((s.argmax(-1) == t.argmax(-1)) & mask).sum() / mask.sum().clamp(min=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("train", "check", "assemble"))
    p.add_argument("--tiny", action="store_true", help="a random tiny teacher and random sequences (CPU dry run)")
    p.add_argument("--teacher", default=TEACHER, help="the teacher's deployment file")
    p.add_argument("--data", default=".cache/distill")
    p.add_argument("--out", default=".models/smollm2-hybrid")
    p.add_argument("--changed", default=None)
    p.add_argument("--student", default=".models/smollm2-hybrid")
    p.add_argument("--minutes", type=float, default=7.0)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seqs", type=int, default=16)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-all", type=float, default=1e-4)
    p.add_argument("--stage1", type=float, default=1.0, help="share of the run training only the GDN layers")
    p.add_argument("--hidden-weight", type=float, default=0.0)
    p.add_argument("--attention-every", type=int, default=4)
    p.add_argument("--eval-every", type=float, default=60.0)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    began = time.monotonic()
    {"train": train, "check": check, "assemble": assemble}[args.part](args)
    print(f"{args.part}: {time.monotonic() - began:.1f} s")


if __name__ == "__main__":
    main()
