#!/usr/bin/env bash
# Issue 30 on the H200, after the SmolLM2 staging on the same (still held) machine: `weights=w12` in the
# engine. 1. the few-row microbenchmark (bench/gpu/fewrow.py); 2. AR on the twin: cuBLAS BF16 (the reference),
# the few-row kernel on BF16 (ar:fewrow=true) and on W12 (ar:weights=w12), with the memory the W12 forms save;
# 3. token forcing of ar:weights=w12 against ar and of stock:weights=w12 against stock on SmolLM2 (LIMIT dev
# requests of each benchmark, MAXNEW tokens; the W12 kernel sums in another order than cuBLAS, so equality is not
# expected: forcing must pass). JSON to $OUT.
set -uo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/prebuild.py --install .stage/cubin
python3 bench/gpu/fewrow.py --out "$OUT" > "$OUT/fewrow.log" 2>&1
echo "fewrow microbenchmark: exit $?"
python3 -m specpilot.cli bench --preset smollm2-twin -s ar -s ar:fewrow=true -s ar:weights=w12 \
    --limit "${TWIN_LIMIT:-1}" --max-new-tokens "${TWIN_NEW:-128}" --json "$OUT/twin_ar_w12.json"
echo "twin bench: exit $?"
for base in ar stock; do
    [ "${FORCE:-1}" = 1 ] || break  # FORCE=0: the timings alone
    python3 -m specpilot.cli force --deployment bench/gpu/smollm2-pair.toml --reference "$base" \
        --candidate "$base:weights=w12" --limit "${LIMIT:-5}" --max-new-tokens "${MAXNEW:-256}" \
        --json "$OUT/force_w12_$base.json"
    echo "force $base:weights=w12: exit $?"
done
