# Issue 27 on the H200 (bf16): the judge against the whole fault suite, the lossless variants and a reference that
# shares a fault, on the real pair and on the twin; on the pair also 20 rounds of a lossless variant against stock
# on disjoint dev requests (the false-reject rate).
#   [EXACT=float32] bash bench/gpu/force_suite.sh [pair|rounds|twin]   (one part per call: each fits ten minutes)
# Writes $OUT/force_suite_<part>.json; prints a table.
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/stage_smollm2.py assemble >/dev/null
case ${1:-pair} in
pair) python3 bench/force_suite.py --deployment bench/gpu/smollm2-pair.toml --limit 1 --max-new-tokens 256 \
          --exact "${EXACT:-deployment}" --out "$OUT/force_suite_pair${EXACT:+_$EXACT}.json" ;;
rounds) python3 bench/force_suite.py --deployment bench/gpu/smollm2-pair.toml --limit 1 --max-new-tokens 256 \
          --no-cases --lossless-rounds "${ROUNDS:-20}" --exact "${EXACT:-deployment}" --out "$OUT/force_suite_rounds${EXACT:+_$EXACT}.json" ;;
twin) python3 bench/force_suite.py --deployment specpilot/presets/smollm2-twin.toml --limit 1 --max-new-tokens 128 \
          --exact "${EXACT:-deployment}" --out "$OUT/force_suite_twin${EXACT:+_$EXACT}.json" ;;
*) echo "usage: bash bench/gpu/force_suite.sh pair|rounds|twin" >&2; exit 2 ;;
esac
