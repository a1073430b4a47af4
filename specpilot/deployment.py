"""Deployments: what is served (target, drafter, regime, device, request sets, budgets), as a TOML file.

Presets are deployments shipped in `specpilot/presets/`. A deployment builds the models it names:
a checkpoint folder (`path`) or a seeded random model (`random`, a table of config fields).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specpilot.datasets import DATASETS
from specpilot.errors import UserError
from specpilot.models.config import DenseConfig, DrafterConfig, GDNShape

PRESET_DIR = Path(__file__).parent / "presets"
REGIMES = ("single", "batch")  # batch: `in_flight` requests at once (continuous batching, runtime/batch.py)
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
    in_flight: int = 1  # requests in flight under regime batch (its engines' slots); 1 under single
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
    # a hybrid twin: {"layers": GDN layers before each layer, and the GDNShape's fields} (models/twin.py)
    twin_gdn: dict | None = None
    system: str | None = None  # the system this deployment serves by default (a loop's best.toml names one)
    source: str = ""

    def serving(self, in_flight: int) -> Deployment:
        """This deployment serving `in_flight` requests at once: regime batch above one, single at one."""
        return dataclasses.replace(self, regime="batch" if in_flight > 1 else "single", in_flight=in_flight)

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

    @property
    def twin(self) -> bool:
        """Whether the models served are the widened twin of the ones named (runtime/pair.py)."""
        return self.twin_width > 1 or self.twin_depth is not None or self.twin_gdn is not None

    def tokenizer_folder(self) -> Path | None:
        """The folder the tokenizer loads from (None: bytes)."""
        if self.tokenizer == "bytes":
            return None
        return self.target.path if self.tokenizer == "target" else Path(self.tokenizer)

    def as_served(self) -> dict:
        """Every field as it resolved, for a result file: model and tokenizer folders absolute, with seeds and
        random configs; the device and dtype the models run on (the file's `auto` kept under `asked`)."""
        served = _plain(dataclasses.asdict(self))
        folder = self.tokenizer_folder()
        served.update(device=str(self.torch_device()), dtype=str(self.torch_dtype()), twin=self.twin,
                      tokenizer="bytes" if folder is None else str(folder.resolve()),
                      asked={"device": self.device, "dtype": self.dtype, "tokenizer": self.tokenizer})
        return served


def _plain(value: Any) -> Any:
    """JSON's types: paths absolute strings, inside tables and lists too."""
    if isinstance(value, Path):
        return str(value.resolve())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


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


_TYPES = {"int": (int, "an integer"), "float": ((int, float), "a number"), "bool": (bool, "true or false"),
          "str": (str, "a string")}


def fits(value: Any, annotation: str) -> bool:
    """Whether a TOML value has the type a dataclass field's annotation names ("int | None", "list[str]", ...);
    an annotation of another kind (a nested config) is not checked here."""
    alternatives = [a.strip() for a in annotation.split("|")]
    if value is None:
        return "None" in alternatives
    known = False
    for a in alternatives:
        if a in _TYPES:
            known = True
            if isinstance(value, _TYPES[a][0]) and (a == "bool") == isinstance(value, bool):
                return True
        elif a.startswith("list[") or a.startswith("dict"):
            known = True
            if a.startswith("list[") and isinstance(value, list) and all(fits(v, a[5:-1]) for v in value):
                return True
            if a.startswith("dict") and isinstance(value, dict):
                return True
    return not known


def described(annotation: str) -> str:
    a = annotation.replace(" | None", "").strip()
    if a.startswith("dict"):
        return "a table"
    if a.startswith("list["):
        return f"a list of {_TYPES.get(a[5:-1], (None, a[5:-1]))[1].removeprefix('an ').removeprefix('a ')}s"
    return _TYPES.get(a, (None, a))[1]


def _get(raw: dict, key: str, annotation: str, default: Any, where: str) -> Any:
    """raw[key] (or default), refused with the field's name unless it has the annotated type."""
    value = raw.get(key, default)
    if not fits(value, annotation):
        raise UserError(f"{where}{key} must be {described(annotation)}, got {value!r}")
    return value


def _only(table: dict, keys: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise UserError(f"{where}takes {', '.join(keys)}; unknown: {', '.join(unknown)}")


def _model_spec(raw: Any, what: str, base: Path, file: Path) -> ModelSpec:
    if not isinstance(raw, dict) or (("path" in raw) == ("random" in raw)):
        raise UserError(f"{file}: [{what}] needs exactly one of path = \"...\" or random = {{...}}")
    where = f"{file}: [{what}] "
    _only(raw, ("path", "random", "seed"), where)
    path = _get(raw, "path", "str | None", None, where)
    random = _get(raw, "random", "dict | None", None, where)
    seed = _get(raw, "seed", "int", 0, where)
    return ModelSpec(path=None if path is None else _resolve(path, base), random=random, seed=seed)


def _twin(raw: Any, file: Path) -> tuple[int, int | None, dict | None]:
    """[twin] width = R (repeat every unit R times), depth = L (optional: pad to L layers), gdn = {layers = P,
    k_heads, v_heads, k_dim, v_dim[, conv]} (optional: a hybrid twin, P GDN layers of that shape before each
    layer)."""
    if not isinstance(raw, dict) or set(raw) - {"width", "depth", "gdn"}:
        raise UserError(f"{file}: [twin] takes width = R, and optionally depth = L or gdn = {{...}}")
    width, depth, gdn = raw.get("width", 1), raw.get("depth"), raw.get("gdn")
    if not isinstance(width, int) or width < 1:
        raise UserError(f"{file}: [twin] width must be a positive integer, got {width!r}")
    if depth is not None and (not isinstance(depth, int) or depth < 1):
        raise UserError(f"{file}: [twin] depth must be a positive integer, got {depth!r}")
    if gdn is not None:
        gdn = _twin_gdn(gdn, file)
        if depth is not None:
            raise UserError(f"{file}: [twin] takes depth or gdn, not both")
    return width, depth, gdn


def _twin_gdn(raw: Any, file: Path) -> dict:
    fields = ("layers", "k_heads", "v_heads", "k_dim", "v_dim", "conv")
    if not isinstance(raw, dict) or set(raw) - set(fields) or set(fields[:5]) - set(raw):
        raise UserError(f"{file}: [twin] gdn takes layers, k_heads, v_heads, k_dim, v_dim (and optionally conv)")
    bad = [k for k, v in raw.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad or raw["v_heads"] % raw["k_heads"]:
        raise UserError(f"{file}: [twin] gdn: positive integers, v_heads a multiple of k_heads (got {raw})")
    return {"conv": 4, **raw}


def _resolve(path: str, base: Path) -> Path:
    """`@models/NAME` is a checkpoint fetched or trained into the models folder ($SPECPILOT_MODELS or
    ~/.cache/specpilot/models); other relative paths are relative to the deployment file."""
    if path.startswith("@models/"):
        from specpilot.models.smollm2 import models_dir

        return models_dir() / path.removeprefix("@models/")
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def _parse(raw: dict[str, Any], file: Path) -> Deployment:
    known = {"name", "target", "drafter", "tokenizer", "regime", "in_flight", "device", "dtype", "context", "datasets",
             "split", "budgets", "enable_thinking", "twin", "system"}
    unknown = set(raw) - known
    if unknown:
        raise UserError(f"{file}: unknown deployment field(s) {', '.join(sorted(unknown))}")
    if "target" not in raw:
        raise UserError(f"{file}: a deployment needs a [target] table")
    where = f"{file}: "
    budgets = _get(raw, "budgets", "dict", {}, where)
    _only(budgets, ("max_new_tokens", "limit"), f"{file}: [budgets] ")
    twin = _twin(raw.get("twin", {}), file)
    tokenizer = _get(raw, "tokenizer", "str", "target", where)
    dep = Deployment(
        name=_get(raw, "name", "str", file.stem, where),
        target=_model_spec(raw["target"], "target", file.parent, file),
        drafter=_model_spec(raw["drafter"], "drafter", file.parent, file) if "drafter" in raw else None,
        tokenizer=tokenizer if tokenizer in ("target", "bytes") else str(_resolve(tokenizer, file.parent)),
        regime=_get(raw, "regime", "str", "single", where),
        in_flight=_get(raw, "in_flight", "int", 1, where),
        device=_get(raw, "device", "str", "auto", where),
        dtype=_get(raw, "dtype", "str", "auto", where),
        context=_get(raw, "context", "int", 4096, where),
        datasets=list(dict.fromkeys(_get(raw, "datasets", "list[str]", ["builtin"], where))),
        split=_get(raw, "split", "str", "dev", where),
        max_new_tokens=_get(budgets, "max_new_tokens", "int", 256, f"{file}: [budgets] "),
        limit=_get(budgets, "limit", "int | None", None, f"{file}: [budgets] "),
        enable_thinking=_get(raw, "enable_thinking", "bool", False, where),
        twin_width=twin[0],
        twin_depth=twin[1],
        twin_gdn=twin[2],
        system=_get(raw, "system", "str | None", None, where),
        source=str(file),
    )
    for key, value in (("context", dep.context), ("[budgets] max_new_tokens", dep.max_new_tokens),
                       ("[budgets] limit", 1 if dep.limit is None else dep.limit)):
        if value <= 0:
            raise UserError(f"{file}: {key} must be positive, got {value}")
    if dep.device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", dep.device):
        raise UserError(f"{file}: device {dep.device!r} (known: auto, cpu, cuda, cuda:N)")
    if dep.tokenizer not in ("target", "bytes") and not Path(dep.tokenizer).is_dir():
        raise UserError(f"{file}: tokenizer folder not found: {dep.tokenizer}")
    if dep.regime not in REGIMES:
        raise UserError(f"{file}: regime {dep.regime!r} is not supported yet (supported: {', '.join(REGIMES)})")
    if dep.in_flight < 1 or (dep.regime == "single" and dep.in_flight != 1):
        raise UserError(f"{file}: in_flight must be 1 under regime single and at least 1 under regime batch, got "
                        f"{dep.in_flight}")
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


def _typed(fields: dict[str, Any], annotations: dict[str, str], what: str) -> None:
    """Each random-model field refused unless its TOML value has the config field's type."""
    for key, value in fields.items():
        if key in annotations and not fits(value, annotations[key]):
            raise UserError(f"deployment: random {what} field {key} must be {described(annotations[key])}, "
                            f"got {value!r}")


def random_target_config(fields: dict[str, Any]) -> DenseConfig:
    fields = dict(fields)
    shape = fields.pop("gdn", None)  # a hybrid's Gated DeltaNet shape: a table of GDNShape's fields
    _typed(fields, {f.name: str(f.type) for f in dataclasses.fields(DenseConfig)}, "target")
    try:
        if shape is not None:
            if not isinstance(shape, dict):
                raise TypeError("gdn must be a table {k_heads, v_heads, k_dim, v_dim, conv}")
            _typed(shape, {f.name: str(f.type) for f in dataclasses.fields(GDNShape)}, "target gdn")
            fields["gdn"] = GDNShape(**shape)
        cfg = DenseConfig(**fields)
    except TypeError as exc:
        raise UserError(f"deployment: bad random target fields: {exc}") from None
    cfg.validate()
    return cfg


def random_drafter_config(target: DenseConfig, fields: dict[str, Any]) -> DrafterConfig:
    from specpilot.fixtures.random_models import tiny_drafter_config

    own = {"layers": "int"}  # tiny_drafter_config's own; the rest are DrafterConfig's fields
    _typed(fields, {**{f.name: str(f.type) for f in dataclasses.fields(DrafterConfig)}, **own}, "drafter")
    try:
        return tiny_drafter_config(target, **fields)
    except TypeError as exc:
        raise UserError(f"deployment: bad random drafter fields: {exc}") from None
