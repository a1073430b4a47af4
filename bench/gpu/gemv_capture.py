"""Why the loop's GEMV systems fail their graph capture on the H100 (2026-12-06: "operation failed due to a previous
error during capture" for ar:gemv=true and stock:gemv=true in the loop's survey, while `specpilot bench` in the same
lease ran ar:gemv=true at 2.07x). The step timing of ar:gemv=true as the survey makes it, in a fresh process
(`fresh`) or after the loop's Phase 0 ceiling of stock (`loop`); the full traceback of a failure."""

import sys
import time
import traceback
from pathlib import Path

from specpilot.bench.harness import Runner
from specpilot.ceiling.run import step_seconds
from specpilot.config.env import parse
from specpilot.deployment import load_deployment


def main() -> None:
    mode = sys.argv[1]
    dep = load_deployment("smollm2", None)
    if mode == "loop":
        from specpilot.loop.main import LoopArgs, build_loop

        args = LoopArgs(dep, {"preset": "smollm2"}, Path(f"/tmp/gemv-capture-{time.time():.0f}"), 1, "builtin",
                        dep.limit or 3, dep.max_new_tokens)
        loop, _ = build_loop(args, lambda s: print(s, flush=True))
        loop.ceiling("stock")
        runner = loop.runner
    else:
        from specpilot.runtime.pair import build_pair

        target, drafter, tok = build_pair(dep)
        runner = Runner(target, drafter, tok, dep.context, max_engines=8)
    prompt = runner.tokenizer.chat_prompt([{"role": "user", "content": "What is 12 times 7? Explain."}])
    for name in sys.argv[2:] or ["ar:gemv=true"]:
        t = time.time()
        try:
            s = step_seconds(runner, parse(name), prompt, 16)
            print(f"{mode} {name}: {1000 * s:.3f} ms a step ({time.time() - t:.0f} s)", flush=True)
        except Exception:
            print(f"{mode} {name}: FAILED after {time.time() - t:.0f} s", flush=True)
            traceback.print_exc()
            break


if __name__ == "__main__":
    main()
