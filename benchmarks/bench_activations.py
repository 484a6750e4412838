#!/usr/bin/env python3
"""Activation / cast benchmark for transformer_engine_torch (issues 2 and 3 acceptance, shared/ANCHORS.md targets).

One run on one GPU:
  1. measures device-to-device copy bandwidth (read + write bytes) on a 268 MB bf16 buffer;
  2. for every case (op x quantizer x size) VALIDATES our op against a pure-PyTorch reference of the same
     math (benchmarks/baselines.py), then times ours, PyTorch eager and torch.compile of that reference (triton
     do_bench median, L2 flushed between calls, randn inputs far larger than L2);
  3. prints one table (us, GB/s, % of copy bandwidth, ratio to the SPEC 5.3 byte floor, speed-up over
     torch.compile), checks the ANCHORS.md targets (MET / NOT MET) and writes the report (JSON, Markdown and
     plots of achieved bandwidth against the copy bandwidth) under benchmarks/results/<gpu>/ (benchmarks/_harness.py).

Exit status: 0 when every measured row validated (missed targets do not fail the run), 1 when any row
failed validation or could not be validated, 2 when the run could not start (no CUDA, no extension).

Run from the repository root after building in place:
    python benchmarks/bench_activations.py [--quick] [--only SUBSTR] [--csv PATH] [--json PATH] [--cpu-smoke]

This file holds the cases only: timer, ceiling, poisoning and report come from _harness.py, the reference math and
the validation from baselines.py (importable without the extension or a GPU).
"""

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402
from baselines import (E4M3_MAX, ValidationError, act_f32, compare_outputs, make_reference,  # noqa: E402
                       ours_outputs)

tex = None  # transformer_engine_torch, bound in main() so that --list and the baselines need no extension

BIG = (16384, 8192)  # 268 MB of bf16: far larger than the 50-60 MB L2 of H100/H200
SMALL = (256, 4096)  # launch-bound case; its target is end-to-end wall time
SMOKE_SIZES = ((256, 512), (128, 256))  # --cpu-smoke: (big, small) stand-ins; multiples of the block sizes


# ----------------------------------------------------------------------------------------------------------
# Cases. bytes_per_elt = SPEC 5.3 minimum bytes per OUTPUT element, bf16 input (gated ops read 2 per output).
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CaseSpec:
    op: str  # gelu | swiglu | dgelu | dbias_dgelu | quantize
    quant: object  # None | "delayed" | "current" | "mxfp8" | "fp8block" | "nvfp4"
    columnwise: bool  # also write the columnwise FP8 copy (transposed for FP8 per-tensor, same shape for MXFP8)
    bytes_per_elt: float


