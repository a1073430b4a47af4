"""Where token forcing's time goes in the loop's gate on a GPU (issue 55: 390 s of a 600-s budget on the pair).

Forcing of ar:gemv=true against stock on REQUESTS dev requests x 256 tokens, scored by the float32 model, as the
gate runs it (in-process outputs, no float32 AR beside the verdict), under cProfile; prints the report's own
seconds per phase and the top functions by cumulative time, and writes both to $OUT/force_profile.txt."""

import cProfile
import io
import os
import pstats
import sys
import time

from specpilot.bench.harness import Runner
from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.forcing.run import ExactTargets, force
from specpilot.runtime.pair import build_pair


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    dep = load_deployment("smollm2", None)
    reqs = [r for d in dep.datasets for r in load_requests(d, "dev", None, n)]
    t = time.time()
    target, drafter, tok = build_pair(dep)
    runner = Runner(target, drafter, tok, dep.context, max_engines=8)
    exact = ExactTargets(dep).target("float32")
    print(f"models {time.time() - t:.1f}s, {len(reqs)} requests", flush=True)
    prof = cProfile.Profile()
    t = time.time()
    prof.enable()
    t0 = time.time()
    report = force(runner, "stock", "ar:gemv=true", reqs, 256, exact=exact, exact_ar=False,
                   progress=lambda: print(f"  a turn done at {time.time() - t0:.1f}s", flush=True))
    prof.disable()
    out = io.StringIO()
    print(f"force {time.time() - t:.1f}s verdict {report['verdict']} seconds {report['seconds']}", file=out)
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
    text = out.getvalue()
    print(text[:6000])
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "force_profile.txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
