"""A distilled-data folder: what `specpilot distill` writes and `specpilot train-drafter --data` reads.

    meta.json                  the recipe and what came of it (counts per family and role, seeds, target,
                               answer budget, minutes, which benchmarks the prompts were checked against)
    prompts.jsonl.gz           one record per sequence, in order: role, family, the user turns' texts
    tokens-00000.safetensors   whole sequences in shards of at most ~15 MB (a GPU run returns files of <= 16 MiB):
                               `tokens` (flat; int16 holding id - 32768 when the vocabulary fits, else int32),
                               `offsets` [n + 1], `prompt_lens` [n]

Roles: `train` (what the drafter learns from), `heldout` (corpus prompts it never trains on: the held-out
figure), `dev` (benchmark dev-half requests with the target's answers: the learning curve on what users ask,
never trained on, never committed). The folder is written to a temporary sibling and renamed into place, so
a reader never sees half of one.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specpilot.errors import UserError
from specpilot.results import folder_atomic
from specpilot.training.distill import Dataset

ROLES = ("train", "heldout", "dev")
SHIFT = 32768  # int16 holds ids 0..65535 shifted down by this


@dataclass
class Record:
    role: str
    family: str
    turns: list[str]  # the user messages (a second turn follows the target's own first answer)

    def to_json(self) -> dict:
        return {"role": self.role, "family": self.family, "turns": self.turns}


@dataclass
class DistilledData:
    sequences: list[list[int]] = field(default_factory=list)
    prompt_lens: list[int] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def add(self, sequence: list[int], prompt_len: int, record: Record) -> None:
        if record.role not in ROLES:
            raise ValueError(f"unknown role {record.role!r}")
        self.sequences.append(sequence)
        self.prompt_lens.append(prompt_len)
        self.records.append(record)

    def split(self, role: str) -> Dataset:
        keep = [i for i, r in enumerate(self.records) if r.role == role]
        return Dataset([self.sequences[i] for i in keep], [self.prompt_lens[i] for i in keep])

    def counts(self) -> dict:
        """Sequences and answer tokens per role and per family of the train role."""
        out: dict = {"roles": {}, "train_families": {}}
        for seq, plen, rec in zip(self.sequences, self.prompt_lens, self.records, strict=True):
            for key, name in (("roles", rec.role), ("train_families", rec.family)):
                if key == "train_families" and rec.role != "train":
                    continue
                entry = out[key].setdefault(name, {"sequences": 0, "answer_tokens": 0})
                entry["sequences"] += 1
                entry["answer_tokens"] += len(seq) - plen
        return out

    def prompts_file(self, roles: tuple[str, ...] = ROLES) -> bytes:
        """The records of these roles as gzipped JSON lines (byte-identical for identical records)."""
        lines = "".join(json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in self.records if r.role in roles)
        return gzip.compress(lines.encode("utf-8"), mtime=0)

    def check_vocabulary(self, vocab_size: int) -> None:
        top = max((max(s) for s in self.sequences if s), default=-1)
        if top >= vocab_size:
            raise UserError(f"the data holds token id {top}, outside this target's vocabulary of {vocab_size}: "
                            "it was distilled from another target")

    def save(self, folder: str | Path, max_shard_bytes: int = 15_000_000) -> None:
        with folder_atomic(folder) as tmp:
            wide = any(t >= 2 * SHIFT or t < 0 for s in self.sequences for t in s)
            for k, (first, last) in enumerate(_shards(self.sequences, max_shard_bytes // (4 if wide else 2))):
                save_file(_pack(self.sequences[first:last], self.prompt_lens[first:last], wide),
                          str(tmp / f"tokens-{k:05d}.safetensors"))
            (tmp / "prompts.jsonl.gz").write_bytes(self.prompts_file())
            meta = {**self.meta, "counts": self.counts(), "sequences": len(self.sequences)}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> DistilledData:
        folder = Path(folder)
        shards = sorted(folder.glob("tokens-*.safetensors"))
        if not (folder / "meta.json").is_file() or not shards:
            raise UserError(f"{folder}: not a distilled-data folder (no meta.json or tokens-*.safetensors); "
                            "make one with `specpilot distill`")
        data = cls(meta=json.loads((folder / "meta.json").read_text()))
        for path in shards:
            seqs, lens = _unpack(load_file(str(path)))
            data.sequences += seqs
            data.prompt_lens += lens
        records = read_records(folder / "prompts.jsonl.gz")
        if len(records) != len(data.sequences):
            raise UserError(f"{folder}: {len(records)} prompt records for {len(data.sequences)} sequences")
        data.records = records
        return data


def read_records(path: str | Path) -> list[Record]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [Record(**json.loads(line)) for line in f if line.strip()]


def _shards(sequences: list[list[int]], max_tokens: int) -> list[tuple[int, int]]:
    out, first, size = [], 0, 0
    for i, s in enumerate(sequences):
        if size and size + len(s) > max_tokens:
            out.append((first, i))
            first, size = i, 0
        size += len(s)
    return out + [(first, len(sequences))]


def _pack(sequences: list[list[int]], prompt_lens: list[int], wide: bool) -> dict[str, torch.Tensor]:
    flat = torch.tensor([t for s in sequences for t in s], dtype=torch.int64)
    lengths = torch.tensor([0] + [len(s) for s in sequences], dtype=torch.int64)
    return {"tokens": flat.to(torch.int32) if wide else (flat - SHIFT).to(torch.int16),
            "offsets": lengths.cumsum(0), "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int32)}


def _unpack(tensors: dict[str, torch.Tensor]) -> tuple[list[list[int]], list[int]]:
    tokens = tensors["tokens"].to(torch.int64)
    if tensors["tokens"].dtype == torch.int16:
        tokens = tokens + SHIFT
    flat, offsets = tokens.tolist(), tensors["offsets"].tolist()
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)], tensors["prompt_lens"].tolist()