CASE_SPECS = [
    CaseSpec("gelu", None, False, 4),  # 2 read x + 2 write y
    CaseSpec("gelu", "delayed", False, 3),  # 2 read x + 1 write q
    CaseSpec("gelu", "delayed", True, 4),  # 2 read x + 1 write q + 1 write q^T
    CaseSpec("gelu", "current", False, 5),  # 2 read x (amax pass) + 2 read x (recompute) + 1 write q
    CaseSpec("swiglu", None, False, 6),  # 4 read [a|b] + 2 write y
    CaseSpec("swiglu", "delayed", False, 5),  # 4 read [a|b] + 1 write q
    CaseSpec("swiglu", "current", False, 9),  # 4 read (amax pass) + 4 read (recompute) + 1 write q
    CaseSpec("dgelu", None, False, 6),  # 2 read grad + 2 read x + 2 write dx
    CaseSpec("dgelu", "delayed", False, 5),  # 2 + 2 read + 1 write q
    CaseSpec("dgelu", "current", False, 9),  # (2 + 2) amax pass + (2 + 2) recompute + 1 write q
    CaseSpec("dbias_dgelu", None, False, 6),  # 2 + 2 read + 2 write dx (+ dbias partials, negligible)
    CaseSpec("dbias_dgelu", "delayed", False, 5),  # 2 + 2 read + 1 write q (+ dbias partials)
    CaseSpec("dbias_dgelu", "current", False, 9),  # (2 + 2) amax pass + (2 + 2) + 1 write q (+ dbias)
    # tex.quantize with no quantizer does not exist: no plain row
    CaseSpec("quantize", "delayed", False, 3),  # 2 read x + 1 write q
    CaseSpec("quantize", "delayed", True, 4),  # 2 read x + 1 write q + 1 write q^T
    CaseSpec("quantize", "current", False, 5),  # 2 read x (amax) + 2 read x (cast) + 1 write q
    # MXFP8 (FULLY_FUSED): one pass; E8M0 scales are 1 byte per 32 elements per copy
    CaseSpec("gelu", "mxfp8", False, 2 + 1 + 1 / 32),  # 2 read x + 1 write q + 1/32 scale
    CaseSpec("gelu", "mxfp8", True, 2 + 2 + 2 / 32),  # 2 read x + 1 + 1 write (both copies) + 2/32 scales
    CaseSpec("swiglu", "mxfp8", False, 4 + 1 + 1 / 32),  # 4 read [a|b] + 1 write q + 1/32 scale
    # FP8 block 1x128 with the columnwise (transposed) copy: one pass; float32 scales, 4 bytes per 128 per copy
    CaseSpec("quantize", "fp8block", True, 2 + 2 + 8 / 128),  # 2 read x + 1 + 1 write (both copies) + scales
    # NVFP4 (FUSED_ACTIVATION_AMAX_NVFP4): amax pass, then recompute + cast; 1/2 byte per element per copy, one
    # E4M3 scale per 16 elements per copy
    CaseSpec("gelu", "nvfp4", False, 2 + 2 + 1 / 2 + 1 / 16),  # two reads of x + packed codes + scales
    CaseSpec("gelu", "nvfp4", True, 2 + 2 + 1 + 2 / 16),  # both copies (columnwise transposed)
    # The backward's casts with both copies (what an MLP backward feeds its dgrad and wgrad GEMMs; issue 34 item 2):
    # dact (+ dbias) of grad and x, written rowwise and columnwise in every format with a columnwise copy
    CaseSpec("dgelu", "delayed", True, 6),  # 2 + 2 read + 1 + 1 write
    CaseSpec("dbias_dgelu", "delayed", True, 6),  # 2 + 2 read + 1 + 1 write (+ dbias partials)
    CaseSpec("dbias_dgelu", "current", True, 10),  # (2 + 2) amax pass + (2 + 2) + 1 + 1 write (+ dbias)
    CaseSpec("dgelu", "mxfp8", True, 2 + 2 + 2 + 2 / 32),  # 2 + 2 read + 1 + 1 write + scales
    CaseSpec("dbias_dgelu", "mxfp8", True, 2 + 2 + 2 + 2 / 32),
    CaseSpec("dbias_dgelu", "fp8block", True, 2 + 2 + 2 + 8 / 128),  # 2 + 2 read + 1 + 1 write + float32 scales
    CaseSpec("dgelu", "nvfp4", True, 2 * (2 + 2) + 1 + 2 / 16),  # amax pass and cast pass over both inputs
    CaseSpec("dbias_dgelu", "nvfp4", True, 2 * (2 + 2) + 1 + 2 / 16),
]


def quant_label(spec):
    if spec.quant is None:
        return "bf16"
    if spec.quant == "mxfp8":
        return "mxfp8" + ("+col" if spec.columnwise else "")
    if spec.quant == "fp8block":
        return "fp8-block 1x128" + (" (+T)" if spec.columnwise else "")
    if spec.quant == "nvfp4":
        return "nvfp4" + ("+T" if spec.columnwise else "")
    return f"fp8-{spec.quant}" + ("+T" if spec.columnwise else "")


def case_name(spec, size):
    m, k = size
    in_k = 2 * k if spec.op == "swiglu" else k  # swiglu: x is [M, 2H], output [M, H] = size
    return f"{spec.op} {quant_label(spec)} {m}x{in_k}"


def input_shapes(spec, size):
    m, k = size
    if spec.op == "swiglu":
        return [(m, 2 * k)]
    if spec.op in ("dgelu", "dbias_dgelu"):
        return [(m, k), (m, k)]  # grad, x
    return [(m, k)]


# ----------------------------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------------------------
def make_quantizer(spec, scale, amax):
    if spec.quant is None:
        return None
    if spec.quant == "delayed":
        return tex.Float8Quantizer(scale, amax, tex.DType.kFloat8E4M3, rowwise=True, columnwise=spec.columnwise)
    if spec.quant == "mxfp8":
        return tex.MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=spec.columnwise)
    if spec.quant == "nvfp4":
        return tex.NVFP4Quantizer(rowwise=True, columnwise=spec.columnwise)
    if spec.quant == "fp8block":
        return tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=spec.columnwise,
                                        block_scaling_dim=1)
    return tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=spec.columnwise)


