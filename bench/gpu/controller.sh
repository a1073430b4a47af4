#!/usr/bin/env bash
# Issue 5 on the H200, after the SmolLM2 staging on the same (still held) machine: the controller on the
# SmolLM2 pair (default) or on the twin (DEPLOY="--preset smollm2-twin" LIMIT=4 MAXNEW=128), single
# request at a time. GPUS=0,1 (an x2 machine) switches to paired runs with the GPUs swapped.
#   1. stock vs stock: measures the A/A noise, then times stock against itself (must not promote);
#   2. stock vs stock:pad_us=X, X = 3% of stock's measured step time (an idle kernel in every step, a
#      known lossless slowdown), reusing run 1's A/A (--aa-card): must not promote, and its gain with
#      the slots' A/A difference divided out should read about 1/1.03.
# Evidence cards come back as JSON; a "not promoted" verdict exits 1 by design.
set -uo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
read -r -a deploy <<< "${DEPLOY:---deployment bench/gpu/smollm2-pair.toml}"
tag="${TAG:-smollm2}"
placement=(--gpu 0)
[[ -n "${GPUS:-}" ]] && placement=(--gpus "$GPUS")  # e.g. GPUS=0,1 on an x2 machine: paired runs
common=("${deploy[@]}" --limit "${LIMIT:-8}" --max-new-tokens "${MAXNEW:-256}" "${placement[@]}")
python3 -m specpilot.cli compare --a stock --b stock "${common[@]}" --json "$OUT/compare_stock_stock_${tag}.json"
echo "compare stock stock: exit $?"
read -r pad < <(python3 - "$OUT/compare_stock_stock_${tag}.json" <<'PY'
import json, sys
card = json.load(open(sys.argv[1]))
ab = card["ab"]
rows = ab["pairings"][0]["rows_a"] if ab.get("mode") == "paired" else ab["rows_a"]
step_us = 1e6 * sum(r["decode_s"] for r in rows) / sum(r["steps"] for r in rows)
print(f"{0.03 * step_us:.1f}")
PY
)
echo "stock step: pad ${pad} us = 3% of it"
python3 -m specpilot.cli compare --a stock --b "stock:pad_us=${pad}" --aa-card "$OUT/compare_stock_stock_${tag}.json" \
    "${common[@]}" \
    --json "$OUT/compare_stock_pad_${tag}.json"
echo "compare stock pad: exit $?"
