# Issue 27 on the H200 (bf16): the judge against the whole fault suite and a reference that shares a fault, on the
# real pair and on the twin; on the pair also the lossless variants, and 20 rounds of a lossless variant against
# stock on disjoint dev requests (the false-reject rate).
#   [EXACT=deployment|float32] bash bench/gpu/force_suite.sh [pair|rounds|twin]   (one part per call: each fits ten
#   minutes; EXACT defaults to auto: forcing/run.exact_mode)
# Writes $OUT/force_suite_<part>.json; prints a table.
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/stage_smollm2.py assemble >/dev/null
PAIR=bench/gpu/smollm2-pair.toml TWIN=specpilot/presets/smollm2-twin.toml
common=(--limit 1 --exact "${EXACT:-auto}")
tag=${EXACT:+_$EXACT}
case ${1:-pair} in
pair) python3 bench/force_suite.py --deployment $PAIR "${common[@]}" --max-new-tokens 256 --cases all \
          --out "$OUT/force_suite_pair$tag.json" ;;
rounds) python3 bench/force_suite.py --deployment $PAIR "${common[@]}" --max-new-tokens 256 --cases none \
          --lossless-rounds "${ROUNDS:-20}" --out "$OUT/force_suite_rounds$tag.json" ;;
twin) python3 bench/force_suite.py --deployment $TWIN "${common[@]}" --max-new-tokens 128 --cases faults \
          --out "$OUT/force_suite_twin$tag.json" ;;
*) echo "usage: [EXACT=deployment|float32] bash bench/gpu/force_suite.sh pair|rounds|twin" >&2; exit 2 ;;
esac
