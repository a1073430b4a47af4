#!/usr/bin/env bash
# Issue 2's headline on one GPU (~7 min; on an x2 machine the 27B runs on GPU 1 beside the rest):
#   the one-row kernels' GPU tests that a change to the ring, the trace, the early release, the step's
#   tail or the cluster attention touches, with PAIRED (e.g. --greedy) ablate_step.py's paired timing of the 8B, then
#   engine_core.py --parts gemv for dense-8b (the default step tuning and, tuned afresh, VARIANTS_8B)
#   and for dense-27b: AR ms per token against cuBLAS AR and the weight-pass floor, one model a process.
# Everything lands in /tmp/o and comes back as one tarball (at most 8 files return from a run).
# Usage: SPECPILOT_COMMIT=<sha> [VARIANTS_8B=pdl,three_rounds] [PAIRED="--greedy [--cluster ...]"] bash bench/gpu/headline.sh
set -u
export PYTHONPATH=.
rm -rf /tmp/o && mkdir -p /tmp/o/8b /tmp/o/27b /tmp/o/paired  # a warm machine keeps old files

core() {  # model, variants
  timeout 300 python3 -u bench/gpu/engine_core.py --parts gemv --models "dense-$1" --gemv-variants "$2" \
    --out "/tmp/o/$1" > "/tmp/o/$1.log" 2>&1
}

first() {
  timeout 150 python3 -m pytest -q tests/test_kernels.py tests/test_trace.py tests/test_attention_cluster.py \
    -k "staged or traced or early or greedy or cluster" \
    > /tmp/o/tests.log 2>&1
  # shellcheck disable=SC2086  # PAIRED may hold several flags, as in paired_round.sh
  [ -n "${PAIRED:-}" ] && timeout 240 python3 -u bench/gpu/ablate_step.py --models dense-8b $PAIRED \
    --out /tmp/o/paired > /tmp/o/paired.log 2>&1
  core 8b "${VARIANTS_8B:-pdl,three_rounds}"
}

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (CUDA_VISIBLE_DEVICES=0 first) &
  (CUDA_VISIBLE_DEVICES=1 core 27b pdl) &
  wait
else
  first
  core 27b pdl
fi
tail -n 2 /tmp/o/tests.log
[ -n "${PAIRED:-}" ] && grep -E "floor" /tmp/o/paired.log
for m in 8b 27b; do grep -E "AR with Triton|^\[bw\]" "/tmp/o/$m.log"; tail -n 3 "/tmp/o/$m.log"; done
tar czf "$OUT/run.tgz" -C /tmp/o .
