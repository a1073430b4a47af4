#!/usr/bin/env bash
# Issue 24 on the H200: distil SmolLM2 at scale, train its drafter, bench the new drafter beside the committed one.
# After the staging runs of bench/gpu/README.md (SmolLM2 under .models, the benchmark files under .stage/data):
#   bash bench/gpu/drafter.sh distill   prompts (templates + self-instruct, no benchmark item), the target's answers,
#                                       second turns, dev-half answers -> .cache/distill (its meta.json in $OUT)
#   bash bench/gpu/drafter.sh train     train on .cache/distill (on the machine that distilled it), one process per
#                                       depth in LAYERS at once, the committed drafter scored on the same data
#                                       first; the best on the dev halves -> $NEW and $OUT/smollm2-dflash
#   bash bench/gpu/drafter.sh bench     the pair, committed drafter and new one in one run, five dev halves, --oracle:
#                                       DRAFTER=<folder of the new one> (default .models/smollm2-dflash-new),
#                                       ALSO=<a third drafter's folder> (optional)
#   bash bench/gpu/drafter.sh twin      the same on the x16 twin (fewer requests: TWIN_LIMIT)
#   bash bench/gpu/drafter.sh kinds     issue 60: an EAGLE-3 and a DSpark drafter trained on .cache/distill at once
#                                       (KINDS, RESUME_DIR) -> $OUT/smollm2-<kind>
# Each call has at most 10 minutes. Knobs: TEMPLATES SELF MINUTES BATCH (distill), LAYERS RANK SEQS BLOCKS
# TRAIN_MINUTES RESUME EVAL_EVERY (train), LIMIT TWIN_LIMIT ALSO (bench).
# Another target (the distilled hybrid student, issue 58): TARGET=<its deployment TOML> NAME=<drafter folder name>
# DATA=<its distillation folder> BASELINE= (none to score first), e.g. TARGET=specpilot/presets/smollm2-hybrid.toml
# NAME=smollm2-hybrid-dflash DATA=.cache/distill-hybrid BASELINE= bash bench/gpu/drafter.sh distill (then train).
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
TARGET=${TARGET:-bench/gpu/smollm2-target.toml}
NAME=${NAME:-smollm2-dflash}
DATA=${DATA:-.cache/distill}
NEW=${DRAFTER:-.models/$NAME-new}
case "${1:-}" in
distill)
    python3 bench/gpu/stage_smollm2.py assemble
    mkdir -p .cache
    python3 -m specpilot.cli distill --deployment "$TARGET" --out "$DATA" --templates "${TEMPLATES:-120000}" \
        --self-instruct "${SELF:-24000}" --max-minutes "${MINUTES:-8}" --batch "${BATCH:-1024}" --data-dir .stage/data
    cp "$DATA/meta.json" "$OUT/distill_meta.json"  # the record; the shards stay on the machine
    ;;
