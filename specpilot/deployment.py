"""Deployments: what is served (target, drafter, regime, device, request sets, budgets), as a TOML file.

Presets are deployments shipped in `specpilot/presets/`. A deployment builds the models it names:
a checkpoint folder (`path`) or a seeded random model (`random`, a table of config fields).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specpilot.bench.datasets import DATASETS
from specpilot.errors import UserError
from specpilot.models.config import DenseConfig, DrafterConfig

PRESET_DIR = Path(__file__).parent / "presets"
REGIMES = ("single",)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSpec:
    path: Path | None = None
    random: dict[str, Any] | None = None
    seed: int = 0


@dataclass
class Deployment:
    name: str
    target: ModelSpec
    drafter: ModelSpec | None
    tokenizer: str = "target"  # "target" (the target folder's own), "bytes", or a folder
    regime: str = "single"
    device: str = "auto"
    dtype: str = "auto"
    context: int = 4096
    datasets: list[str] = field(default_factory=lambda: ["builtin"])
    split: str = "dev"
    max_new_tokens: int = 256
    limit: int | None = None
    enable_thinking: bool = False
    twin_width: int = 1  # > 1: serve the function-preserving widening of target and drafter (models/twin.py)
    twin_depth: int | None = None
    system: str | None = None  # the system this deployment serves by default (a loop's best.toml names one)
    source: str = ""

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"deployment {self.name}: device {self.device!r} asked for, but no CUDA device is here")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return DTYPES[self.dtype]


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def naming(preset: str | None, path: str | Path | None) -> dict:
    """How another process (a controller or forcing worker, a loop's slot) loads the same deployment:
    {"preset": name} or {"deployment": absolute path}."""
    return {"preset": preset} if path is None else {"deployment": str(Path(path).resolve())}


def load_deployment(preset: str | None = None, path: str | Path | None = None) -> Deployment:
    if (preset is None) == (path is None):
        raise UserError("name exactly one of --preset or --deployment")
    if preset is not None:
        file = PRESET_DIR / f"{preset}.toml"
        if not file.is_file():
            raise UserError(f"unknown preset {preset!r} (known: {', '.join(list_presets())})")
    else:
        file = Path(path)
        if not file.is_file():
            raise UserError(f"deployment file not found: {file}")
    try:
        raw = tomllib.loads(file.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"invalid TOML in {file}: {exc}") from None
    return _parse(raw, file)


def _model_spec(raw: Any, what: str, base: Path) -> ModelSpec:
    if not isinstance(raw, dict) or (("path" in raw) == ("random" in raw)):
        raise UserError(f"deployment: [{what}] needs exactly one of path = \"...\" or random = {{...}}")
    path = raw.get("path")
    if path is not None:
        path = _resolve(str(path), base)
    return ModelSpec(path=path, random=raw.get("random"), seed=int(raw.get("seed", 0)))


def _twin(raw: Any, file: Path) -> tuple[int, int | None]:
    """[twin] width = R (repeat every unit R times), depth = L (optional: pad to L layers)."""
    if not isinstance(raw, dict) or set(raw) - {"width", "depth"}:
        raise UserError(f"{file}: [twin] takes width = R and optionally depth = L")
    width, depth = raw.get("width", 1), raw.get("depth")
    if not isinstance(width, int) or width < 1:
        raise UserError(f"{file}: [twin] width must be a positive integer, got {width!r}")
    if depth is not None and (not isinstance(depth, int) or depth < 1):
        raise UserError(f"{file}: [twin] depth must be a positive integer, got {depth!r}")
    return width, depth


def _resolve(path: str, base: Path) -> Path:
    """`@models/NAME` is a checkpoint fetched or trained into the models folder ($SPECPILOT_MODELS or
    ~/.cache/specpilot/models); other relative paths are relative to the deployment file."""
    if path.startswith("@models/"):
        from specpilot.models.smollm2 import models_dir

        return models_dir() / path.removeprefix("@models/")
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def _parse(raw: dict[str, Any], file: Path) -> Deployment:
    known = {"name", "target", "drafter", "tokenizer", "regime", "device", "dtype", "context", "datasets",
             "split", "budgets", "enable_thinking", "twin", "system"}
    unknown = set(raw) - known
    if unknown:
        raise UserError(f"{file}: unknown deployment field(s) {', '.join(sorted(unknown))}")
    if "target" not in raw:
        raise UserError(f"{file}: a deployment needs a [target] table")
    budgets = raw.get("budgets", {})
    twin = _twin(raw.get("twin", {}), file)
    dep = Deployment(
        name=str(raw.get("name", file.stem)),
        target=_model_spec(raw["target"], "target", file.parent),
        drafter=_model_spec(raw["drafter"], "drafter", file.parent) if "drafter" in raw else None,
        tokenizer=str(raw.get("tokenizer", "target")),
        regime=str(raw.get("regime", "single")),
        device=str(raw.get("device", "auto")),
        dtype=str(raw.get("dtype", "auto")),
        context=int(raw.get("context", 4096)),
        datasets=list(raw.get("datasets", ["builtin"])),
        split=str(raw.get("split", "dev")),
        max_new_tokens=int(budgets.get("max_new_tokens", 256)),
        limit=budgets.get("limit"),
        enable_thinking=bool(raw.get("enable_thinking", False)),
        twin_width=twin[0],
        twin_depth=twin[1],
        system=str(raw["system"]) if "system" in raw else None,
        source=str(file),
    )
    if dep.regime not in REGIMES:
        raise UserError(f"{file}: regime {dep.regime!r} is not supported yet (supported: {', '.join(REGIMES)})")
    if dep.dtype != "auto" and dep.dtype not in DTYPES:
        raise UserError(f"{file}: dtype {dep.dtype!r} (known: auto, {', '.join(DTYPES)})")
    for d in dep.datasets:
        if d not in DATASETS:
            raise UserError(f"{file}: unknown dataset {d!r} (known: {', '.join(DATASETS)})")
    if dep.system is not None:
        from specpilot.config.env import parse

        parse(dep.system)  # a bad system name fails while the file loads, not mid-run
    if dep.target.path is None and dep.tokenizer == "target":
        dep.tokenizer = "bytes"
    return dep


def random_target_config(fields: dict[str, Any]) -> DenseConfig:
    try:
        cfg = DenseConfig(**fields)
    except TypeError as exc:
        raise UserError(f"deployment: bad random target fields: {exc}") from None
    cfg.validate()
    return cfg


def random_drafter_config(target: DenseConfig, fields: dict[str, Any]) -> DrafterConfig:
    from specpilot.fixtures.random_models import tiny_drafter_config

    try:
        return tiny_drafter_config(target, **fields)
    except TypeError as exc:
        raise UserError(f"deployment: bad random drafter fields: {exc}") from None
