"""Recording a harness run's lattices: per decode step, the anchor's position, the drafter's lattice (top-K
tokens, their log-probabilities, the selector's edges) and the tokens the step committed; per turn, the prompt
and the output (the target's greedy continuation from every committed prefix). Saved as one torch file.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specpilot.core.contracts import Lattice
from specpilot.errors import UserError
from specpilot.results import folder_atomic

FORMAT = 1


@dataclass
class TurnLattices:
    """One generation's steps, stacked: S steps of a lattice of depth D and width K."""

    id: str
    dataset: str
    sequence: list[int]  # prompt + output
    prompt_len: int
    starts: torch.Tensor  # [S] int64: the anchor's position (its token is sequence[start])
    tokens: torch.Tensor  # [S, D, K] int64
    logp: torch.Tensor  # [S, D, K] float32
    edges: torch.Tensor | None  # [S, D, K, K] float32
    live: list[int] = field(default_factory=list)  # tokens each step committed (as the engine counts them)
    exact: bool = False  # the edges are a drafted tree's exact conditionals (EAGLE-3: core/contracts.Lattice)

    @property
    def steps(self) -> int:
        return self.starts.shape[0]

    def lattice(self, device=None) -> Lattice:
        """All steps as one batch (the builders are batched)."""
        anchor = torch.tensor(self.sequence, dtype=torch.int64)[self.starts]

        def to(t):
            return None if t is None else t.to(device)

        # unary (the drafter's raw logits) is not recorded: no builder reads it
        return Lattice(tokens=to(self.tokens), unary=to(self.logp), logp=to(self.logp), edges=to(self.edges),
                       anchor=to(anchor), exact=self.exact)

    def continuation(self, depth: int) -> torch.Tensor:
        """[S, D]: the tokens after each anchor (-1 past the output's end: nothing matches there)."""
        seq = torch.tensor(self.sequence + [-1] * (depth + 1), dtype=torch.int64)
        return seq[self.starts[:, None] + 1 + torch.arange(depth)]

    def remaining(self) -> torch.Tensor:
        """[S]: output tokens after each anchor (the most a step there can commit)."""
        return len(self.sequence) - 1 - self.starts


class Recorder:
    """Collects the steps of the generation in progress (Engine._decode calls `step`) and, once the harness has
    the turn's output, closes it (`finish`)."""

    def __init__(self):
        self.turns: list[TurnLattices] = []
        self._steps: list[tuple[int, Lattice]] = []

    def begin(self) -> None:
        """A generation starts (a warm-up's steps, never finished, are dropped here)."""
        self._steps = []

    def step(self, start: int, lattice: Lattice) -> None:
        edges = None if lattice.edges is None else lattice.edges[0].float().cpu()
        self._steps.append((start, Lattice(tokens=lattice.tokens[0].cpu(), unary=None,
                                           logp=lattice.logp[0].float().cpu(), edges=edges, anchor=None,
                                           exact=lattice.exact)))

    def finish(self, id: str, dataset: str, prompt: list[int], output: list[int], live: list[int]) -> None:
        steps, self._steps = self._steps[: len(live)], []  # a step launched past a stop is not counted live
        if not steps:
            return
        edges = None if steps[0][1].edges is None else torch.stack([lat.edges for _, lat in steps])
        self.turns.append(TurnLattices(
            id=id, dataset=dataset, sequence=list(prompt) + list(output), prompt_len=len(prompt),
            starts=torch.tensor([s for s, _ in steps], dtype=torch.int64),
            tokens=torch.stack([lat.tokens for _, lat in steps]).long(),
            logp=torch.stack([lat.logp for _, lat in steps]), edges=edges, live=list(live), exact=steps[0][1].exact))


def save(folder: Path, turns: list[TurnLattices], meta: dict) -> Path:
    """folder/lattices.pt and folder/meta.json, the folder replaced as one unit: a reader never finds one file
    of this recording beside one of the last."""
    with folder_atomic(folder) as tmp:
        write(tmp, turns, meta)
    return Path(folder) / "lattices.pt"


def write(folder: Path, turns: list[TurnLattices], meta: dict) -> None:
    """The recording's files into a folder being filled (a ceiling measurement's holds one per system)."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"format": FORMAT, "turns": [t.__dict__ for t in turns]}, folder / "lattices.pt")
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def load(folder: Path) -> tuple[list[TurnLattices], dict]:
    path = Path(folder) / "lattices.pt"
    if not path.exists():
        raise UserError(f"no recorded lattices in {folder} (expected {path}; `specpilot replay --record` makes them)")
    try:
        with warnings.catch_warnings():  # a foreign file's pickle warnings: the error below says it all
            warnings.simplefilter("ignore")
            data = torch.load(path, weights_only=True)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise UserError(f"{path} has record format {got}, this version reads {FORMAT}")
        meta_path = Path(folder) / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        return [TurnLattices(**t) for t in data["turns"]], meta
    except UserError:
        raise
    except Exception as exc:  # truncated, garbled or foreign files: say which, not a traceback
        why = str(exc).splitlines()[0].split(". ")[0] if str(exc) else "unreadable"
        raise UserError(f"{folder} holds no readable recording ({type(exc).__name__}: {why}); record it again "
                        "with `specpilot replay --record`") from None
