"""Forcing's outputs kept in a folder (`specpilot force --outputs DIR`), so that a run cut short resumes where it
stopped: a run at the power bound in bf16 needs about a thousand requests per system, more than one 10-minute
call on the GPU machine holds.

One JSON-lines file per (code, deployment, role, system, output budget): a line per request, written as soon as the
request's turns are made. A file is found again only by the same key, so outputs of other code (the hash of every
file of the package, as the controller's workers report it), another deployment, machine or budget are never reused,
nor another role's: a candidate named as its reference is a second run of that system, never the reference's outputs
read back (files kept before the role joined the key are not found any more). A reused request's prompts are still
checked against this install's (forcing/run.checked) and every token is scored afresh. A line cut short by a kill is
skipped."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from specpilot.bench.harness import TurnRecord
from specpilot.controller.worker import code_hash


class OutputStore:
    """deployment: what identifies the deployment in the key (`described` gives its whole configuration)."""

    def __init__(self, folder: Path, deployment: str, code: str | None = None):
        self.folder = Path(folder)
        self.deployment = deployment
        self.code = code or code_hash(Path(__file__).resolve().parents[1])
        self._loaded: dict[Path, dict[str, list[TurnRecord]]] = {}

    def path(self, role: str, system: str, max_new: int) -> Path:
        """role: "reference", "candidate" or "ar" (forcing/run.ROLES)."""
        key = json.dumps([self.code, self.deployment, role, system, max_new])
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.jsonl"

    def get(self, role: str, system: str, max_new: int) -> dict[str, list[TurnRecord]]:
        """Each stored request's turn records for this role, system and budget."""
        path = self.path(role, system, max_new)
        if path not in self._loaded:
            self._loaded[path] = read_kept(path) if path.exists() else {}
        return self._loaded[path]

    def put(self, role: str, system: str, max_new: int, request: str, records: list[TurnRecord]) -> None:
        path = self.path(role, system, max_new)
        self.get(role, system, max_new)[request] = records
        self.folder.mkdir(parents=True, exist_ok=True)
        if not path.exists():  # the key's parts, for a reader of the folder
            path.with_suffix(".key.json").write_text(json.dumps(
                {"code": self.code, "deployment": self.deployment, "role": role, "system": system,
                 "max_new_tokens": max_new}))
        turns = [{"id": r.id, "dataset": r.dataset, "turn": r.turn, "prompt": r.prompt, "tokens": r.tokens,
                  "prefill_s": r.prefill_s, "decode_s": r.decode_s, "accepted": r.accepted} for r in records]
        with path.open("a+b") as f:  # after a torn last line, a new line: the torn one stays alone and is skipped
            end = f.seek(0, 2)
            torn = end > 0 and f.seek(end - 1) >= 0 and f.read(1) != b"\n"
            f.write((b"\n" if torn else b"") + json.dumps({"request": request, "turns": turns}).encode() + b"\n")
            f.flush()


def read_kept(path: Path) -> dict[str, list[TurnRecord]]:
    """Each request's turn records in one kept file (a line cut short by a kill is skipped)."""
    rows = {}
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # the last line of a killed run
            continue
        rows[row["request"]] = [TurnRecord(**t) for t in row["turns"]]
    return rows


def described(dep) -> str:
    """A deployment's whole configuration (models, dtype, context, budgets) and what it resolves to on this machine
    (device, dtype, torch), as the store's key takes it: outputs made on another GPU, on the CPU or under another
    torch are other outputs, though `device = "auto"` reads the same in each."""
    dev = dep.torch_device()
    here = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "dtype": str(dep.torch_dtype()), "torch": torch.__version__}
    return json.dumps({**dataclasses.asdict(dep), "resolved": here}, sort_keys=True, default=str)
