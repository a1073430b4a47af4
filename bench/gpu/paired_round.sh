#!/usr/bin/env bash
# A paired comparison of the step's options on one GPU (~8 min; on an x2 machine engine_core.py runs on GPU 1
# beside the rest, ~5 min):
#   the one-row kernels' GPU tests a change to their release, ring or trace touches (and the decode
#   attention's, the cluster attention's), then ablate_step.py $PAIRED (8B unless MODELS; with the environment PAIRED_ENV): --early (the
#   kernels' early release as the tuning chose it, nowhere, everywhere, ...), --tail (the attention at q/k/v's tail),
#   --l2 (the L2 hints), --epilogue (the epilogue's inputs early) or --ring-sweep / --options, timed in turn; then
#   engine_core.py --parts gemv for the 8B (AR ms per token, the default tuning against $VARIANTS), and
#   trace_step.py (PDL only) with what is left of the ten minutes.
# Everything lands in /tmp/o and comes back as one tarball (at most 8 files return from a run).
# TESTS: the -k selection of the kernel tests (the 34 tail tests alone need ~150 s with a cold Triton cache; none:
# skip them). The cluster attention's tests always run (~1 min: NVRTC builds its configs). PAIRED may name several
# flags (PAIRED="--cluster --attention-parts"): one tuned engine, each timed in turn.
# Usage: SPECPILOT_COMMIT=<sha> [PAIRED=--early] [PAIRED_ENV=NAME=value] [TESTS=...] [MODELS=dense-8b] \
#        [VARIANTS=pdl,three_rounds] [TRACE=1] [ABLATE_S=240] [CORE_S=240] [CORE=1] bash bench/gpu/paired_round.sh
# (CORE=0: no engine_core.py on one GPU; TRACE=0: no trace; ABLATE_S, CORE_S: those runs' limits in seconds)
set -u
export PYTHONPATH=.
rm -rf /tmp/o && mkdir -p /tmp/o/paired /tmp/o/core /tmp/o/trace  # a warm machine keeps old files

core() {
  timeout "${CORE_S:-240}" python3 -u bench/gpu/engine_core.py --parts gemv --models dense-8b \
    --gemv-variants "${VARIANTS:-pdl,three_rounds}" --out /tmp/o/core > /tmp/o/core.log 2>&1
}

first() {
  : > /tmp/o/tests.log
  [ "${TESTS:-}" != none ] && timeout 150 python3 -m pytest -q tests/test_kernels.py tests/test_trace.py \
    -k "${TESTS:-staged or traced or early}" >> /tmp/o/tests.log 2>&1
  timeout 60 python3 -m pytest -q tests/test_attention_kernel.py -k "preload or fused_combine or decode_step" \
    >> /tmp/o/tests.log 2>&1
  timeout 120 python3 -m pytest -q tests/test_attention_cluster.py >> /tmp/o/tests.log 2>&1
  # shellcheck disable=SC2086  # PAIRED may hold several flags
  timeout "${ABLATE_S:-240}" env ${PAIRED_ENV:-} python3 -u bench/gpu/ablate_step.py --models "${MODELS:-dense-8b}" \
    ${PAIRED:---early} --out /tmp/o/paired > /tmp/o/paired.log 2>&1
}

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (CUDA_VISIBLE_DEVICES=0 first) &
  (CUDA_VISIBLE_DEVICES=1 core) &
  wait
else
  first
  [ "${CORE:-1}" = 1 ] && core
fi
left=$((570 - SECONDS))  # the trace gets what is left of the command's ten minutes
[ "${TRACE:-1}" = 1 ] && [ "$left" -gt 60 ] && timeout "$left" python3 -u bench/gpu/trace_step.py \
  --models dense-8b --modes pdl --out /tmp/o/trace > /tmp/o/trace.log 2>&1
grep -E "passed|failed" /tmp/o/tests.log
grep -E "floor" /tmp/o/paired.log
grep -E "AR with Triton|^\[bw\]" /tmp/o/core.log
grep -A 30 "same token" /tmp/o/trace.log | head -n 30
tar czf "$OUT/run.tgz" -C /tmp/o .