def make_ours(spec, quantizer):
    fn = {"gelu": tex.gelu, "swiglu": tex.swiglu, "dgelu": tex.dgelu, "dbias_dgelu": tex.dbias_dgelu}.get(spec.op)
    if spec.op == "quantize":
        return lambda *t: tex.quantize(t[0], quantizer)
    return lambda *t: fn(*t, quantizer)


def blank_row(spec, size, copy_gbs):
    m, k = size
    nbytes = spec.bytes_per_elt * m * k  # per output element; output is [M, K_out]
    return {
        "case": case_name(spec, size), "op": spec.op, "quantizer": spec.quant or "none",
        "columnwise": spec.columnwise, "M": m, "K_out": k, "bytes_per_elt": spec.bytes_per_elt, "bytes": nbytes,
        "ours_us": None, "eager_us": None, "compile_us": None, "floor_us": nbytes / (copy_gbs * 1e3),
        "ours_gbs": None, "eager_gbs": None, "compile_gbs": None, "pct_copy_bw": None, "ours_over_floor": None,
        "speedup_vs_compile": None,
        "ours_e2e_us": None, "eager_e2e_us": None, "compile_e2e_us": None, "relu_e2e_us": None, "valid": False,
        "note": "",
    }


def run_case(spec, size, timer, copy_gbs, args, seed, small_size, device):
    name = case_name(spec, size)
    m, k = size
    n_out = m * k
    row = blank_row(spec, size, copy_gbs)
    dtype = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(seed)
    inputs = [torch.randn(s, device=device, dtype=dtype, generator=gen) for s in input_shapes(spec, size)]

    extra, amax_buf, scale = [], None, None
    if spec.quant == "delayed":
        # a realistic delayed scale: the activation's amax lands at half the E4M3 range
        act_amax = act_f32(spec.op, inputs).abs().amax().float()
        scale = (0.5 * E4M3_MAX / act_amax).reshape(1).contiguous()
        amax_buf = torch.zeros(1, device=device, dtype=torch.float32)
        extra = [scale, torch.zeros(1, device=device, dtype=torch.float32)]  # reference's own amax history
    ref_fn = make_reference(spec.op, spec.quant, spec.columnwise, dtype)
    ref_args = inputs + extra

    # ---- validate first -------------------------------------------------------------------------------
    try:
        ref = ref_fn(*ref_args)
    except Exception as e:  # a reference that cannot run means the row cannot be validated
        row["note"] = f"reference failed: {type(e).__name__}: {e}"
        H.log(f"FAIL  {name}: {row['note']}")
        return row
    try:
        quantizer = make_quantizer(spec, scale, amax_buf)
        ours = make_ours(spec, quantizer)
        out_bytes = [n_out * (2 if spec.quant is None else 1)] + ([n_out] if spec.columnwise else [])
        H.poison_allocator(device=device, nbytes_list=out_bytes + ([2 * k] if spec.op == "dbias_dgelu" else []))
        got = ours_outputs(spec, ours(*inputs), amax_buf)
        H.synchronize(device)
        info = compare_outputs(got, ref, dtype, m)
    except ValidationError as e:
        row["note"] = f"validation: {e}"
        H.log(f"FAIL  {name}: {row['note']}")
        return row
    except Exception as e:
        row["note"] = f"ours raised {type(e).__name__}: {e}"
        H.log(f"FAIL  {name}: {row['note']}")
        return row
    row["valid"] = True
    del got
    H.log(f"ok    {name}" + (f"  ({info})" if info else ""))

    # ---- time -------------------------------------------------------------------------------------------
    small = size == small_size
    row["ours_us"] = timer.gpu_us(lambda: ours(*inputs))
    row["eager_us"] = timer.gpu_us(lambda: ref_fn(*ref_args))
    if small:
        row["ours_e2e_us"] = timer.e2e_us(lambda: ours(*inputs))
        row["eager_e2e_us"] = timer.e2e_us(lambda: ref_fn(*ref_args))
        # The host's pace at this point of the run: one torch op, one launch, the same loop. On the GPU machines it
        # ranged 7-11 us between runs (torch.compile's worker processes, started by an earlier case, slow it too).
        row["relu_e2e_us"] = timer.e2e_us(lambda: torch.relu(inputs[0]))
    if not args.no_compile:
        try:
            torch._dynamo.reset()  # fresh cache per case: no recompile-limit fallbacks, no dynamic shapes
            compiled = torch.compile(ref_fn, fullgraph=True, dynamic=False, mode=args.compile_mode)
            t0 = time.perf_counter()
            cref = compiled(*ref_args)  # compile + warm-up, outside any timing
            H.synchronize(device)
            compile_s = time.perf_counter() - t0
            try:
                compare_outputs(cref, ref, dtype, m)
            except ValidationError as e:
                row["note"] = f"torch.compile reference differs from eager ({e}); timed anyway"
                H.log(f"warn  {name}: {row['note']}")
            del cref
            row["compile_us"] = timer.gpu_us(lambda: compiled(*ref_args))
            if small:
                row["compile_e2e_us"] = timer.e2e_us(lambda: compiled(*ref_args))
            H.log(f"      compiled reference in {compile_s:.1f} s")
        except Exception as e:
            row["note"] = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            H.log(f"warn  {name}: {row['note']}")

    t = row["ours_us"]
    row["ours_gbs"] = row["bytes"] / (t * 1e3)
    row["eager_gbs"] = row["bytes"] / (row["eager_us"] * 1e3)  # the same minimum bytes over their time (plots)
    if row["compile_us"]:
        row["compile_gbs"] = row["bytes"] / (row["compile_us"] * 1e3)
    row["pct_copy_bw"] = 100.0 * row["ours_gbs"] / copy_gbs
    row["ours_over_floor"] = t / row["floor_us"]
    if row["compile_us"]:
        row["speedup_vs_compile"] = row["compile_us"] / t
    return row


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------
COLUMNS = [  # (header, key, format)
    ("case", "case", "{}"),
    ("B/elt", "bytes_per_elt", "{:g}"),
    ("ours us", "ours_us", "{:.1f}"),
    ("eager us", "eager_us", "{:.1f}"),
    ("compile us", "compile_us", "{:.1f}"),
    ("floor us", "floor_us", "{:.1f}"),
    ("ours GB/s", "ours_gbs", "{:.0f}"),
    ("% of copy BW", "pct_copy_bw", "{:.1f}"),
    ("ours/floor", "ours_over_floor", "{:.2f}"),
    ("speedup vs compile", "speedup_vs_compile", "{:.2f}"),
    ("ours e2e us", "ours_e2e_us", "{:.1f}"),
]


