#!/usr/bin/env bash
# The benchmarks in one call on the GPU machine (issue 19 item 6): build in place when the extension is missing or
# was built from other sources, run bench_activations, bench_gemm, bench_mlp, bench_jax and bench_jax_gemm (each
# writes benchmarks/results/<gpu>/), and copy to $OUT (or ./gpu_out), flat:
#   results-<gpu>.tar.gz   benchmarks/results/<gpu>/ (JSON, Markdown tables, PNG plots), repacked after every step
#                          so a run cut short still returns what it finished; unpack with
#                          tar -xzf results-<gpu>.tar.gz -C benchmarks/results
#   bench_<name>.log       each benchmark's full output
#   build.log              when it built
#   summary.txt            device, wall time and exit status per step, targets and summary lines
# Usage: tools/gpu_bench.sh [build] [act] [gemm] [mlp] [jax] [jax_gemm] [model]   (default: the first six; build is
#        skipped when up to date; model = bench_model.py, MODEL_ARGS=... for its own options, report in $OUT/model/)
#        QUICK=1 tools/gpu_bench.sh                      passes --quick to every benchmark
#        BENCH_ARGS=... tools/gpu_bench.sh               more arguments for every benchmark (--cpu-smoke to try the
#                                                        script on a machine without a GPU)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${*:-build act gemm mlp jax jax_gemm}
flags="${QUICK:+--quick} ${BENCH_ARGS:-}"
gpu=$(python3 -c 'import sys; sys.path.insert(0, "benchmarks"); import _harness; print(_harness.gpu_slug())')
rc=0

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
pack() { [ -d "benchmarks/results/$gpu" ] && tar -czf "$OUT/results-$gpu.tar.gz" -C benchmarks/results "$gpu"; }
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
src_hash() { find csrc setup.py -type f \( -name '*.c*' -o -name '*.h' -o -name '*.py' \) -print0 | sort -z |
             xargs -0 sha256sum | sha256sum | cut -c1-16; }

note "$(date -u '+%F %T UTC') $(nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm \
        --format=csv,noheader 2>/dev/null | head -1); results: benchmarks/results/$gpu"
for step in $steps; do
  t0=$(now_ms)
  case $step in
    build)
      so=$(ls transformer_engine_torch/_C*.so 2>/dev/null | head -1)
      if [ -n "$so" ] && [ "$(cat build/.te_src_hash 2>/dev/null)" = "$(src_hash)" ]; then
        note "build  up to date ($so)"; continue
      fi
      rm -rf build transformer_engine_torch/_C*.so
      TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc --all)} \
        python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
      mkdir -p build && src_hash >build/.te_src_hash
      r=0 ;;
    act|gemm|mlp|jax|jax_gemm)
      name=$([ "$step" = act ] && echo activations || echo "$step")
      python3 "benchmarks/bench_$name.py" $flags >"$OUT/bench_$name.log" 2>&1
      r=$?
      grep -E "^  (MET|NOT MET|NOT MEASURED) |^Summary|^VALIDATION|^FAILED" "$OUT/bench_$name.log" |
        tee -a "$OUT/summary.txt"
      pack ;;
    model)  # not in the default steps (minutes per size); its report goes straight to $OUT/model/
      python3 benchmarks/bench_model.py $flags ${MODEL_ARGS:-} --out-dir "$OUT/model" >"$OUT/bench_model.log" 2>&1
      r=$?
      grep -E "^  (MET|NOT MET|NOT MEASURED) |^Summary|skipped|FAILED" "$OUT/bench_model.log" |
        tee -a "$OUT/summary.txt"
      ;;
    *) note "unknown step $step (build, act, gemm, mlp, jax, jax_gemm, model)"; r=2 ;;
  esac
  [ "$r" -ne 0 ] && rc=1
  note "$(printf '%-6s %7.1f s  exit %d' "$step" "$(( $(now_ms) - t0 ))e-3" "$r")"
done
note "files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $rc
