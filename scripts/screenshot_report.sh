#!/usr/bin/env bash
# Render an autofusion HTML report in headless Chromium and save a PNG screenshot of it.
#
#   scripts/screenshot_report.sh REPORT.html [OUT.png] [WIDTHxHEIGHT]
#
# Needs Debian's chromium package (apt-get install chromium). The page is loaded from the file
# system with networking features off: the report is self-contained, so nothing is fetched.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 REPORT.html [OUT.png] [WIDTHxHEIGHT]" >&2
    exit 2
fi
report=$(realpath "$1")
out=${2:-${report%.html}.png}
size=${3:-1400x2000}
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z "$browser" ]]; then
    echo "$0: chromium not found (apt-get install chromium)" >&2
    exit 1
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --hide-scrollbars --window-size="${size/x/,}" \
    --screenshot="$(realpath -m "$out")" "file://$report" >/dev/null 2>&1
echo "wrote $out"
