#!/usr/bin/env bash
# The layer halves (models/halves.py) on an x2 machine, both GPUs at once (device time is held time):
#   GPU 0: the halves' GPU tests (both orders), then ablate_step.py --options: the tuned step against
#          no late release / no ring / neither / halves order 1 / order 2, timed in turn (8B unless MODELS);
#   GPU 1: trace_step.py --halves for order 1 and order 2: where each launch of a middle layer starts,
#          passes its wait and ends.
# Everything lands in /tmp/o and comes back as one tarball (at most 8 files return from a run).
# Usage: SPECPILOT_COMMIT=<sha> [MODELS=dense-8b] bash bench/gpu/halves_round.sh   (~5 min)
set -u
export PYTHONPATH=.
rm -rf /tmp/o && mkdir -p /tmp/o/options /tmp/o/trace1 /tmp/o/trace2  # a warm machine keeps old files
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 -m pytest -q -x tests/test_kernels.py -k "halves" > /tmp/o/tests.log 2>&1 &&
    timeout 420 python3 bench/gpu/ablate_step.py --models "${MODELS:-dense-8b}" --options --out /tmp/o/options \
      > /tmp/o/options.log 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  for order in 1 2; do  # a hang (a spin that never ends) costs its timeout, not the run
    SPECPILOT_HEAD_HALVES=$order timeout 200 python3 bench/gpu/trace_step.py --models dense-8b --halves \
      --out /tmp/o/trace$order > /tmp/o/trace$order.log 2>&1
  done
) &
wait
tail -n 3 /tmp/o/tests.log
tail -n 2 /tmp/o/options.log
for order in 1 2; do grep -A 12 "a middle layer" /tmp/o/trace$order.log | head -n 13; done
tar czf "$OUT/run.tgz" -C /tmp/o .
