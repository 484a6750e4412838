#!/usr/bin/env python3
"""Where bench_model's Flax decoder training step spends its GPU time, per JAX variant: the device kernels of a few
profiled steps (jax.profiler's Perfetto trace), grouped into the classes of tools/prof_model.py, with the top
kernels by time. The measured reason behind a bench_model JAX row (issue 36). Each variant runs in a process of its
own (as bench_model's JAX section: XLA's memory is per process), built by bench_model.jax_build.

    PYTHONPATH=. python tools/prof_model_jax.py [--size 1b] [--variants "flax bf16,ours fp8 current"] [--steps 3]
        [--top 14] [--cpu-smoke]
"""
import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
sys.path.insert(0, HERE)


def device_events(trace_dir):
    """[(name, microseconds)] of every complete event on a device ("/device:GPU:..." process) of the Perfetto trace
    jax.profiler wrote under trace_dir."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not files:
        return []
    with gzip.open(max(files, key=os.path.getmtime), "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    device_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                   and "/device:" in str(e.get("args", {}).get("name", ""))
                   and "CPU" not in str(e.get("args", {}).get("name", ""))}
    return [(e["name"], float(e.get("dur", 0.0))) for e in events
            if e.get("ph") == "X" and e.get("pid") in device_pids]


def one(name, size, steps, top, smoke):
    """Profile one variant in this process and print its table."""
    if smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    import bench_model as BM
    from prof_model import print_kernels

    args = BM.parse_args(["--sizes", size] + (["--cpu-smoke"] if smoke else []))
    cfg = BM.size_config(size, args)
    call, state, _ = BM.jax_build(name, cfg)
    for _ in range(3):
        call()
    jax.block_until_ready(state["loss"])
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        for _ in range(steps):
            call()
        jax.block_until_ready(state["loss"])
        jax.profiler.stop_trace()
        ev = device_events(tmp)
    if not ev:
        print(f"\n== {size} {name}: no device kernels in the trace (a CPU run has none)")
        return
    print(f"\n== {size} {name}: {len(ev) // steps} device kernels a step")
    print(f"   kernels: {print_kernels(ev, steps, top):.2f} ms a step")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1b")
    ap.add_argument("--variants", default="flax bf16,ours fp8 current")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (the parsing path only)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: profile this variant here
    a = ap.parse_args()
    if a.one:
        return one(a.one, a.size, a.steps, a.top, a.cpu_smoke)
    for name in a.variants.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--one", name.strip(), "--size", a.size, "--steps",
               str(a.steps), "--top", str(a.top)] + (["--cpu-smoke"] if a.cpu_smoke else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout.rstrip())
        if r.returncode:
            print(f"== {name}: the child exited {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
