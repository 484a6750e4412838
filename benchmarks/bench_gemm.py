#!/usr/bin/env python3
"""GEMM benchmark for transformer_engine_torch (issue 4 acceptance, issue 19 item 5).

For each shape M x N x K (D [M, N] = X [M, K] . W [N, K]^T, the TN fprop), one run on one GPU:
  1. VALIDATES first: our FP8 GEMM (current-scaling E4M3 operands, bf16 out) is within the E4M3 tolerance of the
     float64 product of the dequantized operands (512 rows) and is compared bit for bit with torch._scaled_mm on the
     same bytes and scales (equal bits = the same cuBLASLt kernel); likewise our FP8 block GEMM (1x128 activations x
     128x128 weights, native cuBLASLt block scaling on sm_90) against its float64 product and torch's block-scaled
     _scaled_mm where the installed torch has one; our bf16 GEMM against torch.matmul; the fused bias+GELU epilogue
     against matmul + bias + tanh-GELU;
  2. times ours and its torch peer INTERLEAVED (benchmarks/_harness.py: ours, peer, peer, ours, ... on the same
     inputs, a 256 MB write before every call to flush L2, 0.1 ms of GPU spin so the host's launch cost stays out)
     and reports the median of the per-pair speed ratios (peer us / ours us, above 1 = ours faster) with its
     10th-90th percentile and min-max spread: FP8 with fast accumulation and with split accumulation against
     _scaled_mm with the same flag, FP8 block against torch's block-scaled _scaled_mm, bf16 against torch.matmul,
     the fused bias+GELU epilogue against the separate ops; on the small shape also the host's time per call;
  3. logs what cuBLASLt was asked and ran for ours and for torch on every shape (its logger, in process): the
     descriptors, the heuristic request and the kernel chosen, and says whether they differ;
  4. prints the table and the targets (ours >= 0.99x _scaled_mm on every large shape, fused epilogue faster than
     separate), and writes gemm.json / gemm.md / gemm.png under benchmarks/results/<gpu>/.

Exit status: 0 when every row validated, 1 when a validation failed, 2 when no CUDA device or extension.
    python benchmarks/bench_gemm.py [--quick] [--pairs N] [--shape MxNxK]... [--cpu-smoke]
"""
import argparse
import ctypes
import os
import re
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402
import baselines as B  # noqa: E402

SHAPES = [(8192, 8192, 8192), (16384, 8192, 28672), (4096, 4096, 16384), (1024, 2048, 1024)]
LARGE = {(8192, 8192, 8192), (16384, 8192, 28672), (4096, 4096, 16384)}
SMOKE_SHAPES = [(128, 256, 256)]  # --cpu-smoke (torch._scaled_mm on the CPU takes about a second per call)
TARGET = 0.99  # issue 19 item 5: ours >= 0.99x _scaled_mm (same flags) on every large shape
SLEEP_CYCLES = 200_000  # ~0.1 ms of GPU spin before each timed call (the host enqueues the call meanwhile)
REF_ROWS = 512  # rows of the float64 reference product


def shape_name(s):
    return "x".join(map(str, s))


def parse_shape(text):
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"shape {text!r} is not MxNxK")
    return tuple(int(p) for p in parts)


# ----------------------------------------------------------------------------------------------------------
# cuBLASLt's logger, in process: what was asked and which kernel ran, per call
# ----------------------------------------------------------------------------------------------------------
_POINTER = re.compile(r"0[xX][0-9a-fA-F]{8,}")  # device and host addresses (values print as short hex or decimal)


