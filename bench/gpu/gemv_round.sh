#!/usr/bin/env bash
# Issue 2's gemv round on an x2 machine, both halves at once (device time is held time):
#   GPU 0: the decode kernels' GPU tests without and with PDL, then where the step's time goes
#          (profile_step.py, cuBLAS and --gemv, 8B and 27B);
#   GPU 1: engine_core.py --parts gemv (AR with gemv=true against the floor, in its GEMV_VARIANTS).
# Everything lands in /tmp/o and comes back as one tarball (at most 8 files return from a run).
# Usage: SPECPILOT_COMMIT=<sha> [TESTS_K=<pytest -k expr>] [PROFILE="dense-8b ..."] [FUSIONS="1 0"]
#        bash bench/gpu/gemv_round.sh
# (FUSIONS: after the tests, GPU 0 times the 8B's GEMV fusions one by one, ablate_step.py --only, once per
#  SPECPILOT_NORM_HANDOFF value)
# (all the kernel tests take ~4 min a pass on the H200: TESTS_K picks the ones a change touches)
set -u
export PYTHONPATH=.
rm -rf /tmp/o && mkdir -p /tmp/o  # a warm machine keeps the previous run's files
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
  for x in ${FUSIONS:-}; do  # e.g. FUSIONS="1 0": the fusions' costs with and without the norm hand-over
    mkdir -p /tmp/o/fusions_$x
    SPECPILOT_NORM_HANDOFF=$x python3 bench/gpu/ablate_step.py --models dense-8b --out /tmp/o/fusions_$x \
      --only gemvs_only,plain_gemvs,plain_plus_norm,plain_plus_res,plain_plus_pair > /tmp/o/fusions_$x.log 2>&1
  done
) &
(
  export CUDA_VISIBLE_DEVICES="${ENGINE_GPU:-1}"
  OUT=/tmp/o python3 bench/gpu/engine_core.py --parts "${PARTS:-gemv}" > /tmp/o/engine_core.log 2>&1
) &
wait
tail -n 3 /tmp/o/tests.log /tmp/o/tests_pdl.log
grep -h "kernels busy" /tmp/o/profile_*.txt 2> /dev/null
for x in ${FUSIONS:-}; do tail -n 1 /tmp/o/fusions_$x.log; done
tail -n 14 /tmp/o/engine_core.log
tar czf "$OUT/run.tgz" -C /tmp/o .
