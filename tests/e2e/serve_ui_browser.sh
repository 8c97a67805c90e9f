#!/usr/bin/env bash
# serve_ui_browser.sh - the playground in the real Chromium (Debian `chromium`, headless) driven by
# puppeteer-core (tests/clients/playground.mjs, pinned in tests/clients/package-lock.json): load,
# upload a voice, generate (streamed wav played as it arrives, <audio> duration, waveform, download,
# figures), mp3, the server's errors in words, zero console errors; then a server with --api-key:
# the key prompt. Loopback only. Chromium missing is a FAILURE (scripts/install-deps.sh installs it).
# The screenshot after generation: <build>/serve_ui/playground.png (not committed).
set -eu
. "$(dirname "$0")/serve_lib.bash"
CHROMIUM=${CHROMIUM:-$(command -v chromium || true)}
[ -n "$CHROMIUM" ] && [ -x "$CHROMIUM" ] || fail "chromium missing (scripts/install-deps.sh installs it)"
command -v npm >/dev/null || fail "npm missing (scripts/install-deps.sh installs it)"
export CHROMIUM PLAYGROUND_TMP="$WORK" TMPDIR="$WORK" # Chromium's own temporary files too
install_clients
OUTDIR="$(dirname "$DRAMA_BIN")/serve_ui"
rm -f "$OUTDIR/playground.png"
make_wav "$WORK/clip.wav" 0.5

start_server -q
timeout 150 node "$CLIENTS/playground.mjs" main "$BASE" "$OUTDIR" "$WORK/clip.wav" 40 || fail "playground (main)"
[ -s "$OUTDIR/playground.png" ] || fail "no screenshot"
stop_server

KEY=ui-browser-key
start_server --api-key "$KEY" --cfg-allow-request-gamma --max-frames 60 -q
timeout 150 node "$CLIENTS/playground.mjs" key "$BASE" "$KEY" || fail "playground (key)"
stop_server
echo "serve_ui_browser: all passed (screenshot $OUTDIR/playground.png)"
