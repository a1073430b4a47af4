"""Systems: `base[:key=value,...]`, a base (`ar`: greedy decoding; `stock`: the drafter's own greedy chain
verified by the target, as the drafter's release runs it) and the options that differ from their defaults.

A System is the engine's whole configuration: its name lists every non-default option (so equal systems
have equal names), `get` reads any option, `plan()` builds the kernel plan, `to_json()` is what every result
file and evidence card records.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from specpilot.config.options import BASES, OPTIONS, convert, plan_options
from specpilot.config.plan import KernelPlan
from specpilot.errors import UserError


@dataclass(frozen=True)
class System:
    base: str
    options: dict[str, Any] = field(default_factory=dict)  # the non-default ones
    overridden: tuple[str, ...] = ()  # options set by the SPECPILOT_OPTIONS override (config/env.py)
    # options the override named that this system does not read (another base's, another tree builder's)
    ignored: tuple[str, ...] = field(default=(), compare=False)
    # what an engine resolved options whose default defers to the drafter to (block_size=0: its own block); the
    # same system either way, so not compared
    resolved: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        if not self.options:
            return self.base
        return self.base + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in sorted(self.options.items()))

    def get(self, key: str) -> Any:
        return self.options.get(key, OPTIONS[key].default)

    @property
    def speculative(self) -> bool:
        return self.base == "stock"

    def plan(self) -> KernelPlan:
        """A fresh kernel plan (with an empty tuning table) from this system's kernel options."""
        return KernelPlan.stock(**{o.name: self.get(o.name) for o in plan_options() if o.name in self.options})

    def diagnostic(self) -> bool:
        return any(OPTIONS[k].group == "diagnostic" for k in self.options)

    def resolving(self, **values: Any) -> System:
        """This system with the values an engine ran its drafter-relative options at (block_size, nodes)."""
        return replace(self, resolved=values)

    def to_json(self) -> dict:
        """The complete configuration: every option with the value it ran at (resolved, where an engine resolved
        it), the value asked for where that differs, which ones differ from the defaults, which an environment
        override set and which it named to no effect here."""
        values = {name: self.resolved.get(name, self.get(name)) for name, opt in OPTIONS.items()
                  if self.base in opt.bases}
        asked = {k: self.get(k) for k, v in self.resolved.items() if v != self.get(k)}
        return {"system": self.name, "base": self.base, "options": values, "asked": asked,
                "changed": sorted(self.options), "env_overrides": list(self.overridden),
                "env_ignored": list(self.ignored)}


def _fmt(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def parse_system(text: str, diagnostics: bool = False) -> System:
    """`stock:block_size=8` -> System('stock', {'block_size': 8}); defaults are dropped. Diagnostic options
    (outputs wrong, timing only) are refused unless `diagnostics` (the GPU timing scripts)."""
    base, _, rest = text.strip().partition(":")
    if base not in BASES:
        raise UserError(f"unknown system {base!r} (known: {', '.join(BASES)})")
    options = _options(base, rest, text, diagnostics)
    idle = _idle(options)
    if idle:  # a user's text: said, not dropped
        key, builder = idle[0], BUILDER_OF[idle[0]]
        raise UserError(f"option {key} acts only with tree={builder} (in {text!r})")
    return System(base, options)


def check_options(base: str, text: str) -> None:
    """Each key=value of `text` known, applying to `base`, of its option's type and range; no system is made (an
    override's options are checked one by one, wherever they will apply)."""
    _options(base, text, f"{base}:{text}", False)


BUILDER_OF = {"tree_k": "eagle2", "tree_accept": "sequoia"}  # options one tree builder alone reads


def _idle(options: dict[str, Any]) -> list[str]:
    """The options set that the system's tree builder does not read (they would change its name, not its run)."""
    tree = options.get("tree", OPTIONS["tree"].default)
    return [k for k, builder in BUILDER_OF.items() if k in options and tree != builder]


def _options(base: str, rest: str, text: str, diagnostics: bool) -> dict[str, Any]:
    options: dict[str, Any] = {}
    seen: set[str] = set()
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if key in seen:
            raise UserError(f"option {key!r} given twice in {text!r}")
        seen.add(key)
        if key not in OPTIONS:
            raise UserError(f"unknown system option {key!r} in {text!r} (see `specpilot options`)")
        opt = OPTIONS[key]
        if base not in opt.bases:
            raise UserError(f"option {key!r} does not apply to system {base!r}")
        if opt.group == "diagnostic" and not diagnostics:
            raise UserError(f"option {key!r} is a diagnostic (timing only, its outputs are wrong): refused here")
        if not eq:
            raise UserError(f"system option {key!r} in {text!r} needs a value (key=value)")
        try:
            value = convert(opt, raw.strip())
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if value != opt.default:
            options[key] = value
        else:
            options.pop(key, None)
    return options


def with_options(system: System, text: str, diagnostics: bool = False, overridden: bool = False) -> System:
    """`system` with the options of `text` (key=value,...) set on top; with `overridden`, recorded as overrides."""
    changes = _options(system.base, text, text, diagnostics)
    keys = {k.strip().partition("=")[0].strip() for k in text.split(",") if k.strip()}
    options = {k: v for k, v in system.options.items() if k not in keys}
    options.update(changes)
    unread = _unread(options, keys)
    for key in unread & set(options):  # composed (the loop's variants, an override): another builder's option goes
        options.pop(key)
    # an override records what it set that the run reads and, apart, what it named to no effect
    marked = (set(system.overridden) | (keys if overridden else set())) - unread
    ignored = set(system.ignored) | (unread if overridden else set())
    return System(system.base, options, tuple(sorted(marked)), tuple(sorted(ignored)))


def _unread(options: dict[str, Any], named: set[str]) -> set[str]:
    """The options set, or named (at their default too), that the system's tree builder does not read."""
    tree = options.get("tree", OPTIONS["tree"].default)
    return {k for k in set(options) | named if BUILDER_OF.get(k, tree) != tree}
