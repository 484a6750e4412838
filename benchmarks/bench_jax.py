#!/usr/bin/env python3
"""JAX frontend benchmark (issue 20 acceptance): tej's fused activation + quantization kernels through jax.jit,
against the same math written in jnp under jax.jit (XLA fuses it), the copy-bandwidth floor and the torch
frontend's kernel on the same bytes.

One run on one GPU:
  1. copy bandwidth (read + write bytes) of a 268 MB bf16 buffer (the harness's torch copy);
  2. for gelu, swiglu and dgelu+dbias into bf16, FP8 delayed, FP8 current, MXFP8 and NVFP4 (rowwise, E4M3) on
     16384x8192 outputs: VALIDATES ours against tex (bit for bit: the frontends share the core) and the jnp peer
     against ours (the share of equal data bytes, and the dequantized values within the format's tolerance), then
     times the three interleaved: rounds of N back-to-back calls and one wait, so each time is the GPU's time per
     call (the host enqueues far faster than a 200 us kernel runs);
  3. the small call (256x4096, gelu plain and FP8 delayed): wall time per call of a host loop of jitted calls
     against tex's, and the initialize stage's host cost (the same jitted program with TEJ_NO_INITIALIZE=1, in a
     subprocess each);
  4. the table, the targets (ours >= 1.0x XLA on every row, >= 2x on current / MXFP8 / NVFP4; within 3 % of the
     torch kernel; small-call overhead <= tex's) and the report under benchmarks/results/<gpu>/jax.{json,md,png}.

Exit status: 0 when every row validated, 1 when one did not, 2 when the run could not start.
    python benchmarks/bench_jax.py [--quick] [--only SUBSTR] [--cpu-smoke]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and jax share the GPU

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402
import jax_peers as P  # noqa: E402
from baselines import ValidationError  # noqa: E402

BIG, SMALL = (16384, 8192), (256, 4096)
SMOKE_BIG, SMOKE_SMALL = (256, 512), (128, 256)
OPS = ("gelu", "swiglu", "dgelu_dbias")
FORMATS = ("bf16", "delayed", "current", "mxfp8", "nvfp4")
FAST_FORMATS = ("current", "mxfp8", "nvfp4")  # XLA needs extra passes there: target >= 2x
# SPEC §5.3 minimum bytes per output element, bf16 inputs: reads (gated: two per output; backward: dz and x; the
# current-scaling and NVFP4 paths read their inputs twice, amax pass then cast) + the written data + scales.
READS = {"gelu": 2, "swiglu": 4, "dgelu_dbias": 4}
WRITES = {"bf16": 2, "delayed": 1, "current": 1, "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16}
TWO_PASS = ("current", "nvfp4")


def floor_bytes_per_elt(op, fmt):
    return READS[op] * (2 if fmt in TWO_PASS else 1) + WRITES[fmt]


# ----------------------------------------------------------------------------------------------------------
# The three contenders of a case
# ----------------------------------------------------------------------------------------------------------
def tej_quantizer(tej, fmt, scale):
    SM = tej.ScalingMode
    mode = {"delayed": SM.DELAYED_TENSOR_SCALING, "current": SM.CURRENT_TENSOR_SCALING,
            "mxfp8": SM.MXFP8_1D_SCALING, "nvfp4": SM.NVFP4_1D_SCALING}.get(fmt)
    if mode is None:
        return None
    q = tej.QuantizerFactory.create(scaling_mode=mode, q_layout=tej.QuantizeLayout.ROWWISE, amax_history_len=1)
    if fmt == "delayed":
        q = q.__class__.tree_unflatten(q.tree_flatten()[1], (scale, q.amax_history))
    return q


def tex_quantizer(tex, fmt, scale, amax):
    e4m3 = tex.DType.kFloat8E4M3
    return {"bf16": lambda: None,
            "delayed": lambda: tex.Float8Quantizer(scale, amax, e4m3, rowwise=True, columnwise=False),
            "current": lambda: tex.Float8CurrentScalingQuantizer(e4m3, rowwise=True, columnwise=False),
            "mxfp8": lambda: tex.MXFP8Quantizer(e4m3, rowwise=True, columnwise=False),
            "nvfp4": lambda: tex.NVFP4Quantizer(rowwise=True, columnwise=False)}[fmt]()


def make_inputs(jax, op, size, seed):
    """x [M, A, K] (A = 2 for swiglu) and, for the backward, dz [M, K]; bf16, normal * 2."""
    import jax.numpy as jnp
    m, k = size
    kx, kd = jax.random.split(jax.random.PRNGKey(seed))
    x = (jax.random.normal(kx, (m, 2 if op == "swiglu" else 1, k), jnp.float32) * 2).astype(jnp.bfloat16)
    dz = (jax.random.normal(kd, (m, k), jnp.float32) * 2).astype(jnp.bfloat16) if op == "dgelu_dbias" else None
    return x, dz


WITH_AMAX = ("delayed", "nvfp4")  # the formats whose output amax the comparison covers


def ours_fn(jax, tej, op, fmt):
    """The jitted tej call of an op: (*arrays, quantizer) -> (data, scale_inv, dbias, amax; None where absent)."""
    def finish(out, dbias):
        if not hasattr(out, "data"):
            return out, None, dbias, None
        return out.data, out.scale_inv, dbias, out.amax if fmt in WITH_AMAX else None
    if op == "dgelu_dbias":
        def f(dz, x, q):
            return finish(*tej.quantize_dact_dbias(dz, x, "gelu", True, q))
    else:
        def f(x, q):
            return finish(tej.act_lu(x, op, q), None)
    return jax.jit(f)


def tex_fn(tex, op, fmt, quantizer, amax):
    """tex's kernel on torch views of the same bytes: (*tensors) -> (data, scale_inv, dbias, amax; None where
    absent). Delayed scaling's amax is the quantizer's buffer (max-merged by each call)."""
    def finish(out, dbias):
        if quantizer is None:
            return out, None, dbias, None
        if isinstance(out, tex.Float8Tensor):
            return out._data, out._scale_inv, dbias, amax if fmt == "delayed" else None
        return out._rowwise_data, out._rowwise_scale_inv, dbias, out._amax_rowwise if fmt == "nvfp4" else None
    if op == "dgelu_dbias":
        def f(dz, x):
            dbias, dx = tex.dbias_dgelu(dz, x, quantizer)
            return finish(dx, dbias)
    else:
        act = getattr(tex, op)

        def f(x):
            return finish(act(x, quantizer), None)
    return f


# ----------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------
def host_bytes(a):
    """The bytes of a jax array or torch tensor, on the host (uint8, flat)."""
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        return a.detach().contiguous().view(torch.uint8).cpu().numpy().ravel()
    return np.asarray(a).view(np.uint8).ravel()


def same_bytes(ours, theirs, what):
    """Raises ValidationError naming the first piece whose bytes differ."""
    for name, a, b in zip(("data", "scale_inv", "dbias", "amax"), ours, theirs):
        a, b = host_bytes(a), host_bytes(b)
        if (a is None) != (b is None):
            raise ValidationError(f"{what}: {name} present on one side only")
        if a is None:
            continue
        if a.shape != b.shape:
            raise ValidationError(f"{what}: {name} has {a.size} bytes ours, {b.size} theirs")
        bad = np.flatnonzero(a != b)
        if bad.size:
            raise ValidationError(f"{what}: {name} differs at {bad.size} of {a.size} bytes, first at {bad[0]}")


def peer_agreement(ours, peer, fmt, dq_ours, dq_peer):
    """(share of equal data bytes, max |peer - ours| / (|ours| + atol) of the dequantized values). The peer is
    the same math in jnp: it must agree to the format's rounding (SPEC §9 tolerances), not to the bit."""
    a, b = host_bytes(ours[0]), host_bytes(peer[0])
    share = float(np.mean(a == b)) if a.shape == b.shape else 0.0
    x, y = np.asarray(dq_ours, np.float64), np.asarray(dq_peer, np.float64)
    rtol, atol = P.TOLERANCE[fmt]
    allowed = rtol * np.abs(x)
    if fmt == "nvfp4":  # one E2M1 step (at most 2 of the block's 6) of the block's scale
        blocks = np.maximum(np.abs(x), np.abs(y)).reshape(x.shape[0], -1, 16)
        allowed = np.broadcast_to(blocks.max(axis=-1, keepdims=True) / 3, blocks.shape).reshape(x.shape)
    err = float(np.max(np.abs(x - y) - allowed)) if x.size else 0.0
    if err > atol or not np.all(np.isfinite(y) == np.isfinite(x)):
        raise ValidationError(f"the jnp peer disagrees with ours beyond rtol {rtol} atol {atol} "
                                f"(excess {err:.3g}; equal data bytes {100 * share:.2f} %)")
    if ours[2] is not None:
        d, e = np.asarray(ours[2], np.float64), np.asarray(peer[2], np.float64)
        if not np.allclose(d, e, rtol=4 * 2.0 ** -8, atol=1e-2 * max(1.0, float(np.max(np.abs(d))))):
            raise ValidationError("the jnp peer's dbias disagrees with ours beyond 4 bf16 ulps")
    return share