def find(rows, op, quant, columnwise, size):
    name = case_name(CaseSpec(op, quant, columnwise, 0), size)
    for r in rows:
        if r["case"] == name and r["valid"]:
            return r
    return None


def evaluate_targets(report, big, small_size):
    """ANCHORS.md targets into report.targets. Each: name, status (MET / NOT MET / NOT MEASURED), measured,
    required."""
    rows = report.rows
    b = f"{big[0]}x{big[1]}"

    def pct_target(label, row, need):
        report.at_least(label, row and row["pct_copy_bw"], need, "{:.1f} %", f">= {need} % of copy BW")

    def floor_target(label, row, need):
        report.at_most(label, row and row["ours_over_floor"], need, "{:.2f}x floor", f"<= {need}x floor")

    pct_target(f"gelu -> FP8 delayed ({b})", find(rows, "gelu", "delayed", False, big), 92)
    floor_target(f"gelu -> FP8 current ({b})", find(rows, "gelu", "current", False, big), 1.15)
    floor_target(f"swiglu -> FP8 current (x {big[0]}x{2 * big[1]})", find(rows, "swiglu", "current", False, big), 1.15)
    floor_target(f"dbias_dgelu -> FP8 delayed ({b})", find(rows, "dbias_dgelu", "delayed", False, big), 1.15)
    floor_target(f"dbias_dgelu -> FP8 delayed rowwise + columnwise ({b})",
                 find(rows, "dbias_dgelu", "delayed", True, big), 1.15)
    pct_target(f"FP8 cast rowwise + transposed ({b})", find(rows, "quantize", "delayed", True, big), 80)
    pct_target(f"gelu -> MXFP8 rowwise ({b})", find(rows, "gelu", "mxfp8", False, big), 85)
    pct_target(f"gelu -> MXFP8 rowwise + columnwise ({b})", find(rows, "gelu", "mxfp8", True, big), 75)
    pct_target(f"swiglu -> MXFP8 rowwise (x {big[0]}x{2 * big[1]})", find(rows, "swiglu", "mxfp8", False, big), 85)
    floor_target(f"gelu -> NVFP4 rowwise ({b})", find(rows, "gelu", "nvfp4", False, big), 1.2)
    floor_target(f"gelu -> NVFP4 rowwise + columnwise ({b})", find(rows, "gelu", "nvfp4", True, big), 1.2)
    pct_target(f"gelu bf16 -> bf16 ({b})", find(rows, "gelu", None, False, big), 90)
    pct_target(f"dgelu bf16 ({b})", find(rows, "dgelu", None, False, big), 90)

    small = find(rows, "gelu", "current", False, small_size)
    label = f"gelu -> FP8 current {small_size[0]}x{small_size[1]} end to end"
    if small is None:
        report.target(label, "NOT MEASURED", None, "<= 12 us")
    else:
        v = small["ours_e2e_us"]
        extra = f" (GPU median {small['ours_us']:.1f} us, torch.relu e2e {small['relu_e2e_us']:.1f} us at that point"
        extra += f", torch.compile e2e {small['compile_e2e_us']:.1f} us)" if small["compile_e2e_us"] else ")"
        report.target(label, "MET" if v <= 12 else "NOT MET", f"{v:.1f} us" + extra, "<= 12 us")

    timed = [r for r in rows if r["valid"] and r["compile_us"] is not None]
    block = [r for r in timed if r["quantizer"] in ("mxfp8", "nvfp4", "fp8block") and r["M"] == big[0]]
    label = f"block formats >= 1.5x faster than torch.compile ({big[0]} rows)"
    if not block:
        report.target(label, "NOT MEASURED", None, ">= 1.5x")
    else:
        short = [r for r in block if r["speedup_vs_compile"] < 1.5]
        measured = f"{len(block) - len(short)}/{len(block)} cases"
        if short:
            measured += "; short: " + ", ".join(f"{r['case']} ({r['speedup_vs_compile']:.2f}x)" for r in short)
        report.target(label, "NOT MET" if short else "MET", measured, ">= 1.5x on every block-format case")
    slower = [r for r in timed if r["ours_us"] > r["compile_us"]]
    label = "no case slower than torch.compile"
    if not timed:
        report.target(label, "NOT MEASURED", None, "ours <= compile")
    else:
        measured = f"{len(timed) - len(slower)}/{len(timed)} cases at least as fast"
        if slower:
            measured += "; slower: " + ", ".join(f"{r['case']} ({r['speedup_vs_compile']:.2f}x)" for r in slower)
        report.target(label, "NOT MET" if slower else "MET", measured, "ours <= compile on every case")


