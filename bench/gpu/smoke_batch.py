"""A first look at the batch executor and the hybrid target on CUDA (random tiny models, float32, no staging):
each system's batched outputs under CUDA graphs (a graph per batch size and kind) against its single-request
outputs, greedy and sampled, on a dense pair and on a hybrid. Prints one line a case; writes $OUT/smoke_batch.json.

    PYTHONPATH=. python3 bench/gpu/smoke_batch.py
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import torch

from specpilot.config import parse_system
from specpilot.core.contracts import Prompted, Sampling
from specpilot.fixtures.random_models import (
    random_drafter,
    random_target,
    tiny_drafter_config,
    tiny_hybrid_config,
    tiny_target_config,
)
from specpilot.runtime.engine import Engine

VOCAB, CONTEXT = 24, 160
SYSTEMS = ["ar", "stock", "stock:tree=best_first,nodes=10", "stock:tree=ddtree,nodes=8"]


def pair(hybrid: bool):
    make = tiny_hybrid_config if hybrid else tiny_target_config
    tcfg = make(vocab=VOCAB, max_position_embeddings=256)
    target = random_target(tcfg, seed=3, device="cuda")
    dcfg = tiny_drafter_config(tcfg, target_layer_ids=[0, 3], block_size=4, selector_rank=8, selector_top_k=4)
    return target, random_drafter(dcfg, seed=4, device="cuda")


def requests(seed: int, n: int) -> list[Prompted]:
    rng = random.Random(seed)
    return [Prompted([rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))], rng.randint(4, 40), (),
                     Sampling(0.9, 0.95, 0, 100 + i) if i % 3 == 1 else None) for i in range(n)]


def main() -> None:
    rows = []
    for hybrid in (False, True):
        target, drafter = pair(hybrid)
        reqs = requests(int(hybrid), 9)
        for system in SYSTEMS:
            t0 = time.time()
            sys_ = parse_system(system)
            single = Engine(target, drafter, sys_, context=CONTEXT)
            alone = [g.tokens for g in single.generate(reqs)]
            batch = Engine(target, drafter, sys_, context=CONTEXT, slots=4)
            together = [g.tokens for g in batch.generate(reqs, arrivals=[0, 0, 1, 2, 2, 5, 8, 8, 9])]
            equal = sum(a == b for a, b in zip(alone, together, strict=True))
            row = {"hybrid": hybrid, "system": system, "equal": equal, "of": len(reqs),
                   "graphs": batch.use_graphs, "seconds": round(time.time() - t0, 1)}
            rows.append(row)
            print(f"{'hybrid' if hybrid else 'dense '} {system:34s} batched = single: {equal}/{len(reqs)} "
                  f"({row['seconds']} s, graphs {batch.use_graphs})", flush=True)
    out = Path(os.environ.get("OUT", "/tmp")) / "smoke_batch.json"
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("SPECPILOT_COMMIT"),
                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
