"""Block-level hand-offs between two kernels that run at once (the layer halves: models/halves.py).

A kernel launched early by programmatic dependent launch may wait for a kernel two or more launches back
without waiting for the one just before it: each block of the producer arrives on a counter after its
writes, the consumer's blocks spin until all have arrived. `griddepcontrol.wait` can only wait for the
kernel just before. Deadlock-free only because a dependent launch starts after every block of the kernel
before it has started, so that every producer block is running or done by then. The consumer's last
block to pass resets the counter for the next step (the fused attention combine counts the same way).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def arrive(sync_ptr):
    """This block's writes are done: one arrival on sync_ptr[0] (release at GPU scope, after all threads)."""
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")


@triton.jit
def await_arrivals(sync_ptr, expected, consumers):
    """Spin until `expected` blocks arrived on sync_ptr[0]; the last of the `consumers` blocks that wait on
    it resets it and its own count sync_ptr[1]."""
    while tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu") < expected:
        pass
    if tl.atomic_add(sync_ptr + 1, 1, sem="relaxed", scope="gpu") == consumers - 1:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")
