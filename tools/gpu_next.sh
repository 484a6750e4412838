#!/usr/bin/env bash
# The measurements the 2026-11-29 (fifth) stop left for the next GPU session, in the order of their value, each with
# a time limit so that one device call (600 s) leaves its logs in $OUT even when a step runs long:
#   1. patch: the wip/ patches named in $PATCHES (none by default; wip/fp8_transpose_words.patch and
#      wip/nvfp4_cast_rows64.patch wait); build:
#      clean one-arch build, timed
#   2. test: the whole -m cuda suite (6b3b305, the norm's fused FP8 path with the transposed copy, ran only its
#      norm / cast tests)
#   3. model, bench1b: tools/prof_model.py and bench_model.py on the 1B decoder (torch, FP8 current against bf16
#      compiled and torchao): issue 36's model step after 6b3b305
#   4. (not in the default list) nvfp4: the NVFP4 CUDA tests and cast times; block: bench_block_gemm; prof: the MLP
#      step's kernels and host side with the clock probes; acts: bench_activations' both-copy rows (minutes of
#      torch.compile); normbwd: tools/norm_probe.cu's backward times and CPU byte checks; jaxprof: the Flax 1B
#      step's kernels by class (tools/prof_model_jax.py)
# Usage (device tool, carry third_party/cutlass_include and third_party/wheels):
#   bash tools/gpu_next.sh [patch] [build] [test] [model] [bench1b] ...     (default: those five, in this order)
# A failed patch or build stops the script; the rest record their exit codes in $OUT/summary.txt. The device tool
# returns at most 8 files from $OUT: the default run leaves summary.txt, build.log, pytest.log, prof_model.txt and
# bench_model's three (model_1b_torch.{json,md}, model.png).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
steps=${*:-patch build test model bench1b}
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
for step in $steps; do
  t0=$(date +%s)
  case $step in
    patch)
      for f in ${PATCHES:-}; do
        git apply "$f" || { note "patch: $f does not apply"; exit 1; }
      done ;;
    build)
      MAX_JOBS=${MAX_JOBS:-16} STEP_LIMIT=240 OUT=$OUT bash tools/gpu_check.sh build || { note "build failed"; exit 1; }
      ;;
    test)
      STEP_LIMIT=230 OUT=$OUT bash tools/gpu_check.sh test
      tail -1 "$OUT/summary.txt" ;;
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
      timeout 300 python3 benchmarks/bench_activations.py --only "+T 16384" --only "+col 16384" \
        --only "(+T) 16384" --json /tmp/acts.json >/tmp/acts.log 2>&1
      note "bench_activations, the both-copy rows (exit $?):"
      grep -E "dgelu|NOT MET|MET " /tmp/acts.log | tail -30 | tee -a "$OUT/summary.txt" ;;
    normbwd)
      nvcc -O3 -fmad=false -std=c++17 -gencode arch=compute_90a,code=sm_90a -DTE_WITH_CUDA --expt-relaxed-constexpr \
        -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ \
        -D__CUDA_NO_HALF2_OPERATORS__ -Xcompiler -ffp-contract=off -I csrc/core tools/norm_probe.cu \
        csrc/core/producers/norm/norm_cpu.cpp -o /tmp/norm_probe -lpthread &&
        timeout 200 /tmp/norm_probe 2>&1 | grep -E "bwd|bytes" | tee -a "$OUT/summary.txt" ;;
    model)
      # the 1B decoder step's kernels by class, and where the host waits inside a step (issue 36)
      timeout 280 python3 tools/prof_model.py --size 1b --top 30 --where \
        --variants "bf16 torch.compile,ours fp8 current (compile),ours fp8 current" >"$OUT/prof_model.txt" 2>&1
      note "prof_model (exit $?):"
      grep -E "^== |^   [a-z]|host per phase|between|synchronisations" "$OUT/prof_model.txt" | tee -a "$OUT/summary.txt" ;;
    jaxprof)
      # the Flax 1B step's device kernels by class (issue 36: Flax FP8 at 1.13x Flax bf16, target 1.3x)
      timeout 400 python3 tools/prof_model_jax.py --size 1b --variants "flax bf16,ours fp8 current" \
        >"$OUT/prof_model_jax.txt" 2>&1
      note "prof_model_jax (exit $?):"
      grep -E "^== |^   [a-z]" "$OUT/prof_model_jax.txt" | tee -a "$OUT/summary.txt" ;;
    bench1b)
      # bench_model at 1B, torch: the baselines and ours FP8 current, each variant alone (they do not fit together)
      timeout 520 python3 benchmarks/bench_model.py --sizes 1b --frameworks torch --only "fp8 current" --sequential \
        --out-dir "$OUT" >/tmp/bench1b.log 2>&1
      note "bench_model 1b (exit $?):"
      grep -E "MET|\| " /tmp/bench1b.log | tail -16 | tee -a "$OUT/summary.txt" ;;
    prof)
      timeout 90 python3 tools/prof_step.py --recipes bf16,MXFP8,NVFP4 --host >"$OUT/prof_step.txt" 2>&1
      grep -E "==|host:|idle" "$OUT/prof_step.txt" | tee -a "$OUT/summary.txt"
      timeout 90 python3 tools/step_host_probe.py 2>&1 | grep -v -i warn | tee -a "$OUT/summary.txt"
      timeout 60 python3 tools/clock_probe.py 2>&1 | grep -v -i warn | tee -a "$OUT/summary.txt" ;;
    *) note "unknown step $step"; exit 2 ;;
  esac
  note "$(printf '%-8s %5d s' "$step" $(( $(date +%s) - t0 )))"
done
