#!/usr/bin/env bash
# Build (one arch, timed), GPU test suite and benchmark in one go on the GPU machine. Logs go to $OUT (or
# ./gpu_out). Usage: tools/gpu_check.sh [build|test|bench]... (default: all three).
# All three benchmarks with their plotted reports: tools/gpu_bench.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${*:-build test bench}
rc=0
for step in $steps; do
  case $step in
    build)
      rm -rf build transformer_engine_torch/_C*.so
      t0=$(date +%s.%N)
      TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)} \
        python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
      echo "clean build: $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s" | tee -a "$OUT/summary.txt" ;;
    test)
      python3 -m pytest tests -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -25 || rc=1
      tail -1 "$OUT/pytest.log" >>"$OUT/summary.txt" ;;
    bench)
      python3 benchmarks/bench_activations.py --csv "$OUT/bench.csv" --json "$OUT/bench.json" 2>&1 \
        | tee "$OUT/bench.log" || rc=1 ;;
  esac
done
cat "$OUT/summary.txt"
exit $rc