def torch_wait(device):
    """The wait of a torch call for H.interleaved_stream: synchronize the device (the output is not needed)."""
    return lambda out: H.synchronize(device)


# ----------------------------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------------------------
def run_case(ctx, op, fmt, size):
    jax, tej, tex, device, args = ctx["jax"], ctx["tej"], ctx["tex"], ctx["device"], ctx["args"]
    m, k = size
    name = f"{op} {fmt} {m}x{k * (2 if op == 'swiglu' else 1)}"
    nbytes = floor_bytes_per_elt(op, fmt) * m * k
    row = {"case": name, "op": op, "format": fmt, "M": m, "K_out": k, "bytes": nbytes,
           "floor_us": nbytes / (ctx["copy_gbs"] * 1e3), "ours_us": None, "xla_us": None, "tex_us": None,
           "xla_over_ours": None, "ours_over_tex": None, "ours_over_floor": None, "peer_equal_bytes": None,
           "valid": False, "note": ""}
    x, dz = make_inputs(jax, op, size, seed=len(ctx["rows"]))
    arrays = (x,) if dz is None else (dz, x)
    scale = None
    if fmt == "delayed":  # a realistic delayed scale: the output's amax lands at half the E4M3 range
        amax = float(jax.numpy.max(jax.numpy.abs(P.act_f32(op, *arrays))))
        scale = jax.numpy.full((1,), 0.5 * 448.0 / amax, jax.numpy.float32)
    q = tej_quantizer(tej, fmt, scale)
    ours = ours_fn(jax, tej, op, fmt)
    peer = jax.jit(P.peer_fn(op, fmt))
    peer_args = arrays + ((scale,) if fmt == "delayed" else ())
    tensors = [torch.from_dlpack(a).reshape(m, -1) for a in arrays]
    t_scale = None if scale is None else torch.from_dlpack(scale).clone()
    t_amax = torch.zeros(1, device=tensors[0].device, dtype=torch.float32)
    theirs = tex_fn(tex, op, fmt, tex_quantizer(tex, fmt, t_scale, t_amax), t_amax)
    try:
        got = ours(*arrays, q)
        same_bytes(got, theirs(*tensors), f"{name}: tej vs tex")
        want = peer(*peer_args)
        row["peer_equal_bytes"] = peer_agreement(got, want, fmt, P.dequantize(fmt, got, size),
                                                 P.dequantize(fmt, want, size))
    except ValidationError as e:
        row["note"] = f"validation: {e}"
        H.log(f"FAIL  {name}: {row['note']}")
        return row
    except Exception as e:  # a contender that cannot run this case
        row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        H.log(f"FAIL  {name}: {row['note']}")
        return row
    row["valid"] = True
    del got, want
    H.log(f"ok    {name}  (tej == tex bit for bit; jnp peer equal data bytes {100 * row['peer_equal_bytes']:.2f} %)")
    jw, tw = jax.block_until_ready, torch_wait(device)
    times = H.interleaved_stream({"ours": (lambda: ours(*arrays, q), jw), "xla": (lambda: peer(*peer_args), jw),
                                "tex": (lambda: theirs(*tensors), tw)}, ctx["rounds"], ctx["iters"])
    for n in times:
        row[f"{n}_us"] = statistics.median(times[n])
    row["xla_over_ours"] = statistics.median(H.pair_ratios(times, "ours", "xla"))
    row["ours_over_tex"] = statistics.median(H.pair_ratios(times, "tex", "ours"))
    row["ours_over_floor"] = row["ours_us"] / row["floor_us"]
    return row


