#!/usr/bin/env bash
# Issue 24 on the H200: distil SmolLM2 at scale, train its drafter, bench the new drafter beside the committed one.
# After the staging runs of bench/gpu/README.md (SmolLM2 under .models, the benchmark files under .stage/data):
#   bash bench/gpu/drafter.sh distill   prompts (templates + self-instruct, no benchmark item), the target's answers,
#                                       second turns, dev-half answers -> .cache/distill (and a copy in $OUT)
#   bash bench/gpu/drafter.sh train     train on .cache/distill (carry it when the machine is fresh), the committed
#                                       drafter evaluated on the same data first -> $OUT/smollm2-dflash
#   bash bench/gpu/drafter.sh bench     the pair, committed drafter and new one in one run, five dev halves, --oracle:
#                                       DRAFTER=<folder of the new one> (default .models/smollm2-dflash-new)
#   bash bench/gpu/drafter.sh twin      the same on the x16 twin (fewer requests: TWIN_LIMIT)
# Each call has at most 10 minutes. Knobs: TEMPLATES SELF MINUTES BATCH (distill), LAYERS RANK SEQS BLOCKS
# TRAIN_MINUTES RESUME EVAL_EVERY (train), LIMIT TWIN_LIMIT (bench).
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
TARGET=bench/gpu/smollm2-target.toml
NEW=${DRAFTER:-.models/smollm2-dflash-new}
case "${1:-}" in
distill)
    python3 bench/gpu/stage_smollm2.py assemble
    mkdir -p .cache
    python3 -m specpilot.cli distill --deployment "$TARGET" --out .cache/distill --templates "${TEMPLATES:-60000}" \
        --self-instruct "${SELF:-24000}" --max-minutes "${MINUTES:-7}" --batch "${BATCH:-1024}" --data-dir .stage/data
    mkdir -p "$OUT/distill" && cp .cache/distill/* "$OUT/distill/"
    ;;
train)
    python3 bench/gpu/stage_smollm2.py assemble
    python3 -m specpilot.cli train-drafter --deployment "$TARGET" --data .cache/distill --out "$NEW" --amp \
        --layers "${LAYERS:-3}" --selector-rank "${RANK:-32}" --block-size 16 --seqs-per-step "${SEQS:-64}" \
        --blocks-per-seq "${BLOCKS:-16}" --steps 1000000 --max-minutes "${TRAIN_MINUTES:-7.5}" \
        --eval-every "${EVAL_EVERY:-90}" --baseline checkpoints/smollm2-dflash ${RESUME:+--resume "$RESUME"}
    mkdir -p "$OUT/smollm2-dflash" && cp "$NEW"/* "$OUT/smollm2-dflash/"
    ;;
bench|twin)
    # the committed drafter (old) and the new one, each on the same requests; AR runs beside each as the reference
    if [ "$1" = bench ]; then src=bench/gpu/smollm2-pair.toml limit=${LIMIT:-20} extra=--oracle
    else src=specpilot/presets/smollm2-twin.toml limit=${TWIN_LIMIT:-4} extra=; fi
    for name in old new; do
        folder=checkpoints/smollm2-dflash; [ "$name" = new ] && folder=$NEW
        sed "s#^path = \"../../checkpoints/smollm2-dflash\"#path = \"$PWD/$folder\"#" "$src" > "/tmp/$1-$name.toml"
        grep -q "$PWD/$folder" "/tmp/$1-$name.toml"  # the drafter line was found and replaced
        python3 -m specpilot.cli bench --deployment "/tmp/$1-$name.toml" --system ar --system stock \
            --limit "$limit" --max-new-tokens 256 $extra --json "$OUT/${1}_$name.json"
    done
    ;;
*)
    echo "usage: bash bench/gpu/drafter.sh distill|train|bench|twin" >&2
    exit 2
    ;;
esac
