#!/usr/bin/env bash
# Issue 3 on the H200, after the first staging run (see bench/gpu/stage_smollm2.py):
#   bash bench/gpu/real_pair.sh train   (carry .stage/smollm2.part1): assemble + convert SmolLM2, train
#                                        its drafter by self-distillation, return the checkpoint in $OUT
#   bash bench/gpu/real_pair.sh bench   (next run, same machine): 20 dev requests of each benchmark, ar and
#                                        stock, with the lattice replay (--oracle); the committed drafter,
#                                        or the one just trained with PAIR=bench/gpu/smollm2-fresh.toml
# Two calls because each command has at most 10 minutes. Knobs for dry runs: PROMPTS EVAL MAXNEW STEPS
# BLOCK LAYERS MINUTES SEED BATCH LIMIT PAIR, and RESUME=checkpoints/smollm2-dflash
# SEED=1 to continue the committed drafter on freshly distilled answers (training accumulates over sessions).
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
case "${1:-}" in
train)
    python3 bench/gpu/stage_smollm2.py assemble
    python3 -m specpilot.cli train-drafter --deployment bench/gpu/smollm2-target.toml --out .models/smollm2-dflash \
        --prompts "${PROMPTS:-2000}" --eval-prompts "${EVAL:-64}" --max-new-tokens "${MAXNEW:-256}" \
        --steps "${STEPS:-3000}" --max-minutes "${MINUTES:-3.5}" --block-size "${BLOCK:-16}" --layers "${LAYERS:-3}" --selector-rank 32 --seed "${SEED:-0}" --batch "${BATCH:-256}" ${RESUME:+--resume "$RESUME"} \
        2>&1 | tail -n 3
    mkdir -p "$OUT/smollm2-dflash" && cp .models/smollm2-dflash/* "$OUT/smollm2-dflash/"
    ;;
bench)
    python3 -m specpilot.cli bench --deployment "${PAIR:-bench/gpu/smollm2-pair.toml}" --system ar --system stock \
        --limit "${LIMIT:-20}" --max-new-tokens "${MAXNEW:-256}" --oracle --json "$OUT/smollm2_pair.json"
    ;;
*)
    echo "usage: bash bench/gpu/real_pair.sh train|bench" >&2
    exit 2
    ;;
esac
