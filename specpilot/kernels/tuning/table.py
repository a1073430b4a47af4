"""A plan's tuning table: the block config chosen for each one-row kernel key (kind, shape, fusions).

Kernels look their key up here when they launch (`config`); the step tuning (tuning/descent.py) records the
keys a step launches (`record`) and fills the table. A key with no entry runs the autotuner's fallback.
"""

from __future__ import annotations

from collections.abc import Callable


class TuningTable:
    def __init__(self, chosen: dict[tuple, dict] | None = None):
        self.chosen: dict[tuple, dict] = dict(chosen or {})
        self._seen: list[tuple] | None = None  # keys launched while recording

    def config(self, key: tuple) -> dict | None:
        """The config chosen for this key, if any (and note the key while a step is recorded)."""
        if self._seen is not None and key not in self._seen:
            self._seen.append(key)
        return self.chosen.get(key)

    def record(self, step: Callable[[], None]) -> list[tuple]:
        """The keys one eager run of `step` launches, in launch order."""
        self._seen = []
        try:
            step()
            return list(self._seen)
        finally:
            self._seen = None

    def forget(self) -> None:
        self.chosen.clear()

    def __len__(self) -> int:
        return len(self.chosen)

    def to_json(self) -> dict[str, dict]:
        return {repr(key): cfg for key, cfg in self.chosen.items()}
