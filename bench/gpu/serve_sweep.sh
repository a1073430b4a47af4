#!/usr/bin/env bash
# Issue 57's GPU Must: systems served by `specpilot serve` and loaded by `specpilot bench serve`, after the SmolLM2
# staging (and its release). For each system: the server's answers checked first (greedy: the chat answer of two
# prompts against `specpilot generate`'s), then the closed loop at CONCURRENCY, the open loop at RATES, and the
# Python API's batch at 16 in flight (`bench --in-flight 16`, the same requests and budget) for the server's
# overhead. Writes one $OUT/serve_<system>.json a system: {"closed", "open", "api16"} (the device sends back at most 8
# files a call), each part the JSON its command wrote.
#   PRESET=smollm2 SYSTEMS="ar stock stock:tree=best_first,nodes=32" bash bench/gpu/serve_sweep.sh
# RATES=none skips the open loop; CONCURRENCY=16 RATES=none MAX_IN_FLIGHT=16: the overhead Goal alone, the server's
# engine of as many slots as the API's batch (`bench --in-flight 16`), so that both run the same steps.
# Give it SPECPILOT_COMMIT=<the commit> (the GPU copy's .git may be stale).
set -uo pipefail
export PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data PYTHONUNBUFFERED=1
python3 bench/gpu/stage_smollm2.py assemble >/dev/null || exit 1
[ -d checkpoints/smollm2-dflash ] || { echo "no checkpoints/: run \`stage_smollm2.py release\` here first"; exit 1; }
preset=${PRESET:-smollm2}
read -r -a systems <<<"${SYSTEMS:-ar stock stock:tree=best_first,nodes=32}"
data=(--dataset "${DATASET:-gsm8k}" --limit "${LIMIT:-160}")  # 160: each run long enough (seconds, not one) to judge 3%
tokens=${MAX_TOKENS:-256}
cli=(python3 -m specpilot.cli)
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader

for sys in "${systems[@]}"; do
    tag=${sys//[:,=]/_}
    log=/tmp/serve_$tag.log
    "${cli[@]}" serve --preset "$preset" --system "$sys" --port 8000 --max-in-flight "${MAX_IN_FLIGHT:-32}" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do grep -q " at http" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 1; done
    grep " at http" "$log" || { echo "$sys: the server did not start"; tail -5 "$log"; continue; }
    # correctness first: the server's greedy answers are the engine's alone (bf16: reported, not hidden)
    for q in "What is 12 * 7?" "Name the largest planet."; do
        want=$("${cli[@]}" generate "$q" --preset "$preset" --system "$sys" --max-new-tokens 48 2>/dev/null)
        got=$(python3 -c "import json,sys,urllib.request as u; r=u.urlopen(u.Request('http://127.0.0.1:8000/v1/chat/completions', json.dumps({'messages':[{'role':'user','content':sys.argv[1]}],'max_tokens':48,'temperature':0}).encode(), {'Content-Type':'application/json'})); print(json.load(r)['choices'][0]['message']['content'])" "$q")
        [ "$want" == "$got" ] && echo "$sys: '$q' answered as generate does" || echo "$sys: '$q' DIFFERS from generate"
    done
    # an untimed load first: the first system served in a lease compiled its kernels for the prompts' shapes inside
    # its timing (2026-12-07, H100: AR first, p99 TTFT 5.8 s against stock's 0.5 s after it; Triton's cache is on
    # disk, shared by the later servers)
    "${cli[@]}" bench serve --url http://127.0.0.1:8000 --concurrency 16 --dataset "${DATASET:-gsm8k}" --limit 32 \
        --max-tokens 32 >/dev/null 2>&1
    "${cli[@]}" bench serve --url http://127.0.0.1:8000 --concurrency "${CONCURRENCY:-1,8,16,24,32}" "${data[@]}" \
        --max-tokens "$tokens" --json "$OUT/serve_$tag.json" 2>&1 | tail -n 12
    [ "${RATES:-4,16}" != none ] && "${cli[@]}" bench serve --url http://127.0.0.1:8000 --rate "${RATES:-4,16}" \
        --max-concurrency 32 "${data[@]}" --max-tokens "$tokens" --json "$OUT/serve_open_$tag.json" 2>&1 | tail -n 8
    kill -TERM $pid; wait $pid
    "${cli[@]}" bench --preset "$preset" --system "$sys" --in-flight 16 "${data[@]}" --max-new-tokens "$tokens" \
        --json "$OUT/api16_$tag.json" 2>&1 | tail -n 6
    python3 - "$OUT" "$tag" <<'PY'
import json, pathlib, sys
out, tag = pathlib.Path(sys.argv[1]), sys.argv[2]
parts = {"closed": f"serve_{tag}.json", "open": f"serve_open_{tag}.json", "api16": f"api16_{tag}.json"}
merged = {k: json.loads((out / f).read_text()) for k, f in parts.items() if (out / f).exists()}
for f in parts.values():
    (out / f).unlink(missing_ok=True)
(out / f"serve_{tag}.json").write_text(json.dumps(merged, indent=1))
PY
done
