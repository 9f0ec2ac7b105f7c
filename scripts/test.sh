#!/usr/bin/env bash
# Builds Substrate with warnings as errors and runs every test (unit and golden; golden tests read
# ../shared and skip with a message when it is absent).
# Usage: scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release} CMAKE_ARGS="-DSUBSTRATE_WERROR=ON ${CMAKE_ARGS:-}" \
  BUILD_DIR="$BUILD_DIR" scripts/setup.sh
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" --timeout 1200 "$@"
