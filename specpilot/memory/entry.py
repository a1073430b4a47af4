"""A memory entry: one mechanism the loop found (or the engine ships), as the four things a later round needs.

- code: a git patch against the commit it was made on (empty when the mechanism is already an option), and the
  git tree id that applying it must give (the source system's code, byte for byte);
- registry: the system it runs as (`base:key=value,...`) and the parameters that were tuned for it;
- evidence: the controller's card, the forcing verdict, the ceiling factors before and after, and the
  deployment's fingerprint (GPU, target, drafter, regime, dtype) they were measured on;
- provenance: round, direction, agent, parents, cost, and whether it was reused rather than discovered.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

from specpilot.errors import UserError

SHA = re.compile(r"^[0-9a-f]{40}$")
FINGERPRINT = ("gpu", "target", "drafter", "regime", "dtype")


@dataclass(frozen=True)
class Entry:
    title: str
    base_commit: str
    tree: str  # git tree id of the base commit with the patch applied
    registry: dict
    patch: str = ""
    evidence: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("base_commit", "tree"):
            if not SHA.match(getattr(self, name)):
                raise UserError(f"memory entry {self.title!r}: {name} is not a 40-digit git id")
        if not isinstance(self.registry.get("system"), str):
            raise UserError(f"memory entry {self.title!r}: the registry names no system")
        missing = [k for k in FINGERPRINT if k not in self.evidence.get("fingerprint", {})]
        if missing:
            raise UserError(f"memory entry {self.title!r}: the fingerprint lacks {', '.join(missing)}")

    @property
    def id(self) -> str:
        """Content address of what the entry claims (code, registry, evidence, provenance): any edit is a new id."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def option_only(self) -> bool:
        return not self.patch

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Entry:
        known = {k: data[k] for k in ("title", "base_commit", "tree", "registry", "patch", "evidence", "provenance")
                 if k in data}
        try:
            return cls(**known)
        except TypeError as exc:
            raise UserError(f"not a memory entry: {exc}") from None
