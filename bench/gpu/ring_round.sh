#!/usr/bin/env bash
# The output projection's ring size against the attention's late release, on one GPU (~7 min):
#   the staged kernel's GPU tests (every STAGED config against the reference) and the trace test, then
#   ablate_step.py --ring-sweep (8B unless MODELS): every ring size and none, with and without LATE,
#   timed paired; then trace_step.py (PDL only) of the step as the tuning chose it.
# Everything lands in /tmp/o and comes back as one tarball (at most 8 files return from a run).
# Usage: SPECPILOT_COMMIT=<sha> [MODELS=dense-8b] bash bench/gpu/ring_round.sh
set -u
export PYTHONPATH=.
rm -rf /tmp/o && mkdir -p /tmp/o/sweep /tmp/o/trace  # a warm machine keeps old files
timeout 150 python3 -m pytest -q tests/test_kernels.py tests/test_trace.py -k "staged or traced" \
  > /tmp/o/tests.log 2>&1
timeout 330 python3 -u bench/gpu/ablate_step.py --models "${MODELS:-dense-8b}" --ring-sweep --out /tmp/o/sweep \
  > /tmp/o/sweep.log 2>&1
left=$((570 - SECONDS))  # the trace gets what is left of the command's ten minutes
[ "$left" -gt 60 ] && timeout "$left" python3 -u bench/gpu/trace_step.py --models dense-8b --modes pdl \
  --out /tmp/o/trace > /tmp/o/trace.log 2>&1
tail -n 3 /tmp/o/tests.log
tail -n 2 /tmp/o/sweep.log
grep -A 30 "same token" /tmp/o/trace.log | head -n 30
tar czf "$OUT/run.tgz" -C /tmp/o .