def mapped_cublaslt():
    """Paths of every libcublasLt mapped into this process (two paths = torch and the extension load different
    copies, a difference worth knowing when their kernels differ)."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "libcublasLt" in line and "/" in line})
    except OSError:
        return []


class LtLog:
    """cublasLtLoggerSetCallback on every mapped libcublasLt: messages (function, text with addresses blanked) of
    the calls made while `record` is open, everything (mask 31: errors, trace, hints, info, API trace). The
    logger's own printing goes to /dev/null (cublasLtLoggerOpenFile); the callback still gets every message."""

    _PROTO = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)

    def __init__(self):
        self.libs = []
        self.messages = None
        self._cb = self._PROTO(self._on_message)  # kept alive: cuBLASLt holds the raw pointer
        for path in mapped_cublaslt():
            lib = ctypes.CDLL(path)
            lib.cublasLtLoggerSetCallback.argtypes = [self._PROTO]
            lib.cublasLtLoggerSetMask.argtypes = [ctypes.c_int]
            lib.cublasLtLoggerOpenFile.argtypes = [ctypes.c_char_p]
            if lib.cublasLtLoggerSetCallback(self._cb) == 0 and lib.cublasLtLoggerOpenFile(os.devnull.encode()) == 0:
                self.libs.append(lib)
        if not self.libs:
            raise RuntimeError(f"no libcublasLt accepted a logger callback (mapped: {mapped_cublaslt() or 'none'})")

    def _on_message(self, level, func, msg):
        if self.messages is not None and not func.startswith(b"cublasLtLogger"):
            self.messages.append((func.decode(errors="replace"), _POINTER.sub("0x*", msg.decode(errors="replace"))))

    def record(self, fn):
        """Messages of one call of fn (synchronised), logging off again afterwards."""
        self.messages = []
        for lib in self.libs:
            lib.cublasLtLoggerSetMask(31)
        try:
            fn()
            torch.cuda.synchronize()
        finally:
            for lib in self.libs:
                lib.cublasLtLoggerSetMask(0)
        out, self.messages = self.messages, None
        return out


def _fields(text):
    """Top-level key=value fields of a cuBLASLt log message (brackets nest)."""
    out, depth, cur = {}, 0, ""
    for ch in text + " ":
        if ch == " " and depth == 0:
            if "=" in cur:
                k, v = cur.split("=", 1)
                out[k] = v
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        cur += ch
    return out


def compare_calls(ours, peer):
    """What differs between two calls' logs: the fields of the matmul (descriptors, algo, workspace) and of the
    heuristic request (each merged over that function's messages), and messages (attribute settings, layouts) that
    only one side sent."""
    def merged(msgs, name):
        out = None
        for f, m in msgs:
            if f == name:
                out = {**(out or {}), **_fields(m)}
        return out

    diffs = []
    for name in ("cublasLtMatmul", "cublasLtMatmulAlgoGetHeuristic"):
        fa, fb = merged(ours, name), merged(peer, name)
        if fa is None or fb is None:
            if fa is not None or fb is not None:
                diffs.append(f"{name} logged by {'ours' if fa is not None else 'torch'} only")
            continue
        for k in sorted(set(fa) | set(fb)):
            if fa.get(k) != fb.get(k):
                diffs.append(f"{name} {k}: ours {fa.get(k)} / torch {fb.get(k)}")
    skip = ("cublasLtMatmul:", "cublasLtMatmulAlgoGetHeuristic:")
    only_o = sorted({f"{f}: {m}" for f, m in ours} - {f"{f}: {m}" for f, m in peer})
    only_p = sorted({f"{f}: {m}" for f, m in peer} - {f"{f}: {m}" for f, m in ours})
    algo_o = (merged(ours, "cublasLtMatmul") or {}).get("algo")
    algo_p = (merged(peer, "cublasLtMatmul") or {}).get("algo")
    return {"algo_ours": algo_o, "algo_peer": algo_p, "same_kernel": algo_o is not None and algo_o == algo_p,
            "differences": diffs, "messages_only_ours": [m for m in only_o if not m.startswith(skip)],
            "messages_only_peer": [m for m in only_p if not m.startswith(skip)],
            "ours_log": [f"{f}: {m}" for f, m in ours], "peer_log": [f"{f}: {m}" for f, m in peer]}


