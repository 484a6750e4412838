#!/usr/bin/env bash
# The measurements the 2026-11-29 (third) stop left for the next GPU session, in the order of their value, each
# with a time limit so that one device call (600 s) leaves its logs in $OUT even when a step runs long:
#   1. wip/nvfp4_cast_fast.patch applied, clean build (timed), the NVFP4 CUDA tests, the cast times
#   2. bench_block_gemm (the torch MLP rows now interleaved; the layers now free their quantized copies early)
#   3. the MLP step's kernels and peaks (tools/prof_step.py)
#   4. (acts, not in the default list: minutes of torch.compile) bench_activations' dgelu rows, the backward's
#      casts with both copies (issue 34 item 2)
# Usage (device tool, carry third_party/cutlass_include and third_party/wheels):
#   bash tools/gpu_next.sh [patch] [build] [nvfp4] [block] [prof]      (default: all, in this order)
# A failed patch or build stops the script; the rest record their exit codes in $OUT/summary.txt. At most 7 files
# land in $OUT (the device tool returns 8): summary.txt, build.log, nvfp4_tests.log, block_gemm.{json,md,png},
# prof_step.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
steps=${*:-patch build nvfp4 block prof}
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
for step in $steps; do
  t0=$(date +%s)
  case $step in
    patch)
      git apply wip/nvfp4_cast_fast.patch || { note "patch: does not apply"; exit 1; } ;;
    build)
      MAX_JOBS=${MAX_JOBS:-16} STEP_LIMIT=240 OUT=$OUT bash tools/gpu_check.sh build || { note "build failed"; exit 1; }
      ;;
    nvfp4)
      timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda -n 8 tests/torch/test_nvfp4.py \
        tests/jax/test_nvfp4_jax.py tests/torch/test_scale_edges.py tests/torch/test_recipe_modes.py \
        >"$OUT/nvfp4_tests.log" 2>&1
      note "nvfp4 tests (exit $?): $(tail -1 "$OUT/nvfp4_tests.log")"
      timeout 60 python3 tools/nvfp4_cast_time.py 2>&1 | grep -v Warn | tee -a "$OUT/summary.txt" ;;
    block)
      OUT=$OUT timeout 240 python3 benchmarks/bench_block_gemm.py >/tmp/block_gemm.log 2>&1
      note "bench_block_gemm (exit $?):"
      tail -10 /tmp/block_gemm.log | tee -a "$OUT/summary.txt" ;;
    acts)
      timeout 400 python3 benchmarks/bench_activations.py --only dgelu --json /tmp/acts.json >/tmp/acts.log 2>&1
      note "bench_activations --only dgelu (exit $?):"
      grep -E "dgelu|NOT MET|MET " /tmp/acts.log | tail -30 | tee -a "$OUT/summary.txt" ;;
    prof)
      timeout 90 python3 tools/prof_step.py --recipes bf16,MXFP8,NVFP4 >"$OUT/prof_step.txt" 2>&1
      grep "==" "$OUT/prof_step.txt" | tee -a "$OUT/summary.txt" ;;
    *) note "unknown step $step"; exit 2 ;;
  esac
  note "$(printf '%-8s %5d s' "$step" $(( $(date +%s) - t0 )))"
done
