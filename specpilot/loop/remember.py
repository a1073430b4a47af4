"""What a round leaves in the structured memory: one entry per promoted mechanism (option-only: the engine's
code is the commit it ran on), with its evidence card, the deployment's fingerprint and its provenance."""

from __future__ import annotations

from pathlib import Path

import torch

from specpilot.config.system import parse_system
from specpilot.deployment import Deployment
from specpilot.memory.entry import Entry
from specpilot.memory.faithful import tree_of
from specpilot.memory.store import Store


def fingerprint(dep: Deployment) -> dict:
    device = dep.torch_device()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    def model(spec) -> str:
        return spec.path.name if spec.path is not None else f"random(seed={spec.seed})"

    return {"gpu": gpu, "target": model(dep.target) + (f"-x{dep.twin_width}" if dep.twin_width > 1 else ""),
            "drafter": model(dep.drafter) if dep.drafter else "none", "regime": dep.regime,
            "dtype": str(dep.torch_dtype()).removeprefix("torch.")}


def entries(round_out: dict, dep: Deployment, repo: Path, commit: str, dirty: bool, agent: str) -> list[Entry]:
    """An entry for every promoted candidate of the round (the combined one of Phase 2 and Phase 3's included)."""
    gated = [(d["direction"], g) for d in round_out["directions"] for g in d["gated"]]
    if "gated" in round_out["integration"]:
        gated.append(({"factor": "integration", "mechanism": "promoted candidates combined", "reused": False},
                      round_out["integration"]["gated"]))
    if "gated" in round_out["tuning"]:
        gated.append(({"factor": "kernel", "mechanism": f"kernel configuration of {round_out['tuning']['class']}",
                       "reused": False}, round_out["tuning"]["gated"]))
    after = round_out.get("ceiling_after", {}).get("factors")
    out = []
    for direction, g in gated:
        if not g.get("promoted"):
            continue
        start, cand = parse_system(g["start"]), parse_system(g["candidate"])
        tuned = {k: cand.get(k) for k in set(cand.options) | set(start.options) if cand.get(k) != start.get(k)}
        out.append(Entry(
            title=f"{direction['mechanism']}: {g['candidate']}", base_commit=commit, tree=tree_of(repo, commit),
            registry={"system": g["candidate"], "start": g["start"], "tuned": tuned},
            evidence={"fingerprint": fingerprint(dep), "controller": g["controller"], "forcing": g.get("forcing"),
                      "ceiling_before": round_out["ceiling"]["factors"], "ceiling_after": after,
                      "sealed": round_out["sealed"] if round_out["result"] == g["candidate"] else None},
            provenance={"round": round_out["round"], "direction": direction["factor"], "agent": agent,
                        "parents": [], "reused": bool(direction.get("reused")), "cost": None,
                        "dirty_tree": dirty}))
    return out


def remember(store: Store, round_out: dict, dep: Deployment, repo: Path, commit: str, dirty: bool,
             agent: str) -> list[str]:
    return [store.add(e) for e in entries(round_out, dep, repo, commit, dirty, agent)]
