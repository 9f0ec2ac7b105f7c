#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks on a GPU machine, in one go (device time is scarce:
# build elsewhere, run this there). Usage:
#   bench/cuda_device.sh DIR OUT PHASE...
# DIR holds the binaries (substrate, test_backend, test_model) and lib/ (shared libraries the
# machine may lack: `ldd DIR/substrate` here; the H200 machine had no liburing, cpp-httplib,
# pcre2 or brotli); OUT receives logs and JSON; synth files live in $SYNTH_DIR (/tmp/synth).
# Phases, run in order:
#   info                   the GPU, driver and CUDA libraries found
#   tests[:VAR=VALUE,...]  the differential op test, then the model tests on the GPU
#                          (SUBSTRATE_TEST_DEVICE=cuda), with VAR set (e.g. SUBSTRATE_CUDA_PDL=0;
#                          SUBSTRATE_TEST_VRAM=half: under a budget that holds half the weights).
#                          The test binaries read the fixtures, and run `substrate` (the
#                          conversion tests), at the paths of the machine that built them
#                          (../shared, the source tree, the build folder): link those to the
#                          copies here, or those tests fail to start
#   gemv[:TOKENS]          DIR/bench_cuda_gemv: each decode product kernel alone, GB/s
#   attn[:MAX_SPLITS]      DIR/bench_cuda_attention: the decode attention alone, 32-16384
#                          positions, against the floor of a small dependent launch (with the
#                          splits capped at MAX_SPLITS); then prefill attention, float kernel
#                          against tensor cores
#   broken                 DIR/test_backend_broken (a build with a deliberately wrong kernel)
#                          must fail the op test that guards that kernel
#   synth:PRESET:TYPE      `substrate synth` a file (kept for the phases after)
#   sub:PRESET:TYPE[:VAR=VALUE]  `substrate bench --device cuda -p 512 -n 128 -r 3` on it
#                          (with VAR set: an A/B of an environment switch)
#   vram:PRESET:TYPE:SIZE[,VAR=VALUE]  `substrate bench ... --max-vram SIZE -p 512 -n 64 -r 2`
#                          on it (with VAR set), with the plan and the device's peak memory use
#                          (nvidia-smi, sampled)
#   ab:PRESET:TYPE         on it: decode without programmatic dependent launch, without
#                          graphs, and per-kernel times (decode, prefill)
#   vramprof:PRESET:TYPE:SIZE  per-kernel decode times under --max-vram SIZE (graphs off)
#   llama-build            build llama-bench for sm_90 and this CPU (its -ngl / --n-cpu-moe
#                          layers run there) from DIR/llama-min.tar.xz (a llama.cpp
#                          source tree) in the background
#   depth:PRESET:TYPE:D[,KV[,VAR=VALUE]]  `substrate bench ... -p 512 -n 128 -d D -r 2` (decode
#                          over a KV cache of D positions; KV: its --kv-type, f32 by default)
#   llamadepth:PRESET:TYPE:D  `llama-bench -ngl 99 -p 512 -n 128 -d D -r 2` (its default F16
#                          cache)
#   llama-wait             wait for that build
#   llama:PRESET:TYPE      `llama-bench -ngl 99 -p 512 -n 128 -r 3` on the file
#   llamaoff:PRESET:TYPE:ARGS  `llama-bench ARGS -p 512 -n 64 -r 2` (ARGS: -ngl N, or -ngl 99
#                          --n-cpu-moe N: part of the model on the CPU), with the peak memory use
#   rm:PRESET:TYPE         delete the file
set -uo pipefail
DIR=$(cd "$1" && pwd)
OUT=$2
shift 2
export LD_LIBRARY_PATH="$DIR/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
SYNTH=${SYNTH_DIR:-/tmp/synth}
LLAMA=/tmp/llama
mkdir -p "$OUT" "$SYNTH"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/summary.txt"; }
# Runs a command while sampling the GPU's memory in use; prints the peak (MiB) after it.
with_peak() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/.mem" 2>/dev/null &
  local smi=$!
  "$@"
  local rc=$?
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  echo "peak GPU memory in use: $(sort -n "$OUT/.mem" | tail -1) MiB" >> "$OUT/summary.txt"
  rm -f "$OUT/.mem"
  return $rc
}