# ----------------------------------------------------------------------------------------------------------
# One shape
# ----------------------------------------------------------------------------------------------------------
def probe_block_peer(tex, fb1, fb2, device):
    """The torch call that runs a 1x128 x 128x128 block-scaled GEMM on our bytes, tried on a tiny problem: (fn, name)
    or (None, 'peer not available in torch X (why)')."""
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(256, 512, device=device, dtype=torch.bfloat16, generator=g)
    w = torch.randn(256, 512, device=device, dtype=torch.bfloat16, generator=g)
    Xb, Wb = fb1(x), fb2(w)
    ours = tex.general_gemm(Wb, Xb, out_dtype=torch.bfloat16)[0].float()
    why = []
    for name, fn in (("torch._scaled_mm", B.scaled_mm_blockwise), ("F.scaled_mm", B.scaled_mm_blockwise_v2)):
        try:
            out = fn(B.blockwise_peer_operands(Xb, Wb)).float()
            if torch.allclose(out, ours, rtol=1.6e-2, atol=1e-2):
                return fn, name
            why.append(f"{name} differs from ours by {(out - ours).abs().max().item():.3g}")
        except Exception as e:
            why.append(f"{name}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}")
    return None, f"peer not available in torch {torch.__version__} ({'; '.join(why)})"


def ref_close(out, Xq, Wq, rtol, atol):
    """out's first REF_ROWS rows within (rtol, atol) of the float64 product of the dequantized operands."""
    r = min(REF_ROWS, out.shape[0])
    ref = Xq.dequantize(torch.float32)[:r].double() @ Wq.dequantize(torch.float32).double().t()
    return bool(torch.allclose(out[:r].double(), ref, rtol=rtol, atol=atol))


