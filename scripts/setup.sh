#!/usr/bin/env bash
# Installs the Debian packages Substrate needs and builds it (Release) into build/.
# Usage: scripts/setup.sh            (run as root, or with sudo available)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config git
          nlohmann-json3-dev libpcre2-dev liburing-dev libcpp-httplib-dev
          libgtest-dev libgmock-dev curl)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# For the serve tests driven by Node (the official SDKs, the web page in headless Chromium):
# optional, those tests skip with a message when these are missing. SUBSTRATE_NO_BROWSER=1
# leaves them out.
# Checked by command, not package: node may come from another package than Debian's (whose
# npm would then conflict).
optional_missing=()
command -v node >/dev/null || optional_missing+=(nodejs)
command -v npm >/dev/null || optional_missing+=(npm)
command -v chromium >/dev/null || optional_missing+=(chromium)
command -v chromedriver >/dev/null || optional_missing+=(chromium-driver)
if [ ${#optional_missing[@]} -gt 0 ] && [ -z "${SUBSTRATE_NO_BROWSER:-}" ]; then
  if ! { $SUDO apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${optional_missing[@]}"; }; then
    echo "setup: could not install ${optional_missing[*]}; the Node/Chromium serve tests will skip" >&2
  fi
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR"
