"""The one place the engine's options may come from the environment: SPECPILOT_OPTIONS.

`SPECPILOT_OPTIONS="pdl=off,l2=weights_kv"` sets options on top of every system a command runs (bench,
generate, force, the controller's workers): an override for ablations, never a default. Each result records
which options an override set (System.to_json's `env_overrides`) and which it named to no effect (`env_ignored`).
Nothing else in the engine reads the environment for an option; kernels never do.
"""

from __future__ import annotations

import os
from dataclasses import replace

from specpilot.config.options import BASES, OPTIONS
from specpilot.config.system import System, check_options, parse_system, with_options
from specpilot.errors import UserError

VARIABLE = "SPECPILOT_OPTIONS"


def override_text() -> str:
    return os.environ.get(VARIABLE, "").strip()


def overridden(system: System) -> System:
    """The system with SPECPILOT_OPTIONS applied; options it does not read (another base's, another tree
    builder's) are left out and listed as ignored."""
    text = override_text()
    if not text:
        return system
    items = [i for i in text.split(",") if i.strip()]
    try:
        for item in items:  # each checked, value too, against a base it applies to: a typo fails for AR too
            key = item.partition("=")[0].strip()
            check_options(OPTIONS[key].bases[0] if key in OPTIONS else BASES[0], item)  # the usual errors
        kept = [i for i in items if system.base in OPTIONS[_key(i)].bases]
        out = with_options(system, ",".join(kept), overridden=True) if kept else system
    except UserError as exc:
        raise UserError(f"{VARIABLE}={text!r}: {exc}") from None
    other_base = {_key(i) for i in items} - {_key(i) for i in kept}
    return replace(out, ignored=tuple(sorted(set(out.ignored) | other_base)))


def _key(item: str) -> str:
    return item.partition("=")[0].strip()


def parse(text: str) -> System:
    """A system as the command line gives it: parsed, then the environment's overrides applied."""
    return overridden(parse_system(text))
