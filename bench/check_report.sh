#!/usr/bin/env bash
# Render a loop's report and check report.html in headless Chromium, by hand (tests/test_report_browser.py does the
# same on a fixture): the verdict box and the tables in the rendered DOM, and a screenshot that is not empty.
#   bench/check_report.sh RUN_DIR    -> RUN_DIR/report.html, and RUN_DIR/report-screenshot.png to look at
set -euo pipefail
dir=${1:?usage: bench/check_report.sh RUN_DIR (a loop\'s run directory)}
python=${PYTHON:-python}
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "no chromium or chromium-browser on PATH: apt-get install -y chromium" >&2; exit 2; }
"$python" -m specpilot.cli report "$dir"
page="$(cd "$dir" && pwd)/report.html"
shot="$(cd "$dir" && pwd)/report-screenshot.png"
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
flags=(--headless --disable-gpu --no-sandbox --user-data-dir="$profile")
dom=$("$browser" "${flags[@]}" --dump-dom "file://$page" 2>/dev/null)
grep -q '<div id="verdict"' <<<"$dom" || { echo "FAIL: no verdict box in the rendered DOM" >&2; exit 1; }
tables=$(grep -o '<table>' <<<"$dom" | wc -l)
[ "$tables" -ge 1 ] || { echo "FAIL: no table in the rendered DOM" >&2; exit 1; }
rm -f "$shot"
"$browser" "${flags[@]}" --screenshot="$shot" --window-size=1280,2000 "file://$page" 2>/dev/null
[ -s "$shot" ] || { echo "FAIL: the screenshot $shot is empty" >&2; exit 1; }
echo "ok: verdict box and $tables table(s) rendered; screenshot $shot ($(wc -c <"$shot") bytes)"
