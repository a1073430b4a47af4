"""The kernel profile of decode steps: torch.profiler over generations run eagerly, every kernel attributed to a
class by the regions around its launch (core/regions.py). On the GPU a kernel's time is its CUDA duration;
on the CPU (tests) an operator's own CPU time. Prefill is left out.

Eager, not replayed from a graph: a graph replay carries no host ranges to attribute by, and it runs the same
kernels with the same configurations, so their durations are the same; what the graph saves (launches and the
gaps between kernels) is what T_step / T_prof measures.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

from specpilot.core.contracts import Prompted
from specpilot.core.regions import PREFIX, labelled

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
    # (name, class) -> {seconds (per step), calls}: one kernel may serve several classes (a cuBLAS GEMM
    # configuration shared by the target's and the drafter's projections)
    kernels: dict[tuple[str, str], dict] = field(default_factory=dict)
    device: str = "cpu"
    unlinked_s: float = 0.0  # device time per step of kernels no host range, device-side span or name claimed
    by_name_s: float = 0.0  # unlinked kernels classed by their name (BY_NAME)
    by_span_s: float = 0.0  # unlinked kernels classed by the region spans around them on the device timeline
    unlinked: dict[str, float] = field(default_factory=dict)  # name -> seconds per step, what is left unlinked

    @property
    def total(self) -> float:
        return sum(self.classes.values())

    def to_json(self) -> dict:
        top = sorted(self.kernels.items(), key=lambda kv: -kv[1]["seconds"])
        return {"steps": self.steps, "device": self.device, "seconds_per_step": self.total,
                "unlinked_s": self.unlinked_s, "by_name_s": self.by_name_s,
                "by_span_s": self.by_span_s,
                "unlinked_kernels": dict(sorted(self.unlinked.items(), key=lambda kv: -kv[1])[:20]),
                "classes": self.classes, "stages": self.stages,
                "kernels": [{"name": name, "class": cls, **v} for (name, cls), v in top[:40]]}


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
    kernels: dict[tuple[str, str], dict] = {}
    device: dict[str, float] = defaultdict(float)  # every kernel and copy on the device, by name (us)
    on_device, spans = [], []  # kernels; the device-side spans of our regions (start, end, region)
    linked: dict[str, float] = defaultdict(float)
    for evt in events:
        if evt.device_type.name != "CPU":
            start, end = evt.time_range.start, evt.time_range.end
            if evt.name.startswith(PREFIX):  # a region's annotation on the device timeline, not a kernel
                spans.append((start, end, evt.name[len(PREFIX):]))
            else:
                device[evt.name] += end - start
                on_device.append(evt)
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
    # what no host range claims (a Triton launch goes through the driver API): each such launch is classed by the
    # region spans around it on the device timeline, ours by name first; the rest is reported, never dropped
    left = {name: us - linked.get(name, 0.0) for name, us in device.items()}
    left_evts = [e for e in on_device if left[e.name] > 0]
    unlinked: dict[str, float] = defaultdict(float)
    by_name = by_span = 0.0
    for evt, regions in _within(spans, left_evts):
        share = left[evt.name] / device[evt.name]  # a name partly linked: its launches' unlinked share
        s = share * (evt.time_range.end - evt.time_range.start) / 1e6 / steps
        named = next((c for key, c in BY_NAME.items() if key in evt.name), None)
        cls = None if "prefill" in regions else named or (classify(regions) if regions else None)
        if cls is not None:
            where = "tree" if named == "tree" else stage(regions)
            _add(classes, stages, kernels, evt.name, cls, where, s, share)
            by_name, by_span = (by_name + s, by_span) if named else (by_name, by_span + s)
        elif not regions:
            unlinked[evt.name] += s
    for entry in kernels.values():
        entry["calls"] /= steps
    return Profile(steps=steps, classes=dict(classes), stages=dict(stages), kernels=kernels,
                   device="cuda" if cuda else "cpu", unlinked_s=sum(unlinked.values()),
                   by_name_s=by_name, by_span_s=by_span, unlinked=dict(unlinked))


def _within(spans: list[tuple], evts: list) -> list[tuple]:
    """Each device event with the regions whose device-side spans hold its midpoint (a sweep in time order)."""
    spans = sorted(spans)
    out, open_, i = [], [], 0
    for evt in sorted(evts, key=lambda e: e.time_range.start + e.time_range.end):
        mid = (evt.time_range.start + evt.time_range.end) / 2
        while i < len(spans) and spans[i][0] <= mid:
            open_.append(spans[i])
            i += 1
        open_ = [sp for sp in open_ if sp[1] >= mid]
        out.append((evt, {sp[2] for sp in open_}))
    return out


def _add(classes, stages, kernels, name: str, cls: str, where: str, s: float, calls: int = 1) -> None:
    classes[cls] += s
    stages[where] += s
    entry = kernels.setdefault((name, cls), {"seconds": 0.0, "calls": 0})
    entry["seconds"] += s
    entry["calls"] += calls


def profile_generations(engine, prompts: list[list[int]], max_new_tokens: int, stop_ids=()) -> Profile:
    """Run each prompt through an eager engine (the system with graphs off) under the profiler; per decode step.
    Each prompt runs once before the profiler starts, so that no first-use work (Triton compiles and autotuning,
    whose benchmark runs and cache flushes the profiler would see as kernels) falls inside it."""
    cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    steps = 0
    requests = [Prompted(prompt, max_new_tokens, tuple(stop_ids)) for prompt in prompts]
    engine.generate(requests)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*clears events.*")  # one cycle is all it records here
        prof = profile(activities=activities)
        with _fd2_silenced():
            prof.start()
        try:
            with labelled():
                steps += sum(max(len(gen.accepted), 1) for gen in engine.generate(requests))
                if cuda:
                    torch.cuda.synchronize(engine.device)
        finally:
            with _fd2_silenced():
                prof.stop()
        return attribute(prof.events(), cuda, steps)


@contextlib.contextmanager
def _fd2_silenced():
    """Kineto prints its profiler_start / profiler_stop lines straight to file descriptor 2 (KINETO_LOG_LEVEL does
    not stop them), in the middle of a user's terminal: silenced for the start and the stop alone."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
