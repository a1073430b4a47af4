"""The pieces of a tree step on the GPU, each captured as a CUDA graph and timed alone (issue 25's c(N)).

Usage: PYTHONPATH=. python bench/gpu/tree_step.py --deployment bench/gpu/smollm2-pair.toml [--nodes 8,16,...]
       [--tiny] (a CPU dry run of the script on the tiny preset, without graphs or timing)

On a real request's state (a GSM8K-style prompt prefilled, then the drafter's lattice at its anchor):
1. correctness: each builder's tree is valid (parents first, N rows), and a tree mask that lets every row see
   all earlier rows gives the causal chain's argmax (the same tokens at the same positions see the same slots);
2. times: the AR step, the drafter's lattice, each builder at each N, the target's verify of N rows as a chain
   and as the best_first tree (the tree mask's cost), and the tree's acceptance walk + commit.
Prints a short table last and writes $OUT/tree_step.json.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from specpilot.config import parse_system
from specpilot.core.contracts import Forward, Proposal, Visibility
from specpilot.deployment import load_deployment
from specpilot.models.dense import Mode
from specpilot.results import environment
from specpilot.runtime.engine import Engine
from specpilot.runtime.graphs import replay_ms
from specpilot.runtime.pair import build_pair
from specpilot.speculative.accept import accept_tree
from specpilot.speculative.tree import BUILDERS, TreeBuilder

PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether in April and May? Explain each step of your reasoning.")


def timed(fn, device, reps: int = 20) -> float | None:
    if device.type != "cuda":
        fn()
        return None
    return round(replay_ms(fn, lambda: None, reps), 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deployment", default="bench/gpu/smollm2-pair.toml")
    ap.add_argument("--nodes", default="8,16,24,32,48,64")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    dep = load_deployment("tiny", None) if args.tiny else load_deployment(None, args.deployment)
    target, drafter, tok = build_pair(dep, with_drafter=True)
    device = target.device
    engine = Engine(target, drafter, parse_system("stock"), context=dep.context)
    prompt = tok.chat_prompt([{"role": "user", "content": PROMPT}])
    with torch.inference_mode():
        gen = engine.generate_one(prompt, 64, ())  # real context in both caches
        start = engine.pos.clone()
        lattice = engine.spec.proposer.lattice(engine.token, start)
        rows = {"ar_step_ms": timed(engine._ar_step, device), "lattice_ms": timed(
            lambda: engine.spec.proposer.lattice(engine.token, start), device)}
        depth, width = lattice.depth, lattice.width
        checks, builders, verify = [], {}, {}
        for n in [int(x) for x in args.nodes.split(",")]:
            for name in BUILDERS:
                b = TreeBuilder(name, n, depth, width)
                tree = b(lattice)
                ok = bool((tree.parents[:, 1:] < torch.arange(1, b.rows, device=device)).all())
                checks.append({"builder": name, "nodes": n, "rows": b.rows, "valid": ok})
                builders[f"{name}@{n}"] = timed(lambda b=b: b(lattice), device)
                if name in ("best_first", "ddtree"):  # the one-launch kernel (the engine's path) against the reference
                    fast = TreeBuilder(name, n, depth, width, plan=engine.plan)
                    got = fast(lattice)
                    same = all(torch.equal(getattr(got, f), getattr(tree, f)) for f in ("parents", "depth", "cand",
                                                                                        "tokens"))
                    valid = got.seen is not None and same and torch.equal(got.seen, tree.ancestors(depth))
                    checks.append({"builder": name + "_kernel", "nodes": n, "rows": fast.rows, "valid": valid})
                    builders[f"{name}_kernel@{n}"] = timed(lambda b=fast: b(lattice), device)
            verify[str(n)] = verify_times(engine, lattice, start, n, device)
    record = {"environment": environment(), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
              "deployment": dep.name, "prompt_tokens": len(prompt), "generated": len(gen.tokens),
              "position": int(start), "checks": checks, "times_ms": rows, "builders_ms": builders,
              "verify_ms": verify}
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "tree_step.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"checks: {sum(c['valid'] for c in checks)}/{len(checks)} valid; "
          f"chain rows == tree logits: {all(v['chain_rows_equal'] for v in verify.values())}")
    print(f"AR step {rows['ar_step_ms']} ms, lattice {rows['lattice_ms']} ms")
    names = list(BUILDERS) + ["best_first_kernel", "ddtree_kernel"]
    print("N    verify chain / tree ms   walk+commit ms   " + "  ".join(f"{b[:12]:>12s}" for b in names))
    for n, v in verify.items():
        print(f"{n:>3s}  {v['chain_ms']} / {v['tree_ms']}   {v['walk_commit_ms']}   "
              + "  ".join(f"{builders[f'{b}@{n}']!s:>12s}" for b in names))


def verify_times(engine: Engine, lattice, start: torch.Tensor, n: int, device) -> dict:
    """The target's verify of n rows as a chain and as the best_first tree, and the tree's walk + commit."""
    tree = TreeBuilder("best_first", n, lattice.depth, lattice.width)(lattice)
    seen = tree.ancestors(lattice.depth)
    index = torch.arange(n, device=device)
    target, plan, cache = engine.target, engine.plan, engine.cache

    def chain():
        rows = start[:, None] + index
        return target(tree.tokens, Forward(rows, rows, Visibility(start, start)), cache, Mode.VERIFY, plan,
                      engine.spec.hidden_layers)

    def as_tree():
        meta = Forward(start[:, None] + tree.depth, start[:, None] + index, Visibility(start, start, tree=seen))
        return target(tree.tokens, meta, cache, Mode.VERIFY, plan, engine.spec.hidden_layers)

    # A chain of these tokens at consecutive positions and a tree of them in which every row sees all earlier
    # rows, at the same positions, must give the same logits: the tree mask path against the causal one.
    full = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None]
    rows = start[:, None] + index
    same, _ = target(tree.tokens, Forward(rows, rows, Visibility(start, start, tree=full)), cache, Mode.VERIFY, plan,
                     engine.spec.hidden_layers)
    ref, _ = chain()
    proposal = Proposal(tokens=tree.tokens, positions=start[:, None] + tree.depth, slots=start[:, None] + index,
                        visibility=Visibility(start, start, tree=seen), parents=tree.parents, index=index,
                        chain=False, path_rows=lattice.depth + 1)
    logits, _ = as_tree()
    saved_k, saved_v = cache[0]._k.clone(), cache[0]._v.clone()

    def walk_commit():
        verdict = accept_tree(proposal, logits.argmax(-1))
        cache.commit(verdict.path, verdict.accepted, start)

    out = {"chain_ms": timed(chain, device), "tree_ms": timed(as_tree, device),
           "walk_commit_ms": timed(walk_commit, device),
           "chain_rows_equal": bool(torch.equal(same.argmax(-1), ref.argmax(-1))),
           "chain_rows_max_diff": float((same.float() - ref.float()).abs().max())}
    cache[0]._k.copy_(saved_k)
    cache[0]._v.copy_(saved_v)
    return out


if __name__ == "__main__":
    main()