def queue_plots(report, copy_gbs, big, small):
    """activations.png: achieved bandwidth (SPEC 5.3 minimum bytes / time) of ours, eager and torch.compile per big
    case against the copy bandwidth; activations_small.png: GPU and end-to-end time of the launch-bound cases."""
    rows_big = [r for r in report.rows if r["valid"] and (r["M"], r["K_out"]) == big]
    rows_small = [r for r in report.rows if r["valid"] and (r["M"], r["K_out"]) == small]
    colors = {"ours": "tab:green", "torch eager": "tab:gray", "torch.compile": "tab:blue"}

    def draw_big(fig):
        ax = fig.add_subplot(1, 1, 1)
        H.grouped_bars(ax, [r["case"] for r in rows_big],
                       {"ours": [r["ours_gbs"] for r in rows_big], "torch eager": [r["eager_gbs"] for r in rows_big],
                        "torch.compile": [r["compile_gbs"] for r in rows_big]}, horizontal=True, colors=colors)
        ax.axvline(copy_gbs, color="tab:red", linestyle="--", label=f"copy bandwidth {copy_gbs:.0f} GB/s")
        ax.set_xlabel("GB/s (SPEC 5.3 minimum bytes / median time)")
        ax.set_title(f"Activations and casts, {big[0]}x{big[1]} bf16 output: achieved bandwidth vs the copy ceiling")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(axis="x", alpha=0.3)

    def draw_small(fig):
        names = [r["case"] for r in rows_small]
        for i, (kind, keys) in enumerate((("GPU time (median)", ("ours_us", "eager_us", "compile_us")),
                                          ("end to end (host loop, then sync)",
                                           ("ours_e2e_us", "eager_e2e_us", "compile_e2e_us")))):
            ax = fig.add_subplot(1, 2, i + 1)
            H.grouped_bars(ax, names if i == 0 else [""] * len(names),
                           {label: [r[k] for r in rows_small] for label, k in zip(colors, keys)},
                           horizontal=True, colors=colors)
            ax.set_xlabel("us per call")
            ax.set_title(f"{small[0]}x{small[1]}: {kind}", fontsize=9)
            ax.grid(axis="x", alpha=0.3)
            if i == 0:
                ax.legend(fontsize=8, loc="lower right")

    if rows_big:
        report.plot("activations", draw_big, figsize=(11, 0.42 * len(rows_big) + 1.5))
    if rows_small:
        report.plot("activations_small", draw_small, figsize=(13, 0.32 * len(rows_small) + 1.5))


