"""Run a `specpilot` command with a sampling profiler: where a long run's wall time goes, without cProfile's
slowdown of the host loop (which would change the timings the run itself makes).

    python3 bench/gpu/sampled.py OUT.txt loop --preset smollm2 ...

A wall-clock timer (SIGALRM every INTERVAL seconds) reads the main thread's stack in the main thread itself, between
two of its bytecodes. Not a thread: with a sampling thread the loop lost every GEMV system to spoiled graph captures
on the H100 (2026-12-06), most likely because the thread held frames past their exit and freed their objects in its
own thread, the step tuning's throwaway CUDA graphs among them, while the main thread captured another (under CUDA's
global capture mode a graph destroyed mid-capture spoils it). Every 20 s (and at
exit, SIGTERM included) OUT.txt is rewritten with the samples by innermost specpilot frame, by each specpilot
function on the stack (inclusive), and a timeline: the innermost specpilot frames of one sample every 10 s."""

from __future__ import annotations

import collections
import signal
import sys
import time
import traceback

INTERVAL = 0.2


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    t0 = time.monotonic()
    leaf, inclusive, timeline = collections.Counter(), collections.Counter(), []
    last = {"dump": 0.0, "line": 0.0}

    def dump() -> None:
        n = sum(leaf.values()) or 1
        lines = [f"{n} samples every {INTERVAL} s ({time.monotonic() - t0:.0f} s)", "", "innermost specpilot frame:"]
        lines += [f"{100 * c / n:5.1f}%  {k}" for k, c in leaf.most_common(40)]
        lines += ["", "on the stack (inclusive):"]
        lines += [f"{100 * c / n:5.1f}%  {k}" for k, c in inclusive.most_common(60)]
        lines += ["", "timeline:"] + timeline
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")

    def sample(signum, frame) -> None:
        stack = [f"{fs.filename.split('specpilot/')[-1]}:{fs.name}" for fs in traceback.extract_stack(frame)
                 if "/specpilot/" in fs.filename]
        del frame  # the frames are the main thread's live ones: dropping them here frees nothing
        inner = stack[-1] if stack else "(outside specpilot)"
        leaf[inner] += 1
        for k in set(stack):
            inclusive[k] += 1
        now = time.monotonic() - t0
        if now - last["line"] >= 10:
            timeline.append(f"{now:7.1f}s  {' > '.join(stack[-4:])}")
            last["line"] = now
        if now - last["dump"] >= 20:
            dump()
            last["dump"] = now

    def stop(*_) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        dump()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, sample)
    signal.setitimer(signal.ITIMER_REAL, INTERVAL, INTERVAL)
    from specpilot.cli import main as cli

    sys.argv = ["specpilot", *argv]
    try:
        cli()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        dump()


if __name__ == "__main__":
    main()
