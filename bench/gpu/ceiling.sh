# Issue 26 on the H200: the ceiling report of stock and of the best tree on the real pair and on the twin.
#   bash bench/gpu/ceiling.sh [pair|twin|both]
# Each deployment: `specpilot ceiling --measure` of stock and the tree (the timed run, lattices, kernel profile,
# c(N) at N = 8..64, floors, machine rates), its predicted S(N) checked against the committed issue-25 sweep of
# the same deployment; then the checks (the profile claims its kernels, replay = live) and a short table.
# Writes $OUT/<dep>_ceiling.{json,png} and $OUT/<dep>_inputs.json (the measurements, without the lattices).
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/stage_smollm2.py assemble >/dev/null
SWEEPS=bench/results/2026-12-03_trees
one() {  # name deployment limit tree
    python3 -m specpilot.cli ceiling "/tmp/ceil-$1" --measure --deployment "$2" --limit "$3" --max-new-tokens 256 \
        --system stock --system "$4" --nodes 8,16,32,48,64 --sweep "${SWEEPS}_$1_sweep_4eb8239_h200.json" \
        --json "$OUT/$1_ceiling.json" --png "$OUT/$1_ceiling.png"
    cp "/tmp/ceil-$1/inputs.json" "$OUT/$1_inputs.json"
    python3 bench/gpu/ceiling_check.py "$OUT/$1_ceiling.json" "$OUT/$1_inputs.json" || echo "$1: CHECKS FAILED"
}
what=${1:-both}
if [ "$what" != twin ]; then one pair bench/gpu/smollm2-pair.toml 2 stock:tree=best_first,nodes=32; fi
if [ "$what" != pair ]; then one twin specpilot/presets/smollm2-twin.toml 1 stock:tree=best_first,nodes=48; fi
