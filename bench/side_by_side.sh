#!/usr/bin/env bash
# Prefill and decode of one or more GGUF files, llama.cpp's llama-bench and ours side by side in
# one sitting: per file, the page cache dropped, llama-bench, the page cache dropped, substrate
# bench; each engine's peak RSS from /usr/bin/time. One JSON line per file: both engines' pp and
# tg tokens/s, the ratios, our decode against the memory bandwidth our bench read in the same
# run (bw_ratio: the highest probe of the run; bw_ratio_run: the probes just before and after the
# decode run; bw_ratio_token: each token against 512 MiB reads just before and after it, p10,
# median and p90), and both peaks.
#
#   bench/side_by_side.sh SUBSTRATE LLAMA_BENCH THREADS FILE...
#
# Dropping the page cache needs root; llama.cpp is built outside the project.
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: $0 SUBSTRATE LLAMA_BENCH THREADS FILE..." >&2
  exit 2
fi
substrate=$1 llama_bench=$2 threads=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
peak_kb() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$1"; }

for file in "$@"; do
  drop_caches
  /usr/bin/time -v "$llama_bench" -m "$file" -t "$threads" -p 512 -n 64 -r 1 -o json \
    > "$tmp/llama.json" 2> "$tmp/llama.time"
  drop_caches
  /usr/bin/time -v "$substrate" bench -m "$file" -t "$threads" -p 512 -n 64 -r 1 --json \
    --bw-each-token 512M \
    > "$tmp/ours.json" 2> "$tmp/ours.time"
  python3 - "$file" "$tmp/llama.json" "$tmp/ours.json" "$(peak_kb "$tmp/llama.time")" \
    "$(peak_kb "$tmp/ours.time")" <<'EOF'
import json, sys
file, llama_path, ours_path, llama_kb, ours_kb = sys.argv[1:]
llama = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in json.load(open(llama_path))}
ours = json.load(open(ours_path))
pp, tg = ours["pp"]["tokens_per_s"], ours["tg"]["tokens_per_s"]
print(json.dumps({
    "file": file,
    "pp512": {"ours": round(pp, 2), "llama.cpp": round(llama["pp"], 2),
              "ratio": round(pp / llama["pp"], 2)},
    "tg64": {"ours": round(tg, 2), "llama.cpp": round(llama["tg"], 2),
             "ratio": round(tg / llama["tg"], 2)},
    "mem_bw_gb_s": round(ours["mem_bw"]["bytes_per_s"] / 1e9, 1),
    "tg_bw_ratio": round(ours["bw_ratio"], 3),
    "tg_bw_ratio_run": round(ours["bw_ratio_run_median"], 3),
    "tg_bw_ratio_token": {k: round(ours["tg"]["per_token"]["bw_ratio_" + k], 3)
                          for k in ("p10", "median", "p90")},
    "peak_rss_gb": {"ours": round(int(ours_kb) / 1e6, 2),
                    "llama.cpp": round(int(llama_kb) / 1e6, 2)},
}))
EOF
done
