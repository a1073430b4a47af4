"""A first look at the batch executor and the hybrid target on CUDA (random tiny models, float32, no staging):
each system's batched outputs under CUDA graphs (a graph per batch size and kind) against its single-request
outputs, greedy and sampled, on a dense pair, on a hybrid, and with an EAGLE-3 drafter on the dense target (its
steps captured: a host sync inside them fails the capture). Prints one line a case (a failure: its first exception
and traceback, then the case again without graphs); writes $OUT/smoke_batch.json.

    PYTHONPATH=. python3 bench/gpu/smoke_batch.py
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

import torch

from specpilot.config import parse_system
from specpilot.core.contracts import Prompted, Sampling
from specpilot.fixtures.random_models import (
    random_drafter,
    random_eagle3,
    random_target,
    tiny_drafter_config,
    tiny_hybrid_config,
    tiny_target_config,
)
from specpilot.runtime.engine import Engine

VOCAB, CONTEXT = 24, 160
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a dry run of the script (no graphs)
# SYSTEMS="a|b" names others; issue 59's mechanisms: a chain's budget, a tree's budget chosen each step, admission
SYSTEMS = os.environ.get("SYSTEMS", "ar|stock|stock:tree=best_first,nodes=10|stock:tree=ddtree,nodes=8|"
                         "stock:batch_budget=6|stock:tree=best_first,nodes=10,batch_rows=auto|stock:admit=true|"
                         "stock:tree=best_first,nodes=10,admit=true|"
                         "stock:tree=best_first,nodes=10,admit=true,batch_rows=auto").split("|")
# EAGLE-3's: its stock (the release's eagle2 tree), its chain, a best_first tree with a budget, admission
EAGLE3 = os.environ.get("EAGLE3", "stock|stock:nodes=7|stock:tree=best_first,nodes=10,batch_rows=auto|"
                        "stock:admit=true").split("|")


def pair(kind: str):
    """kind: dense, hybrid (the target) or eagle3 (the drafter, on the dense target)."""
    make = tiny_hybrid_config if kind == "hybrid" else tiny_target_config
    tcfg = make(vocab=VOCAB, max_position_embeddings=256)
    target = random_target(tcfg, seed=3, device=DEVICE)
    if kind == "eagle3":
        return target, random_eagle3(tcfg, draft_vocab=16, seed=4, device=DEVICE)
    dcfg = tiny_drafter_config(tcfg, target_layer_ids=[0, 3], block_size=4, selector_rank=8, selector_top_k=4)
    return target, random_drafter(dcfg, seed=4, device=DEVICE)


def requests(seed: int, n: int) -> list[Prompted]:
    rng = random.Random(seed)
    return [Prompted([rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))], rng.randint(4, 40), (),
                     Sampling(0.9, 0.95, 0, 100 + i) if i % 3 == 1 else None) for i in range(n)]


def case(target, drafter, system: str, reqs: list[Prompted]) -> dict:
    sys_ = parse_system(system)
    single = Engine(target, drafter, sys_, context=CONTEXT)
    alone = [g.tokens for g in single.generate(reqs)]
    batch = Engine(target, drafter, sys_, context=CONTEXT, slots=4)
    together = [g.tokens for g in batch.generate(reqs, arrivals=[0, 0, 1, 2, 2, 5, 8, 8, 9])]
    return {"equal": sum(a == b for a, b in zip(alone, together, strict=True)), "of": len(reqs),
            "graphs": batch.use_graphs}


def failure(exc: BaseException) -> dict:
    """The first exception of the chain (a failed capture reports only "a previous error during capture"), with
    its traceback: the next lease's evidence."""
    root = exc
    while root.__context__ is not None and root.__context__ is not root:
        root = root.__context__
    return {"error": f"{type(root).__name__}: {str(root).splitlines()[0] if str(root) else ''}"[:400],
            "traceback": "".join(traceback.format_exception(root))[-6000:]}


def main() -> None:
    rows = []
    for kind, systems in (("dense", SYSTEMS), ("hybrid", SYSTEMS), ("eagle3", EAGLE3)):
        target, drafter = pair(kind)
        reqs = requests(kind == "hybrid", 9)
        for system in systems:
            # each system as it is, then without graphs where that failed: which part broke
            for name in (system, with_graphs_off(system)):
                t0 = time.time()
                try:
                    row = {"kind": kind, "system": name, **case(target, drafter, name, reqs)}
                except Exception as exc:  # noqa: BLE001 (a smoke run: every case is tried, each failure kept)
                    row = {"kind": kind, "system": name, **failure(exc)}
                    if DEVICE == "cuda":
                        torch.cuda.synchronize()  # (raises where the failure left the context broken)
                row["seconds"] = round(time.time() - t0, 1)
                rows.append(row)
                if "error" in row:
                    print(f"{kind:6s} {name:48s} FAILED: {row['error']}\n{row['traceback']}", flush=True)
                else:
                    print(f"{kind:6s} {name:48s} batched = single: {row['equal']}/{row['of']} ({row['seconds']} s, "
                          f"graphs {row['graphs']})", flush=True)
                    break
    out = Path(os.environ.get("OUT", "/tmp")) / "smoke_batch.json"
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    head = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu, "commit": os.environ.get("SPECPILOT_COMMIT"),
            "command": " ".join(["python3", *sys.argv])}
    out.write_text(json.dumps({**head, "rows": rows}, indent=1))


def with_graphs_off(system: str) -> str:
    return system + ("," if ":" in system else ":") + "graphs=false"


if __name__ == "__main__":
    main()
