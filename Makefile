# Quick start: `make demo` (installs torch + jax, builds both packages, runs both demos), then `make test`.
PYTHON ?= python3

.PHONY: install demo test gpu-check bench bench-smoke clean

install:
	$(PYTHON) -m pip install -q -r requirements.txt
	bash tools/fetch_cutlass.sh
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

demo: install
	$(PYTHON) examples/mlp_demo.py
	$(PYTHON) examples/jax_mlp_demo.py

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
	rm -rf build transformer_engine_torch/_C*.so *.egg-info
