"""`distill`, `train-drafter` and `twin`: data, drafters and widened twins for a deployment's target."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from specpilot.cli.common import (
    DataDir,
    DeploymentFile,
    Preset,
    app,
    check_output_folder,
    console,
    err,
    interruptible,
    load_named,
    positive,
)
from specpilot.errors import UserError


def _provenance(target) -> dict:
    """When, where and by which code a file of data was made (results carry the same through results.py)."""
    import datetime

    import torch

    from specpilot.results import environment

    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": environment()["commit"], "command": " ".join(["specpilot", *sys.argv[1:]]),
            "gpu": torch.cuda.get_device_name() if target.device.type == "cuda" else None}


@app.command()
def distill(
    out: Annotated[Path, typer.Option(help="Data folder to write (token shards, prompts.jsonl.gz, meta.json).")],
    preset: Preset = None,
    deployment: DeploymentFile = None,
    templates: Annotated[int, typer.Option(help="Template prompts (training/corpus/ families).")] = 40_000,
    self_instruct: Annotated[int, typer.Option(help="Meta-prompts the target answers at a temperature to write "
                                                    "prompts itself (fewer survive parsing and the filters).")] = 0,
    follow_up_share: Annotated[float, typer.Option(help="Share of first turns given a second turn.")] = 0.2,
    heldout: Annotated[int, typer.Option(help="Held-out corpus prompts (never trained on).")] = 64,
    dev_limit: Annotated[int, typer.Option(help="Dev-half requests per benchmark answered for the learning "
                                                "curve (never trained on; 0: none).")] = 20,
    max_new_tokens: Annotated[int, typer.Option(help="Length of each answer.")] = 256,
    max_prompt_tokens: Annotated[int, typer.Option(help="Skip longer prompts.")] = 512,
    batch: Annotated[int, typer.Option(help="Rows generated at once.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed for the template draws and the sampling.")] = 0,
    max_minutes: Annotated[float, typer.Option(help="Stop answering new prompts after this long (what is done "
                                                    "is kept); 0 = answer them all.")] = 0.0,
    data_dir: DataDir = None,
) -> None:
    """Distil the deployment's target: prompts (templates and its own self-instruct ones, no benchmark item of
    any split), its greedy answers and second turns, and the dev-half answers for the learning curve."""
    from specpilot.runtime.pair import build_pair
    from specpilot.training.make_data import DataRecipe, Job

    dep = load_named(preset, deployment)
    positive(heldout=heldout, max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens, batch=batch)
    if templates < 0 or self_instruct < 0 or dev_limit < 0 or max_minutes < 0:
        raise UserError("--templates, --self-instruct, --dev-limit and --max-minutes must be >= 0")
    if templates + self_instruct <= heldout:
        raise UserError(f"--templates + --self-instruct must exceed --heldout ({heldout})")
    if not 0 <= follow_up_share <= 1:
        raise UserError(f"--follow-up-share must be in [0, 1], got {follow_up_share}")
    check_output_folder(out, "meta.json")
    recipe = DataRecipe(templates=templates, self_instruct=self_instruct, follow_up_share=follow_up_share,
                        heldout=heldout, dev_limit=dev_limit, max_new=max_new_tokens, max_prompt=max_prompt_tokens,
                        batch=batch, seed=seed, max_minutes=max_minutes)
    with interruptible(f"distilling interrupted: nothing was written ({out} was not touched)"):
        target, _, tok = build_pair(dep, with_drafter=False)
        data = Job(target, tok, recipe, data_dir, say=lambda line: err.print(f"[dim]{line}[/dim]")).run()
        data.meta.update(_provenance(target), target=str(dep.target.path or dep.name))
        data.save(out)
    counts = data.counts()["roles"]
    console.print(", ".join(f"{role}: {c['sequences']} sequences, {c['answer_tokens']} answer tokens"
                            for role, c in counts.items()) + f"; wrote {out}")


@app.command("train-drafter")
def train_drafter(
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write (Hugging Face layout + training.json + "
                                           "prompts.jsonl.gz, the prompts it was trained on).")],
    preset: Preset = None,
    deployment: DeploymentFile = None,
    data: Annotated[Path | None, typer.Option(help="A folder from `specpilot distill`; without it, template "
                                                   "prompts are distilled here first (--prompts).")] = None,
    prompts: Annotated[int, typer.Option(help="Without --data: template prompts to distil.")] = 2000,
    eval_prompts: Annotated[int, typer.Option(help="Without --data: held-out prompts.")] = 64,
    max_new_tokens: Annotated[int, typer.Option(help="Without --data: length of each answer.")] = 256,
    max_prompt_tokens: Annotated[int, typer.Option(help="Without --data: skip longer prompts.")] = 512,
    batch: Annotated[int, typer.Option(help="Without --data: rows generated at once.")] = 64,
    steps: Annotated[int, typer.Option(help="Optimizer steps (the learning rate's cosine spans them, or "
                                            "--max-minutes if that ends first).")] = 2000,
    kind: Annotated[str, typer.Option(help="The drafter's kind: dflash (a parallel block; DFlash2's selector "
                                           "with --selector-rank), dspark (DeepSpec's: a Markov head of "
                                           "--markov-rank and a confidence head) or eagle3 (one autoregressive "
                                           "layer over three target layers, trained with EAGLE-3's "
                                           "training-time test over --block-size - 1 steps).")] = "dflash",
    block_size: Annotated[int | None, typer.Option(help="Draft block size: dflash's and eagle3's anchor + B-1 "
                                                        "drafted tokens, dspark's B drafted tokens (DeepSpec's "
                                                        "count). Default: 16, eagle3 7.")] = None,
    layers: Annotated[int, typer.Option(help="Drafter layers (and taps of target layers).")] = 4,
    selector_rank: Annotated[int, typer.Option(help="DFlash2 selector rank (0: no selector; dflash only).")] = 64,
    markov_rank: Annotated[int, typer.Option(help="DSpark's Markov head rank (dspark only).")] = 64,
    draft_vocab: Annotated[int, typer.Option(help="EAGLE-3's draft vocabulary: the training answers' most frequent "
                                                  "tokens (0: the target's whole vocabulary; eagle3 only).")] = 8192,
    mask_token_id: Annotated[int | None, typer.Option(help="Mask token (default: the last vocabulary id).")] = None,
    seqs_per_step: Annotated[int, typer.Option(help="Sequences per optimizer step.")] = 16,
    blocks_per_seq: Annotated[int, typer.Option(help="Draft blocks (anchors) per sequence and step.")] = 16,
    amp: Annotated[bool, typer.Option(help="bf16 autocast on CUDA (the float32 reference path otherwise).")
                   ] = False,
    eval_every: Annotated[float, typer.Option(help="A learning-curve point (held-out and dev tau) every this "
                                                   "many seconds; 0 = only at the end.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for data order, init and sampling.")] = 0,
    max_minutes: Annotated[float, typer.Option(help="Stop training after this long (then evaluate and save); "
                                                     "0 = run every step.")] = 0.0,
    resume: Annotated[Path | None, typer.Option(help="Continue training this drafter checkpoint (its block size, "
                                                     "layers and selector are kept).")] = None,
    baseline: Annotated[Path | None, typer.Option(help="A drafter checkpoint scored on the same held-out and dev "
                                                       "data first, recorded beside the new one's figures.")] = None,
) -> None:
    """Train a drafter (DFlash-style, DSpark or EAGLE-3) for the deployment's target by self-distillation."""
    from specpilot.runtime.pair import build_pair
    from specpilot.training.data import DistilledData
    from specpilot.training.make_data import DataRecipe, Job
    from specpilot.training.train_drafter import run_training
    from specpilot.training.train_eagle3 import EAGLE3_BLOCK

    dep = load_named(preset, deployment)
    positive(prompts=prompts, eval_prompts=eval_prompts, max_new_tokens=max_new_tokens, steps=steps, layers=layers,
              batch=batch, seqs_per_step=seqs_per_step, blocks_per_seq=blocks_per_seq)
    if kind not in ("dflash", "dspark", "eagle3"):
        raise UserError(f"--kind must be dflash, dspark or eagle3, got {kind!r}")
    if block_size is None:
        block_size = EAGLE3_BLOCK if kind == "eagle3" else 16
    if block_size < (1 if kind == "dspark" else 2):
        raise UserError(f"--block-size must be at least {1 if kind == 'dspark' else 2} for {kind}, got {block_size}")
    if max_minutes < 0 or eval_every < 0 or selector_rank < 0 or markov_rank < 1 or draft_vocab < 0:
        raise UserError("--max-minutes, --eval-every, --selector-rank and --draft-vocab must be >= 0, "
                        "--markov-rank >= 1")
    if resume is not None and not resume.is_dir():
        raise UserError(f"--resume: drafter checkpoint folder not found: {resume}")
    for name, folder in (("data", data), ("baseline", baseline)):
        if folder is not None and not folder.is_dir():
            raise UserError(f"--{name}: folder not found: {folder}")
    check_output_folder(out, "training.json")
    with interruptible(f"training interrupted: no checkpoint was written ({out} was not touched)"):
        target, _, tok = build_pair(dep, with_drafter=False)
        _fits_target(target.cfg, layers if resume is None else 1, mask_token_id)  # resumed: the checkpoint's
        if data is not None:
            distilled = DistilledData.load(data)
        else:
            recipe = DataRecipe(templates=prompts + eval_prompts, self_instruct=0, follow_up_share=0.0,
                                heldout=eval_prompts, dev_limit=0, max_new=max_new_tokens,
                                max_prompt=max_prompt_tokens, batch=batch, seed=seed)
            distilled = Job(target, tok, recipe, say=lambda line: err.print(f"[dim]{line}[/dim]")).run()
        metrics = run_training(dep, out, console=err, data=distilled, steps=steps, block_size=block_size,
                               layers=layers, selector_rank=selector_rank, mask_token_id=mask_token_id, seed=seed,
                               max_minutes=max_minutes, resume=resume, kind=kind, markov_rank=markov_rank,
                               draft_vocab=draft_vocab,
                               seqs_per_step=seqs_per_step,
                               blocks_per_seq=blocks_per_seq, amp=amp, eval_every_s=eval_every, target=target,
                               baseline=baseline)
    dev = metrics.get("dev")
    console.print(f"held-out tau {metrics['tau']:.3f} (oracle over top-{metrics['top_k']} lattice "
                  f"{metrics['oracle_tau_top_k']:.3f}) on {metrics['blocks']} blocks"
                  + (f"; dev replay tau {dev['tau']:.3f} (oracle {dev['oracle_tau_top_k']:.3f})" if dev else "")
                  + f" after {metrics['steps_done']} steps; wrote {out}")


