"""Which implementation a kernel package runs: the Triton kernel or the plain PyTorch reference.

The environment variable SPECPILOT_KERNELS picks:
  auto (default)  Triton for CUDA tensors when triton imports, the reference otherwise;
  naive           always the reference;
  triton          always Triton, also for CPU tensors (for tests under TRITON_INTERPRET=1).
Nothing here touches tensor data, so the choice is safe inside CUDA-graph capture.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

MODES = ("auto", "naive", "triton")
_forced: list[str] = []  # innermost `kernels_forced` wins over the environment


@contextlib.contextmanager
def kernels_forced(mode: str):
    """Run a region with one implementation, e.g. "naive" for training: the Triton kernels have no
    backward, the references are plain differentiable PyTorch."""
    if mode not in MODES:
        raise ValueError(f"kernel mode {mode!r}: expected one of {', '.join(MODES)}")
    _forced.append(mode)
    try:
        yield
    finally:
        _forced.pop()


def kernel_mode() -> str:
    if _forced:
        return _forced[-1]
    mode = os.environ.get("SPECPILOT_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"SPECPILOT_KERNELS={mode!r}: expected one of {', '.join(MODES)}")
    return mode


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """True when the Triton kernel should handle tensor t (see the module docstring)."""
    mode = kernel_mode()
    if mode == "naive":
        return False
    if mode == "triton":
        if not triton_available():
            raise RuntimeError("SPECPILOT_KERNELS=triton but triton cannot be imported")
        return True
    return t.is_cuda and triton_available()


def env_switch(name: str) -> bool:
    """An on-by-default environment switch: unset or 1 on, 0 off, anything else an error."""
    mode = os.environ.get(name, "").strip()
    if mode not in ("", "0", "1"):
        raise ValueError(f"{name}={mode!r}: expected 1 (on, the default) or 0 (off)")
    return mode != "0"


def fix_triton_interpreter() -> None:
    """Let Triton's CPU interpreter (TRITON_INTERPRET=1) run loops whose bounds are computed in-kernel.

    The interpreter holds scalars as 1-element numpy arrays and turns them into Python ints with int(),
    which NumPy >= 2.4 refuses for arrays of ndim > 0, so `for i in range(lo, hi, step)` with tensor
    bounds fails. This wraps the interpreter's tensor patching so that __index__ uses .item(). It does
    nothing outside interpreter mode or when the interpreter's internals are not as expected."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or not triton_available():
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


def pdl_on(t: torch.Tensor, default: bool = False) -> bool:
    """Launch the decode kernels with programmatic dependent launch (Hopper and later): a kernel's blocks
    start while the previous kernel drains, stream what no earlier kernel writes (weights), then wait
    (`griddepcontrol.wait`) before reading activations. It changes when kernels run, never what they
    compute. SPECPILOT_PDL=1 / 0 forces it on / off; unset, `default` decides: the kernels of the one-row
    `gemv` step pass True (the streaming GEMV releases the next kernel after its last weight load, the
    latency-bound rope and attention at their start: on the H200 the 8B AR step was 3-9% faster with it,
    the 27B step -0.4 to +1.9%, bench/results/2026-11-29_engine_core_*_h200.json), kernels beside cuBLAS's
    GEMMs False (there early launches made the step slower, ..._engine_core_gemv_pdl_h200.json).
    Releasing the next kernel earlier than after the last weight load (at a streaming kernel's start,
    halfway, or 1-4 weight tiles before its end) made both models' steps 2-17% slower
    (..._engine_core_pdl_{early,mid,ahead}_*_h200.json): the next kernel's first loads then compete with
    the running kernel's last ones, which are on the critical path (bench/gpu/trace_step.py shows it)."""
    forced = os.environ.get("SPECPILOT_PDL", "").strip()
    if forced not in ("", "0", "1"):
        raise ValueError(f"SPECPILOT_PDL={forced!r}: expected 1 (on), 0 (off) or unset (the kernel's default)")
    if not t.is_cuda or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    if not (forced == "1" or (forced == "" and default)):
        return False
    return _capability(t.device.index if t.device.index is not None else torch.cuda.current_device())[0] >= 9
