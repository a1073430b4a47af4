#!/usr/bin/env bash
# Issue 28 on the H200: `specpilot loop` on the twin, single request, from stock (after the SmolLM2 staging on the
# same held machine). One call runs until BUDGET seconds are spent (between two measurements; a measurement
# cut off by the call's limit left nothing), then renders the report and sends the run directory back as
# $OUT/loop.tgz. Carry `.loop` (the run directory unpacked here) into the next call: it resumes, and nothing
# finished is measured again.
#   ROUNDS=3 LIMIT=1 MAXNEW=64 BUDGET=440 bash bench/gpu/loop.sh
set -uo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/stage_smollm2.py assemble >/dev/null
run=.loop/twin
resume=()
[ -d "$run/steps" ] && resume=(--resume)
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
timeout --signal=INT -k 30 "${KILL:-540}" python3 -m specpilot.cli loop --preset smollm2-twin --agent builtin \
    --rounds "${ROUNDS:-3}" --limit "${LIMIT:-1}" --max-new-tokens "${MAXNEW:-64}" --budget "${BUDGET:-440}" \
    --run-dir "$run" "${resume[@]}"
echo "loop: exit $?"
python3 -m specpilot.cli report "$run" || echo "report failed"
tail -n 40 "$run/log.jsonl" | cut -c1-200
tar czf "$OUT/loop.tgz" -C .loop twin
