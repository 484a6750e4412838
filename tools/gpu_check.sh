#!/usr/bin/env bash
# Build (one arch, timed), GPU tests, compute-sanitizer and benchmark on the GPU machine. Logs go to $OUT (or
# ./gpu_out), summary lines to $OUT/summary.txt. Usage: tools/gpu_check.sh [STEP]...  (default: build test bench)
#   build     clean one-arch build, timed
#   modes     tests/torch/test_recipe_modes.py on the GPU: every recipe eager vs torch.compile vs CUDA graph (issue 19)
#   sanitize  the same tests under compute-sanitizer memcheck
#   test      every test marked `cuda`, in parallel workers with few CPU threads each
#   bench     bench_activations (all three benchmarks with plots: tools/gpu_bench.sh)
#   multigpu  every test marked `multigpu` (NCCL: torch process groups, JAX one process / one process per GPU)
#   collective  bench_collective on every visible GPU: torchrun at tp = 2 and tp = all, then the JAX mode
#   tpmlp     bench_tp_mlp (a tensor-parallel tex.MLP training step, overlap on vs off) at tp = all GPUs
#   hang      tools/initialize_hang_check.py: 50 fresh JAX processes with and without the initialize stages
# NVLink multicast stays off in every process (the device tool's rule).
# Each step has a time limit (seconds): STEP_LIMIT=... (default 500), so a stuck step still leaves its log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# Several pytest workers share the machine's cores: without this each one starts a thread per core and the
# suite runs ten times slower.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
steps=${*:-build test bench}
limit=${STEP_LIMIT:-500}
workers=${WORKERS:-8}
pytest_args="-q -p no:cacheprovider -p no:benchmark -rfE --timeout 300"
rc=0
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
for step in $steps; do
  t0=$(date +%s.%N)
  case $step in
    build)
      rm -rf build transformer_engine_torch/_C*.so
      TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc --all)} \
        timeout "$limit" python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
      ;;
    modes)
      timeout "$limit" python3 -m pytest tests/torch/test_recipe_modes.py -m cuda $pytest_args -n 4 >"$OUT/modes.log" 2>&1 || rc=1
      tail -1 "$OUT/modes.log" | sed 's/^/modes: /' >>"$OUT/summary.txt" ;;
    sanitize)
      # Without the caching allocator every tensor is its own cudaMalloc, so an out-of-bounds access shows; a CUDA
      # graph capture needs the caching allocator (cudaFree is illegal while capturing), so those tests keep it.
      : >"$OUT/sanitize.log"
      for part in "not graph_replay:1" "graph_replay:0"; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=${part##*:} timeout "$limit" compute-sanitizer --tool memcheck \
          --error-exitcode 9 --print-limit 20 python3 -m pytest tests/torch/test_recipe_modes.py -m cuda -k "${part%:*}" \
          $pytest_args -n 4 >>"$OUT/sanitize.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        note "sanitize -k '${part%:*}': exit $r; $(grep -E '^========= ERROR SUMMARY' "$OUT/sanitize.log" | tail -1) $(tail -1 "$OUT/sanitize.log")"
      done ;;
    test)
      timeout "$limit" python3 -m pytest tests -m cuda $pytest_args -n "$workers" --durations 15 >"$OUT/pytest.log" 2>&1 || rc=1
      tail -1 "$OUT/pytest.log" | sed 's/^/test: /' >>"$OUT/summary.txt" ;;
    bench)
      timeout "$limit" python3 benchmarks/bench_activations.py --csv "$OUT/bench.csv" --json "$OUT/bench.json" \
        >"$OUT/bench.log" 2>&1 || rc=1 ;;
    multigpu)
      NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 timeout "$limit" \
        python3 -m pytest tests -m multigpu -q -p no:cacheprovider -rfEs --timeout 600 -p no:xdist \
        >"$OUT/multigpu.log" 2>&1 || rc=1
      tail -1 "$OUT/multigpu.log" | sed 's/^/multigpu: /' >>"$OUT/summary.txt" ;;
    collective)
      n=$(nvidia-smi -L | grep -c '^GPU ')
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      for t in $(printf '%s\n' 2 "$n" | sort -un); do
        timeout "$limit" torchrun --nproc-per-node="$t" benchmarks/bench_collective.py ${BENCH_ARGS:-} \
          --out-dir "$OUT/collective_tp$t" >"$OUT/collective_tp$t.log" 2>&1 || rc=1
      done
      timeout "$limit" python3 benchmarks/bench_collective.py --jax ${BENCH_ARGS:-} --out-dir "$OUT/collective_jax" \
        >"$OUT/collective_jax.log" 2>&1 || rc=1 ;;
    tpmlp)
      n=$(nvidia-smi -L | grep -c '^GPU ')
      NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 timeout "$limit" \
        torchrun --nproc-per-node="$n" benchmarks/bench_tp_mlp.py ${TPMLP_ARGS:-} --out-dir "$OUT/tp_mlp" \
        >"$OUT/tp_mlp.log" 2>&1 || rc=1 ;;
    hang)
      timeout "$limit" python3 tools/initialize_hang_check.py --json "$OUT/initialize_hang.json" \
        >"$OUT/hang.log" 2>&1 || rc=1
      cat "$OUT/hang.log" >>"$OUT/summary.txt" ;;
    *) note "unknown step $step"; rc=1; continue ;;
  esac
  note "$(printf '%-9s %6.1f s' "$step" "$(python3 -c "print($(date +%s.%N) - $t0)")")"
done
cat "$OUT/summary.txt"
exit $rc
