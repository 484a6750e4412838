#!/usr/bin/env python3
"""LayerNorm / RMSNorm benchmark (issue 35 item 1 targets): forward with plain, FP8 delayed, FP8 current and MXFP8
output and the backward, at hidden 4096 and 8192 x 16384 rows (bf16 input, FP32 gamma/beta).

Each case is VALIDATED first (the output bytes equal tex.quantize of the FP32 y the SPEC §11 output step gives from
the op's own statistics; the backward against float64 math), then timed (median, L2 flushed: benchmarks/_harness.py
Timer), beside a device-to-device copy of the same run (copy bandwidth) and torch.compile of the same math. Reported
per row: us, GB/s of the byte floor, % of copy bandwidth, ratio to the byte floor's time at copy bandwidth, speed-up
over torch.compile, and MET / NOT MET against the targets:
  RMSNorm -> FP8 current scaling <= 1.1x its byte floor (floor: 2 reads of x + 1 byte written per element);
  FP8 delayed and MXFP8 forward >= 88 % of copy bandwidth; backward >= 80 %; every quantized output >= 1.5x torch.compile.
Usage: python3 benchmarks/bench_norm.py [--quick] [--out-dir DIR]  (DIR/bench_norm.json, .md, .png; --render JSON
redraws the table and plot of an earlier run)
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _harness as H  # noqa: E402

EPS = 1e-5
ROWS = 16384
HIDDENS = (4096, 8192)


def torch_norm(kind, x, gamma, beta):
    """The same math in PyTorch (FP32 statistics), for torch.compile."""
    xf = x.float()
    if kind == "ln":
        mu = xf.mean(-1, keepdim=True)
        var = ((xf - mu) ** 2).mean(-1, keepdim=True)
        rs = torch.rsqrt(var + EPS)
        return (xf - mu) * rs * gamma + beta, mu, rs
    rs = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + EPS)
    return xf * rs * gamma, None, rs


def torch_fp8(y, scale):
    return (y * scale).clamp(-448, 448).to(torch.float8_e4m3fn)


def torch_norm_bwd(kind, dz, x, mu, rs, gamma):
    xf, dzf = x.float(), dz.float()
    xhat = (xf - mu) * rs if kind == "ln" else xf * rs
    dyg = dzf * gamma
    inner = dyg - xhat * (dyg * xhat).mean(-1, keepdim=True)
    if kind == "ln":
        inner = inner - dyg.mean(-1, keepdim=True)
    return (rs * inner).to(x.dtype), (dzf * xhat).sum(0), dzf.sum(0)


def print_row(r):
    t = ", ".join(f"{k}: {v}" for k, v in r["targets"].items())
    print(f"{r['op']:14} {r['quant']:8} {r['hidden']:>5} {r['us']:8.1f} us {r['gbs']:7.0f} GB/s {r['pct_copy']:6.1f} "
          f"%copy {r['floor_ratio']:6.2f} xfloor {r['vs_compile']:6.2f} xcompile valid={r['valid']!s:5} {t}",
          flush=True)


COLUMNS = (("op", "op", "{}"), ("output", "quant", "{}"), ("hidden", "hidden", "{}"), ("µs", "us", "{:.1f}"),
           ("% copy BW", "pct_copy", "{:.1f}"), ("× byte floor", "floor_ratio", "{:.2f}"),
           ("× torch.compile", "vs_compile", "{:.2f}"), ("targets", "targets_text", "{}"))


def write_report(doc, out_dir):
    """bench_norm.md (the table, MET / NOT MET per target) and bench_norm.png (% of copy bandwidth per case against
    the targets' lines) beside the JSON."""
    rows = [dict(r, targets_text=", ".join(f"{k}: {v}" for k, v in r["targets"].items()) or "-")
            for r in doc["rows"]]
    met = sum(v == "MET" for r in rows for v in r["targets"].values())
    total = sum(len(r["targets"]) for r in rows)
    lines = [f"# bench_norm on {doc['device']}", "",
             f"Copy bandwidth {doc['copy']['gbs']:.0f} GB/s; {met} of {total} targets met.", ""]
    lines += H.markdown_table(COLUMNS, rows)
    with open(os.path.join(out_dir, "bench_norm.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for ax, h in zip(axes, sorted({r["hidden"] for r in rows})):
        sub = [r for r in rows if r["hidden"] == h]
        groups = [f"{r['op'].replace('layernorm', 'ln').replace('rmsnorm', 'rms').replace('_', ' ')}\n{r['quant']}" for r in sub]
        H.grouped_bars(ax, groups, {"ours": [r["pct_copy"] for r in sub]}, value_fmt="{:.0f}")
        ax.axhline(88, color="tab:green", ls="--", lw=1, label="forward target 88 %")
        ax.axhline(80, color="tab:orange", ls=":", lw=1, label="backward target 80 %")
        ax.set_title(f"16384 x {h}, bf16 in")
        ax.tick_params(axis="x", labelsize=6)
    axes[0].set_ylabel("% of copy bandwidth")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "bench_norm.png"), dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out-dir", default="benchmarks/results/norm")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU: checks the script, times nothing")
    ap.add_argument("--render", metavar="JSON", help="only write the table and plot of an earlier run's JSON")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            write_report(json.load(f), args.out_dir)
        return 0
    global ROWS, HIDDENS
    if args.cpu_smoke:
        ROWS, HIDDENS = 64, (256,)
    elif not torch.cuda.is_available():
        print("bench_norm: needs CUDA")
        return 2
    import transformer_engine_torch as tex
    from tests.ref.normalization import norm_output_f32

    dev = "cpu" if args.cpu_smoke else "cuda"
    timer = H.Timer(quick=args.quick, device=dev)
    copy = H.measure_copy_bandwidth(timer, shape=(ROWS, HIDDENS[-1]))
    bw = copy["gbs"]
    print(f"copy bandwidth {bw:.0f} GB/s ({timer.method})")
    rows_out = []
    ok = True
    compiled = {}

    def compiled_us(key, *args):
        """torch.compile of the same math (one compiled function per case kind, reused over the hidden sizes)."""
        if key not in compiled:
            if key[0] == "bwd":
                compiled[key] = torch.compile(lambda dz, x, mu, rs, g, k=key[1]: torch_norm_bwd(k, dz, x, mu, rs, g))
            elif key[2]:
                compiled[key] = torch.compile(
                    lambda x, g, b, k=key[1]: torch_norm(k, x, g, b)[0].to(torch.bfloat16))
            else:
                compiled[key] = torch.compile(lambda x, g, b, k=key[1]: torch_fp8(torch_norm(k, x, g, b)[0], 3.0))
        try:
            return timer.gpu_us(lambda: compiled[key](*args))
        except Exception as e:  # noqa: BLE001
            print(f"torch.compile failed: {e}")
            return float("nan")
    e4 = tex.DType.kFloat8E4M3

    def quantizer(kind):
        if kind == "delayed":
            return tex.Float8Quantizer(torch.tensor([3.0], device=dev), torch.zeros(1, device=dev), e4,
                                       columnwise=False)
        if kind == "current":
            return tex.Float8CurrentScalingQuantizer(e4, columnwise=False)
        if kind == "mxfp8":
            return tex.MXFP8Quantizer(e4, columnwise=False)
        return None

    for h in HIDDENS:
        g = torch.Generator(device=dev).manual_seed(h)
        x = torch.randn(ROWS, h, device=dev, dtype=torch.bfloat16, generator=g)
        gamma = torch.randn(h, device=dev, generator=g)
        beta = torch.randn(h, device=dev, generator=g)
        dz = torch.randn(ROWS, h, device=dev, dtype=torch.bfloat16, generator=g)
        n = x.numel()
        for kind in ("rms", "ln"):
            def fwd(q, otype=torch.bfloat16):
                if kind == "ln":
                    return tex.layernorm_fwd(x, gamma, beta, EPS, None, q, otype, 0, False)
                return tex.rmsnorm_fwd(x, gamma, EPS, None, q, otype, 0, False)

            for qk in ("plain", "delayed", "current", "mxfp8"):
                q = quantizer(qk)
                out, mu, rs = fwd(q)
                # Validation: the op's bytes equal tex.quantize of the FP32 y of its own statistics.
                y = norm_output_f32(x, None if kind == "rms" else mu, rs, gamma, None if kind == "rms" else beta)
                try:
                    if q is None:
                        assert torch.equal(out, y.to(torch.bfloat16))
                    else:
                        ref = tex.quantize(y, quantizer(qk))
                        for k, v in vars(ref).items():
                            if isinstance(v, torch.Tensor) and k != "_amax":
                                assert torch.equal(getattr(out, k), v), k
                    valid = True
                except AssertionError as e:
                    valid, ok = False, False
                    print(f"VALIDATION FAILED {kind} {qk} h={h}: {e}")
                us = timer.gpu_us(lambda: fwd(q))
                floor_b = {"plain": 4, "delayed": 3, "current": 5, "mxfp8": 3 + 1 / 32}[qk] * n
                tc_us = compiled_us(("fwd", kind, qk == "plain"), x, gamma, beta)
                gbs = floor_b / us / 1e3
                row = {"op": ("layernorm" if kind == "ln" else "rmsnorm") + "_fwd", "quant": qk, "hidden": h, "rows": ROWS, "us": us, "gbs": gbs,
                       "pct_copy": 100 * gbs / bw, "floor_ratio": us / (floor_b / bw / 1e3),
                       "vs_compile": tc_us / us, "valid": valid}
                # Issue 35: >= 1.5x torch.compile for every QUANTIZED output (plain bf16 is bounded by the copy).
                targets = [] if qk == "plain" else [("vs_compile >= 1.5", row["vs_compile"] >= 1.5)]
                if kind == "rms" and qk == "current":
                    targets.append(("floor_ratio <= 1.1", row["floor_ratio"] <= 1.1))
                if qk in ("delayed", "mxfp8"):
                    targets.append(("pct_copy >= 88", row["pct_copy"] >= 88))
                row["targets"] = {t: ("MET" if m else "NOT MET") for t, m in targets}
                rows_out.append(row)
                print_row(row)
            _, mu, rs = fwd(None, torch.float32)

            def bwd():
                if kind == "ln":
                    return tex.layernorm_bwd(dz, x, mu, rs, gamma, 0, False)
                return tex.rmsnorm_bwd(dz, x, rs, gamma, 0, False)

            res = bwd()
            mu2 = None if kind == "rms" else mu[:, None]
            r64 = torch_norm_bwd(kind, dz.double(), x.double(), None if mu2 is None else mu2.double(),
                                 rs[:, None].double(), gamma.double())
            valid = bool(torch.allclose(res[0].double(), r64[0].double(), rtol=2e-2, atol=5e-2)
                         and torch.allclose(res[1].double(), r64[1], rtol=1e-3, atol=1e-1))
            ok = ok and valid
            us = timer.gpu_us(bwd)
            floor_b = 6 * n  # read dz, x; write dx (bf16)
            tc_us = compiled_us(("bwd", kind), dz, x, mu2, rs[:, None], gamma)
            gbs = floor_b / us / 1e3
            row = {"op": ("layernorm" if kind == "ln" else "rmsnorm") + "_bwd", "quant": "-", "hidden": h, "rows": ROWS, "us": us, "gbs": gbs,
                   "pct_copy": 100 * gbs / bw, "floor_ratio": us / (floor_b / bw / 1e3), "vs_compile": tc_us / us,
                   "valid": valid}
            row["targets"] = {"pct_copy >= 80": "MET" if row["pct_copy"] >= 80 else "NOT MET"}
            rows_out.append(row)
            print_row(row)
    print(f"{sum(v == 'MET' for r in rows_out for v in r['targets'].values())} targets met of "
          f"{sum(len(r['targets']) for r in rows_out)}")
    os.makedirs(args.out_dir, exist_ok=True)
    doc = {"device": "cpu" if args.cpu_smoke else torch.cuda.get_device_name(), "copy": copy, "rows": rows_out}
    with open(os.path.join(args.out_dir, "bench_norm.json"), "w") as f:
        json.dump(doc, f, indent=1)
    write_report(doc, args.out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
