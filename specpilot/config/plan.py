"""The kernel plan: what the kernels are told, handed explicitly to every kernel entry point.

A plan holds the `kernel`, `tuning` and `diagnostic` options of a system (config/options.py is their one
list, with their defaults) and the per-key tuning table its engine's step tuning fills
(kernels/tuning). Each engine owns its plan, so two engines with different plans in one process do not
interfere; engines whose plans agree may share one (and so one tuning).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specpilot.config.options import OPTIONS, check, plan_options


class TuningTable:
    """A plan's tuning table: the block config chosen for each one-row kernel key (kind, shape, fusions).

    Kernels look their key up here when they launch (`config`); the step tuning (kernels/tuning/descent.py)
    records the keys a step launches (`record`) and fills the table. A key with no entry runs the autotuner's
    fallback."""

    def __init__(self, chosen: dict[tuple, dict] | None = None):
        self.chosen: dict[tuple, dict] = dict(chosen or {})
        self._seen: list[tuple] | None = None  # keys launched while recording

    def config(self, key: tuple) -> dict | None:
        """The config chosen for this key, if any (and note the key while a step is recorded)."""
        if self._seen is not None and key not in self._seen:
            self._seen.append(key)
        return self.chosen.get(key)

    def record(self, step: Callable[[], None]) -> list[tuple]:
        """The keys one eager run of `step` launches, in launch order."""
        self._seen = []
        try:
            step()
            return list(self._seen)
        finally:
            self._seen = None

    def forget(self) -> None:
        self.chosen.clear()

    def __len__(self) -> int:
        return len(self.chosen)

    def to_json(self) -> dict[str, dict]:
        return {repr(key): cfg for key, cfg in self.chosen.items()}


NOT_OPTIONS = ("table", "view")  # a plan's fields that no option sets: what its runs learn, and each pass's own


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
    fp8_dense: str
    fewrow: bool
    staged: bool
    attn_late: bool
    cluster: bool
    tune_rounds: int
    tune_start: bool
    tune_store: bool
    attn_ablate: str
    hybrid_tree: str
    table: TuningTable = field(default_factory=TuningTable, compare=False, repr=False)
    # the weights a pass reads (core/contracts.VIEWS): set per forward from its metadata, never an option
    view: str = "exact"

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
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in NOT_OPTIONS}

    def but(self, **changes: Any) -> KernelPlan:
        """The same plan with some options changed, sharing this plan's tuning table (the drafter runs the
        target's plan without the GEMV; keys it launches are its own)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return {**self.features(), "tuning": self.table.to_json()}
