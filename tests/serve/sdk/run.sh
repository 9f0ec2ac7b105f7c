#!/usr/bin/env bash
# The official OpenAI and Anthropic SDKs (from npm) against `substrate serve` and the bundled
# model (sdk_test.mjs says what is checked). Skips (exit 77) when node or npm is unavailable.
# Usage: run.sh SUBSTRATE_BINARY SOURCE_DIR BUILD_DIR SHARED_DIR
set -uo pipefail
SUBSTRATE=$1 SRC=$2 BUILD=$3 SHARED=$4
source "$SRC/tests/serve/node_setup.sh"
NODE_DIR="$BUILD/serve-node"
need_node_packages "$NODE_DIR" openai@7.59.0 @anthropic-ai/sdk@1.14.0 ajv@8.20.0 ajv-formats@3.0.1 || exit 77
MODEL="$SRC/models/tiny-coder-Q8_0.gguf"
[ -f "$MODEL" ] || { echo "SKIP: $MODEL is missing"; exit 77; }
OUT="$BUILD/serve-sdk"
mkdir -p "$OUT"
trap stop_server EXIT

start_server "$OUT/server.log" -m "$MODEL" -c 1024 --parallel 2 || exit 1
MAIN_PORT=$PORT MAIN_PID=$SERVER_PID
# A second server with a chat template that thinks (DeepSeek R1's ends its prompt in <think>).
THINK_PORT=
R1="$SHARED/templates/src/llama-cpp-deepseek-r1.jinja"
if [ -f "$R1" ]; then
  start_server "$OUT/server-r1.log" -m "$MODEL" -c 1024 --chat-template-file "$R1" || exit 1
  THINK_PORT=$PORT
fi
NODE_PATH="$NODE_DIR/node_modules" BASE_PORT=$MAIN_PORT THINK_PORT=$THINK_PORT \
  node --test --test-reporter=spec "$SRC/tests/serve/sdk/sdk_test.cjs"
rc=$?
stop_server
SERVER_PID=$MAIN_PID; stop_server
exit $rc
