# Sourced by the Node-driven serve tests (tests/serve/sdk, tests/serve/web): npm packages
# installed into the build folder on first use, and a `substrate serve` started on a free port.
# A test that cannot get what it needs prints why and exits 77, which CTest reports as skipped.

# need_node_packages DIR PACKAGE@VERSION...: installs the packages under DIR (once).
need_node_packages() {
  local dir=$1; shift
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "SKIP: node and npm are not installed (Debian packages nodejs, npm)"; return 1
  fi
  mkdir -p "$dir"
  local missing=0 p name
  for p in "$@"; do
    name=${p%@*}
    [ -f "$dir/node_modules/$name/package.json" ] || missing=1
  done
  [ $missing -eq 0 ] && return 0
  if ! timeout 600 npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$@" \
       >"$dir/npm-install.log" 2>&1; then
    echo "SKIP: cannot install npm packages ($*): npm unreachable? see $dir/npm-install.log"
    tail -5 "$dir/npm-install.log"; return 1
  fi
}

# start_server LOG ARGS...: `$SUBSTRATE serve --port 0 ARGS...` in the background; sets
# SERVER_PID and PORT once it listens.
start_server() {
  local log=$1; shift
  "$SUBSTRATE" serve --port 0 "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$PORT" ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "the server exited:"; cat "$log"; return 1; }
    sleep 0.1
  done
  echo "the server did not start:"; cat "$log"; return 1
}

stop_server() {
  [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
}