def _fits_target(cfg, layers: int, mask_token_id: int | None) -> None:
    """A drafter's layers each tap a target layer; its mask token is one of the target's ids."""
    if layers > cfg.num_layers:
        raise UserError(f"--layers {layers}: the target has {cfg.num_layers} layers for the drafter to tap")
    if mask_token_id is not None and not 0 <= mask_token_id < cfg.vocab_size:
        raise UserError(f"--mask-token-id must be a token id of the target (0..{cfg.vocab_size - 1}), "
                        f"got {mask_token_id}")


@app.command()
def twin(
    target: Annotated[Path, typer.Option(help="Target checkpoint folder.")],
    out: Annotated[Path, typer.Option(help="Folder to write: <out>/target and <out>/drafter (an earlier twin there "
                                           "is replaced as a whole).")],
    width: Annotated[int, typer.Option(help="Repeat every hidden unit, head and MLP unit this many times.")],
    drafter: Annotated[Path | None, typer.Option(help="Its drafter's checkpoint folder, DFlash-style or EAGLE-3 "
                                                        "(widened alike, written in its own layout).")] = None,
    depth: Annotated[int | None, typer.Option(help="Pad to this many layers with layers that change nothing.")
                     ] = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16 for the written weights.")] = "bfloat16",
) -> None:
    """Write a function-preserving widened twin of a target (and drafter, DFlash-style or EAGLE-3): same logits, more
    bytes."""
    import torch

    from specpilot.models.eagle3 import check_eagle3_pair, is_eagle3, load_eagle3, save_eagle3
    from specpilot.models.loading import load_drafter, load_target, save_drafter, save_target
    from specpilot.models.twin import widen_drafter, widen_eagle3, widen_target
    from specpilot.results import folder_atomic

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise UserError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    if width < 1:
        raise UserError(f"--width must be at least 1, got {width}")
    check_output_folder(out, "target")
    small = load_target(target, torch.float32)
    if depth is not None and depth < small.cfg.num_layers:
        raise UserError(f"--depth {depth} is below the target's {small.cfg.num_layers} layers")
    eagle3 = drafter is not None and is_eagle3(drafter)
    d = None  # both checked before any write
    if eagle3:
        d = load_eagle3(drafter, torch.float32, target_layers=small.cfg.num_layers)
        try:
            check_eagle3_pair(small.cfg, d.cfg)
        except UserError as e:
            raise UserError(f"{drafter} is not a drafter of {target}: {e}") from None
    elif drafter is not None:
        d = load_drafter(drafter, torch.float32)
        if d.cfg.layer.hidden_size != small.cfg.hidden_size:
            raise UserError(f"{drafter} is not a drafter of {target}: hidden size {d.cfg.layer.hidden_size} against "
                            f"{small.cfg.hidden_size}")
    with interruptible(f"twin interrupted: nothing was written ({out} was not touched)"), folder_atomic(out) as tmp:
        save_target(widen_target(small, width, depth).to(dtypes[dtype]), tmp / "target")
        if eagle3:  # depth pads after the source's layers: the taps keep their indices
            save_eagle3(widen_eagle3(d, width).to(dtypes[dtype]), tmp / "drafter")
        elif d is not None:
            save_drafter(widen_drafter(d, width, depth).to(dtypes[dtype]), tmp / "drafter")
    console.print(f"wrote {out / 'target'}" + (f" and {out / 'drafter'}" if d is not None else ""), markup=False)