train)
    # each depth in LAYERS (e.g. "3 4") trains in its own process, all at once on the one GPU (a step leaves the
    # GPU idle most of its time) for the same minutes; the best on the dev halves becomes $NEW
    python3 bench/gpu/stage_smollm2.py assemble
    base=() pids=()
    baseline=${BASELINE-checkpoints/smollm2-dflash}
    [ -n "$baseline" ] && base=(--baseline "$baseline")
    for layers in ${LAYERS:-3}; do
        python3 -m specpilot.cli train-drafter --deployment "$TARGET" --data "$DATA" \
            --out ".models/$NAME-l$layers" --amp --layers "$layers" --selector-rank "${RANK:-32}" \
            --block-size 16 --seqs-per-step "${SEQS:-64}" --blocks-per-seq "${BLOCKS:-16}" --steps 1000000 \
            --max-minutes "${TRAIN_MINUTES:-7.5}" --eval-every "${EVAL_EVERY:-90}" "${base[@]}" \
            ${RESUME:+--resume "$RESUME"} > "/tmp/train-l$layers.log" 2>&1 &
        pids+=($!) base=()
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    for layers in ${LAYERS:-3}; do tail -c 1500 "/tmp/train-l$layers.log"; done
    [ "$status" = 0 ]
    best=$(NAME=$NAME python3 - ${LAYERS:-3} <<'PY'
import json, os, sys
def dev(layers):
    m = json.load(open(f".models/{os.environ['NAME']}-l{layers}/training.json"))["metrics"]
    return m.get("dev", m)["tau"]
print(max(sys.argv[1:], key=dev))
PY
)
    echo "best depth on the dev halves: $best layers"
    rm -rf "$NEW" && cp -r ".models/$NAME-l$best" "$NEW"
    for layers in ${LAYERS:-3}; do cp ".models/$NAME-l$layers/training.json" "$OUT/train_l$layers.json"; done
    mkdir -p "$OUT/$NAME" && cp "$NEW"/* "$OUT/$NAME/"
    ;;
kinds)
    # issue 60: the other drafter kinds, each trained once on .cache/distill, all at once on the one GPU, for the same
    # minutes: KINDS (default "eagle3 dspark") -> .models/smollm2-<kind> and $OUT/smollm2-<kind> (its training.json
    # holds the curve; a later lease goes on with RESUME_DIR=<a folder holding smollm2-<kind> checkpoints>)
    python3 bench/gpu/stage_smollm2.py assemble
    pids=()
    for kind in ${KINDS:-eagle3 dspark}; do
        case $kind in
        eagle3) args=(--kind eagle3 --block-size 7 --draft-vocab "${DRAFT_VOCAB:-8192}") ;;
        dspark) args=(--kind dspark --block-size 16 --markov-rank "${MARKOV:-64}" --layers "${LAYERS:-3}") ;;
        *) echo "KINDS: eagle3 or dspark, got $kind" >&2; exit 2 ;;
        esac
        resume=()
        [ -n "${RESUME_DIR:-}" ] && [ -d "$RESUME_DIR/smollm2-$kind" ] && resume=(--resume "$RESUME_DIR/smollm2-$kind")
        python3 -m specpilot.cli train-drafter --deployment "$TARGET" --data "$DATA" --out ".models/smollm2-$kind" \
            --amp "${args[@]}" --seqs-per-step "${SEQS:-64}" --blocks-per-seq "${BLOCKS:-16}" --steps 1000000 \
            --max-minutes "${TRAIN_MINUTES:-7.5}" --eval-every "${EVAL_EVERY:-90}" "${resume[@]}" \
            > "/tmp/train-$kind.log" 2>&1 &
        pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    for kind in ${KINDS:-eagle3 dspark}; do
        tail -c 1200 "/tmp/train-$kind.log"
        # (the device sends back 8 files a call: the weights, config and record, not the prompts)
        [ -d ".models/smollm2-$kind" ] && mkdir -p "$OUT/smollm2-$kind" && \
            find ".models/smollm2-$kind" -maxdepth 1 -type f ! -name 'prompts.jsonl.gz' -exec cp {} "$OUT/smollm2-$kind/" \;
    done
    [ "$status" = 0 ]
    ;;
bench|twin)
    # the committed drafter (old) and the new one, each on the same requests; AR runs beside each as the reference
    if [ "$1" = bench ]; then src=bench/gpu/smollm2-pair.toml limit=${LIMIT:-20} extra=--oracle
    else src=specpilot/presets/smollm2-twin.toml limit=${TWIN_LIMIT:-4} extra=; fi
    for name in old new ${ALSO:+also}; do
        folder=checkpoints/smollm2-dflash; [ "$name" = new ] && folder=$NEW; [ "$name" = also ] && folder=$ALSO
        sed "s#^path = \"../../checkpoints/smollm2-dflash\"#path = \"$PWD/$folder\"#" "$src" > "/tmp/$1-$name.toml"
        grep -q "$PWD/$folder" "/tmp/$1-$name.toml"  # the drafter line was found and replaced
        python3 -m specpilot.cli bench --deployment "/tmp/$1-$name.toml" --system ar --system stock \
            --limit "$limit" --max-new-tokens 256 $extra --json "$OUT/${1}_$name.json"
    done
    ;;
*)
    echo "usage: bash bench/gpu/drafter.sh distill|train|kinds|bench|twin" >&2
    exit 2
    ;;
esac
