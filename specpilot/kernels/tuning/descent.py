"""Block configs of the one-row kernels, chosen by timing the whole captured decode step.

Triton's autotuner times each kernel alone, where ramp-up and drain dominate; in a step the kernels run back
to back and what counts is the step. `tune_step` walks the kernels a step launches (recorded by key: kernel
kind, shape, fusions) and, one key at a time with the others held, gives the key the candidate config under
which the captured step replays fastest. The choices go into the plan's tuning table; kernels whose key has
no choice fall back to the autotuner.
"""

from __future__ import annotations

from collections.abc import Callable

from specpilot.config.plan import KernelPlan
from specpilot.kernels.tuning.candidates import candidates


def tune_step(step: Callable[[], None], measure: Callable[[Callable[[], None]], float], plan: KernelPlan,
              start: dict[tuple, dict] | None = None) -> dict:
    """Coordinate descent over the keys `step` launches: each key gets the candidate under which
    `measure(step)` (milliseconds of the whole step) is lowest. The first round tunes each key while the keys
    after it still run their fallbacks (on the H200 8B a step ~30% slower than the tuned one); each later
    round (plan.tune_rounds in all) times every key's candidates again with all the others at their choices.
    Loading one loop step ahead (plan.ahead) is chosen per key too: each round times its winner once more
    with AHEAD False (on the H200, loading ahead everywhere made the 8B's step 0.06-0.10 ms faster; on the
    27B's it was within the run-to-run spread, either way). start: configs the keys not chosen yet begin from
    (the later keys of the first round run them, not the autotuner's). Keys the table already holds (an
    engine sharing this plan tuned them) are not tuned again. Returns {key: {config, ms by candidate in the
    last round, and in the first}}."""
    table = plan.table
    keys = [key for key in table.record(step) if key not in table.chosen]
    begun = {key: start[key] for key in keys if start and key in start and _startable(key, start[key], plan)}
    table.chosen.update(begun)  # where the descent begins: the start table's configs, else the fallbacks
    report = {repr(key): {"start": cfg} for key, cfg in begun.items()}
    for _ in range(plan.tune_rounds):
        for key in keys:
            cands = candidates(key, plan)
            times = []
            for i, cfg in enumerate(cands):
                table.chosen[key] = cfg
                times.append((measure(step), i))
            best_ms, best = min(times)
            table.chosen[key] = winner = cands[best]
            entry = report.setdefault(repr(key), {})
            entry.setdefault("ms_first_round", [t for t, _ in times])
            entry.update(ms=[t for t, _ in times])
            if plan.ahead:  # the winner once more without loading ahead: it did not pay on every kernel
                table.chosen[key] = {**winner, "AHEAD": False}
                entry["ms_without_ahead"] = measure(step)
                if entry["ms_without_ahead"] >= best_ms:
                    table.chosen[key] = winner
            entry["config"] = table.chosen[key]
    return report


def _startable(key: tuple, cfg: dict, plan: KernelPlan) -> bool:
    """A start config is used only if it is one of the key's candidates now (loading ahead or not)."""
    return {f: v for f, v in cfg.items() if f != "AHEAD"} in candidates(key, plan)