for phase in "$@"; do
  IFS=: read -r what preset type var <<< "$phase"
  f="$SYNTH/$preset-$type.gguf"
  name="$preset-$type${var:+-${var//=/-}}"
  setvar=(env)
  [ -n "${var:-}" ] && setvar=(env "$var")
  case "$what" in
    info)
      log info
      { nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
          --format=csv; nvidia-smi | head -15; ls /usr/local/cuda/lib64/ | grep -E 'cublas|cudart';
        nproc; free -g; df -h /tmp | tail -1; cat /proc/loadavg; } > "$OUT/info.txt" 2>&1
      head -3 "$OUT/info.txt" | tee -a "$OUT/summary.txt"
      ;;
    tests)
      tv=${preset:-}  # tests:VAR=VALUE[,VAR=VALUE...]
      te=(env)
      [ -n "$tv" ] && IFS=, read -r -a more <<< "$tv" && te=(env "${more[@]}")
      tag=${tv:+-${tv//[=,]/-}}
      log "op test $tv"
      "${te[@]}" "$DIR/test_backend" 2>&1 | tee "$OUT/op_test$tag.log" \
        | grep -E '^\[  (PASSED|FAILED)|FAILED|note:' | tee -a "$OUT/summary.txt"
      log "model tests on cuda $tv"
      "${te[@]}" SUBSTRATE_TEST_DEVICE=cuda "$DIR/test_model" \
        --gtest_filter='*GoldenLogits*:Greedy.*:MoeHints.*' 2>&1 \
        | tee "$OUT/model_test$tag.log" | grep -E '^\[  (PASSED|FAILED)|FAILED' \
        | head -40 | tee -a "$OUT/summary.txt"
      ;;
    gemv)
      log "gemv kernels ${preset:-1} token(s)"
      "$DIR/bench_cuda_gemv" "${preset:-1}" 2>&1 | tee "$OUT/gemv-${preset:-1}.txt" >> "$OUT/summary.txt"
      ;;
    attn)
      log "decode attention kernel ${preset:+(at most $preset splits)}"
      "$DIR/bench_cuda_attention" ${preset:-} 2>&1 | tee "$OUT/attn${preset:+-$preset}.txt" \
        >> "$OUT/summary.txt"
      ;;
    broken)
      log "op test of the deliberately broken build (must fail)"
      "$DIR/test_backend_broken" --gtest_filter='*BeyondOneWave*' > "$OUT/broken.log" 2>&1
      echo "rc $? (non-zero expected)" | tee -a "$OUT/summary.txt"
      grep -m3 -E 'Failure|cuda: MatMul' "$OUT/broken.log" | tee -a "$OUT/summary.txt"
      ;;
    synth)
      log "synth $name"
      /usr/bin/time -f "synth %e s" "$DIR/substrate" synth --preset "$preset" --type "$type" -o "$f" \
        -t "$(nproc)" > "$OUT/synth-$name.log" 2>&1
      tail -1 "$OUT/synth-$name.log" | tee -a "$OUT/summary.txt"
      ;;
    sub)
      log "substrate bench $name"
      "${setvar[@]}" "$DIR/substrate" bench -m "$f" --device cuda -p 512 -n 128 -r 3 --json \
        > "$OUT/substrate-$name.json" 2> "$OUT/substrate-$name.err"
      python3 - "$OUT/substrate-$name.json" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    print("substrate pp512 %.1f %s tg128 %.1f %s bytes/token %.4g GB bw %.0f GB/s ratio %.3f"
          % (j["pp"]["tokens_per_s"], [round(x) for x in j["pp"]["runs"]], j["tg"]["tokens_per_s"],
             [round(x, 1) for x in j["tg"]["runs"]], j["weight_bytes_per_token"] / 1e9,
             j["mem_bw"]["bytes_per_s"] / 1e9, j["bw_ratio"]))
except Exception as e:
    print("substrate bench failed:", e)
