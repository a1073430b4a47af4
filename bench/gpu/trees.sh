# Issue 25 on the H200: draft trees on the real pair (or the twin).
#   bash bench/gpu/trees.sh sweep [pair|twin]   record stock's lattices and replay every builder x N (tau_best,
#        Sequoia's acceptance by rank), then bench AR, stock and every builder x N in one run (tau, speedup, ms/step)
#   bash bench/gpu/trees.sh force               token forcing of each builder (N = 32) against stock on the pair
#   bash bench/gpu/trees.sh step                the tree step's pieces timed alone (bench/gpu/tree_step.py)
# LIMIT: requests per benchmark (pair 10, twin 1); NODES: node budgets; BUILDERS: which builders.
set -euo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/stage_smollm2.py assemble >/dev/null
PAIR=bench/gpu/smollm2-pair.toml
NODES=${NODES:-8,16,24,32,48,64}
BUILDERS=${BUILDERS:-ddtree best_first eagle2 sequoia}
case "${1:-}" in
sweep)
    what=${2:-pair}
    if [ "$what" = pair ]; then dep=$PAIR limit=${LIMIT:-10}; else dep=specpilot/presets/smollm2-twin.toml limit=${LIMIT:-1}; fi
    python3 -m specpilot.cli replay "/tmp/rec-$what" --record --deployment "$dep" --limit "$limit" \
        --max-new-tokens 256 --nodes "$NODES" --json "$OUT/${what}_replay.json"
    accept=$(python3 -c "import json; from specpilot.replay.run import accept_option as a; \
print(a(json.load(open('$OUT/${what}_replay.json'))['accept_by_rank']))")
    systems=(--system ar --system stock --system stock:nodes=8)
    for b in $BUILDERS; do
        for n in ${NODES//,/ }; do
            extra=; [ "$b" = sequoia ] && extra=",tree_accept=$accept"
            systems+=(--system "stock:tree=$b,nodes=$n$extra")
        done
    done
    python3 -m specpilot.cli bench --deployment "$dep" "${systems[@]}" --limit "$limit" --max-new-tokens 256 \
        --json "$OUT/${what}_sweep.json"
    ;;
force)
    for b in $BUILDERS; do
        python3 -m specpilot.cli force --deployment "$PAIR" --candidate "stock:tree=$b,nodes=${FORCE_NODES:-32}" \
            --limit "${LIMIT:-2}" --max-new-tokens 256 --json "$OUT/force_$b.json" || true  # a reject is a result
    done
    ;;
step)
    python3 bench/gpu/tree_step.py --deployment "$PAIR" --nodes "$NODES"
    ;;
*)
    echo "usage: bash bench/gpu/trees.sh sweep [pair|twin] | force | step" >&2
    exit 2
    ;;
esac
