"""What an agent must not change, fingerprinted when the loop starts and checked after every agent and before
every judgement: the install the loop, the controller and token forcing run from (every file of the package),
and the data files the sealed requests come from. The loop's process imported its code before any agent ran, so
an edit cannot change what it runs; the check catches what the next timing worker or a later run would read
(the worker script itself lives in the install), and names the files."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path


def file_hashes(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under root (byte-compiled caches excepted)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass
class Seal:
    install: Path  # the package folder (`specpilot/`) the loop runs from
    code: dict[str, str] = field(default_factory=dict)
    data: dict[str, str | None] = field(default_factory=dict)  # data file -> sha256

    @classmethod
    def take(cls, install: Path, data_files: list[Path]) -> Seal:
        return cls(install, file_hashes(install), {str(p): _digest(p) for p in data_files})

    def broken(self) -> list[str]:
        """Why the seal no longer holds (empty: it holds)."""
        now = file_hashes(self.install)
        changed = sorted(k for k in set(now) | set(self.code) if now.get(k) != self.code.get(k))
        out = []
        if changed:
            out.append(f"the judges' install {self.install} changed: {', '.join(changed[:8])}"
                       + (f" and {len(changed) - 8} more" if len(changed) > 8 else ""))
        out += [f"the sealed requests' file {p} changed" for p, h in self.data.items() if _digest(Path(p)) != h]
        return out

    def to_json(self) -> dict:
        return {"install": str(self.install), "files": len(self.code), "data": self.data}
