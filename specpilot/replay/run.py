"""`specpilot replay`: record a system's lattices through the harness (or read a recording), then replay every
tree builder and node budget asked for, with tau_best and the acceptance by rank Sequoia's shape needs."""

from __future__ import annotations

from collections.abc import Callable

from specpilot.bench.harness import Runner
from specpilot.config import System
from specpilot.datasets import Request
from specpilot.errors import UserError
from specpilot.replay.record import Recorder, TurnLattices
from specpilot.speculative.tree import BUILDERS


def record(runner: Runner, system: System, requests: list[Request], max_new_tokens: int,
           progress: Callable[[], None] | None = None) -> list[TurnLattices]:
    """One harness run of a speculative system with every step's lattice recorded (steps one by one)."""
    if system.get("verify") == "tlv":
        raise UserError(f"{system.name}: a recording holds one drafting round a step and verify=tlv drafts two; "
                        "record the system with verify=exact")
    recorder = Recorder()
    runner.warmup(system)
    for request in requests:
        runner.run(system, request, max_new_tokens, progress, recorder=recorder)
    return recorder.turns


def policies(builders: list[str], budgets: list[int], block: int) -> list[tuple[str, int]]:
    """(builder, nodes) pairs; a chain holds at most the block, so its larger budgets are dropped."""
    out = []
    for name in builders or list(BUILDERS):
        sizes = sorted({min(n, block) for n in budgets}) if name == "chain" else budgets
        out.extend((name, n) for n in sizes)
    return out


def accept_option(profile: list[float]) -> str:
    """The `tree_accept` value for a measured profile (ranks with a measurable share only)."""
    kept = [p for p in profile if p >= 0.001]
    return "/".join(f"{p:.3f}" for p in kept)