# ----------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repetitions (do_bench warmup 5 ms, rep 20 ms; 200 e2e calls)")
    p.add_argument("--only", action="append", default=[], metavar="SUBSTR",
                   help="run only cases whose name contains SUBSTR (case-insensitive; repeatable, OR). "
                        "Names look like 'gelu fp8-delayed+T 16384x8192'; see --list. A partial run writes no "
                        "report under benchmarks/results/ unless --out-dir is given")
    p.add_argument("--csv", metavar="PATH", help="write the table (all columns, raw numbers) as CSV")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile timings (faster)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument("--list", action="store_true", help="list case names and exit")
    H.add_output_args(p)
    return p.parse_args(argv)


def selected_cases(only, sizes=(BIG, SMALL)):
    cases = [(s, size) for size in sizes for s in CASE_SPECS]
    if only:
        subs = [o.lower() for o in only]
        cases = [(s, z) for s, z in cases if any(o in case_name(s, z).lower() for o in subs)]
    return cases


def main(argv=None):
    global tex
    args = parse_args(argv)
    t_start = time.perf_counter()
    big, small = SMOKE_SIZES if args.cpu_smoke else (BIG, SMALL)
    if args.cpu_smoke:
        args.no_compile = True  # Inductor's CPU compile of 44 graphs takes minutes on a small host
    cases = selected_cases(args.only, (big, small))
    if args.list:
        for s, z in cases:
            print(f"{case_name(s, z):<36} {s.bytes_per_elt:g} B/elt")
        return 0
    if not cases:
        print(f"no case matches --only {args.only}; use --list", file=sys.stderr)
        return 2
    device, tex = H.start(args, "bench_activations")
    if tex is None:
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    timer = H.Timer(args.quick, device)
    name = H.device_name(device)
    l2_mb = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) / 2**20 if device == "cuda" else 0
    H.log(f"device {name} (L2 {l2_mb:.0f} MB), torch {torch.__version__}, timing: {timer.method}")

    copy = H.measure_copy_bandwidth(timer, big)
    H.log(f"D2D copy {copy['bytes'] / 1e6:.0f} MB (read + write): {copy['us']:.1f} us = {copy['gbs']:.0f} GB/s")

    report = H.Report("activations", {
        "device": name, "timing": timer.method, "copy_bytes": copy["bytes"], "copy_us": copy["us"],
        "copy_gbs": copy["gbs"], "quick": args.quick, "only": args.only, "compile_mode": args.compile_mode,
        "e2e_iters": timer.e2e_iters, "cpu_smoke": args.cpu_smoke})
    for i, (spec, size) in enumerate(cases):
        try:
            report.rows.append(run_case(spec, size, timer, copy["gbs"], args, 1000 + i, small, device))
        except torch.cuda.OutOfMemoryError as e:
            H.log(f"FAIL  {case_name(spec, size)}: out of memory ({e})")
            row = blank_row(spec, size, copy["gbs"])
            row["note"] = f"out of memory: {e}"
            report.rows.append(row)
        H.release(device)

    rows = report.rows
    report.emit()
    report.emit(f"{name}; copy bandwidth {copy['gbs']:.0f} GB/s measured in this run; "
                f"floor = SPEC 5.3 minimum bytes / copy bandwidth; speedup vs compile = compile us / ours us; "
                f"e2e = host loop of {timer.e2e_iters} calls then synchronize, per call ({small[0]}x{small[1]} rows "
                f"only)")
    report.table(COLUMNS, invalid_keep=2)
    evaluate_targets(report, big, small)
    report.print_targets("Targets (shared/ANCHORS.md):")

    failed = [r for r in rows if not r["valid"]]
    if failed:
        report.emit(f"\nVALIDATION FAILED for {len(failed)} of {len(rows)} cases:")
        for r in failed:
            report.emit(f"  {r['case']}: {r['note']}")
    for r in [r for r in rows if r["valid"] and r.get("note")]:
        report.emit(f"note: {r['case']}: {r['note']}")
    report.summary("cases", time.perf_counter() - t_start, args.cpu_smoke)

    queue_plots(report, copy["gbs"], big, small)
    report.save(H.out_dir_of(args, partial=bool(args.only)), json_path=args.json, csv_path=args.csv)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
