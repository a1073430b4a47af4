"""Smoke test of the float32 check on a GPU: the float32 pair's build, one AR request, a few candidates, timed."""

import time

import torch

from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.forcing.logic import LogicCheck

CANDIDATES = ["stock:tree=best_first,nodes=32", "stock:tree=eagle2,nodes=32", "ar:gemv=true", "stock:fault=low_head",
              "stock:fault=kv_low"]


def main() -> None:
    dep = load_deployment("smollm2", None)
    reqs = [r for d in ["gsm8k", "humaneval", "mtbench"] for r in load_requests(d, "dev", None, 1)]
    t = time.time()
    check = LogicCheck(dep)
    print("float32 pair built", f"{time.time() - t:.1f}s", check.runner.target.embed.weight.device, flush=True)
    t = time.time()
    check.ar(reqs[0], 64)
    print("one AR request", f"{time.time() - t:.1f}s", flush=True)
    for s in CANDIDATES:
        t = time.time()
        out = check.check(s, reqs, 64)
        print(s, out["verdict"], out.get("ran_as"), out["reason"][:160], f"{time.time() - t:.1f}s", flush=True)
    print(check._noise, check._eps, torch.cuda.max_memory_allocated() / 1e9)


if __name__ == "__main__":
    main()
