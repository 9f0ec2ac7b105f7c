#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks on a GPU machine, in one go (device time is scarce:
# build elsewhere, run this there). Usage:
#   bench/cuda_device.sh DIR OUT PHASE...
# DIR holds the binaries (substrate, test_backend, test_model, optionally llama-bench) and lib/
# (shared libraries the machine may lack); OUT receives logs and JSON. Phases:
#   info                         the GPU, driver and cuBLAS found
#   tests                        the differential op test, then the golden/greedy model tests
#                                with SUBSTRATE_TEST_DEVICE=cuda (fixtures under DIR/shared)
#   bench:PRESET:TYPE[:ARGS]     synth a file (deleted after), `substrate bench --device cuda`
#                                on it, then llama-bench (-ngl 99) when DIR has it
set -uo pipefail
DIR=$(cd "$1" && pwd)
OUT=$2
shift 2
export LD_LIBRARY_PATH="$DIR/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
SYNTH=${SYNTH_DIR:-/tmp/synth}
mkdir -p "$OUT" "$SYNTH"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/summary.txt"; }

for phase in "$@"; do
  case "$phase" in
    info)
      log info
      { nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
          --format=csv; nvidia-smi | head -15; ls /usr/local/cuda/lib64/ | grep -E 'cublas|cudart';
        nproc; free -g; df -h /tmp | tail -1; cat /proc/loadavg; } > "$OUT/info.txt" 2>&1
      head -3 "$OUT/info.txt" | tee -a "$OUT/summary.txt"
      ;;
    tests)
      log "op test"
      "$DIR/test_backend" 2>&1 | tee "$OUT/op_test.log" | grep -E '^\[  (PASSED|FAILED)|FAILED|note:' \
        | tee -a "$OUT/summary.txt"
      log "model tests on cuda"
      SUBSTRATE_TEST_DEVICE=cuda "$DIR/test_model" --gtest_filter='*GoldenLogits*:Greedy.*:MoeHints.*' \
        2>&1 | tee "$OUT/model_test.log" | grep -E '^\[  (PASSED|FAILED)|FAILED|SKIPPED \]|rel err' \
        | head -80 | tee -a "$OUT/summary.txt"
      ;;
    bench:*)
      IFS=: read -r _ preset type extra <<< "$phase"
      f="$SYNTH/$preset-$type.gguf"
      name="$preset-$type"
      log "synth $name"
      /usr/bin/time -f "synth %e s" "$DIR/substrate" synth --preset "$preset" --type "$type" -o "$f" \
        -t "$(nproc)" > "$OUT/synth-$name.log" 2>&1
      tail -1 "$OUT/synth-$name.log" | tee -a "$OUT/summary.txt"
      log "substrate bench $name"
      # shellcheck disable=SC2086
      "$DIR/substrate" bench -m "$f" --device cuda -p 512 -n 128 -r 3 --json ${extra//,/ } \
        > "$OUT/substrate-$name.json" 2> "$OUT/substrate-$name.err"
      python3 - "$OUT/substrate-$name.json" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    print("substrate pp512 %.1f tg128 %.1f (runs %s) bytes/token %.3g GB bw %.0f GB/s ratio %.3f"
          % (j["pp"]["tokens_per_s"], j["tg"]["tokens_per_s"], [round(x, 1) for x in j["tg"]["runs"]],
             j["weight_bytes_per_token"] / 1e9, j["mem_bw"]["bytes_per_s"] / 1e9, j["bw_ratio"]))
except Exception as e:
    print("substrate bench failed:", e)
EOF
      tail -3 "$OUT/substrate-$name.err" >> "$OUT/summary.txt"
      if [ -x "$DIR/llama-bench" ]; then
        log "llama-bench $name"
        "$DIR/llama-bench" -m "$f" -ngl 99 -p 512 -n 128 -r 3 -o json \
          > "$OUT/llama-$name.json" 2> "$OUT/llama-$name.err"
        python3 - "$OUT/llama-$name.json" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
try:
    for r in json.load(open(sys.argv[1])):
        print("llama.cpp n_prompt %d n_gen %d: %.1f t/s (fa %s)" % (r["n_prompt"], r["n_gen"], r["avg_ts"], r.get("flash_attn")))
except Exception as e:
    print("llama-bench failed:", e)
EOF
        tail -2 "$OUT/llama-$name.err" >> "$OUT/summary.txt"
      fi
      [ "${KEEP_SYNTH:-0}" = 1 ] || rm -f "$f"
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
log done