EOF
      tail -3 "$OUT/substrate-$name.err" >> "$OUT/summary.txt"
      ;;
    vram)
      IFS=, read -r size venv <<< "$var"
      log "substrate bench $name --max-vram $size ${venv:-}"
      with_peak env ${venv:+"$venv"} "$DIR/substrate" bench -m "$f" --device cuda --max-vram "$size" -p 512 -n 64 -r 2 \
        --json --print-plan > "$OUT/vram-$name.json" 2> "$OUT/vram-$name.err"
      python3 - "$OUT/vram-$name.json" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    u = j.get("host_link", {})
    print("substrate pp512 %.1f tg64 %.2f %s host link %.1f MB/token h2d %.1f GB/s limit %.2f t/s "
          "ratio %.3f device ledger peak %.2f GB"
          % (j["pp"]["tokens_per_s"], j["tg"]["tokens_per_s"], [round(x, 2) for x in j["tg"]["runs"]],
             u.get("bytes_per_token", 0) / 1e6, u.get("host_to_device_bytes_per_s", 0) / 1e9,
             u.get("limit_tokens_per_s", 0), u.get("ratio", 0), j["device_ledger"]["peak_bytes"] / 1e9))
    h = u.get("hybrid")
    if h:
        print("hybrid: CPU %.1f MB/token (share %.2f), host memory %.1f GB/s"
              % (h["cpu_bytes_per_token"] / 1e6, h["cpu_share"], h["host_read_bytes_per_s"] / 1e9))
    print("device accounts (peak MB):", ", ".join("%s %.0f" % (k, v["peak"] / 1e6)
          for k, v in j["device_ledger"].get("accounts", {}).items()))
except Exception as e:
    print("substrate bench failed:", e, open(sys.argv[1]).read()[-600:])
EOF
      tail -4 "$OUT/vram-$name.err" | tee -a "$OUT/summary.txt"
      ;;
    vramprof)
      log "profile decode $name under --max-vram $var"
      SUBSTRATE_CUDA_PROFILE=1 "$DIR/substrate" bench -m "$f" --device cuda --max-vram "$var" -p 0 -n 16 \
        -r 1 > /dev/null 2> "$OUT/vramprof-$name.txt"
      head -22 "$OUT/vramprof-$name.txt" | tee -a "$OUT/summary.txt"
      ;;
    depth)
      IFS=, read -r d kv env <<< "$var"
      kv=${kv:-f32}
      log "substrate bench $preset-$type at depth $d, $kv cache ${env:-}"
      env ${env:+"$env"} "$DIR/substrate" bench -m "$f" --device cuda -p 512 -n 128 -d "$d" \
        --kv-type "$kv" -r 2 --json > "$OUT/depth-$preset-$type-$d-$kv${env:+-${env%%=*}}.json" 2> "$OUT/depth.err"
      python3 -c 'import json,sys
j = json.load(open(sys.argv[1]))
print("substrate pp512 @ d%d %.1f tg128 @ d%d %.1f (KV %.1f MB a token; ratio %.3f)" % (j["depth"],
      j["pp"]["tokens_per_s"], j["depth"], j["tg"]["tokens_per_s"], j["kv_bytes_per_token"] / 1e6,
      j["bw_ratio"]))' "$OUT/depth-$preset-$type-$d-$kv${env:+-${env%%=*}}.json" 2>&1 | tee -a "$OUT/summary.txt"
      ;;
    llamadepth)
      log "llama-bench $preset-$type at depth $var"
      "$LLAMA/llama-min/build/bin/llama-bench" -m "$f" -ngl 99 -p 512 -n 128 -d "$var" -r 2 \
        -o json > "$OUT/llamadepth-$preset-$type-$var.json" 2> "$OUT/llamadepth.err"
      python3 -c 'import json,sys
for r in json.load(open(sys.argv[1])):
    print("llama.cpp n_prompt %d n_gen %d depth %d: %.1f t/s (fa %s, cache %s)" % (r["n_prompt"],
          r["n_gen"], r.get("n_depth", -1), r["avg_ts"], r.get("flash_attn"), r.get("type_k")))' \
        "$OUT/llamadepth-$preset-$type-$var.json" 2>&1 | tee -a "$OUT/summary.txt"
      ;;
    llamaoff)
      log "llama-bench $preset-$type $var"
      # shellcheck disable=SC2086
      with_peak "$LLAMA/llama-min/build/bin/llama-bench" -m "$f" $var -p 512 -n 64 -r 2 -o json \
        > "$OUT/llamaoff-$preset-$type-${var// /_}.json" 2> "$OUT/llamaoff.err"
      python3 -c 'import json,sys
