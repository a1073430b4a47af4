#!/usr/bin/env bash
# The engine's headline on one GPU (~7 min): the GPU-only kernel tests, then engine_core.py --parts gemv for
# dense-8b (the default step tuning and, tuned afresh, VARIANTS_8B) and for dense-27b: AR ms per token against
# cuBLAS AR and the weight-pass floor, one model a process. Everything lands in /tmp/o and comes back as one
# tarball (at most 8 files return from a run).
# Usage: SPECPILOT_COMMIT=<sha> [VARIANTS_8B=pdl,three_rounds] [TESTS=0] bash bench/gpu/headline.sh
set -u
export PYTHONPATH=.
rm -rf /tmp/o && mkdir -p /tmp/o/8b /tmp/o/27b  # a warm machine keeps old files

core() {  # model, variants
  timeout 300 python3 -u bench/gpu/engine_core.py --parts gemv --models "dense-$1" --gemv-variants "$2" \
    --out "/tmp/o/$1" > "/tmp/o/$1.log" 2>&1
}

: > /tmp/o/tests.log
[ "${TESTS:-1}" = 1 ] && timeout 180 python3 -m pytest -q tests/test_kernels.py tests/test_attention_kernel.py \
  tests/test_attention_cluster.py -k "staged or greedy or cluster or bf16 or graph or decode_step" >> /tmp/o/tests.log 2>&1
core 8b "${VARIANTS_8B:-pdl,three_rounds}"
core 27b pdl
tail -n 2 /tmp/o/tests.log
for m in 8b 27b; do grep -E "AR with Triton|^\[bw\]" "/tmp/o/$m.log"; tail -n 3 "/tmp/o/$m.log"; done
tar czf "$OUT/run.tgz" -C /tmp/o .
