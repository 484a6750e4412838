#!/usr/bin/env python3
"""MXFP8 / NVFP4 GEMMs and MLP training steps against bf16 (issue 34 item 1), one GPU.

Rows:
  1. GEMM (TN fprop, D [M, N] = X [M, K] . W [N, K]^T, bf16 out) at 8192^3 and 16384x8192x28672: tex.general_gemm on
     MXFP8 / NVFP4 operands (quantized once, outside the timing) against tex.general_gemm on the bf16 operands, timed
     INTERLEAVED (benchmarks/_harness.py: L2 flushed before every call); ratio = bf16 us / ours us (median of the
     per-pair ratios). Validated first against the float64 product of the decoded operands (512 rows).
     Target: >= 0.95x bf16.
  2. torch MLP training step (tex.MLP, 8192 tokens, 4096 -> 16384, GELU, bf16 parameters): no recipe, MXFP8, NVFP4,
     timed INTERLEAVED (ratio = median of the per-round ratios); peak allocated memory of each variant alone
     (torch.cuda.max_memory_allocated over its build and three steps, the model and its inputs included). Target:
     time >= 0.9x bf16's speed, peak <= 1.3x bf16's.
  3. Flax MLP training step (tej.flax.MLP, same sizes, nnx.jit, SGD): no recipe, MXFP8, NVFP4, each in its own
     process (XLA's peak_bytes_in_use is per process), run one after another (not interleaved). Same targets.
On sm_90 the MXFP8 / NVFP4 GEMMs run as SPEC §6.7 says: each operand decoded once to bf16 in the GEMM's workspace,
then the bf16 cuBLASLt GEMM.

    python benchmarks/bench_block_gemm.py [--quick] [--skip-flax] [--skip-mlp] [--pairs N]   ($OUT/block_gemm.*)
    python benchmarks/bench_block_gemm.py --render benchmarks/results/h200/block_gemm.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GEMM_SHAPES = [(8192, 8192, 8192), (16384, 8192, 28672)]
GEMM_TARGET, STEP_TARGET, MEM_TARGET = 0.95, 0.9, 1.3
TOKENS, HIDDEN, FFN = 8192, 4096, 16384


def verdict(ok):
    return "MET" if ok else "NOT MET"


def gemm_rows(tex, torch, H, args):
    rows = []
    shapes = GEMM_SHAPES[:1] if args.quick else GEMM_SHAPES
    for (m, n, k) in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
        for fmt in ("MXFP8", "NVFP4"):
            q = tex.MXFP8Quantizer(tex.DType.kFloat8E4M3) if fmt == "MXFP8" else tex.NVFP4Quantizer()
            q.optimize_for_gemm = True
            X, W = tex.quantize(x, q), tex.quantize(w, q)
            out = tex.general_gemm(W, X, layout="TN", out_dtype=torch.bfloat16)[0]
            # validation: the float64 product of the decoded copies (first 512 rows)
            xd = X.dequantize(torch.float32)[:512].double()
            wd = W.dequantize(torch.float32).double()
            want = xd @ wd.t()
            err = (out[:512].double() - want).abs().max().item() / want.abs().max().item()
            valid = err <= 2.0 ** -7
            fns = {"ours": lambda W=W, X=X: tex.general_gemm(W, X, layout="TN", out_dtype=torch.bfloat16),
                   "bf16": lambda: tex.general_gemm(w, x, layout="TN", out_dtype=torch.bfloat16)}
            times = H.interleaved(fns, args.pairs)
            ratio = statistics.median(H.pair_ratios(times, "ours", "bf16"))
            rows.append({"row": f"{fmt} GEMM {m}x{n}x{k}", "ours_us": statistics.median(times["ours"]),
                         "bf16_us": statistics.median(times["bf16"]), "ratio": ratio, "valid": valid,
                         "rel_err": err, "target": f">= {GEMM_TARGET}x", "verdict": verdict(valid and
                                                                                          ratio >= GEMM_TARGET)})
            H.log(f"{rows[-1]}")
            del X, W, out, xd, wd, want
        del x, w
        torch.cuda.empty_cache()
    return rows


def mlp_rows(tex, torch, H, args):
    """The torch MLP step per recipe: the peak memory of each variant alone (model, inputs and grads included, as
    max_memory_allocated over its own build and steps), then the three steps timed interleaved (round by round,
    the order alternating), the speed ratio the median of the per-round ratios."""
    from bench_mlp import step_fn

    variants = (("bf16", None), ("MXFP8", tex.MXFP8BlockScaling()), ("NVFP4", tex.NVFP4BlockScaling()))

    def build(recipe):
        m = tex.MLP(HIDDEN, FFN, activation="gelu", params_dtype=torch.bfloat16, device="cuda")
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        dy = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g)
        return step_fn(tex, m, x, dy, recipe)

    peaks = {}
    for name, recipe in variants:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        step = build(recipe)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated()
        del step
    torch.cuda.empty_cache()
    steps = {name: build(recipe) for name, recipe in variants}
    times = H.interleaved(steps, max(2 * args.iters, 10), flush=False)
    rows = []
    for name in ("MXFP8", "NVFP4"):
        ms, bf16_ms = statistics.median(times[name]) / 1e3, statistics.median(times["bf16"]) / 1e3
        speed = statistics.median(H.pair_ratios(times, name, "bf16"))
        mem = peaks[name] / peaks["bf16"]
        rows.append({"row": f"torch MLP step {name}", "ours_ms": ms, "bf16_ms": bf16_ms, "ratio": speed,
                     "peak_GiB": peaks[name] / 2 ** 30, "bf16_peak_GiB": peaks["bf16"] / 2 ** 30, "mem_ratio": mem,
                     "verdict": verdict(speed >= STEP_TARGET and mem <= MEM_TARGET)})
        H.log(f"{rows[-1]}")
    return rows


def flax_worker(recipe_name, iters):
    """One Flax MLP step variant in this process: prints a JSON line {ms, peak}."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import transformer_engine_jax as tej

    recipe = None if recipe_name == "bf16" else getattr(tej, recipe_name)()
    with tej.autocast(enabled=recipe is not None, recipe=recipe):
        model = tej.flax.MLP(HIDDEN, FFN, activation_type=("gelu",), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                             rngs=nnx.Rngs(0))
    kx, ky = jax.random.split(jax.random.PRNGKey(7))
    x = jax.random.normal(kx, (TOKENS, HIDDEN), jnp.bfloat16)
    y = 0.1 * jax.random.normal(ky, (TOKENS, HIDDEN), jnp.bfloat16)

    @nnx.jit
    def step(model, x, y):
        def loss_fn(m):
            return jnp.mean(jnp.square(m(x).astype(jnp.float32) - y.astype(jnp.float32)))

        with tej.autocast(enabled=recipe is not None, recipe=recipe):
            loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(model)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda p, g: (p - 1e-3 * g.astype(jnp.float32)).astype(p.dtype), params,
                                       grads))
        return loss

    import time
    for _ in range(3):
        jax.block_until_ready(step(model, x, y))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(step(model, x, y))
        times.append(1e3 * (time.perf_counter() - t0))
    stats = jax.devices()[0].memory_stats() or {}
    print("RESULT " + json.dumps({"ms": statistics.median(times), "peak": stats.get("peak_bytes_in_use", 0)}))


