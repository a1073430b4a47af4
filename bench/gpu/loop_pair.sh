#!/usr/bin/env bash
# Issue 55's acceptance on one GPU: `specpilot loop --preset smollm2 --rounds 1 --budget 600` (bf16, defaults
# otherwise) beside a `specpilot bench` sweep of the systems it searches, in one lease, after the SmolLM2 staging.
# A 600-s loop does not fit one call (10 minutes at most, start-up included), so it runs in its own session
# (setsid) and the calls watch it:
#   bash bench/gpu/loop_pair.sh sweep        the bench sweep (~4 min), then the loop started in the background,
#                                            watched until AFTER s (default 540) from the call's start
#   bash bench/gpu/loop_pair.sh watch        waits until the loop ends (WAIT s at most), then sends it back (the
#                                            newest loop the sweep call started, unless PRESET names one)
# Give the calls SPECPILOT_COMMIT=<the commit> (the GPU copy's .git may be stale). Each call sends back what it
# has: $OUT/sweep.json, $OUT/loop.tgz (the run directory, its report and the log).
# RESUME=.stage/loop.tgz (carried): the run in that loop.tgz goes on (`loop --resume`: its finished steps read back,
# their seconds kept in log.jsonl), where a machine taken back cut it off; its log is appended to. A resumed loop's
# budget starts afresh (docs/loop.md): give BUDGET what the earlier calls left of it.
# PRESET=smollm2-twin runs the twin instead (its sweep: stock, best_first N = 32/48/64 and ar:gemv=true, LIMIT 1).
# Then, in the same lease: python3 bench/gpu/gate_suite.py builders faults; python3 bench/gpu/gate_suite.py rounds
set -uo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/stage_smollm2.py assemble >/dev/null || exit 1
preset=${PRESET:-smollm2}
if [ "${1:-sweep}" = watch ] && [ -z "${PRESET:-}" ]; then  # the loop the sweep call started, whichever preset
    newest=$(ls -t /tmp/o/loop-*.log 2>/dev/null | head -n 1)
    [ -n "$newest" ] && preset=$(basename "$newest" .log) && preset=${preset#loop-}
fi
run=/tmp/o/loop-$preset
mkdir -p /tmp/o

send_back() {
    [ -d "$run" ] && python3 -m specpilot.cli report "$run" >/dev/null 2>&1
    tar czf "$OUT/loop.tgz" -C /tmp/o "loop-$preset" "loop-$preset.log" "loop-$preset.samples" 2>/dev/null
    tail -n 30 "/tmp/o/loop-$preset.log"
}

case "${1:-sweep}" in
sweep)
    # the staging's `hold` moves the checkpoints aside: a sweep without them would only wait out AFTER
    [ -d checkpoints/smollm2-dflash ] || { echo "no checkpoints/: run \`stage_smollm2.py release\` here first"; exit 1; }
    nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
    systems=(--system ar:gemv=true --system stock:tree=best_first,nodes=16 --system stock:tree=best_first,nodes=32
             --system stock:tree=best_first,nodes=48 --system stock:tree=best_first,nodes=64 --system stock:tree=ddtree,nodes=32
             --system stock:tree=eagle2,nodes=32 --system stock:tree=sequoia,nodes=32 --system stock:gemv=true)
    limit=${LIMIT:-2}
    if [ "$preset" != smollm2 ]; then  # the twin: its steps are ~15x dearer, so fewer systems and requests
        systems=(--system stock:tree=best_first,nodes=32 --system stock:tree=best_first,nodes=48
                 --system stock:tree=best_first,nodes=64 --system ar:gemv=true)
        limit=${LIMIT:-1}
    fi
    # SWEEP_S=0: no sweep, the loop alone (e.g. ROUNDS=3 BUDGET=1200 for the twin's three-round Goal)
    [ "${SWEEP_S:-330}" -gt 0 ] && timeout -k 20 "${SWEEP_S:-330}" python3 -m specpilot.cli bench --preset "$preset" --system stock "${systems[@]}" \
        --limit "$limit" --max-new-tokens 256 --json "$OUT/sweep.json" 2>&1 | tail -n 25
    resume=()
    if [ -n "${RESUME:-}" ]; then  # RESUME=<a loop.tgz an earlier call sent back, carried>: that run goes on
        [ -f "$RESUME" ] || { echo "RESUME=$RESUME: no such file"; exit 1; }
        rm -rf "$run" && tar xzf "$RESUME" -C /tmp/o && resume=(--resume)
    else
        rm -rf "$run" "/tmp/o/loop-$preset.log"
    fi
    # SAMPLE=1: under the sampling profiler (bench/gpu/sampled.py), where the loop's wall time went, in
    # loop-PRESET.samples (not for acceptance runs: a profiler of its first kind, a thread, spoiled GEMV captures)
    launch=(python3 -m specpilot.cli)
    [ -n "${SAMPLE:-}" ] && launch=(python3 bench/gpu/sampled.py "/tmp/o/loop-$preset.samples")
    setsid nohup "${launch[@]}" loop --preset "$preset" --rounds "${ROUNDS:-1}" --budget "${BUDGET:-600}" \
        --run-dir "$run" "${resume[@]}" >>"/tmp/o/loop-$preset.log" 2>&1 </dev/null &
    left=$(( ${AFTER:-540} - SECONDS ))  # AFTER: seconds from the call's start (the call's limit is 600)
    [ "$left" -gt 0 ] && sleep "$left"
    send_back
    ;;
watch)
    for _ in $(seq "${WAIT:-560}"); do pgrep -f "(specpilot.cli|sampled.py .*) loop --preset" >/dev/null || break; sleep 1; done
    pgrep -f "(specpilot.cli|sampled.py .*) loop --preset" >/dev/null && echo "loop still running"
    send_back
    ;;
esac
