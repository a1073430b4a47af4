#!/usr/bin/env bash
# Issue 3 on the H200, in the second staging run (see bench/gpu/stage_smollm2.py for the first):
# assemble + convert SmolLM2, train its drafter by self-distillation, benchmark the pair on 20 dev
# requests of each benchmark, and return the checkpoint and the figures under $OUT.
#   carry: [".stage/smollm2.part1"]   command: bash bench/gpu/real_pair.sh
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/stage_smollm2.py assemble
python3 -m specpilot.cli train-drafter --deployment bench/gpu/smollm2-target.toml --out .models/smollm2-dflash \
    --prompts "${PROMPTS:-2000}" --eval-prompts "${EVAL:-64}" --max-new-tokens "${MAXNEW:-256}" --steps "${STEPS:-3000}" \
    --block-size "${BLOCK:-16}" --layers "${LAYERS:-2}" --selector-rank 32 --seed 0 2>&1 | tail -n 3
mkdir -p "$OUT/smollm2-dflash" && cp .models/smollm2-dflash/* "$OUT/smollm2-dflash/"
python3 -m specpilot.cli bench --deployment bench/gpu/smollm2-pair.toml --system ar --system stock \
    --limit "${LIMIT:-20}" --max-new-tokens "${MAXNEW:-256}" --oracle --json "$OUT/smollm2_pair.json"
