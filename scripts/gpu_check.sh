#!/usr/bin/env bash
# One call on the GPU machine: configure, build with all cores, then run the requested steps, logging into a folder.
# Usage: scripts/gpu_check.sh OUT_DIR [steps...]
#        steps: smoke tests decode bench_decode hf_generate text sanitize_decode trace traces ab hf bench bench_ops
#               sanitize sanitize_forward ablation waits ab_decode ncu sass probes
# (run scripts/prepare_gpu_deps.sh here first and carry .gpu-deps: the GPU machine cannot install PCRE2)
#        (default: smoke tests trace hf bench sass)
# NOTE: a GPU machine keeps at most 8 files of OUT_DIR: pack it (tar) before the call ends.
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [steps...]}
shift
steps=${*:-"smoke tests trace hf bench sass"}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-gpu
status=0

step() {  # step NAME COMMAND...: runs the command, logs to $out/NAME.log, remembers a failure, returns its code
  local name=$1
  shift
  echo "=== $name: $*"
  local code=0
  "$@" >"$out/$name.log" 2>&1 || code=$?
  if [ "$code" -ne 0 ]; then
    echo "!!! $name failed (exit $code), log tail:"
    status=1
  fi
  tail -n 25 "$out/$name.log"
  return "$code"
}

# start_clock_sampler MS: samples the SM clock and the power cap every MS ms into $clock_samples, until
# stop_clock_sampler, which prints clock_summary's line of them.
start_clock_sampler() {
  clock_samples=$(mktemp)
  nvidia-smi --query-gpu=clocks.sm,clocks_throttle_reasons.sw_power_cap --format=csv,noheader,nounits -lms "$1" \
    >"$clock_samples" 2>/dev/null &
  clock_sampler=$!
}

stop_clock_sampler() {
  kill "$clock_sampler" 2>/dev/null
  wait "$clock_sampler" 2>/dev/null
  clock_summary "$clock_samples"
  rm -f "$clock_samples"
}

# step_with_clocks NAME COMMAND...: step, with the SM clock sampled every 100 ms and summarized at its log's end.
# NOTE: long timed runs are power-capped (docs/perf.md, fourth session, run 7: 1740-1755 MHz against a 1980 MHz
# boost), so a benchmark's figures carry the clock they ran at.
step_with_clocks() {
  local name=$1 code=0
  start_clock_sampler 100
  step "$@" || code=$?
  stop_clock_sampler | tee -a "$out/$name.log"
  return "$code"
}

# clock_summary CSV: the SM clock of the samples under load (above 1 GHz) and how often the power cap held it.
clock_summary() {
  awk -F', *' '$1 + 0 > 1000 { print $1 + 0, ($2 ~ /^Active/) }' "$1" | sort -n | awk '
    { n++; mhz[n] = $1; capped += $2 }
    END {
      if (n == 0) { print "clocks: no samples under load"; exit }
      printf "clocks: %d samples under load, SM clock median %d MHz (min %d, max %d), software power cap %d%%\n",
        n, mhz[int((n + 1) / 2)], mhz[1], mhz[n], 100 * capped / n
    }'
}

# clocked COMMAND...: the `time` line of an `mk run` command, with the SM clock sampled every 20 ms while it ran
# ("failed" and false if it failed).
clocked() {
  local time_line code=0
  start_clock_sampler 20
  time_line=$("$@" 2>&1 | grep -E '^time') || code=1
  [ "$code" -eq 0 ] || time_line=failed
  echo "$time_line; $(stop_clock_sampler | sed 's/^clocks: //')"
  return "$code"
}

# decode_p50 BINARY PRESET PROMPT BATCH CONTEXT [FLAGS...]: `mk generate`'s p50 line for 128 new tokens on random
# weights (ids streamed to nowhere), or "failed" and a failing return.
decode_p50() {
  local binary=$1 preset=$2 prompt=$3 batch=$4 context=$5
  shift 5
  timeout 300 "$binary" generate --preset "$preset" --engine gpu --prompt-ids "$prompt" --batch "$batch" \
    --max-new-tokens 128 --max-context "$context" --stream none "$@" 2>&1 | grep -E 'p50' || {
    echo failed
    return 1
  }
}

