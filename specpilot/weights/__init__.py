"""Weight formats: objects that hold a projection's weight and own the kernels that multiply by it (and the
plain PyTorch reference they are checked against). `dense` is the model's own dtype (bf16 on the GPU);
a lossless 12-bit format plugs in beside it with the same methods."""

from specpilot.weights.dense import DenseWeight

__all__ = ["DenseWeight"]
