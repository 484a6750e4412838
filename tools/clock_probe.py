#!/usr/bin/env python3
"""Does the GPU lower its clocks under sustained GEMM load, and more when memory-bound kernels run between the
GEMMs? Pure torch (no extension needed): an MLP-step-like chain of bf16 GEMMs (8192 tokens, 4096 <-> 16384), alone
and with bandwidth-bound copies between them (the block recipes' decodes and casts), each run back to back and
with a GPU spin between iterations; SM clock and board power sampled by nvidia-smi.

    python tools/clock_probe.py [--iters 40]
"""
import argparse
import shutil
import statistics
import subprocess

import torch


class Clocks:
    """nvidia-smi sampling the SM clock (MHz) and board power (W) every 50 ms while the block runs."""

    def __enter__(self):
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                          "-lms", "50", "-i", str(torch.cuda.current_device())],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        self.summary = "no nvidia-smi"
        if self.proc is None:
            return False
        self.proc.terminate()
        out, _ = self.proc.communicate()
        rows = [r.split(",") for r in out.strip().splitlines() if r.count(",") == 1]
        try:
            mhz = [float(a) for a, _ in rows]
            watts = [float(b) for _, b in rows]
            self.summary = (f"SM clock mean {statistics.mean(mhz):.0f} MHz (min {min(mhz):.0f}), "
                            f"power mean {statistics.mean(watts):.0f} W ({len(rows)} samples)")
        except (ValueError, statistics.StatisticsError):
            self.summary = f"unparsed nvidia-smi output: {out[:80]!r}"
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=40)
    a = ap.parse_args()
    t, h, f = 8192, 4096, 16384
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, generator=g)
    w1 = torch.randn(f, h, device="cuda", dtype=torch.bfloat16, generator=g)
    w2 = torch.randn(h, f, device="cuda", dtype=torch.bfloat16, generator=g)
    big = torch.empty(t, f, device="cuda", dtype=torch.bfloat16)

    def step(copies):
        y = x @ w1.t()
        if copies:
            for _ in range(copies):
                big.copy_(y)
        z = y @ w2.t()
        dy = z @ w2
        return (dy.t() @ x).sum()

    for copies in (0, 6):
        for spin in (0, int(4e7)):
            for _ in range(3):
                step(copies)
            torch.cuda.synchronize()
            times = []
            with Clocks() as clk:
                for _ in range(a.iters):
                    if spin:
                        torch.cuda._sleep(spin)
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    step(copies)
                    e.record()
                    times.append((s, e))
                torch.cuda.synchronize()
            ms = statistics.median(s.elapsed_time(e) for s, e in times)
            print(f"copies {copies} spin {'yes' if spin else 'no '}: {ms:.3f} ms per step; {clk.summary}")


if __name__ == "__main__":
    main()