def run_shape(shape, ctx):
    """Rows of one shape: one per comparison (ours vs its torch peer), validated, then timed interleaved."""
    tex, dev, args = ctx["tex"], ctx["device"], ctx["args"]
    M, N, K = shape
    name = shape_name(shape)
    flops = 2.0 * M * N * K
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g) / K ** 0.5
    bias = torch.randn(N, device=dev, dtype=torch.bfloat16, generator=g)
    X, W = ctx["cs"](x), ctx["cs"](w)
    Xb, Wb = ctx["fb1"](x), ctx["fb2"](w)
    block_ops = B.blockwise_peer_operands(Xb, Wb) if ctx["block_peer"] else None
    r = min(REF_ROWS, M)

    def close64(out, epilogue):
        """bf16 output within bf16 tolerance of epilogue(X W^T) in float64 on the first rows."""
        ref = epilogue(x[:r].double() @ w.double().t())
        return bool(torch.allclose(out[:r].double(), ref, rtol=1.6e-2, atol=2e-2))

    def ours_fp8(fast):
        return lambda: tex.general_gemm(W, X, out_dtype=torch.bfloat16, use_split_accumulator=not fast)[0]

    def smm(fast):
        return lambda: B.scaled_mm_tensorwise(X, W, fast)

    comparisons = [  # (label, ours, peer, peer name, validation of ours: fn(out) -> bool)
        ("FP8 fast accum", ours_fp8(True), smm(True), "torch._scaled_mm",
         lambda o: ref_close(o, X, W, *B.TOL_E4M3)),
        ("FP8 split accum", ours_fp8(False), smm(False), "torch._scaled_mm",
         lambda o: ref_close(o, X, W, *B.TOL_E4M3)),
        ("FP8 block 1x128 x 128x128", lambda: tex.general_gemm(Wb, Xb, out_dtype=torch.bfloat16)[0],
         (lambda: ctx["block_peer"](block_ops)) if block_ops is not None else None, ctx["block_peer_name"] or "-",
         lambda o: ref_close(o, Xb, Wb, 1.6e-2, 1e-2)),  # bf16 output of an exact product
        ("bf16", lambda: tex.general_gemm(w, x)[0], lambda: torch.matmul(x, w.t()), "torch.matmul",
         lambda o: close64(o, lambda h: h)),
        ("bf16 + bias + GELU", lambda: tex.general_gemm(w, x, bias=bias, gelu=True)[0],
         lambda: F.gelu(torch.matmul(x, w.t()) + bias, approximate="tanh"), "matmul, + bias, F.gelu",
         lambda o: close64(o, lambda h: F.gelu(h + bias.double(), approximate="tanh"))),
    ]
    rows = []
    for label, ours, peer, peer_name, check in comparisons:
        row = {"shape": name, "M": M, "N": N, "K": K, "comparison": label, "peer": peer_name, "large": shape in LARGE,
               "valid": False, "same_bits": None, "ours_us": None, "peer_us": None, "ours_tflops": None,
               "peer_tflops": None, "ratio_median": None, "ratio_p10": None, "ratio_p90": None, "ratio_min": None,
               "ratio_max": None, "pairs": 0, "ours_e2e_us": None, "peer_e2e_us": None, "note": ""}
        rows.append(row)
        try:
            o = ours()
            row["valid"] = check(o)
        except Exception as e:
            row["note"] = f"ours raised {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            H.log(f"FAIL  {name} {label}: {row['note']}")
            continue
        if peer is None:
            row["note"] = ctx["block_peer_why"]
        else:
            try:
                p = peer()
                row["same_bits"] = bool(torch.equal(o, p))
                if not row["same_bits"] and not torch.allclose(o.float(), p.float(), rtol=1.6e-2, atol=2e-2):
                    row["note"] = f"{peer_name} differs from ours beyond the bf16 tolerance"
                del p
            except Exception as e:
                row["note"] = f"{peer_name} raised {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
                peer = None
        del o
        if not row["valid"]:
            H.log(f"FAIL  {name} {label}: ours is outside the tolerance of the float64 reference")
            continue
        fns = {"ours": ours} if peer is None else {"ours": ours, "peer": peer}
        times = H.interleaved(fns, ctx["pairs"], warmup=3, device=dev, sleep_cycles=SLEEP_CYCLES)
        row["ours_us"] = H.spread(times["ours"])["median"]
        row["ours_tflops"] = flops / row["ours_us"] / 1e6
        row["pairs"] = len(times["ours"])
        if peer is not None:
            row["peer_us"] = H.spread(times["peer"])["median"]
            row["peer_tflops"] = flops / row["peer_us"] / 1e6
            s = H.spread(H.pair_ratios(times, "ours", "peer"))
            row.update(ratio_median=s["median"], ratio_p10=s["p10"], ratio_p90=s["p90"], ratio_min=s["min"],
                       ratio_max=s["max"])
            if shape not in LARGE and label.startswith("FP8 fast") and dev == "cuda":
                # launch-bound shape: the host's cost per call as a model sees it (host loop, then one sync)
                row["ours_e2e_us"] = ctx["timer"].e2e_us(ours)
                row["peer_e2e_us"] = ctx["timer"].e2e_us(peer)
        H.log(f"ok    {name} {label}: ours {row['ours_us']:.1f} us" + (
            f", {peer_name} {row['peer_us']:.1f} us, ours/peer {row['ratio_median']:.3f} "
            f"[{row['ratio_p10']:.3f}, {row['ratio_p90']:.3f}]" if peer is not None else f" (no peer: {row['note']})"))

    algo = {}
    if ctx["ltlog"] is not None:
        for label, ours, peer, _, _ in comparisons[:3]:
            if peer is not None:
                try:
                    algo[label] = compare_calls(ctx["ltlog"].record(ours), ctx["ltlog"].record(peer))
                except Exception as e:  # the log is a diagnosis: it must not cost the run its numbers
                    H.log(f"warn  {name} {label}: cuBLASLt log failed: {type(e).__name__}: {e}")
    del x, w, X, W, Xb, Wb, block_ops
    if dev == "cuda":
        torch.cuda.empty_cache()
    return rows, algo


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------
COLUMNS = [
    ("shape MxNxK", "shape", "{}"),
    ("comparison", "comparison", "{}"),
    ("ours us", "ours_us", "{:.1f}"),
    ("peer us", "peer_us", "{:.1f}"),
    ("ours TFLOP/s", "ours_tflops", "{:.1f}"),
    ("peer TFLOP/s", "peer_tflops", "{:.1f}"),
    ("ours/peer", "ratio_median", "{:.3f}"),
    ("p10", "ratio_p10", "{:.3f}"),
    ("p90", "ratio_p90", "{:.3f}"),
    ("min", "ratio_min", "{:.3f}"),
    ("max", "ratio_max", "{:.3f}"),
    ("same bits", "same_bits", "{}"),
    ("ours e2e us", "ours_e2e_us", "{:.1f}"),
    ("peer e2e us", "peer_e2e_us", "{:.1f}"),
    ("peer", "peer", "{}"),
]