def flax_rows(H, args):
    res = {}
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    for name in ("bf16", "MXFP8BlockScaling", "NVFP4BlockScaling"):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--flax-worker", name, "--iters",
                            str(args.iters)], env=env, capture_output=True, text=True, timeout=240)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not line:
            H.log(f"flax {name} failed: {p.stderr[-2000:]}")
            continue
        res[name] = json.loads(line[-1][len("RESULT "):])
    rows = []
    for name in ("MXFP8BlockScaling", "NVFP4BlockScaling"):
        if name not in res or "bf16" not in res:
            rows.append({"row": f"Flax MLP step {name}", "verdict": "NOT MET (did not run)"})
            continue
        speed = res["bf16"]["ms"] / res[name]["ms"]
        mem = res[name]["peak"] / max(res["bf16"]["peak"], 1)
        rows.append({"row": f"Flax MLP step {name}", "ours_ms": res[name]["ms"], "bf16_ms": res["bf16"]["ms"],
                     "ratio": speed, "peak_GiB": res[name]["peak"] / 2 ** 30,
                     "bf16_peak_GiB": res["bf16"]["peak"] / 2 ** 30, "mem_ratio": mem,
                     "verdict": verdict(speed >= STEP_TARGET and mem <= MEM_TARGET)})
        H.log(f"{rows[-1]}")
    return rows


