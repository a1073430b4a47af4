"""What a round leaves in the structured memory: one entry per promoted mechanism, with its evidence card, the
deployment's fingerprint and its provenance. An option-only entry's code is the commit it ran on; a coding
agent's entry carries its code delta (the patch from the round's base commit to the agent's frozen commit), which
the store checks replays to the tree that was judged, byte for byte."""

from __future__ import annotations

from pathlib import Path

import torch

from specpilot.config.system import parse_system
from specpilot.deployment import Deployment
from specpilot.errors import UserError
from specpilot.memory.entry import Entry
from specpilot.memory.faithful import patch_between, tree_of
from specpilot.memory.store import Store


def fingerprint(dep: Deployment) -> dict:
    device = dep.torch_device()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    def model(spec) -> str:
        return spec.path.name if spec.path is not None else f"random(seed={spec.seed})"

    return {"gpu": gpu, "target": model(dep.target) + (f"-x{dep.twin_width}" if dep.twin_width > 1 else "")
                                                   + ("-hybrid" if dep.twin_gdn else ""),
            "drafter": model(dep.drafter) if dep.drafter else "none", "regime": dep.regime,
            **({"in_flight": dep.in_flight} if dep.regime == "batch" else {}),
            "dtype": str(dep.torch_dtype()).removeprefix("torch.")}


def entries(round_out: dict, dep: Deployment, repo: Path, commit: str, dirty: bool, agent: str) -> list[Entry]:
    """An entry for every promoted candidate of the round (the combined one of Phase 2 and Phase 3's included)."""
    gated = [({**d["direction"], "agent_report": d.get("agent")}, g) for d in round_out["directions"]
             for g in d["gated"]]
    if "gated" in round_out["integration"]:
        gated.append(({"factor": "integration", "mechanism": "promoted candidates combined", "reused": False},
                      round_out["integration"]["gated"]))
    if "gated" in round_out["tuning"]:
        gated.append(({"factor": "kernel", "mechanism": f"kernel configuration of {round_out['tuning']['class']}",
                       "reused": False}, round_out["tuning"]["gated"]))
    after = round_out.get("ceiling_after", {}).get("factors")
    out, seen = [], set()
    for direction, g in gated:
        if not g.get("promoted") or (g["candidate"], g.get("tree")) in seen:
            continue  # one entry per mechanism: code several directions' agents wrote alike is judged once
        seen.add((g["candidate"], g.get("tree")))
        code = g.get("commit")
        out.append(Entry(
            title=f"{direction['mechanism']}: {g['candidate']}", base_commit=commit,
            tree=g["tree"] if code else tree_of(repo, commit),
            patch=patch_between(repo, commit, code) if code else "",
            registry={"system": g["candidate"], "start": g["start"], "tuned": tuned(g["start"], g["candidate"]),
                      **({"commit": code} if code else {})},
            evidence={"fingerprint": fingerprint(dep), "controller": g["controller"], "forcing": g.get("forcing"),
                      "ceiling_before": round_out["ceiling"]["factors"], "ceiling_after": after,
                      "sealed": round_out["sealed"] if round_out["result"] == g["candidate"] else None},
            provenance={"round": round_out["round"], "direction": direction["factor"], "agent": agent,
                        "parents": [], "reused": bool(direction.get("reused")), "cost": _cost(direction, g),
                        "dirty_tree": dirty}))
    return out


def tuned(start: str, candidate: str) -> dict:
    """The options the candidate sets differently from the start. A system of another tree may name options this
    install lacks: read as text then."""
    try:
        a, b = parse_system(start), parse_system(candidate)
        return {k: b.get(k) for k in set(b.options) | set(a.options) if b.get(k) != a.get(k)}
    except UserError:
        def opts(name: str) -> dict:
            _, _, rest = name.partition(":")
            return dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)
        a, b = opts(start), opts(candidate)
        return {k: b.get(k) for k in set(a) | set(b) if a.get(k) != b.get(k)}


def _cost(direction: dict, g: dict) -> dict | None:
    """What finding it cost where the evidence says: the gate's seconds, the agent's wall time, turns and money."""
    agent = direction.get("agent_report") or {}
    seconds = g.get("seconds") or {}  # "timing" holds the A/A and A/B runs ("aa", "ab") already
    out = {"gate_s": seconds.get("timing", 0.0) + seconds.get("forcing", 0.0)}
    if agent.get("finished"):
        out.update({"agent_s": agent["finished"]["seconds"], "turns": agent["watch"]["turns"],
                    "usd": agent["watch"]["cost_usd"]})
    return out


def remember(store: Store, round_out: dict, dep: Deployment, repo: Path, commit: str, dirty: bool,
             agent: str) -> list[str]:
    return [store.add(e) for e in entries(round_out, dep, repo, commit, dirty, agent)]