# build_old: builds mk from each tree under old/ and old2/ (scripts/gpu_snapshot.sh REF OLD_REF [OLD2_REF]) once,
# into build-old/ and build-old2/; false if there is no old/. Sets ab_trees: new, old, and old2 when there is one.
build_old() {
  if [ ! -d "$root/old" ]; then
    echo "!!! no old/ tree here (scripts/gpu_snapshot.sh REF OLD_REF)"
    status=1
    return 1
  fi
  ab_trees="new"
  for tree in old old2; do
    [ -d "$root/$tree" ] || continue
    if [ ! -x "$root/build-$tree/mk" ]; then
      step "build-$tree" bash -c "cmake -S '$root/$tree' -B '$root/build-$tree' -G Ninja -DCMAKE_BUILD_TYPE=Release &&
                                  cmake --build '$root/build-$tree' -j $(nproc) --target mk"
    fi
    [ -x "$root/build-$tree/mk" ] || return 1
    ab_trees="$ab_trees $tree"
  done
}

# The mk binary of an A/B tree: new is this tree's build.
tree_binary() {
  if [ "$1" = new ]; then echo "$build/mk"; else echo "$root/build-$1/mk"; fi
}

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
if [ -f "$root/COMMIT" ]; then  # a copy made by scripts/gpu_snapshot.sh
  echo "commit $(cat "$root/COMMIT")" >"$out/commit.txt"
else
  git -C "$root" log -1 --format='commit %h %s' >"$out/commit.txt" 2>/dev/null || echo "commit unknown" >"$out/commit.txt"
fi
# The GPU machine has no package registry: PCRE2 comes from .gpu-deps/ (scripts/prepare_gpu_deps.sh) when needed.
if ! pkg-config --exists libpcre2-8 2>/dev/null && [ -d "$root/.gpu-deps/pcre2" ]; then
  export PKG_CONFIG_PATH=$root/.gpu-deps/pcre2/usr/lib/x86_64-linux-gnu/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$root/.gpu-deps/pcre2
fi
step build bash -c "cmake -S '$root' -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build '$build' -j $(nproc)"
# ptxas warns on spills (-Xptxas=--warn-on-spills) and reports wgmma serialization (C75xx) on its own; either is a
# failure. The verdict needs the megakernel to have been compiled in this build.
if ! grep -q "megakernel.cu" "$out/build.log"; then
  echo "ptxas: megakernel.cu was not compiled in this build (up to date?): no verdict on spills"
elif grep -E "spill|stack frame|Potential Performance Loss" "$out/build.log"; then
  echo "!!! ptxas: spills or serialized wgmma (above)"
  status=1
else
  echo "ptxas: no spills, no serialized wgmma"
fi

