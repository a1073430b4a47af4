"""What binds the few-row kernel (issue 30), for Nsight Compute: the product on one projection shape (mlp.gate of
the hybrid, 5120 -> 17408) in W12 and BF16 at 1, 32 and 64 rows, each launched REPEATS times on fresh weights
(no L2 reuse), in a named NVTX-free order that the profile's launch index follows: w12/1, w12/32, w12/64,
bf16/1, bf16/32, bf16/64.

Usage (on the GPU, repository root; prebuilt cubins installed):
  ncu --clock-control none -k regex:few_row_product --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --csv \
      python3 bench/gpu/fewrow_profile.py > $OUT/fewrow_ncu.csv
"""

from __future__ import annotations

import torch

from bench.gpu.fewrow import weights_like
from specpilot.kernels import fewrow

REPEATS = 2
K, N = 5120, 17408


def main() -> None:
    forms = []
    for seed in range(REPEATS):
        w = weights_like(N, K, seed)
        forms.append((fewrow.encode_checked(w), fewrow.FewRowWeight.bf16(w)))
    x = torch.randn(64, K, device="cuda").to(torch.bfloat16)
    for which in (0, 1):  # W12, then BF16
        for m in (1, 32, 64):
            for pair in forms:
                fewrow.product(x[:m], pair[which])
    torch.cuda.synchronize()
    print("launches:", [f"{f}/{m}" for f in ("w12", "bf16") for m in (1, 32, 64) for _ in range(REPEATS)])


if __name__ == "__main__":
    main()
