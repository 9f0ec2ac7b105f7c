#!/usr/bin/env bash
# Decode out of core against decode resident, in the same sitting: the issue's measure for MoE
# streaming (decode >= 0.8 of min(resident tok/s, disk-bound tok/s)). A shared host's memory and
# disk move from minute to minute, so the two runs alternate, pair by pair, and each pair gives
# its own ratio. Usage:
#   bench/ooc_against_resident.sh SUBSTRATE MEMCAP MODEL CAP MAX_RAM PAIRS [bench args...]
# e.g. bench/ooc_against_resident.sh build/substrate ../shared/tools/memcap qwen2moe-Q4_0.gguf \
#        3G 2.75G 3 -p 0 -n 128 -t 2
# Each out-of-core run is `memcap --evict MODEL CAP substrate bench -m MODEL --max-ram MAX_RAM
# -r 1 --json ARGS` (the file evicted first, the cap kept by memcap: the expert cache starts
# empty and the reads of the first tokens' experts are timed); each resident run is the same
# bench without a budget. With OOC_STORE=DIR set, the out-of-core runs read the packed store DIR
# (`bench --store DIR`, every file of it evicted) instead of MODEL in place. Prints one JSON line
# per pair, then a summary line.
set -euo pipefail
if [ $# -lt 6 ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
SUB=$1 MEMCAP=$2 MODEL=$3 CAP=$4 MAX_RAM=$5 PAIRS=$6
shift 6
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "${OOC_STORE:-}" ]; then
  evict=() && for f in "$OOC_STORE"/*; do evict+=(--evict "$f"); done
  source=(--store "$OOC_STORE")
else
  evict=(--evict "$MODEL") source=(-m "$MODEL")
fi
for i in $(seq 1 "$PAIRS"); do
  "$MEMCAP" "${evict[@]}" "$CAP" "$SUB" bench "${source[@]}" --max-ram "$MAX_RAM" -r 1 --json "$@" \
    > "$tmp/ooc.json" 2> "$tmp/ooc.err" || { cat "$tmp/ooc.err" >&2; exit 1; }
  "$SUB" bench -m "$MODEL" -r 1 --json "$@" > "$tmp/res.json" 2> "$tmp/res.err" \
    || { cat "$tmp/res.err" >&2; exit 1; }
  python3 - "$tmp/ooc.json" "$tmp/res.json" "$tmp/ooc.err" "$i" <<'EOF' | tee -a "$tmp/pairs"
import json, re, sys
ooc, res = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
peak = re.search(r"peak_bytes=(\d+).*oom_kills=(\d+)", open(sys.argv[3]).read())
s = ooc["store"]
tps, resident, disk = ooc["tg"]["tokens_per_s"], res["tg"]["tokens_per_s"], ooc["disk_bound_tokens_per_s"]
bound = min(resident, disk) if disk > 0 else resident
print(json.dumps({
    "pair": int(sys.argv[4]), "ooc_tokens_per_s": round(tps, 2), "resident_tokens_per_s": round(resident, 2),
    "disk_bound_tokens_per_s": round(disk, 1), "ratio": round(tps / bound, 3),
    "expert_slots": s.get("expert_slots"), "disk_mb_per_token": round(ooc["disk_bytes_per_token"] / 1e6, 1),
    "stall_s": round(s.get("stall_us", 0) / 1e6, 2), "memcap_peak_bytes": int(peak.group(1)) if peak else None,
    "oom_kills": int(peak.group(2)) if peak else None}))
EOF
done
python3 - "$tmp/pairs" <<'EOF'
import json, sys
p = [json.loads(l) for l in open(sys.argv[1])]
r = [x["ratio"] for x in p]
print(json.dumps({"pairs": len(p), "ratio_mean": round(sum(r) / len(r), 3), "ratio_min": min(r),
                  "ratio_max": max(r), "goal": 0.8,
                  "memcap_peak_bytes_max": max(x["memcap_peak_bytes"] or 0 for x in p),
                  "oom_kills": sum(x["oom_kills"] or 0 for x in p)}))
EOF
