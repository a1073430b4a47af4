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
# Our Triton kernels by name, for launches the profiler links to no host range (on the H200 every decode
# attention kernel was unlinked: a Triton launch goes through the driver API). Only kernels used by one class.
BY_NAME = {"_split_kernel": "attention", "_combine_kernel": "attention", "_best_first_kernel": "tree",
           "_eagle2_kernel": "tree"}


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
    unlinked_s: float = 0.0  # device time per step (prefill's included) of kernels neither a host range nor
    # their name claimed
    by_name_s: float = 0.0  # unlinked kernels classed by their name (BY_NAME; prefill's included; stage: target)
    unlinked: dict[str, float] = field(default_factory=dict)  # name -> seconds per step, what is left unlinked

    @property
    def total(self) -> float:
        return sum(self.classes.values())

    def to_json(self) -> dict:
        top = sorted(self.kernels.items(), key=lambda kv: -kv[1]["seconds"])
        return {"steps": self.steps, "device": self.device, "seconds_per_step": self.total,
                "unlinked_s": self.unlinked_s, "by_name_s": self.by_name_s,
                "unlinked_kernels": dict(sorted(self.unlinked.items(), key=lambda kv: -kv[1])[:20]),
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
    device: dict[str, float] = defaultdict(float)  # every kernel and copy on the device, by name (us)
    launches: dict[str, int] = defaultdict(int)
    linked: dict[str, float] = defaultdict(float)
    for evt in events:
        if evt.device_type.name != "CPU":
            device[evt.name] += evt.time_range.end - evt.time_range.start
            launches[evt.name] += 1
            continue
        if cuda:  # a kernel launched straight from a region (a Triton launch) is linked to the region itself
            items = [(k.name, k.duration) for k in evt.kernels]
            for name, us in items:
                linked[name] += us
        elif not evt.name.startswith(PREFIX):  # a region's own CPU time is Python, not an operator
            items = [(evt.name, evt.self_cpu_time_total)]
        else:
            continue
        regions = _regions(evt)
        cls = classify(regions)
        if cls is None or not items:
            continue
        for name, us in items:
            _add(classes, stages, kernels, name, cls, stage(regions), us / 1e6 / steps)
    # kernels no host range claims (launched outside every op and region): ours are classed by name, the rest
    # reported, never silently dropped
    left = {name: max(us - linked.get(name, 0.0), 0.0) / 1e6 / steps for name, us in device.items()} if cuda else {}
    by_name = 0.0
    for name, s in list(left.items()):
        cls = next((c for key, c in BY_NAME.items() if key in name), None)
        if cls is not None and s > 0:
            _add(classes, stages, kernels, name, cls, "tree" if cls == "tree" else "target", s, launches[name])
            by_name += s
            del left[name]
    for entry in kernels.values():
        entry["calls"] /= steps
    unlinked = {name: s for name, s in left.items() if s > 0}
    return Profile(steps=steps, classes=dict(classes), stages=dict(stages), kernels=kernels,
                   device="cuda" if cuda else "cpu", unlinked_s=sum(unlinked.values()),
                   by_name_s=by_name, unlinked=unlinked)


def _add(classes, stages, kernels, name: str, cls: str, where: str, s: float, calls: int = 1) -> None:
    classes[cls] += s
    stages[where] += s
    entry = kernels.setdefault(name, {"class": cls, "seconds": 0.0, "calls": 0})
    entry["seconds"] += s
    entry["calls"] += calls


def profile_generations(engine, prompts: list[list[int]], max_new_tokens: int, stop_ids=()) -> Profile:
    """Run each prompt through an eager engine (the system with graphs off) under the profiler; per decode step.
    Each prompt runs once before the profiler starts, so that no first-use work (Triton compiles and autotuning,
    whose benchmark runs and cache flushes the profiler would see as kernels) falls inside it."""
    cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    steps = 0
    for prompt in prompts:
        engine.generate(prompt, max_new_tokens, stop_ids)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*clears events.*")  # one cycle is all it records here
        with profile(activities=activities) as prof, labelled():
            for prompt in prompts:
                steps += max(len(engine.generate(prompt, max_new_tokens, stop_ids).accepted), 1)
            if cuda:
                torch.cuda.synchronize(engine.device)
        return attribute(prof.events(), cuda, steps)
