#!/usr/bin/env bash
# The layer halves (models/halves.py) and where the plain step's time goes, in one run:
#   the halves' GPU tests (both orders) and the ring's trace test, then ablate_step.py --options: the tuned
#   step against no late release / no ring / neither / halves order 1 / order 2, timed in turn (8B unless
#   MODELS); trace_step.py without the halves (trace0) and with them (trace1, trace2: where each launch of
#   a middle layer starts, passes its wait and ends).
# On an x2 machine the traces run on GPU 1 beside the rest on GPU 0; on one GPU everything runs in turn
# (~8 min). Everything lands in /tmp/o and comes back as one tarball (at most 8 files return from a run).
# Usage: SPECPILOT_COMMIT=<sha> [MODELS=dense-8b] [ORDERS="0 1 2"] bash bench/gpu/halves_round.sh
set -u
export PYTHONPATH=.
rm -rf /tmp/o && mkdir -p /tmp/o/options  # a warm machine keeps old files
gpus=$(nvidia-smi -L | wc -l)

tests_and_options() {
  timeout 150 python3 -m pytest -q -x tests/test_kernels.py tests/test_trace.py -k "halves or staged or traced" \
    > /tmp/o/tests.log 2>&1 &&
    timeout 330 python3 bench/gpu/ablate_step.py --models "${MODELS:-dense-8b}" --options --out /tmp/o/options \
      > /tmp/o/options.log 2>&1
}

traces() {
  for order in ${ORDERS:-0 1 2}; do  # a hang (a spin that never ends) costs its timeout, not the run
    mkdir -p /tmp/o/trace$order
    flag=$([ "$order" = 0 ] || echo --halves)
    SPECPILOT_HEAD_HALVES=$order timeout 150 python3 bench/gpu/trace_step.py --models dense-8b $flag \
      --out /tmp/o/trace$order > /tmp/o/trace$order.log 2>&1
  done
}

if [ "$gpus" -ge 2 ]; then
  (CUDA_VISIBLE_DEVICES=0 tests_and_options) &
  (CUDA_VISIBLE_DEVICES=1 traces) &
  wait
else
  traces
  tests_and_options
fi
tail -n 3 /tmp/o/tests.log
tail -n 2 /tmp/o/options.log
for order in ${ORDERS:-0 1 2}; do grep -B 10 -A 12 "a middle layer" /tmp/o/trace$order.log | head -n 24; done
tar czf "$OUT/run.tgz" -C /tmp/o .
