"""Systems and their option registry.

A system is `base[:key=value,...]`: `ar` (plain greedy decoding) or `stock` (the drafter's own greedy
chain verified by the target, as the drafter's release runs it). Every option's default reproduces
stock exactly; later mechanisms add options here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specpilot.errors import UserError
from specpilot.runtime.faults import FAULTS

BASES = ("ar", "stock")


@dataclass(frozen=True)
class Option:
    name: str
    kind: type
    default: Any
    help: str
    bases: tuple[str, ...] = BASES
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("graphs", bool, True, "capture decode/verify steps as CUDA graphs (no effect on the CPU)"),
        Option("gemv", bool, False, "few-row target projections through the Triton weight-streaming GEMV "
               "(default: cuBLAS)"),
        Option("fault", str, "none", "a deliberately lossy variant, for auditing token forcing "
               "(logit_bias, fp16_head, skip_layer, topk_truncate, norm_eps, unverified_accept)",
               choices=FAULTS),
        Option("block_size", int, 0, "draft block size: 0 = the drafter's own, else 2..its own",
               bases=("stock",), minimum=0),
        Option("pad_us", float, 0.0, "an idle kernel of this many microseconds in every decode step: a known, "
               "lossless slowdown for testing the controller", minimum=0),
    )
}


@dataclass(frozen=True)
class System:
    base: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        if not self.options:
            return self.base
        return self.base + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in sorted(self.options.items()))

    def get(self, key: str) -> Any:
        return self.options.get(key, OPTIONS[key].default)


def _fmt(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _convert(opt: Option, raw: str) -> Any:
    if opt.kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise UserError(f"option {opt.name} takes true or false, got {raw!r}")
    try:
        value = opt.kind(raw)
    except ValueError:
        raise UserError(f"option {opt.name} takes a {opt.kind.__name__}, got {raw!r}") from None
    if opt.choices is not None and value not in opt.choices:
        raise UserError(f"option {opt.name} must be one of {', '.join(map(str, opt.choices))}, got {raw!r}")
    if opt.minimum is not None and value < opt.minimum:
        raise UserError(f"option {opt.name} must be >= {opt.minimum}, got {raw!r}")
    return value


def parse_system(text: str) -> System:
    """`stock:block_size=8` -> System('stock', {'block_size': 8}); defaults are dropped so that equal
    systems have equal names."""
    base, _, rest = text.strip().partition(":")
    if base not in BASES:
        raise UserError(f"unknown system {base!r} (known: {', '.join(BASES)})")
    options: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if key not in OPTIONS:
            raise UserError(f"unknown system option {key!r} in {text!r} (known: {', '.join(OPTIONS)})")
        opt = OPTIONS[key]
        if base not in opt.bases:
            raise UserError(f"option {key!r} does not apply to system {base!r}")
        if not eq:
            raise UserError(f"system option {key!r} in {text!r} needs a value (key=value)")
        value = _convert(opt, raw.strip())
        if value != opt.default:
            options[key] = value
    return System(base, options)
