#!/usr/bin/env bash
# Puts the CUTLASS 3.x headers the grouped GEMM's tensor-core kernels need under third_party/cutlass_include (ignored
# by git), from the nvidia-cutlass wheel (headers only; none of its Python dependencies). Idempotent; without network
# it says so and the build falls back to the portable grouped kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=4.2.0.0
DEST=third_party/cutlass_include
[ -f "$DEST/cutlass/gemm/group_array_problem_shape.hpp" ] && exit 0
[ "${TE_NO_CUTLASS:-0}" = "1" ] && exit 0  # the build will not use them
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$PYTHON" -m pip download -q --no-deps "nvidia-cutlass==$VERSION" -d "$tmp" 2>"$tmp/err"; then
  echo "fetch_cutlass: could not download nvidia-cutlass $VERSION ($(tail -1 "$tmp/err")); no tensor-core grouped GEMM"
  exit 0
fi
"$PYTHON" - "$tmp"/nvidia_cutlass-*.whl "$DEST" <<'PY'
import os, sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = sys.argv[2] + "/" + name[len(prefix):]
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(z.read(name))
PY
echo "fetch_cutlass: CUTLASS $VERSION headers in $DEST"
