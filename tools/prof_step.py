#!/usr/bin/env python3
"""Where a tex.MLP training step's GPU time goes, per recipe: the kernels of a few profiled steps (torch.profiler),
grouped by name, with their share of the step, and the step's peak memory. The measured reason behind a slow
bench_block_gemm / bench_mlp row.

    PYTHONPATH=. python tools/prof_step.py [--recipes bf16,MXFP8,NVFP4] [--tokens 8192] [--hidden 4096]
        [--ffn 16384] [--steps 3] [--top 14]
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import transformer_engine_torch as tex

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_mlp import step_fn  # noqa: E402  (the benchmark's step: the one whose time this explains)

RECIPES = {"bf16": lambda: None, "MXFP8": tex.MXFP8BlockScaling, "NVFP4": tex.NVFP4BlockScaling,
           "current": tex.Float8CurrentScaling, "delayed": tex.DelayedScaling}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="bf16,MXFP8,NVFP4")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=14)
    a = ap.parse_args()
    for name in a.recipes.split(","):
        recipe = RECIPES[name]()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        m = tex.MLP(a.hidden, a.ffn, activation="gelu", params_dtype=torch.bfloat16, device="cuda")
        x = torch.randn(a.tokens, a.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(a.tokens, a.hidden, device="cuda", dtype=torch.bfloat16)

        step = step_fn(tex, m, x, dy, recipe)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.steps):
                step()
            torch.cuda.synchronize()
        rows = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                key = e.name[:90]
                t, n = rows.get(key, (0.0, 0))
                rows[key] = (t + e.device_time, n + 1)
        total = sum(t for t, _ in rows.values())
        print(f"\n== {name}: {total / a.steps / 1e3:.3f} ms of kernels per step, peak "
              f"{torch.cuda.max_memory_allocated() / 2 ** 30:.2f} GiB")
        for key, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:a.top]:
            print(f"  {t / a.steps / 1e3:8.3f} ms {100 * t / total:5.1f} %  x{n // a.steps:<3d} {key}")
        del m, x, dy


if __name__ == "__main__":
    main()
