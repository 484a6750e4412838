# Quick start: `make demo` (installs torch + jax, builds both packages, runs both demos), then `make test`.
PYTHON ?= python3

.PHONY: deps install demo test wheel wheel-check gpu-check bench bench-smoke clean

deps:
	$(PYTHON) -m pip install -q -r requirements.txt

install: deps
	bash tools/fetch_cutlass.sh
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

demo: install
	$(PYTHON) examples/mlp_demo.py
	$(PYTHON) examples/jax_mlp_demo.py

# A binary wheel in dist/ holding both extension modules and both packages (one compile; torch must be installed).
# The GPU archs: TORCH_CUDA_ARCH_LIST, here sm_90a SASS plus compute_90 PTX for newer GPUs (docs/building.md).
wheel:
	bash tools/fetch_cutlass.sh
	TORCH_CUDA_ARCH_LIST="$${TORCH_CUDA_ARCH_LIST:-9.0+PTX}" $(PYTHON) -m pip wheel -q --no-build-isolation --no-deps -w dist .

# The wheel in dist/ installed into a fresh virtual environment and tested there, never the source tree:
# WHEEL_TESTS (default: a smoke subset; `all`: the whole suite). tools/wheel_check.sh says how.
wheel-check:
	bash tools/wheel_check.sh $(WHEEL_TESTS)

# The whole suite; GPU tests (marker `cuda`) run when a GPU is visible and are skipped otherwise.
test:
	@ls transformer_engine_torch/_C*.so >/dev/null 2>&1 || $(MAKE) install
	$(PYTHON) -m pytest tests -q -p no:cacheprovider

# On the GPU machine (no network, no pip): in-place one-arch build, timed, then the suite and the benchmark.
gpu-check:
	bash tools/gpu_check.sh

# The benchmarks (validated first, then timed); each writes benchmarks/results/<gpu>/<bench>.json, .md and PNG plots
# (bench_model: benchmarks/results/model/). QUICK=1: a short run (--quick). All run even if one fails; the exit
# status says whether any did.
BENCH_ARGS ?= $(if $(QUICK),--quick,)
bench:
	@rc=0; for b in activations gemm mlp norm jax jax_gemm model; do $(PYTHON) benchmarks/bench_$$b.py $(BENCH_ARGS) || rc=1; done; exit $$rc

# Without a GPU: tiny shapes on the CPU through the same code (validation, JSON, plots); results/cpu/ is ignored.
bench-smoke:
	$(MAKE) bench BENCH_ARGS=--cpu-smoke

clean:
	rm -rf build dist transformer_engine_torch/_C*.so transformer_engine_jax/_ffi*.so *.egg-info
