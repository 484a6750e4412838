#!/usr/bin/env bash
# Tests the built wheel as a user gets it: installed into a fresh virtual environment, imported from there, never
# from the source tree. Usage: tools/wheel_check.sh [smoke | all | PYTEST_ARGS...]   (default: smoke)
#   smoke  a few test files of both frontends (about a minute on 2 cores)
#   all    the whole suite (what CI runs)
#   other arguments are passed to pytest as they are (test files under tests/, -k, -x, ...)
# WHEEL: the wheel file (default: the newest dist/transformer_engine_torch-*.whl, from `make wheel`).
# BASE_PYTHON: the interpreter the environment is made from (default python3; not a venv's, whose packages a
# venv made from it would not see); --system-site-packages gives the environment the base's torch and jax (and
# anything else the tests import), so nothing is downloaded.
# WHEEL_ENV: where the environment is made (default: a fresh temporary folder, removed on exit); an existing one is
# reused and the wheel reinstalled into it: a torch or jax installed into it (another version) wins over the base's.
#
# The test tree is a temporary folder holding a copy of the repository's other files (tests/, and docs, csrc,
# examples, benchmarks, which tests read; copies, not links, since tests resolve paths and check they stay inside
# the tree), its two package folders being links to the installed packages in site-packages: tests that read the
# packages' sources, and subprocesses that put the test tree on PYTHONPATH, then see the installed files too. pytest runs with the interpreter's -P (no current folder on sys.path) and
# --import-mode=append (the test tree after site-packages), so `import transformer_engine_torch` resolves to
# site-packages itself; tools/wheel_guard.py checks that before the first test and prints each module's file.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WHEEL=${WHEEL:-$(ls -t "$REPO"/dist/transformer_engine_torch-*.whl 2>/dev/null | head -1)}
[ -n "$WHEEL" ] && [ -f "$WHEEL" ] || { echo "wheel_check: no wheel (make wheel, or WHEEL=path)" >&2; exit 2; }
WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ENV_DIR=${WHEEL_ENV:-$WORK/venv}
PY=$ENV_DIR/bin/python
[ -x "$PY" ] || "${BASE_PYTHON:-python3}" -m venv --system-site-packages "$ENV_DIR"
"$PY" -m pip install -q --no-deps --force-reinstall "$WHEEL"
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")

TREE=$WORK/tree
mkdir -p "$TREE" "$WORK/plugins"
for entry in "$REPO"/* "$REPO"/.ci; do
  name=$(basename "$entry")
  case $name in
    transformer_engine_torch | transformer_engine_jax) ln -s "$SITE/$name" "$TREE/$name" ;;
    build | dist | third_party) ;;
    *) cp -r "$entry" "$TREE/$name" ;;
  esac
done
find "$TREE" -name __pycache__ -prune -exec rm -rf {} +
cp "$REPO/tools/wheel_guard.py" "$WORK/plugins/"

case "${1:-smoke}" in
  smoke) set -- tests/torch/test_import.py tests/torch/test_activations.py tests/torch/test_python_call.py \
           tests/test_format_table.py tests/jax/test_activations_jax.py ;;
  all) set -- tests ;;
esac
echo "wheel_check: $(basename "$WHEEL") in $ENV_DIR; $("$PY" -c 'import torch, jax; print("torch", torch.__version__, "jax", jax.__version__)')"
cd "$TREE"
TE_WHEEL_SITE=$SITE PYTHONPATH=$WORK/plugins "$PY" -P -m pytest -p wheel_guard -p no:cacheprovider \
  --import-mode=append -q "$@"
