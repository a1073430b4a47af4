#!/usr/bin/env bash
# Issue 2's gemv round on an x2 machine, both halves at once (device time is held time):
#   GPU 0: the decode kernels' GPU tests without and with PDL, then where the step's time goes
#          (profile_step.py, cuBLAS and --gemv, 8B and 27B);
#   GPU 1: engine_core.py --parts gemv (AR with gemv=true against the floor, no PDL and PDL).
# Everything lands in /tmp/o and comes back as one tarball (at most 8 files return from a run).
# Usage: SPECPILOT_COMMIT=<sha> [TESTS_K=<pytest -k expr>] [PROFILE="dense-8b ..."] bash bench/gpu/gemv_round.sh
# (all the kernel tests take ~4 min a pass on the H200: TESTS_K picks the ones a change touches)
set -u
export PYTHONPATH=.
mkdir -p /tmp/o
tests="tests/test_kernels.py tests/test_attention_kernel.py"
(
  export CUDA_VISIBLE_DEVICES=0
  SPECPILOT_PDL=0 python3 -m pytest -q -x $tests -k "${TESTS_K:-}" > /tmp/o/tests.log 2>&1
  SPECPILOT_PDL=1 python3 -m pytest -q -x $tests -k "${TESTS_K:-}" > /tmp/o/tests_pdl.log 2>&1
  for m in ${PROFILE-dense-8b dense-27b}; do
    for g in "" --gemv; do
      OUT=/tmp/o python3 bench/gpu/profile_step.py --model $m $g > /dev/null 2>> /tmp/o/profile.err
    done
  done
) &
(
  export CUDA_VISIBLE_DEVICES="${ENGINE_GPU:-1}"
  OUT=/tmp/o python3 bench/gpu/engine_core.py --parts "${PARTS:-gemv}" > /tmp/o/engine_core.log 2>&1
) &
wait
tail -n 3 /tmp/o/tests.log /tmp/o/tests_pdl.log
grep -h "kernels busy" /tmp/o/profile_*.txt
tail -n 12 /tmp/o/engine_core.log
tar czf "$OUT/run.tgz" -C /tmp/o .
