#!/usr/bin/env bash
# Screenshot an evidence package's index.html in headless Chromium, to look at it as a
# reviewer's browser shows it (issue 19 item 5). PNGs are not committed.
#
#   tools/screenshot_evidence.sh out/evidence [out/evidence.png] [1280,2400]
#
# Needs /usr/bin/chromium (Debian package `chromium`). A fresh profile directory each
# run; no network, no sync, no first-run pages, so the page is all that loads.
set -euo pipefail
pkg=${1:?usage: $0 PACKAGE_DIR [PNG] [WIDTH,HEIGHT]}
png=${2:-${pkg%/}.png}
size=${3:-1280,2400}
page=$(realpath "$pkg")/index.html
[ -f "$page" ] || page=$(realpath "$pkg")/evidence.html
[ -f "$page" ] || { echo "no index.html or evidence.html in $pkg" >&2; exit 2; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
flags=(--headless --disable-gpu --disable-quic --no-first-run --disable-background-networking
  --disable-component-update --disable-sync --hide-scrollbars "--user-data-dir=$profile")
[ "$(id -u)" = 0 ] && flags+=(--no-sandbox)
chromium=${CHROMIUM:-/usr/bin/chromium}
"$chromium" "${flags[@]}" "--screenshot=$(realpath -m "$png")" "--window-size=$size" \
  "file://$page" 2>/dev/null
echo "$png"