# ----------------------------------------------------------------------------------------------------------
# The small call and the initialize stage
# ----------------------------------------------------------------------------------------------------------
def small_call(ctx, size):
    """Wall time per call of a host loop of jitted tej calls vs tex's eager calls (the launch-bound regime)."""
    jax, tej, tex, device = ctx["jax"], ctx["tej"], ctx["tex"], ctx["device"]
    x, _ = make_inputs(jax, "gelu", size, seed=99)
    xt = torch.from_dlpack(x).reshape(size)
    scale = jax.numpy.ones((1,), jax.numpy.float32)
    out = []
    for fmt in ("bf16", "delayed"):
        q = tej_quantizer(tej, fmt, scale)
        f = ours_fn(jax, tej, "gelu", fmt)
        t_amax = torch.zeros(1, device=xt.device)
        g = tex_fn(tex, "gelu", fmt, tex_quantizer(tex, fmt, torch.ones(1, device=xt.device), t_amax), t_amax)
        t = H.interleaved_stream({"ours": (lambda: f(x, q), jax.block_until_ready),
                                  "tex": (lambda: g(xt), torch_wait(device))},
                               ctx["rounds"], ctx["e2e_iters"])
        out.append({"case": f"gelu {fmt} {size[0]}x{size[1]} (wall per call)", "ours_us": statistics.median(t["ours"]),
                    "tex_us": statistics.median(t["tex"]), "valid": True})
    return out


