#!/usr/bin/env bash
# The web page at / in headless Chromium against `substrate serve` and the bundled model
# (web_test.cjs says what is checked); the screenshot is kept in BUILD_DIR/serve-web/.
# Skips (exit 77) when Chromium (Debian packages chromium, chromium-driver: scripts/setup.sh
# installs them), node or npm is unavailable.
# Usage: run.sh SUBSTRATE_BINARY SOURCE_DIR BUILD_DIR SHARED_DIR
set -uo pipefail
SUBSTRATE=$1 SRC=$2 BUILD=$3
source "$SRC/tests/serve/node_setup.sh"
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { echo "SKIP: $CHROMIUM is missing (Debian package chromium; scripts/setup.sh installs it)"; exit 77; }
NODE_DIR="$BUILD/serve-node-web"
need_node_packages "$NODE_DIR" playwright-core@1.65.1 || exit 77
MODEL="$SRC/models/tiny-coder-Q8_0.gguf"
[ -f "$MODEL" ] || { echo "SKIP: $MODEL is missing"; exit 77; }
OUT="$BUILD/serve-web"
rm -rf "$OUT/profile"
mkdir -p "$OUT/profile"
trap stop_server EXIT
start_server "$OUT/server.log" -m "$MODEL" -c 1024 || exit 1
NODE_PATH="$NODE_DIR/node_modules" BASE_PORT=$PORT CHROMIUM="$CHROMIUM" OUT="$OUT" \
  node --test --test-reporter=spec "$SRC/tests/serve/web/web_test.cjs"
