#!/usr/bin/env python3
"""Where bench_model's decoder training step spends its GPU time, per variant: the kernels of a few profiled steps
(torch.profiler), grouped into classes (GEMM, attention, norm, quantize, elementwise / fused, optimizer, copy,
other) with their share of the step, the top kernels by time, the step's wall time against its kernels' sum, and
the host's time to issue one (a step of more kernels than the launch queue holds, ~1000, shows the spin's length
there: the host waited for a queue slot, not for a synchronisation). The measured reason behind a bench_model row
(issue 36: "a profile of where the step's time goes").
Builds the variants exactly as bench_model does (its build()), from the same bf16 weights.

    PYTHONPATH=. python tools/prof_model.py [--size 1b] [--variants "bf16 torch.compile,ours fp8 current (compile)"]
        [--steps 3] [--top 12]
"""
import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_model as BM  # noqa: E402

import transformer_engine_torch as tex  # noqa: E402

# Kernel name patterns of each class, first match wins (lower case).
CLASSES = (("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
           ("gemm", ("nvjet", "gemm", "cutlass", "sm90_xmma", "wgmma", "decode_")),
           ("norm", ("norm", "rsigma")),
           ("rope (triton)", ("cos_mul",)),
           ("quantize", ("fp8", "amax", "cast", "quantiz", "mxfp8", "nvfp4", "scale", "transpose")),
           ("optimizer", ("adam", "multi_tensor", "foreach")),
           ("copy", ("memcpy", "memset", "copy", "cat")),
           ("elementwise / fused", ("triton", "elementwise", "vectorized", "reduce", "act_", "softmax", "rope",
                                    "rotary")))


def kernel_class(name):
    low = name.lower()
    return next((c for c, pats in CLASSES if any(p in low for p in pats)), "other")


def print_kernels(events, steps, top):
    """The classes and the top kernels of `events` [(kernel name, microseconds)] over `steps` steps; returns the
    kernels' total per step in ms."""
    rows, classes = {}, {}
    for name, us in events:
        t, n = rows.get(name[:100], (0.0, 0))
        rows[name[:100]] = (t + us, n + 1)
        k = kernel_class(name)
        classes[k] = classes.get(k, 0.0) + us
    total = sum(t for t, _ in rows.values())
    for k, t in sorted(classes.items(), key=lambda kv: -kv[1]):
        print(f"   {k:22s} {t / steps / 1e3:8.3f} ms {100 * t / total:5.1f} %")
    for key, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"     {t / steps / 1e3:8.3f} ms {100 * t / total:5.1f} %  x{n // steps:<4d} {key}")
    return total / steps / 1e3


def where_host_waits(c):
    """The host waited for the GPU inside a step (its issue time spans the spin before it): the phase (forward,
    backward, optimizer) and, from module hooks, the longest host gaps, with what torch's sync debug mode saw."""
    marks = []
    hooks = []
    for name, m in c.model.named_modules():
        hooks.append(m.register_forward_pre_hook(lambda m, a, n=name: marks.append((time.perf_counter(), f"fwd> {n}"))))
        hooks.append(m.register_forward_hook(lambda m, a, o, n=name: marks.append((time.perf_counter(), f"fwd< {n}"))))
        hooks.append(m.register_full_backward_pre_hook(
            lambda m, g, n=name: marks.append((time.perf_counter(), f"bwd> {n}"))))
        hooks.append(m.register_full_backward_hook(
            lambda m, gi, go, n=name: marks.append((time.perf_counter(), f"bwd< {n}"))))
    try:
        torch.cuda._sleep(int(3e9))
        t = [time.perf_counter()]
        with c.context():
            loss = c.model(c.tokens, c.targets)
        t.append(time.perf_counter())
        loss.backward()
        t.append(time.perf_counter())
        c.opt.step()
        c.opt.zero_grad(set_to_none=True)
        t.append(time.perf_counter())
        torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    print("   host per phase: " + ", ".join(f"{n} {1e3 * (b - a):.1f} ms" for n, a, b in
                                           zip(("forward", "backward", "optimizer"), t, t[1:])))
    gaps = sorted(((b[0] - a[0], a[1], b[1]) for a, b in zip(marks, marks[1:])), reverse=True)[:5]
    for dt, a_, b_ in gaps:
        print(f"     {1e3 * dt:9.2f} ms between {a_} and {b_}")
    from prof_step import sync_report
    sync_report(c.step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1b", choices=list(BM.SIZES))
    ap.add_argument("--variants", default="bf16 torch.compile,ours fp8 current (compile),ours fp8 current")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--where", action="store_true", help="when the host waits inside a step: where (hooks, phases)")
    a = ap.parse_args()
    args = BM.parse_args([])
    cfg = BM.size_config(a.size, args)
    ref = BM.torch_decoder(cfg, torch.bfloat16, "cuda")
    g = torch.Generator(device="cpu").manual_seed(1)
    data = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g).to("cuda")
    args.batch_tokens = (data[:, :-1].contiguous(), data[:, 1:].contiguous())
    specs = {s[0]: s for s in BM.variants("cuda", False)}
    _, ao_why = BM.H.import_torchao()  # torchao from third_party/wheels when it is not installed
    for name in a.variants.split(","):
        name = name.strip()
        if name not in specs:
            print(f"unknown variant {name!r}; known: {', '.join(specs)}")
            continue
        torch.cuda.empty_cache()
        try:
            c = BM.build(tex, specs[name], ref, cfg, args, "cuda", ao_why)
        except Exception as e:  # noqa: BLE001  (a variant that cannot run, e.g. no torchao)
            print(f"\n== {a.size} {name}: skipped: {type(e).__name__}: {e}")
            continue
        for _ in range(3):
            c.step()
        torch.cuda.synchronize()
        # host: the time to issue one step while the GPU is busy with a spin (so nothing waits on the GPU)
        torch.cuda._sleep(int(3e9))
        t0 = time.perf_counter()
        c.step()
        host_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        if host_ms > 500 and a.where:
            where_host_waits(c)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(a.steps):
            c.step()
        e.record()
        torch.cuda.synchronize()
        wall_ms = s.elapsed_time(e) / a.steps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.steps):
                c.step()
            torch.cuda.synchronize()
        ev = [(x.name, x.device_time) for x in prof.events() if x.device_type == torch.autograd.DeviceType.CUDA]
        print(f"\n== {a.size} {name}: {wall_ms:.2f} ms per step back to back, host issues a step in {host_ms:.2f} ms, "
              f"{len(ev) // a.steps} kernels a step")
        print(f"   kernels: {print_kernels(ev, a.steps, a.top):.2f} ms a step")
        del c
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
