"""The loop's result as a file the other commands take as they are: `DIR/best.toml`, the deployment it ran on
with `system = "..."` set to the fastest configuration it proved lossless (`specpilot bench --deployment
DIR/best.toml` runs AR and that system; `generate` serves it)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from specpilot.deployment import Deployment, load_deployment
from specpilot.errors import UserError


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    raise UserError(f"cannot write {v!r} into a deployment file")


def _path(p: Path) -> str:
    """`@models/NAME` for a model in the models folder (the file then works on any machine that fetched it),
    else the absolute path (it then works from any folder)."""
    from specpilot.models.smollm2 import models_dir

    p, root = Path(p).resolve(), models_dir().resolve()
    return f"@models/{p.relative_to(root).as_posix()}" if p.is_relative_to(root) else str(p)


def _model(spec) -> dict:
    out = {"path": _path(spec.path)} if spec.path is not None else {"random": spec.random}
    return {**out, "seed": spec.seed}


def to_toml(dep: Deployment, system: str, comment: str = "") -> str:
    """The deployment as TOML (model paths absolute or in the models folder, so the file works from any folder)
    with its system."""
    top = {"name": dep.name, "system": system, "regime": dep.regime, "device": dep.device, "dtype": dep.dtype,
           "context": dep.context, "datasets": dep.datasets, "split": dep.split, "tokenizer": dep.tokenizer,
           "enable_thinking": dep.enable_thinking}
    lines = [f"# {line}" for line in comment.splitlines()] + [f"{k} = {_value(v)}" for k, v in top.items()]
    tables = {"target": _model(dep.target), **({"drafter": _model(dep.drafter)} if dep.drafter else {}),
              "budgets": {"max_new_tokens": dep.max_new_tokens, **({"limit": dep.limit} if dep.limit else {})}}
    if dep.twin:
        tables["twin"] = {"width": dep.twin_width, **({"depth": dep.twin_depth} if dep.twin_depth else {}),
                          **({"gdn": dep.twin_gdn} if dep.twin_gdn else {})}
    for name, body in tables.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def _resolved(dep: Deployment) -> tuple:
    return tuple(replace(m, path=Path(m.path).resolve()) if m and m.path is not None else m
                 for m in (dep.target, dep.drafter))


def write_best(path: Path, dep: Deployment, system: str, comment: str = "") -> Path:
    """Written atomically, then read back through the deployment loader: a file it cannot load is never left."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(to_toml(dep, system, comment))
    try:
        back = load_deployment(path=tmp)
        if back.system != system or _resolved(back) != _resolved(dep):
            raise UserError(f"{path}: the written deployment does not read back as written")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_best_patch(path: Path, repo: Path, base: str, commit: str) -> Path:
    """A result that is code: the patch from the loop's base commit to the result's (`git apply` it to a checkout of
    the base, then run the system loop.json names)."""
    from specpilot.memory.faithful import patch_between
    from specpilot.results import write_text_atomic

    write_text_atomic(path, patch_between(repo, base, commit))
    return path
