"""The deployment's own reduction-order noise, measured: how far an exact-equivalent recomputation moves a margin.

The same output of the exact target is scored as one verify pass over all its rows, then again under
perturbations that compute the same function in another order: passes of 1, 4 and 16 rows (the decode's and the
verify's shapes) and, on a GPU, other kernel configurations (the PyTorch references instead of Triton, the
few-row GEMV). Their top-1/top-2 log-prob gaps differ only by the order of reductions. That difference,
position by position, is the noise a lossless system's margins carry; its maximum bounds how far a legitimate
near-tie can be from zero. (CUDA graphs replay the kernels they captured: graphs on or off is no perturbation.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Forward
from specpilot.models.dense import DenseTarget, Mode


@torch.inference_mode()
def _gaps(target: DenseTarget, prompt: list[int], output: list[int], rows: int, plan: KernelPlan) -> torch.Tensor:
    """[len(output)] float32: log p(top-1) - log p(top-2) before each output token, the output fed `rows` at a
    time after the prompt's prefill, every forward under `plan`."""
    device = target.embed.weight.device
    cache = target.new_cache(1, len(prompt) + len(output))
    ids = torch.tensor([prompt], device=device)
    logits, _ = target(ids, Forward.consecutive(torch.arange(len(prompt), device=device)[None]), cache, Mode.PREFILL,
                       plan)
    out = [logits[0, -1:]]
    seq = torch.tensor(output, device=device)
    for s in range(0, len(output) - 1, rows):
        chunk = seq[s : min(s + rows, len(output) - 1)]
        start = torch.tensor([len(prompt) + s], device=device)
        pos = start[:, None] + torch.arange(len(chunk), device=device)
        logits, _ = target(chunk[None], Forward.consecutive(pos), cache, Mode.VERIFY, plan)
        out.append(logits[0])
    logp = torch.log_softmax(torch.cat(out).float(), -1)
    top = logp.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).cpu()


def perturbations(device: torch.device, share: Callable[[KernelPlan], KernelPlan] = lambda p: p
                  ) -> dict[str, tuple[int | None, KernelPlan]]:
    """name -> (rows per pass, None: all at once; kernel plan): the exact-equivalent recomputations measured.
    share: the plan of equal features whose kernel configs are chosen already (bench/harness.Runner.shared_plan):
    on a GPU the GEMV's autotuner would otherwise compile every config of every shape (39 s on SmolLM2)."""
    stock = share(KernelPlan.stock())
    out: dict[str, tuple[int | None, KernelPlan]] = {"rows=1": (1, stock), "rows=4": (4, stock), "rows=16": (16, stock)}
    if device.type == "cuda":  # elsewhere every plan runs the same PyTorch references
        out["kernels=naive"] = (None, share(KernelPlan.stock(kernels="naive")))
        out["gemv,rows=1"] = (1, share(KernelPlan.stock(gemv=True)))
    return out


def margin_noise(target: DenseTarget, pairs: list[tuple[list[int], list[int]]], max_tokens: int = 64,
                 naive: bool = False, share: Callable[[KernelPlan], KernelPlan] = lambda p: p) -> dict:
    """pairs: (prompt, output) of the exact target's own greedy runs. Returns the per-position changes of the
    top-2 gap between a one-pass recomputation and each perturbation: their maximum (the noise bound), a high
    quantile, each perturbation's maximum and how many positions were measured. naive: on the PyTorch references
    alone, in passes of 1, 4 and 16 rows (the noise of a computation that runs on them: forcing/logic.py)."""
    stock, diffs = share(KernelPlan.stock(**({"kernels": "naive"} if naive else {}))), {}
    which = perturbations(torch.device("cpu") if naive else target.embed.weight.device, share)
    if naive:
        which = {name: (rows, stock) for name, (rows, _) in which.items()}
    for prompt, output in pairs:
        out = output[:max_tokens]
        if len(out) < 2:
            continue
        base = _gaps(target, prompt, out, len(out), stock)
        for name, (rows, plan) in which.items():
            diffs.setdefault(name, []).append((base - _gaps(target, prompt, out, rows or len(out), plan)).abs())
    if not diffs:
        return {"positions": 0, "max": 0.0, "q99": 0.0, "perturbations": {}}
    each = {name: torch.cat(d) for name, d in diffs.items()}
    d = torch.cat(list(each.values()))
    return {"positions": d.numel() // len(each), "max": float(d.max()), "q99": float(d.quantile(0.99)),
            "perturbations": {name: float(v.max()) for name, v in each.items()}}