INIT_PROBE = r"""
import os, statistics, sys, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
import transformer_engine_jax as tej
calls, iters = int(sys.argv[1]), int(sys.argv[2])
x = jnp.ones((256, 1, 4096), jnp.bfloat16)
@jax.jit
def step(x):
    for _ in range(calls):
        x = tej.act_lu(x, "gelu")[:, None, :]
    return x
jax.block_until_ready(step(x))
per = []
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(iters):
        jax.block_until_ready(step(x))
    per.append((time.perf_counter() - t0) / iters)
print(1e6 * statistics.median(per))
"""


def initialize_cost(ctx, calls=32):
    """Host time per step of a jitted program of `calls` tej calls, with and without the initialize stage
    (TEJ_NO_INITIALIZE=1 registers execute only), each in a fresh process; the difference per call is the stage's
    host cost as XLA runs it."""
    us = {}
    for off in ("0", "1"):
        env = dict(os.environ, TEJ_NO_INITIALIZE=off, PYTHONPATH=H.REPO_ROOT)
        r = subprocess.run([sys.executable, "-c", INIT_PROBE, str(calls), str(ctx["e2e_iters"] // 10)],
                           env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return {"note": f"probe failed: {r.stderr.strip().splitlines()[-1:]}"}
        us["with" if off == "0" else "without"] = float(r.stdout.strip().splitlines()[-1])
    return {"calls": calls, "step_us_with": us["with"], "step_us_without": us["without"],
            "per_call_us": (us["with"] - us["without"]) / calls}


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------
COLUMNS = [("case", "case", "{}"), ("ours us", "ours_us", "{:.1f}"), ("XLA jnp us", "xla_us", "{:.1f}"),
           ("tex us", "tex_us", "{:.1f}"), ("floor us", "floor_us", "{:.1f}"), ("XLA/ours", "xla_over_ours", "{:.2f}"),
           ("ours/tex", "ours_over_tex", "{:.3f}"), ("ours/floor", "ours_over_floor", "{:.2f}"),
           ("peer = bytes", "peer_equal_bytes", "{:.1%}")]


def evaluate_targets(report, rows, small, init):
    for r in rows:
        need = 2.0 if r["format"] in FAST_FORMATS else 1.0
        report.at_least(f"{r['case']}: XLA / ours", r["xla_over_ours"], need, "{:.2f}x", f">= {need}x")
    worst = max((r["ours_over_tex"] for r in rows if r["ours_over_tex"]), default=None)
    report.at_most("every row: ours / tex kernel", worst, 1.03, "{:.3f} (worst)", "<= 1.03")
    for s in small:
        report.at_most(f"{s['case']}: ours <= tex", s["ours_us"] / s["tex_us"], 1.0,
                       f"{s['ours_us']:.1f} us vs {s['tex_us']:.1f} us" + " ({:.2f}x)", "<= 1.0x")
    if "per_call_us" in init:
        report.target("initialize stage host cost per call", "MEASURED", f"{init['per_call_us']:.2f} us",
                      "measured and stated")


def queue_plot(report, rows):
    done = [r for r in rows if r["valid"]]

    def draw(fig):
        ax = fig.add_subplot(1, 1, 1)
        series = {"ours": [r["ours_us"] for r in done], "XLA jnp": [r["xla_us"] for r in done],
                  "tex kernel": [r["tex_us"] for r in done], "copy floor": [r["floor_us"] for r in done]}
        H.grouped_bars(ax, [r["case"] for r in done], series, horizontal=True)
        ax.set_xlabel("us per call (lower is better)")
        ax.legend(fontsize=8)
        ax.set_title("tej through jax.jit vs XLA-fused jnp vs the torch frontend's kernel")
    if done:
        report.plot("jax", draw, figsize=(10, 0.45 * len(done) + 1.5))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds and calls")
    p.add_argument("--only", action="append", default=[], metavar="SUBSTR", help="cases whose name holds SUBSTR")
    H.add_output_args(p)
    args = p.parse_args()
    device, tex, jax, tej = H.start_jax(args, "bench_jax.py")
    if device is None:
        return 2
    t_start = time.time()
    big, small = (SMOKE_BIG, SMOKE_SMALL) if args.cpu_smoke else (BIG, SMALL)
    ctx = {"jax": jax, "tej": tej, "tex": tex, "device": device, "args": args, "rows": [],
           "rounds": 3 if args.quick or args.cpu_smoke else 9, "iters": 2 if args.cpu_smoke else 30,
           "e2e_iters": 20 if args.cpu_smoke else (300 if args.quick else 2000)}
    timer = H.Timer(quick=args.quick, device=device)
    copy = H.measure_copy_bandwidth(timer, big)
    ctx["copy_gbs"] = copy["gbs"]
    report = H.Report("jax", {"device": H.device_name(device), "jax": jax.__version__,
                              "jax_backend": jax.default_backend(), "copy_gbs": copy["gbs"], "quick": args.quick,
                              "timing": f"median of {ctx['rounds']} interleaved rounds of {ctx['iters']} "
                                        "back-to-back calls then one wait (GPU time per call)"})
    report.emit(f"device {report.meta['device']}, jax {jax.__version__} ({jax.default_backend()}), copy bandwidth "
                f"{copy['gbs']:.0f} GB/s")
    for op in OPS:
        for fmt in FORMATS:
            name = f"{op} {fmt}"
            if args.only and not any(s in name for s in args.only):
                continue
            ctx["rows"].append(run_case(ctx, op, fmt, big))
            H.release(device)
    report.rows = ctx["rows"]
    report.table(COLUMNS)
    small_rows = [] if args.only else small_call(ctx, small)
    init = {} if args.only or args.cpu_smoke else initialize_cost(ctx)
    if small_rows:
        report.emit("")
        report.table([("small call", "case", "{}"), ("ours us", "ours_us", "{:.1f}"), ("tex us", "tex_us", "{:.1f}")],
                     small_rows)
    if init:
        report.emit(f"\ninitialize stage: {init}")
    report.extra = {"small_call": small_rows, "initialize": init}
    evaluate_targets(report, [r for r in ctx["rows"] if r["valid"]], small_rows, init)
    report.print_targets("Targets (issue 20):")
    report.summary("cases", time.time() - t_start, smoke=args.cpu_smoke)
    queue_plot(report, ctx["rows"])
    report.save(H.out_dir_of(args, partial=bool(args.only)), json_path=args.json)
    return 0 if all(r["valid"] for r in ctx["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
