"""Host-side cost of one small op call, measured on the CPU with tiny tensors: the Python wrapper, the quantizer
spec/wrap, the entry into C++ (the wrappers' _C.call, or torch's binding for a bare op), the dispatcher, the C++
bridge and, for 8x16 inputs, a few microseconds of CPU kernel (the rows on a 0-row input leave only the host
overhead). On a shared host the figures move by 10-20 % between runs: compare rows of one run.

python3 tools/overhead_cpu.py [--profile NAME]   (NAME: a row label, prints a cProfile of that call)
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

# The checkout this script sits in, not whichever copy is pip-installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import transformer_engine_torch as tex  # noqa: E402

torch.set_num_threads(1)
x = torch.randn(8, 16, dtype=torch.bfloat16)
g = torch.randn(8, 16, dtype=torch.bfloat16)
x0 = torch.empty(0, 16, dtype=torch.bfloat16)  # no rows: the kernels do nothing, what is left is host overhead
cs = tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, columnwise=False)
dl = tex.Float8Quantizer(torch.ones(1), torch.zeros(1), tex.DType.kFloat8E4M3, columnwise=False)
act = torch.ops.te.act.default
act_quantize = torch.ops.te.act_quantize.default
spec = cs._spec()

ROWS = {
    "tex.gelu(x, None)": lambda: tex.gelu(x, None),
    "tex.gelu(x, current)": lambda: tex.gelu(x, cs),
    "tex.gelu(x, delayed)": lambda: tex.gelu(x, dl),
    "tex.quantize(x, current)": lambda: tex.quantize(x, cs),
    "tex.dgelu(g, x, current)": lambda: tex.dgelu(g, x, cs),
    "tex.dgelu(g, x, None)": lambda: tex.dgelu(g, x, None),
    "tex.gelu(x0, None) [0 rows]": lambda: tex.gelu(x0, None),
    "tex.gelu(x0, current) [0 rows]": lambda: tex.gelu(x0, cs),
    "te.act op (no wrapper)": lambda: act(x, 0, 7.0, 1.702, 1.0),
    "te.act_quantize op [0 rows]": lambda: act_quantize(x0, 0, 7.0, 1.702, 1.0, *spec),
    "_C.call(act_quantize) [0 rows]": lambda: tex._C.call(act_quantize, (x0, 0, 7.0, 1.702, 1.0) + spec),
    "torch.relu(x) (reference)": lambda: torch.relu(x),
    "torch.relu(x0) [0 rows]": lambda: torch.relu(x0),
}


def per_call_us(f, n=5000, repeats=5):
    """Best of `repeats` timed loops of `n` calls, after a warm-up: the least disturbed figure on a busy host."""
    for _ in range(500):
        f()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", help="row label to run under cProfile")
    a = ap.parse_args()
    if a.profile:
        f = ROWS[a.profile]
        prof = cProfile.Profile()
        prof.runcall(lambda: [f() for _ in range(5000)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    for name, f in ROWS.items():
        print(f"{name:<32} {per_call_us(f):7.2f} us/call")


if __name__ == "__main__":
    main()