for s in $steps; do
  case $s in
    smoke)
      step smoke-tiny timeout 120 "$build/mk" bisect --preset tiny
      step smoke-seed timeout 300 "$build/mk" run --preset seed --engine gpu
      ;;
    tests)
      # The whole ctest; on this machine a skipped test (a GPU test that found no usable GPU) is a failure.
      # NOTE: GPU tests one at a time: each launch takes every SM.
      step ctest timeout 1200 bash -c "ctest --test-dir '$build' --output-on-failure -L cpu -j 8; cpu=\$?;
                                       ctest --test-dir '$build' --output-on-failure -L gpu; exit \$((cpu | \$?))"
      skipped=$(grep -c -E "\*\*\*Skipped|Not Run" "$out/ctest.log")
      if [ "$skipped" -ne 0 ]; then
        echo "!!! ctest: $skipped tests skipped on the GPU machine"
        status=1
      fi
      grep -E "tests passed|tests failed" "$out/ctest.log"
      ;;
    decode)
      # Generation on the megakernel: the tiny preset, then Llama-3.2-1B's shape (random weights) at batch 1 with
      # a context of about 1k: the per-token latency against the bandwidth floor.
      step generate-tiny timeout 120 "$build/mk" generate --preset tiny --engine gpu --prompt-ids 1,2,3,4 \
        --max-new-tokens 16
      step decode-1b timeout 600 "$build/mk" generate --preset llama-3.2-1b --engine gpu \
        --prompt-ids "$(seq -s, 1 896)" --max-new-tokens 128 --max-context 1024 --stream none \
        --trace "$out/trace-decode-1b.json"
      ;;
    hf_generate)
      step hf-generate timeout 600 python3 "$root/scripts/compare_hf_generate.py" --mk "$build/mk" \
        --work /tmp/mk-hf-generate --engines gpu
      ;;
    text)
      # Text in, text out on the GPU: a small random Llama with the llama3 tokenizer fixture (the text is noise).
      step text bash -c "python3 '$root/scripts/make_text_model.py' --out /tmp/mk-text &&
                         '$build/mk' generate --model /tmp/mk-text --engine gpu --prompt 'Hello world' \
                           --max-new-tokens 24"
      ;;
    sanitize_decode)
      step sanitize-decode timeout 600 compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$build/mk" generate --preset tiny --engine gpu --prompt-ids '1,2,3,4,5;6,7' --max-new-tokens 8
      # The wgmma decode kernel (batch > 8) at the 1B shape: the decode GEMMs on wgmma, a fused norm's squares summed.
      step sanitize-decode-wide timeout 600 compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$build/mk" generate --preset llama-3.2-1b --engine gpu --prompt-ids '1,2,3' --batch 20 --max-new-tokens 2 \
        --stall-timeout 300
      ;;
    bench_decode)
      # BENCH_DECODE_ARGS: extra flags, split on spaces (sweep specs join their words with _)
      step_with_clocks bench-decode timeout 900 python3 "$root/bench/bench_decode.py" --mk "$build/mk" \
        --out "$out/decode" \
        ${BENCH_DECODE_ARGS:-}
      ;;
    hf)
      step hf timeout 600 python3 "$root/scripts/compare_hf.py" --mk "$build/mk" --work /tmp/mk-hf
      ;;
    bench)
      # BENCH_ARGS: extra flags, split on spaces (e.g. --sweeps seq --torch-backends eager+graph,reduce-overhead: a
      # whole run of every sweep and backend outlasts one call to the GPU machine)
      step_with_clocks bench timeout 900 python3 "$root/bench/bench.py" --mk "$build/mk" --out "$out" ${BENCH_ARGS:-}
      ;;
    bench_ops)
      # BENCH_OPS_CONFIGS: ;-separated config labels (default: bench_ops.py's)
      step_with_clocks bench-ops timeout 600 python3 "$root/bench/bench_ops.py" --mk "$build/mk" --out "$out" \
        ${BENCH_OPS_CONFIGS:+--configs "$BENCH_OPS_CONFIGS"}
      ;;
    sanitize | sanitize_forward)
      # NOTE: racecheck slows a decode step to seconds (6.5 s at batch 3), and the default 5 s stall timeout cut a
      # batch-1 step's sample wait short with no hazard found (twentieth session, run 2).
      sanitized_stall_s=300
      for tool in memcheck racecheck synccheck; do
        step "sanitize-$tool" timeout 600 compute-sanitizer --tool "$tool" --error-exitcode 1 \
          "$build/mk" run --preset tiny --engine gpu --iterations 2 --stall-timeout "$sanitized_stall_s"
      done
      # The tiny preset has no 256-column GEMM tile: one layer of d_model 2048 at 1 x 2176 has wide o_proj and down
      # tiles, whose second half is staged in a held ring stage with its residual (thirteenth session, run 7).
      for tool in racecheck synccheck; do
        step "sanitize-wide-$tool" timeout 600 compute-sanitizer --tool "$tool" --error-exitcode 1 \
          "$build/mk" run --preset seed --layers 1 --d-model 2048 --batch 1 --seq 2176 --engine gpu --iterations 1 \
          --stall-timeout "$sanitized_stall_s"
      done
      # sanitize_forward: the forward kernel's pipeline alone, for a change that leaves the decode kernels as they were
      # (the decode runs below take most of the step's time).
      [ "$s" = sanitize_forward ] && continue
      # Decode: a prefill, then greedy steps in groups (the on-device feed between launches) on a 100k vocabulary,
      # whose sample goes through several double-buffered passes (fifteenth session): one sequence (the CUDA-core
      # GEMM path), then three ragged ones (the tensor-core path).
      if step sanitize-decode-model python3 "$root/scripts/make_text_model.py" --out /tmp/mk-sanitize-decode \
        --vocab 100000; then
        for tool in memcheck racecheck synccheck; do
          for batch_and_prompts in "1 1,2,3,4,5" "3 1,2,3,4,5;6,7;8,9,10"; do
            read -r batch prompts <<<"$batch_and_prompts"
            step "sanitize-decode-$tool-batch$batch" timeout 600 \
              compute-sanitizer --tool "$tool" --error-exitcode 1 "$build/mk" generate --model /tmp/mk-sanitize-decode \
              --engine gpu --prompt-ids "$prompts" --max-new-tokens 8 --steps-per-sync 4 --stream none \
              --stall-timeout "$sanitized_stall_s"
          done
        done
      fi
      ;;
    trace)
      step trace timeout 300 "$build/mk" trace --preset seed --engine gpu --out "$out/trace-seed.json" --overhead 20
      step trace-plot python3 "$root/scripts/plot_trace.py" "$out/trace-seed.json" --out "$out/trace-seed.png"
      ;;
    traces)
      # TRACE_ARGS: ;-separated shape flags for `mk trace --preset seed` (default: the seed and S=4096); the summaries
      # (per-op phases, what the waits ended on, the critical path) go to traces.log
      IFS=';' read -ra shapes <<<"${TRACE_ARGS:---seq 256;--seq 4096}"
      for shape in "${shapes[@]}"; do
        echo "=== trace $shape" >>"$out/traces.log"
        # shellcheck disable=SC2086  # the shape is flags, split on purpose
        if ! timeout 120 "$build/mk" trace --preset seed $shape --engine gpu --out "$out/trace.json" \
          >>"$out/traces.log" 2>&1; then
          echo "!!! trace $shape failed"
          status=1
        fi
      done
      rm -f "$out/trace.json"
      grep -E "^=== trace|^trace \(gpu\)" "$out/traces.log"
      ;;
    ab)
      # The trees under old/ and old2/ (scripts/gpu_snapshot.sh REF OLD_REF [OLD2_REF]) against this one, alternating
      # in this call, AB_ROUNDS times (default 2): `mk run --preset seed` with each of AB_ARGS' ;-separated shape flags
      # (default: the seed and S=4096), each run with the SM clock it ran at.
      # NOTE: the trees take turns going first (a rotation a round), so that a clock still rising from idle, or one
      # falling to the power cap, does not always favour the same tree (thirteenth session, run 7: one tree +7% at
      # 100 launches, 0% at 20).
      build_old || continue
      IFS=';' read -ra shapes <<<"${AB_ARGS:---seq 256 --iterations 200;--seq 4096 --iterations 30}"
      read -ra order <<<"$ab_trees"
      for ((round = 0; round < ${AB_ROUNDS:-2}; round++)); do
        for shape in "${shapes[@]}"; do
          for ((i = 0; i < ${#order[@]}; i++)); do
            tree=${order[$(((i + round) % ${#order[@]}))]}
            # shellcheck disable=SC2086  # the shape is flags, split on purpose
            time_line=$(clocked timeout 300 "$(tree_binary "$tree")" run --preset seed $shape --engine gpu) || status=1
            echo "$tree ($shape): $time_line" | tee -a "$out/ab.log"
          done
        done
      done
      ;;
    ablation)
      # One launch per op and layer against the single launch, same build (ABLATION_ARGS: ;-separated shape flags
      # for `mk run --preset seed`, default the seed and S=4096).
      IFS=';' read -ra shapes <<<"${ABLATION_ARGS:---seq 256 --iterations 100;--seq 4096 --iterations 20}"
      for shape in "${shapes[@]}"; do
        for mode in "" "--launch-per-op"; do
          # shellcheck disable=SC2086  # the shape is flags, split on purpose
          time_line=$(timeout 300 "$build/mk" run --preset seed $shape $mode --engine gpu 2>&1 | grep -E '^time') || {
            time_line=failed
            status=1
          }
          echo "${mode:-single launch} ($shape): $time_line" | tee -a "$out/ablation.log"
        done
      done
      ;;
    waits)
      # What the dependency waits cost, same build: each of WAITS_ARGS' ;-separated shapes of `mk run --preset seed`
      # (default the seed and S=4096) timed with and without --skip-dependency-waits, alternating, twice; then
      # `mk generate` on WAITS_DECODE_PRESET (default llama-3.2-1b; a 896-token prompt, context 1024) at each of
      # WAITS_DECODE_BATCHES (default 1) the same way; then one traced launch of each with the waits skipped
      # (waits.log: its per-op table is each op's time with nothing to wait for), and decode traced with them too.
      IFS=';' read -ra shapes <<<"${WAITS_ARGS:---seq 256 --iterations 200;--seq 4096 --iterations 30}"
      prompt=$(seq -s, 1 896)
      preset=${WAITS_DECODE_PRESET:-llama-3.2-1b}
      for _ in 1 2; do
        for shape in "${shapes[@]}"; do
          for mode in "" "--skip-dependency-waits"; do
            # shellcheck disable=SC2086  # the shape is flags, split on purpose
            time_line=$(clocked timeout 300 "$build/mk" run --preset seed $shape $mode --engine gpu) || status=1
            echo "${mode:-with waits} ($shape): $time_line" | tee -a "$out/waits.log"
          done
        done
        for batch in ${WAITS_DECODE_BATCHES:-1}; do
          for mode in "" "--skip-dependency-waits"; do
            # shellcheck disable=SC2086  # an empty mode is no flag
            p50_line=$(decode_p50 "$build/mk" "$preset" "$prompt" "$batch" 1024 $mode) || status=1
            echo "${mode:-with waits} ($preset batch $batch): $p50_line" | tee -a "$out/waits.log"
          done
        done
      done
      for shape in "${shapes[@]}"; do
        echo "=== trace --skip-dependency-waits $shape" >>"$out/waits.log"
        # shellcheck disable=SC2086  # the shape is flags, split on purpose
        timeout 120 "$build/mk" trace --preset seed ${shape%--iterations*} --engine gpu --skip-dependency-waits \
          --out "$out/trace-skip.json" >>"$out/waits.log" 2>&1 || status=1
      done
      # Decode is traced both ways: the difference, boundary by boundary, is where the waits' time goes.
      for batch in ${WAITS_DECODE_BATCHES:-1}; do
        for mode in "" "--skip-dependency-waits"; do
          echo "=== decode trace ${mode:-with waits} batch $batch" >>"$out/waits.log"
          # shellcheck disable=SC2086  # an empty mode is no flag
          timeout 300 "$build/mk" generate --preset "$preset" --engine gpu --prompt-ids "$prompt" --batch "$batch" \
            --max-new-tokens 16 --max-context 1024 --stream none $mode \
            --trace "$out/trace-decode-${mode:+skip-}batch$batch.json" >>"$out/waits.log" 2>&1 || status=1
        done
      done
      rm -f "$out/trace-skip.json"
      ;;
    ab_decode)
      # Decode against old/'s tree (and old2/'s), alternating, twice: `mk generate`'s p50 per token on
      # AB_DECODE_PRESET's shape (default llama-3.2-1b; random weights, an AB_DECODE_PROMPT-token prompt (default 896),
      # 128 new tokens, context AB_DECODE_CONTEXT (default 1024)) at each of AB_DECODE_BATCHES (default 1 8); then
      # traced steps and their tokens compared (below). NOTE: each tree's default --steps-per-sync: 8 (a group's time
      # over its steps) since 1639e7a, a wait every step before.
      build_old || continue
      prompt=$(seq -s, 1 "${AB_DECODE_PROMPT:-896}")
      context=${AB_DECODE_CONTEXT:-1024}
      preset=${AB_DECODE_PRESET:-llama-3.2-1b}
      for _ in 1 2; do
        for batch in ${AB_DECODE_BATCHES:-1 8}; do
          for tree in $ab_trees; do
            p50_line=$(decode_p50 "$(tree_binary "$tree")" "$preset" "$prompt" "$batch" "$context") || status=1
            echo "$tree (batch $batch): $p50_line" | tee -a "$out/ab-decode.log"
          done
        done
      done
      # Then one traced step a tree at each of AB_DECODE_TRACE_BATCHES (default 1): its summary (the per-op table,
      # the waits table, the per-layer phases and their stragglers, the HBM-idle gaps) says where each tree's time
      # went. Batch 1's files keep their old names (decode-trace-TREE.log, trace-decode-TREE.json).
      for batch in ${AB_DECODE_TRACE_BATCHES:-1}; do
        suffix=$([ "$batch" = 1 ] || echo "-batch$batch")
        for tree in $ab_trees; do
          binary=$(tree_binary "$tree")
          if ! timeout 300 "$binary" generate --preset "$preset" --engine gpu --prompt-ids "$prompt" \
            --batch "$batch" --max-new-tokens 128 --max-context "$context" --stream none \
            --trace "$out/trace-decode-$tree$suffix.json" >"$out/decode-trace-$tree$suffix.log" 2>&1; then
            echo "!!! traced decode step ($tree, batch $batch) failed"
            status=1
          fi
          grep -E "^trace \(gpu\)|p50" "$out/decode-trace-$tree$suffix.log" | sed "s/^/$tree (batch $batch): /"
        done
        # Same weights and prompt: whether a change moved any generated token (on the CUDA cores each output's sum
        # has one order whatever its tile; on the tensor cores a tile's K slices, and so the order, depend on it).
        for tree in $ab_trees; do
          [ "$tree" = new ] && continue
          echo "$tree (batch $batch): $(python3 "$root/scripts/compare_tokens.py" "$out/decode-trace-new$suffix.log" \
            "$out/decode-trace-$tree$suffix.log")"
        done
      done
      ;;
    ncu)
      # Nsight Compute on one megakernel launch per NCU_RUNS entry (;-separated NAME|LAUNCHES_TO_SKIP|MK_ARGS, default
      # the seed's warm launch), through scripts/ncu_profile.sh: read the result with scripts/ncu_stalls.py.
      IFS=';' read -ra runs <<<"${NCU_RUNS:-seed|1|run --preset seed --engine gpu --iterations 2}"
      for entry in "${runs[@]}"; do
        IFS='|' read -r name skip args <<<"$entry"
        read -ra mk_args <<<"$args"
        step "ncu-$name" env NCU_SKIP="$skip" timeout 400 bash "$root/scripts/ncu_profile.sh" "$out" "ncu-$name" \
          "$build/mk" "${mk_args[@]}"
      done
      ;;
    probes)
      # The standalone CUDA probes behind docs/decode.md's limits: decode's weight-streaming patterns
      # (hbm_read_probe.cu), hand-offs between SMs and a dependent load beside streaming HBM (hop_latency_probe.cu),
      # the hand-off per counter line (counter_line_probe.cu), the SMs a clustered grid keeps (cluster_fit_probe.cu),
      # what a launch costs outside its CTAs' span (launch_probe.cu).
      for probe in hbm_read_probe hop_latency_probe counter_line_probe cluster_fit_probe launch_probe; do
        step "$probe" bash -c "nvcc -O3 -std=c++20 -I '$root/include' -gencode=arch=compute_90a,code=sm_90a \
          '$root/bench/$probe.cu' -o '$build/$probe' && timeout 120 '$build/$probe'"
      done
      ;;
    sass)
      step sass bash "$root/scripts/sass.sh" "$build" "" "$out/megakernel.sass"
      ;;
  esac
done
exit $status
