"""Which implementation a kernel package runs, as the kernel plan says (its `kernels` option):
  auto (default)  Triton for CUDA tensors when triton imports, the reference otherwise;
  naive           always the plain PyTorch reference;
  triton          always Triton, also for CPU tensors (for tests under Triton's interpreter).
Nothing here touches tensor data, so the choice is safe inside CUDA-graph capture. No kernel module reads
the environment: every choice comes from the plan the caller hands over.
"""

from __future__ import annotations

import functools

import torch

from specpilot.config.plan import KernelPlan


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton runs its CPU interpreter (its own TRITON_INTERPRET knob, read by Triton)."""
    if not triton_available():
        return False
    import triton.knobs

    return bool(triton.knobs.runtime.interpret)


def use_triton(t: torch.Tensor, plan: KernelPlan) -> bool:
    """True when the Triton kernel should handle tensor t under this plan (see the module docstring)."""
    if plan.kernels == "naive":
        return False
    if plan.kernels == "triton":
        if not triton_available():
            raise RuntimeError("the plan asks for kernels=triton but triton cannot be imported")
        return True
    return t.is_cuda and triton_available()


def fix_triton_interpreter() -> None:
    """Let Triton's CPU interpreter run loops whose bounds are computed in-kernel.

    The interpreter holds scalars as 1-element numpy arrays and turns them into Python ints with int(),
    which NumPy >= 2.4 refuses for arrays of ndim > 0, so `for i in range(lo, hi, step)` with tensor
    bounds fails. This wraps the interpreter's tensor patching so that __index__ uses .item(). It does
    nothing outside interpreter mode or when the interpreter's internals are not as expected."""
    if not interpreting():
        return
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_specpilot_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched._specpilot_fixed = True
    interpreter._patch_lang_tensor = patched


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def pdl_on(t: torch.Tensor, plan: KernelPlan, default: bool = False) -> bool:
    """Launch the decode kernels with programmatic dependent launch (Hopper and later): a kernel's blocks
    start while the previous kernel drains, stream what no earlier kernel writes (weights), then wait
    (`griddepcontrol.wait`) before reading activations. It changes when kernels run, never what they
    compute. The plan's `pdl` = on / off forces it; auto lets `default` decide: the kernels of the one-row
    `gemv` step pass True (the streaming GEMV releases the next kernel after its last weight load, the
    latency-bound rope and attention at their start: on the H200 the 8B AR step was 3-9% faster with it,
    the 27B step -0.4 to +1.9%, bench/results/2026-11-29_engine_core_*_h200.json), kernels beside cuBLAS's
    GEMMs False (there early launches made the step slower, ..._engine_core_gemv_pdl_h200.json).
    Releasing the next kernel earlier than after the last weight load (at a streaming kernel's start,
    halfway, or 1-4 weight tiles before its end) made both models' steps 2-17% slower
    (..._engine_core_pdl_{early,mid,ahead}_*_h200.json): the next kernel's first loads then compete with
    the running kernel's last ones, which are on the critical path."""
    if not t.is_cuda or interpreting():
        return False
    if not (plan.pdl == "on" or (plan.pdl == "auto" and default)):
        return False
    return _capability(t.device.index if t.device.index is not None else torch.cuda.current_device())[0] >= 9
