# Quick start: `make demo` (installs torch + builds the package + runs the demo), then `make test`.
PYTHON ?= python3

.PHONY: install demo test gpu-check bench clean

install:
	$(PYTHON) -m pip install -q -r requirements.txt
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

demo: install
	$(PYTHON) examples/mlp_demo.py

# The whole suite; GPU tests (marker `cuda`) run when a GPU is visible and are skipped otherwise.
test:
	@ls transformer_engine_torch/_C*.so >/dev/null 2>&1 || $(MAKE) install
	$(PYTHON) -m pytest tests -q -p no:cacheprovider

# On the GPU machine (no network, no pip): in-place one-arch build, timed, then the suite and the benchmark.
gpu-check:
	bash tools/gpu_check.sh

bench:
	$(PYTHON) benchmarks/bench_activations.py
	$(PYTHON) benchmarks/bench_mlp.py

clean:
	rm -rf build transformer_engine_torch/_C*.so *.egg-info
