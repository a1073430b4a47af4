"""The kernel profile of decode steps: torch.profiler over generations run eagerly, every kernel attributed to a
class by the regions around its launch (runtime/regions.py). On the GPU a kernel's time is its CUDA duration;
on the CPU (tests) an operator's own CPU time. Prefill is left out.

Eager, not replayed from a graph: a graph replay carries no host ranges to attribute by, and it runs the same
kernels with the same configurations, so their durations are the same; what the graph saves (launches and the
gaps between kernels) is what T_step / T_prof measures.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

from specpilot.runtime.regions import PREFIX, labelled

STAGES = ("drafter", "tree")  # regions that name where in the step a kernel runs (else: the target)


def classify(regions: set[str]) -> str | None:
    """A kernel's class from the regions around its launch; None for prefill (not a decode step's)."""
    if "prefill" in regions:
        return None
    if "tree" in regions:
        return "tree"
    if "head" in regions:
        return "lm_head"
    if "attention" in regions:
        return "attention"
    if "gemm" in regions:
        return "drafter_gemm" if "drafter" in regions else "target_gemm"
    return "drafter_other" if "drafter" in regions else "elementwise"


def stage(regions: set[str]) -> str:
    return next((s for s in STAGES if s in regions), "target")


@dataclass
class Profile:
    """Kernel time per decode step by class and by stage (seconds), and the kernels by total time."""

    steps: int
    classes: dict[str, float] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, dict] = field(default_factory=dict)  # name -> {class, seconds (per step), calls}
    device: str = "cpu"
    unlinked_s: float = 0.0  # device time per step (prefill's included) of kernels no host range was linked to

    @property
    def total(self) -> float:
        return sum(self.classes.values())

    def to_json(self) -> dict:
        top = sorted(self.kernels.items(), key=lambda kv: -kv[1]["seconds"])
        return {"steps": self.steps, "device": self.device, "seconds_per_step": self.total,
                "unlinked_s": self.unlinked_s,
                "classes": self.classes, "stages": self.stages,
                "kernels": [{"name": k, **v} for k, v in top[:40]]}


def _regions(evt) -> set[str]:
    out = set()
    while evt is not None:
        if evt.name.startswith(PREFIX):
            out.add(evt.name[len(PREFIX):])
        evt = evt.cpu_parent
    return out


def attribute(events, cuda: bool, steps: int) -> Profile:
    """Per step: each kernel's (CUDA) or operator's own (CPU) time, summed by class, stage and name."""
    classes: dict[str, float] = defaultdict(float)
    stages: dict[str, float] = defaultdict(float)
    kernels: dict[str, dict] = {}
    device_us = linked_us = 0.0
    for evt in events:
        if evt.device_type.name != "CPU":
            device_us += evt.time_range.end - evt.time_range.start  # every kernel and copy on the device
            continue
        if cuda:  # a kernel launched straight from a region (a Triton launch) is linked to the region itself
            items = [(k.name, k.duration) for k in evt.kernels]
            linked_us += sum(us for _, us in items)
        elif not evt.name.startswith(PREFIX):  # a region's own CPU time is Python, not an operator
            items = [(evt.name, evt.self_cpu_time_total)]
        else:
            continue
        regions = _regions(evt)
        cls = classify(regions)
        if cls is None or not items:
            continue
        for name, us in items:
            s = us / 1e6 / steps
            classes[cls] += s
            stages[stage(regions)] += s
            entry = kernels.setdefault(name, {"class": cls, "seconds": 0.0, "calls": 0})
            entry["seconds"] += s
            entry["calls"] += 1
    for entry in kernels.values():
        entry["calls"] /= steps
    # kernels no host range claims (launched outside every op and region): reported, never silently dropped
    unlinked = max(device_us - linked_us, 0.0) / 1e6 / steps if cuda else 0.0
    return Profile(steps=steps, classes=dict(classes), stages=dict(stages), kernels=kernels,
                   device="cuda" if cuda else "cpu", unlinked_s=unlinked)


def profile_generations(engine, prompts: list[list[int]], max_new_tokens: int, stop_ids=()) -> Profile:
    """Run each prompt through an eager engine (the system with graphs off) under the profiler; per decode step."""
    cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    steps = 0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*clears events.*")  # one cycle is all it records here
        with profile(activities=activities) as prof, labelled():
            for prompt in prompts:
                steps += max(len(engine.generate(prompt, max_new_tokens, stop_ids).accepted), 1)
            if cuda:
                torch.cuda.synchronize(engine.device)
        return attribute(prof.events(), cuda, steps)