def evaluate_targets(report):
    for r in report.rows:
        if r["comparison"].startswith("FP8 ") and "block" not in r["comparison"] and r["large"]:
            report.at_least(f"ours FP8 ({r['comparison']}) >= {TARGET}x _scaled_mm on {r['shape']}", r["ratio_median"],
                            TARGET, "{:.3f}x (median of per-pair ratios, p10-p90 " +
                            (f"{r['ratio_p10']:.3f}-{r['ratio_p90']:.3f})" if r["ratio_p10"] else "-)"),
                            f">= {TARGET}x")
    for r in report.rows:
        if r["comparison"] == "bf16 + bias + GELU":
            report.at_least(f"fused bias+GELU faster than separate ops on {r['shape']}", r["ratio_median"], 1.0 + 1e-9,
                            "{:.2f}x", "> 1x")


def queue_plot(report):
    rows = report.rows
    shapes = list(dict.fromkeys(r["shape"] for r in rows))

    def get(comp, key):
        by = {r["shape"]: r for r in rows if r["comparison"] == comp}
        return [by[s][key] if s in by else None for s in shapes]

    def draw(fig):
        ax = fig.add_subplot(1, 2, 1)
        series = {"ours FP8 (fast acc.)": get("FP8 fast accum", "ours_tflops"),
                  "_scaled_mm FP8 (fast acc.)": get("FP8 fast accum", "peer_tflops"),
                  "ours FP8 (split acc.)": get("FP8 split accum", "ours_tflops"),
                  "_scaled_mm FP8 (split acc.)": get("FP8 split accum", "peer_tflops"),
                  "ours FP8 block": get("FP8 block 1x128 x 128x128", "ours_tflops"),
                  "torch FP8 block": get("FP8 block 1x128 x 128x128", "peer_tflops"),
                  "ours bf16": get("bf16", "ours_tflops"), "torch.matmul bf16": get("bf16", "peer_tflops")}
        H.grouped_bars(ax, shapes, series, colors={
            "ours FP8 (fast acc.)": "tab:green", "_scaled_mm FP8 (fast acc.)": "tab:blue",
            "ours FP8 (split acc.)": "yellowgreen", "_scaled_mm FP8 (split acc.)": "lightsteelblue",
            "ours FP8 block": "darkgreen", "torch FP8 block": "navy", "ours bf16": "tab:olive",
            "torch.matmul bf16": "tab:gray"})
        ax.set_ylabel("TFLOP/s (2MNK / median time)")
        ax.set_title("GEMM throughput, TN, bf16 output", fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax = fig.add_subplot(1, 2, 2)
        comps = ["FP8 fast accum", "FP8 split accum", "FP8 block 1x128 x 128x128", "bf16", "bf16 + bias + GELU"]
        H.grouped_bars(ax, shapes, {c: get(c, "ratio_median") for c in comps},
                       errors={c: (get(c, "ratio_p10"), get(c, "ratio_p90")) for c in comps})
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(TARGET, color="tab:red", linestyle="--", linewidth=0.8, label=f"target {TARGET}")
        vals = [v for c in comps for v in get(c, "ratio_p10") + get(c, "ratio_p90") if v is not None]
        if vals:
            ax.set_ylim(min(0.9, min(vals) - 0.02), max(1.1, max(vals) + 0.02))
        ax.set_ylabel("ours / torch peer, per interleaved pair (median, p10-p90)")
        ax.set_title("Speed ratio against the torch peer (> 1: ours faster)", fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)

    if rows:
        report.plot("gemm", draw, figsize=(15, 5.5))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer interleaved pairs (10 instead of --pairs)")
    p.add_argument("--pairs", type=int, default=40, help="interleaved pairs per comparison (default 40)")
    p.add_argument("--shape", type=parse_shape, action="append", metavar="MxNxK",
                   help="shapes to run (repeatable; default the four of the issue). A run with --shape writes no "
                        "report under benchmarks/results/ unless --out-dir is given")
    p.add_argument("--no-algo-log", action="store_true", help="skip the cuBLASLt logger comparison")
    H.add_output_args(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    device, tex = H.start(args, "bench_gemm")
    if tex is None:
        return 2
    shapes = args.shape or (SMOKE_SHAPES if args.cpu_smoke else SHAPES)
    pairs = 2 if args.cpu_smoke else (10 if args.quick else args.pairs)
    cs = tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, columnwise=False)
    # FP8 blocks as training uses them: activations 1x128, weights 128x128 (SPEC 4.7); native on sm_90.
    fb1 = tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, columnwise=False, block_scaling_dim=1)
    fb2 = tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, columnwise=False, block_scaling_dim=2)
    name = H.device_name(device)
    native = "n/a"
    if device == "cuda":
        from transformer_engine_torch import _device

        native = "Float8BlockwiseQTensor" in _device.native_gemm_formats(torch.cuda.current_device())
    block_peer, block_peer_name = probe_block_peer(tex, fb1, fb2, device)
    ltlog, lt_note = None, "skipped (--no-algo-log)" if args.no_algo_log else "CPU run"
    if device == "cuda" and not args.no_algo_log:
        try:
            ltlog, lt_note = LtLog(), "cublasLtLoggerSetCallback, mask 31"
        except Exception as e:
            lt_note = f"not available: {type(e).__name__}: {e}"
    report = H.Report("gemm", {
        "device": name, "cublaslt_ours": tex.get_cublasLt_version(), "cublaslt_mapped": mapped_cublaslt(),
        "timing": f"interleaved pairs ({pairs} per comparison), CUDA events, {H.FLUSH_BYTES >> 20} MB L2 flush and "
                  f"{SLEEP_CYCLES} cycles of GPU spin before each call" if device == "cuda" else "CPU smoke",
        "fp8_block_native": native, "fp8_block_peer": block_peer_name, "algo_log": lt_note,
        "quick": args.quick, "cpu_smoke": args.cpu_smoke})
    H.log(f"device {name}, torch {torch.__version__}, cuBLASLt (ours) {report.meta['cublaslt_ours']}, mapped "
          f"{report.meta['cublaslt_mapped'] or '-'}; FP8 block peer: {block_peer_name}; logger: {lt_note}")
    ctx = {"tex": tex, "device": device, "args": args, "pairs": pairs, "cs": cs, "fb1": fb1, "fb2": fb2,
           "block_peer": block_peer, "block_peer_name": block_peer_name if block_peer else None,
           "block_peer_why": block_peer_name,
           "timer": H.Timer(args.quick, device), "ltlog": ltlog}
    algo = {}
    for shape in shapes:
        rows, algo[shape_name(shape)] = run_shape(shape, ctx)
        report.rows += rows
    report.extra["cublaslt_calls"] = algo

    report.emit()
    report.emit(f"{name}: ours vs its torch peer on the same operands, timed interleaved (ours/peer = peer us / ours "
                f"us per pair: median, 10th-90th percentile, min-max; > 1 means ours is faster); TFLOP/s = 2MNK / "
                f"median us; same bits = outputs bit-identical; e2e = host loop then one sync, per call")
    report.table(COLUMNS, invalid_keep=2)
    if algo and any(algo.values()):
        report.emit("\ncuBLASLt calls, ours vs torch (cuBLASLt's logger; addresses blanked):")
        for shp, per in algo.items():
            for label, c in per.items():
                verdict = ("same kernel" if c["same_kernel"] else "kernel not in the log"
                           if c["algo_ours"] is None and c["algo_peer"] is None else "DIFFERENT kernel")
                report.emit(f"  {shp} {label}: {verdict}; ours algo={c['algo_ours']}"
                            + ("" if c["same_kernel"] else f"; torch algo={c['algo_peer']}"))
                for d in c["differences"]:
                    report.emit(f"      differs: {d}")
                for m in c["messages_only_ours"][:8]:
                    report.emit(f"      only ours: {m[:220]}")
                for m in c["messages_only_peer"][:8]:
                    report.emit(f"      only torch: {m[:220]}")
    evaluate_targets(report)
    report.print_targets("Targets (issue 19 item 5; issue 4):")
    failed = [r for r in report.rows if not r["valid"]]
    for r in failed:
        report.emit(f"VALIDATION FAILED: {r['shape']} {r['comparison']}: {r['note'] or 'outside tolerance'}")
    for r in report.rows:
        if r["valid"] and r["note"]:
            report.emit(f"note: {r['shape']} {r['comparison']}: {r['note']}")
    report.summary("rows", time.perf_counter() - t_start, args.cpu_smoke)
    queue_plot(report)
    report.save(H.out_dir_of(args, partial=bool(args.shape)), json_path=args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
