"""Token forcing's pieces timed one by one on a GPU: each system's first and second request (warm-up, then a
plain run), and scoring one output under the float32 model twice (compile, then a plain pass)."""

import sys
import time

import torch

from specpilot.bench.harness import Runner
from specpilot.config.env import parse
from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.forcing.run import ExactTargets
from specpilot.forcing.score import score_output
from specpilot.runtime.pair import build_pair


def timed(what, fn):
    torch.cuda.synchronize()
    t = time.time()
    out = fn()
    torch.cuda.synchronize()
    print(f"{what}: {time.time() - t:.2f}s", flush=True)
    return out


def main() -> None:
    dep = load_deployment("smollm2", None)
    reqs = [r for d in ("gsm8k", "humaneval") for r in load_requests(d, "dev", None, 1)]
    target, drafter, tok = build_pair(dep)
    runner = Runner(target, drafter, tok, dep.context, max_engines=8)
    exact = timed("float32 model", lambda: ExactTargets(dep).target("float32"))
    for name in ("stock", "ar", "ar:gemv=true"):
        recs = timed(f"{name} request 1", lambda n=name: runner.run(parse(n), reqs[0], 256))
        timed(f"{name} request 2", lambda n=name: runner.run(parse(n), reqs[1], 256))
    for k in range(3):
        timed(f"score {k}", lambda k=k: score_output(exact, recs[0].prompt, recs[0].tokens[: 200 + k]))


def noise() -> None:
    """margin_noise on the deployment's target: every perturbation, then each alone, on one 16-token output."""
    from specpilot.config.plan import KernelPlan
    from specpilot.forcing.noise import _gaps

    dep = load_deployment("smollm2", None)
    req = load_requests("gsm8k", "dev", None, 1)[0]
    target, drafter, tok = build_pair(dep)
    runner = Runner(target, drafter, tok, dep.context, max_engines=8)
    rec = runner.run(parse("ar"), req, 16)[0]
    for name, plan, rows in (("stock", KernelPlan.stock(), 16), ("rows=1", KernelPlan.stock(), 1),
                             ("naive", KernelPlan.stock(kernels="naive"), 16),
                             ("gemv,rows=1", KernelPlan.stock(gemv=True), 1),
                             ("gemv,rows=1 again", KernelPlan.stock(gemv=True), 1)):
        timed(name, lambda p=plan, r=rows: _gaps(target, rec.prompt, rec.tokens, r, p))


if __name__ == "__main__":
    noise() if sys.argv[1:] == ["noise"] else main()
