#!/usr/bin/env python3
"""Where a tex.MLP training step's GPU time goes, per recipe: the kernels of a few profiled steps (torch.profiler),
grouped by name, with their share of the step, and the step's peak memory. The measured reason behind a slow
bench_block_gemm / bench_mlp row. With --host, also the host's side: the time to issue a step (no synchronisation)
against the step's wall time, and every host synchronisation inside a step (torch.cuda.set_sync_debug_mode) with
the Python frames that caused it.

    PYTHONPATH=. python tools/prof_step.py [--recipes bf16,MXFP8,NVFP4] [--tokens 8192] [--hidden 4096]
        [--ffn 16384] [--steps 3] [--top 14] [--host]
"""
import argparse
import os
import sys
import time
import traceback
import warnings

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
    ap.add_argument("--host", action="store_true", help="also the host's issue time and synchronisations per step")
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
            if a.host:  # the GPU spins while the host queues every step: the gaps left are the GPU's own
                torch.cuda._sleep(int(2e8))
            for _ in range(a.steps):
                step()
            torch.cuda.synchronize()
        rows = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and "spin_kernel" not in e.name:
                key = e.name[:90]
                t, n = rows.get(key, (0.0, 0))
                rows[key] = (t + e.device_time, n + 1)
        total = sum(t for t, _ in rows.values())
        print(f"\n== {name}: {total / a.steps / 1e3:.3f} ms of kernels per step, peak "
              f"{torch.cuda.max_memory_allocated() / 2 ** 30:.2f} GiB")
        for key, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:a.top]:
            print(f"  {t / a.steps / 1e3:8.3f} ms {100 * t / total:5.1f} %  x{n // a.steps:<3d} {key}")
        if a.host:
            gap_report(prof, a.steps)
            host_report(step, a.steps * 4)
        del m, x, dy


def gap_report(prof, steps, top=12):
    """The GPU's idle time between consecutive kernels of the profiled steps (back to back, as the benchmark runs
    them), grouped by the pair of kernels around each gap: where a step's wall time exceeds its kernels' sum."""
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                 and "spin_kernel" not in e.name), key=lambda e: e.time_range.start)
    pairs, total = {}, 0.0
    for prev, nxt in zip(ev, ev[1:]):
        gap = nxt.time_range.start - prev.time_range.end
        if gap <= 0:
            continue
        total += gap
        key = (prev.name[:60], nxt.name[:60])
        t, n = pairs.get(key, (0.0, 0))
        pairs[key] = (t + gap, n + 1)
    print(f"   GPU idle between kernels: {total / steps / 1e3:.3f} ms per step")
    for (p, q), (t, n) in sorted(pairs.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"     {t / steps:8.1f} us x{n // steps:<3d} after {p}\n{'':28s}before {q}")


def host_report(step, n):
    """Issue time vs wall time per step, and the synchronisations inside one step with their Python frames."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"   host: {1e3 * (t1 - t0) / n:.3f} ms to issue a step, {1e3 * (t2 - t0) / n:.3f} ms wall per step")
    sync_report(step)


def sync_report(step):
    """Every host synchronisation torch sees in one call of step() (torch.cuda.set_sync_debug_mode), with the
    Python frames that caused it."""
    seen = []

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
        seen.append((str(message)[:80], [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames[-6:]]))

    with warnings.catch_warnings():  # restores showwarning and the filters on exit
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    print(f"   host synchronisations in one step: {len(seen)}")
    for msg, frames in seen[:8]:
        print(f"     {msg}")
        for f in frames:
            print(f"        {f}")


if __name__ == "__main__":
    main()
