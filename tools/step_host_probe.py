#!/usr/bin/env python3
"""Why a torch MLP step in bench_block_gemm takes longer than its kernels: the host, or the GPU's clocks? The three
steps (bf16, MXFP8, NVFP4) timed interleaved as the benchmark does, then again with a GPU spin before each step
(outside its events), so that the host has queued the step before it starts, and the GPU idles at low power
between steps. Either can move the ratio: with the SM clock and board power sampled by nvidia-smi during each run
(when present), a run whose clocks drop is power-bound, one whose clocks hold and still gains is host-bound.

    PYTHONPATH=. python tools/step_host_probe.py [--rounds 10]
"""
import argparse
import os
import statistics
import sys

import torch

import transformer_engine_torch as tex

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import _harness as H  # noqa: E402
from bench_mlp import step_fn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clock_probe import Clocks  # noqa: E402

TOKENS, HIDDEN, FFN = 8192, 4096, 16384


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    steps = {}
    for name, recipe in (("bf16", None), ("MXFP8", tex.MXFP8BlockScaling()), ("NVFP4", tex.NVFP4BlockScaling())):
        m = tex.MLP(HIDDEN, FFN, activation="gelu", params_dtype=torch.bfloat16, device="cuda")
        x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16)
        steps[name] = step_fn(tex, m, x, dy, recipe)
    for label, cycles in (("as the benchmark", 0), ("host ahead (GPU spin before each step)", int(4e7))):
        with Clocks() as clk:
            times = H.interleaved(steps, a.rounds, flush=False, sleep_cycles=cycles)
        med = {n: statistics.median(t) / 1e3 for n, t in times.items()}
        ratios = {n: statistics.median(H.pair_ratios(times, n, "bf16")) for n in ("MXFP8", "NVFP4")}
        print(f"{label}: " + ", ".join(f"{n} {ms:.2f} ms" for n, ms in med.items()) +
              "; vs bf16: " + ", ".join(f"{n} {r:.3f}x" for n, r in ratios.items()) + f"\n    {clk.summary}")
    for name, step in steps.items():  # each alone, back to back: its own sustained clock
        with Clocks() as clk:
            ms = H.step_ms(step, a.rounds, "cuda")
        print(f"{name} alone: {ms:.2f} ms per step; {clk.summary}")


if __name__ == "__main__":
    main()
