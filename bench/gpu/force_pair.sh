#!/usr/bin/env bash
# Issue 5 on the H200, after the SmolLM2 staging on the same (still held) machine: token forcing of
# stock against AR and against a logit-bias fault, 5 dev requests of each benchmark (25; MT-Bench has
# two turns), 256 tokens. DEPLOY="--preset smollm2-twin" TAG=twin runs it on the twin. The verdicts
# and evidence come back as JSON; a reject exits 1 by design.
set -uo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
read -r -a deploy <<< "${DEPLOY:---deployment bench/gpu/smollm2-pair.toml}"
for candidate in ar stock:fault=logit_bias; do
    python3 -m specpilot.cli force "${deploy[@]}" --reference stock \
        --candidate "$candidate" --limit "${LIMIT:-5}" --max-new-tokens "${MAXNEW:-256}" \
        --json "$OUT/force_${TAG:-smollm2}_${candidate//[:=]/_}.json"
    echo "force $candidate: exit $?"
done
