#!/usr/bin/env bash
# A hybrid distilled student of SmolLM2-135M-Instruct: 23 of its 30 attention layers replaced by Gated DeltaNet
# layers (Qwen3.5's 3:1 pattern), distilled from SmolLM2 (specpilot/training/hybrid_student.py). A distilled student,
# not a released model. After the staging runs of bench/gpu/README.md (SmolLM2 under .models, the benchmark files
# under .stage/data), in one held machine:
#   bash bench/gpu/hybrid_student.sh distill   as drafter.sh distill (skipped when .cache/distill is there)
#   bash bench/gpu/hybrid_student.sh train     distil for MINUTES (default 7) -> .models/smollm2-hybrid (whole,
#                                              bf16, shards <= 15 MB); what training changed (the GDN layers, ~41 MB
#                                              after stage 1) -> $OUT/smollm2-hybrid/, the learning curve printed
#   bash bench/gpu/hybrid_student.sh check     the student as a target in the engine (AR): greedy agreement with the
#                                              teacher on PROMPTS dev prompts, AR tokens/s -> $OUT/hybrid_check.json
# Here, afterwards: python3 bench/gpu/hybrid_student.py assemble --changed <what came back> \
#                   --out ~/.cache/specpilot/models/smollm2-hybrid   (the whole student, the preset smollm2-hybrid)
# PRESET=tiny: a random tiny teacher and random sequences on the CPU (the dry run; no staging, no data).
# Knobs: MINUTES SEQS MAX_LEN LR STAGE1 (share of the run training only the GDN layers; below 1 the rest trains
# everything, and the changed tensors are then the whole model: too big to come back) HIDDEN EVAL_EVERY PROMPTS.
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hybrid-out}
mkdir -p "$OUT"
tiny=() student=.models/smollm2-hybrid
if [ "${PRESET:-}" = tiny ]; then tiny=(--tiny --context 256 --max-new 32) student=/tmp/smollm2-hybrid-tiny; fi
case "${1:-}" in
distill)
    if [ ${#tiny[@]} = 0 ] && [ ! -f .cache/distill/meta.json ]; then bash bench/gpu/drafter.sh distill; fi
    ;;
train)
    [ ${#tiny[@]} = 0 ] && python3 bench/gpu/stage_smollm2.py assemble
    python3 bench/gpu/hybrid_student.py train "${tiny[@]}" --out "$student" --changed "$OUT/smollm2-hybrid" \
        --minutes "${MINUTES:-7}" --seqs "${SEQS:-16}" --max-len "${MAX_LEN:-512}" --lr "${LR:-1e-3}" \
        --stage1 "${STAGE1:-1.0}" --hidden-weight "${HIDDEN:-0}" --eval-every "${EVAL_EVERY:-60}" 2>&1 \
        | tee "$OUT/hybrid_train.log"
    ;;
check)
    python3 bench/gpu/hybrid_student.py check "${tiny[@]}" --student "$student" --prompts "${PROMPTS:-10}" \
        --json "$OUT/hybrid_check.json"
    ;;
*)
    echo "usage: [PRESET=tiny] bash bench/gpu/hybrid_student.sh distill|train|check" >&2
    exit 2
    ;;
esac
