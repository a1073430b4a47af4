"""The kernel plan: what the kernels are told, handed explicitly to every kernel entry point.

A plan holds the `kernel`, `tuning` and `diagnostic` options of a system (config/options.py is their one
list, with their defaults) and the per-key tuning table its engine's step tuning fills
(kernels/tuning). Each engine owns its plan, so two engines with different plans in one process do not
interfere; engines whose plans agree may share one (and so one tuning).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specpilot.config.options import OPTIONS, check, plan_options
from specpilot.kernels.tuning.table import TuningTable


@dataclass(frozen=True)
class KernelPlan:
    gemv: bool
    kernels: str
    pdl: str
    handoff: bool
    ahead: bool
    epilogue_early: bool
    l2: str
    embed_kernel: bool
    greedy_kernel: bool
    weights: str
    w12_dense: str
    fewrow: bool
    staged: bool
    attn_late: bool
    cluster: bool
    tune_rounds: int
    tune_start: bool
    attn_ablate: str
    table: TuningTable = field(default_factory=TuningTable, compare=False, repr=False)

    @classmethod
    def stock(cls, **changes: Any) -> KernelPlan:
        """Every plan option at its default (config/options.py), but for `changes`."""
        values = {o.name: o.default for o in plan_options()}
        unknown = set(changes) - set(values)
        if unknown:
            raise ValueError(f"not kernel-plan options: {', '.join(sorted(unknown))}")
        for name, value in changes.items():
            check(OPTIONS[name], value)
        return cls(**{**values, **changes})

    def features(self) -> dict[str, Any]:
        """The options, without the tuning table: equal features, equal kernels."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "table"}

    def but(self, **changes: Any) -> KernelPlan:
        """The same plan with some options changed, sharing this plan's tuning table (the drafter runs the
        target's plan without the GEMV; keys it launches are its own)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return {**self.features(), "tuning": self.table.to_json()}