for r in json.load(open(sys.argv[1])):
    print("llama.cpp n_prompt %d n_gen %d ngl %s n_cpu_moe %s: %.2f t/s" % (r["n_prompt"], r["n_gen"],
          r.get("n_gpu_layers"), r.get("n_cpu_moe"), r["avg_ts"]))' \
        "$OUT/llamaoff-$preset-$type-${var// /_}.json" 2>&1 | tee -a "$OUT/summary.txt"
      ;;
    ab)
      for v in SUBSTRATE_CUDA_PDL=0 SUBSTRATE_CUDA_GRAPHS=0; do
        log "$v $name"
        "${setvar[@]}" "$v" "$DIR/substrate" bench -m "$f" --device cuda -p 0 -n 128 -r 2 --json \
          > "$OUT/ab-${v%%=*}-$name.json" 2> "$OUT/ab-${v%%=*}-$name.err"
        python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("tg128 %.1f %s" % (j["tg"]["tokens_per_s"], j["tg"]["runs"]))' \
          "$OUT/ab-${v%%=*}-$name.json" 2>&1 | tee -a "$OUT/summary.txt"
      done
      log "profile decode $name"
      "${setvar[@]}" SUBSTRATE_CUDA_PROFILE=1 "$DIR/substrate" bench -m "$f" --device cuda -p 0 -n 32 -r 1 \
        > /dev/null 2> "$OUT/profile-decode-$name.txt"
      head -16 "$OUT/profile-decode-$name.txt" | tee -a "$OUT/summary.txt"
      log "profile prefill $name"
      "${setvar[@]}" SUBSTRATE_CUDA_PROFILE=1 "$DIR/substrate" bench -m "$f" --device cuda -p 512 -n 0 -r 2 \
        > /dev/null 2> "$OUT/profile-prefill-$name.txt"
      head -12 "$OUT/profile-prefill-$name.txt" | tee -a "$OUT/summary.txt"
      ;;
    llama-build)
      log "llama.cpp build (background)"
      rm -rf "$LLAMA" && mkdir -p "$LLAMA" && tar -xJf "$DIR/llama-min.tar.xz" -C "$LLAMA" \
        2>&1 | tail -2 | tee -a "$OUT/summary.txt"
      ( cd "$LLAMA/llama-min" && CUDACXX=/usr/local/cuda/bin/nvcc cmake -S . -B build -G Ninja \
          -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
          -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_CUDA_NCCL=OFF \
          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
          -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF > "$LLAMA/build.log" 2>&1 &&
        nice -n 19 cmake --build build --target llama-bench -j "$(nproc)" >> "$LLAMA/build.log" 2>&1;
        echo $? > "$LLAMA/done" ) &
      ;;
    llama-status)
      log "llama.cpp build so far"
      tail -2 "$LLAMA/build.log" | tee -a "$OUT/summary.txt"
      ;;
    llama-wait)
      log "waiting for the llama.cpp build"
      while [ ! -f "$LLAMA/done" ]; do sleep 2; done
      log "llama.cpp build rc $(cat "$LLAMA/done")"
      ls "$LLAMA" "$LLAMA/llama-min" 2>&1 | head -5 >> "$OUT/summary.txt"
      tail -4 "$LLAMA/build.log" 2>&1 | tee -a "$OUT/summary.txt"
      ;;
    llama)
      log "llama-bench $name"
      "$LLAMA/llama-min/build/bin/llama-bench" -m "$f" -ngl 99 -p 512 -n 128 -r 3 -o json \
        > "$OUT/llama-$name.json" 2> "$OUT/llama-$name.err"
      python3 - "$OUT/llama-$name.json" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
try:
    for r in json.load(open(sys.argv[1])):
        print("llama.cpp n_prompt %d n_gen %d: %.1f t/s %s (fa %s, %s)" % (r["n_prompt"], r["n_gen"],
              r["avg_ts"], [round(x, 1) for x in r.get("samples_ts", [])], r.get("flash_attn"),
              r.get("build_commit")))
except Exception as e:
    print("llama-bench failed:", e)
EOF
      tail -2 "$OUT/llama-$name.err" >> "$OUT/summary.txt"
      ;;
    rm) rm -f "$f" ;;
    *) echo "unknown phase $phase" ;;
  esac
done
log done
