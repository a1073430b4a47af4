"""Build a deployment's target, drafter and tokenizer, and check that the two models fit together."""

from __future__ import annotations

from specpilot.deployment import Deployment, random_drafter_config, random_target_config
from specpilot.errors import UserError
from specpilot.models.config import DenseConfig, DrafterConfig
from specpilot.models.dense import DenseTarget
from specpilot.models.dflash import DFlashDrafter
from specpilot.models.tokenizer import ByteTokenizer, HFTokenizer


def check_pair(target: DenseConfig, drafter: DrafterConfig) -> None:
    if drafter.layer.vocab_size != target.vocab_size:
        raise UserError(f"drafter and target vocabularies differ: {drafter.layer.vocab_size} vs {target.vocab_size}")
    if drafter.layer.hidden_size != target.hidden_size:
        raise UserError(f"drafter and target hidden sizes differ: {drafter.layer.hidden_size} vs {target.hidden_size}")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise UserError(f"drafter mask_token_id {drafter.mask_token_id} is outside the target vocabulary "
                        f"(0..{target.vocab_size - 1})")
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise UserError(f"drafter target_layer_ids {bad} are outside the target's {target.num_layers} layers")
    if drafter.num_target_layers and drafter.num_target_layers != target.num_layers:
        raise UserError(f"drafter was made for a {drafter.num_target_layers}-layer target, "
                        f"this target has {target.num_layers}")


def build_pair(dep: Deployment, with_drafter: bool = True):
    """-> (target, drafter or None, tokenizer), on the deployment's device and dtype."""
    from specpilot.fixtures.random_models import random_drafter, random_target
    from specpilot.models.loading import load_drafter, load_target

    device, dtype = dep.torch_device(), dep.torch_dtype()
    if dep.target.path is not None:
        fetch_if_known(dep.target.path)
    for spec, what in ((dep.target, "target"), (dep.drafter, "drafter")):
        if spec is not None and spec.path is not None and not spec.path.is_dir():
            raise UserError(f"{what} checkpoint folder not found: {spec.path}" + _hint(spec.path))
    rope = dep.context + 1
    if dep.target.path is not None:
        target: DenseTarget = load_target(dep.target.path, dtype, device, rope_length=rope)
    else:
        cfg = random_target_config(dep.target.random or {})
        target = random_target(cfg, dep.target.seed, dtype, device, rope_length=rope)
    drafter: DFlashDrafter | None = None
    if with_drafter and dep.drafter is not None and _eagle3(dep.drafter):
        drafter = _build_eagle3(dep, target, dtype, device, rope)
    elif with_drafter and dep.drafter is not None:
        if dep.drafter.path is not None:
            drafter = load_drafter(dep.drafter.path, dtype, device, rope_length=rope)
        else:
            dcfg = random_drafter_config(target.cfg, dep.drafter.random or {})
            check_pair(target.cfg, dcfg)
            drafter = random_drafter(dcfg, dep.drafter.seed, dtype, device, rope_length=rope)
        check_pair(target.cfg, drafter.cfg)
    tokenizer = _tokenizer(dep, target.cfg)
    if dep.twin:
        target, drafter = _twin(dep, target, drafter)
    return target, drafter, tokenizer


def _eagle3(spec) -> bool:
    """Whether the deployment's drafter is an EAGLE-3 one (its checkpoint's architecture, or random kind=eagle3)."""
    from specpilot.models.eagle3 import is_eagle3

    return (spec.random or {}).get("kind") == "eagle3" if spec.path is None else is_eagle3(spec.path)


def _build_eagle3(dep: Deployment, target: DenseTarget, dtype, device, rope: int):
    from specpilot.fixtures.random_models import random_eagle3
    from specpilot.models.eagle3 import check_eagle3_pair, load_eagle3

    if dep.drafter.path is not None:
        drafter = load_eagle3(dep.drafter.path, dtype, device, target.cfg.num_layers)
    else:
        fields = {k: v for k, v in (dep.drafter.random or {}).items() if k != "kind"}
        unknown = set(fields) - {"draft_vocab", "taps"}
        if unknown:
            raise UserError(f"deployment: random EAGLE-3 drafter fields {sorted(unknown)} (known: draft_vocab, taps)")
        drafter = random_eagle3(target.cfg, int(fields.get("draft_vocab", target.cfg.vocab_size)), dep.drafter.seed,
                                tuple(fields["taps"]) if "taps" in fields else None, dtype, device)
    check_eagle3_pair(target.cfg, drafter.cfg)
    drafter.set_rope_length(max(rope, drafter.rope.length), device=device)
    return drafter


def _twin(dep: Deployment, target: DenseTarget, drafter: DFlashDrafter | None):
    """Widen in memory (the fast path: no 50 GB checkpoint to write or read)."""
    from specpilot.models.config import GDNShape
    from specpilot.models.twin import widen_drafter, widen_eagle3, widen_target

    r, depth, hybrid = dep.twin_width, dep.twin_depth, dict(dep.twin_gdn or {})
    if depth is not None and depth < target.cfg.num_layers:
        raise UserError(f"[twin] depth {depth} is below the target's {target.cfg.num_layers} layers")
    per = hybrid.pop("layers", 0)
    gdn = GDNShape(**hybrid) if per else None
    if gdn is not None and "gdn" in target.cfg.kinds:
        raise UserError("[twin] gdn: the target is already a hybrid; a hybrid twin is made of a dense model")
    small = sum(p.numel() * p.element_size() for p in target.parameters())
    need = small * r * r * (depth or target.cfg.num_layers) / target.cfg.num_layers * (1 + per)
    if target.embed.weight.device.type == "cpu" and need > 0.5 * _memory_bytes():
        raise UserError(f"the x{r} twin needs about {need / 1e9:.0f} GB of weights, more than half of this "
                        "machine's memory: run it on a GPU")
    wide_target = widen_target(target, r, depth, gdn, per)
    if drafter is None:
        wide_drafter = None
    elif isinstance(drafter, DFlashDrafter):
        wide_drafter = widen_drafter(drafter, r, depth, per)
    else:  # EAGLE-3: depth pads after the source's layers, so its taps keep their indices
        wide_drafter = widen_eagle3(drafter, r, per)
    return wide_target, wide_drafter


def _memory_bytes() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fetch_if_known(path) -> None:
    """A model `specpilot models fetch` knows (SmolLM2) is fetched on first use, like a hub download;
    a folder that exists is never touched (the GPU machine stages its own copy, offline)."""
    import sys

    from specpilot.models.smollm2 import fetch_smollm2, models_dir

    if path == models_dir() / "smollm2" and not path.exists():
        print(f"fetching SmolLM2-135M-Instruct into {path} (once)", file=sys.stderr)
        fetch_smollm2(path, progress=lambda s: print(s, file=sys.stderr))


def _hint(path) -> str:
    if path.name == "smollm2":
        return " (run `specpilot models fetch smollm2`)"
    if path.name.endswith("-dflash"):
        return " (train it with `specpilot train-drafter`)"
    return ""


def _tokenizer(dep: Deployment, cfg: DenseConfig):
    folder = dep.tokenizer_folder()
    if folder is None:
        tok = ByteTokenizer(cfg.vocab_size)
    else:
        tok = HFTokenizer(folder, enable_thinking=dep.enable_thinking)
        if tok.vocab_size > cfg.vocab_size:
            raise UserError(f"tokenizer has {tok.vocab_size} tokens, more than the target's {cfg.vocab_size}")
    tok.eos_ids = tuple(dict.fromkeys([*tok.eos_ids, *cfg.eos_token_ids]))
    return tok