COLUMNS = (("row", "row", "{}"), ("ours", "ours_us", "{:.1f} us"), ("bf16", "bf16_us", "{:.1f} us"),
           ("ours step", "ours_ms", "{:.2f} ms"), ("bf16 step", "bf16_ms", "{:.2f} ms"), ("speed vs bf16", "ratio", "{:.3f}x"),
           ("peak", "peak_GiB", "{:.2f} GiB"), ("peak vs bf16", "mem_ratio", "{:.2f}x"), ("verdict", "verdict", "{}"))


def render(rows, out_dir):
    """block_gemm.md (the table) and block_gemm.png (speed vs bf16 per row, the targets as lines) in out_dir."""
    import _harness as H
    met = sum(r["verdict"] == "MET" for r in rows)
    lines = ["# bench_block_gemm", "", f"{met} of {len(rows)} rows meet their targets (GEMM >= {GEMM_TARGET}x bf16; MLP "
             f"step >= {STEP_TARGET}x bf16 speed with peak memory <= {MEM_TARGET}x bf16's).", ""]
    lines += H.markdown_table(COLUMNS, rows)
    with open(os.path.join(out_dir, "block_gemm.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4))
    H.grouped_bars(ax, [r["row"].replace(" GEMM ", "\nGEMM ").replace(" step ", "\nstep ") for r in rows],
                   {"speed vs bf16": [r["ratio"] for r in rows],
                    "peak memory vs bf16": [r.get("mem_ratio") for r in rows]}, value_fmt="{:.2f}")
    ax.axhline(GEMM_TARGET, color="tab:green", ls="--", lw=1, label=f"GEMM target {GEMM_TARGET}x")
    ax.axhline(STEP_TARGET, color="tab:orange", ls=":", lw=1, label=f"step target {STEP_TARGET}x")
    ax.axhline(MEM_TARGET, color="tab:red", ls="-.", lw=1, label=f"memory bound {MEM_TARGET}x")
    ax.set_ylabel("x bf16")
    ax.tick_params(axis="x", labelsize=6)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "block_gemm.png"), dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8192^3 only")
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--skip-mlp", action="store_true")
    p.add_argument("--skip-flax", action="store_true")
    p.add_argument("--flax-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--render", metavar="JSON", help="only write block_gemm.md / .png of an earlier run's JSON")
    args = p.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            render(json.load(f), os.path.dirname(os.path.abspath(args.render)))
        return 0
    if args.flax_worker:
        flax_worker(args.flax_worker, args.iters)
        return 0
    import torch

    import _harness as H
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    import transformer_engine_torch as tex

    rows = gemm_rows(tex, torch, H, args)
    if not args.skip_mlp:
        rows += mlp_rows(tex, torch, H, args)
    if not args.skip_flax:
        rows += flax_rows(H, args)
    print(f"\n{'row':42s} {'ratio':>7s} {'mem':>6s}  verdict")
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "-"
        mem = f"{r['mem_ratio']:.2f}" if "mem_ratio" in r else "-"
        print(f"{r['row']:42s} {ratio:>7s} {mem:>6s}  {r['verdict']}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "block_gemm.json"), "w") as f:
            json.dump(rows, f, indent=1)
        render(rows, out)
    return 0 if all(r.get("valid", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
