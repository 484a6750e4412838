#!/usr/bin/env python3
"""MLP forward+backward step time and peak memory (issue 5; issue 19 item 6): bf16 nn.Linear + activation eager
(baselines.TorchMLP), the same under torch.compile, tex.MLP under each recipe (FP8 delayed, FP8 current, FP8 block,
MXFP8, NVFP4) and, when torchao imports, torchao's float8 training on the same module under torch.compile.
MLP(hidden 4096, ffn 16384), gelu and swiglu, tokens 8192 and 16384, bf16.

Per configuration each variant gets a module of its own (weights copied from one bf16 reference), then:
  1. validation: its output after three steps (delayed scaling starts from scale 1 with an empty history) against
     bf16 eager, max |out - eager| over max |eager| within 0.1 (0.5 for NVFP4, whose E2M1 operands are coarser);
  2. step time: median of `--iters` steps (CUDA events around each, synchronised);
  3. peak memory: torch.cuda.max_memory_allocated over the variant's whole life (module built, validated, timed)
     minus what was allocated before it (the shared input, output gradient and reference weights): its weights,
     their gradients, saved activations, quantized copies and workspaces.
Targets (issue 5): FP8 current scaling >= 1.4x faster than bf16 eager and faster than bf16 torch.compile.
Report: benchmarks/results/<gpu>/mlp.json, .md and mlp.png (benchmarks/_harness.py).

    python3 benchmarks/bench_mlp.py [--quick] [--tokens 8192 16384] [--acts gelu swiglu] [--cpu-smoke]
"""
import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402
from baselines import TorchMLP  # noqa: E402

EMULATED = "*"  # marks MXFP8 / NVFP4 on devices without their native GEMM (sm_90): dequantized to bf16, then a bf16
#                GEMM (SPEC 6.7): correct, not fast


def copy_weights(src, dst):
    with torch.no_grad():
        dst.fc1_weight.copy_(src.fc1.weight)
        dst.fc1_bias.copy_(src.fc1.bias)
        dst.fc2_weight.copy_(src.fc2.weight)
        dst.fc2_bias.copy_(src.fc2.bias)


def step_fn(tex, module, x, dy, recipe=None):
    def step():
        for p in module.parameters():
            p.grad = None
        x.grad = None
        with tex.autocast(enabled=recipe is not None, recipe=recipe):
            y = module(x)
        y.backward(dy)
        return y
    return step


def variant_builders(tex, ref, act, args, device):
    """{name: build() -> (module, recipe or None)}, each building a fresh module with ref's weights."""
    def torch_eager():
        return copy.deepcopy(ref), None

    def torch_compiled():
        torch._dynamo.reset()  # fresh cache per configuration: no recompile limits, no dynamic shapes
        return torch.compile(copy.deepcopy(ref), dynamic=False), None

    def tex_mlp(recipe):
        def build():
            m = tex.MLP(args.hidden, args.ffn, activation=act, params_dtype=torch.bfloat16, device=device)
            copy_weights(ref, m)
            return m, recipe
        return build

    def torchao_float8():
        from torchao.float8 import convert_to_float8_training

        torch._dynamo.reset()
        m = copy.deepcopy(ref)
        convert_to_float8_training(m)
        return torch.compile(m, dynamic=False), None

    builders = {"bf16 eager": torch_eager}
    if args.no_compile:
        builders["bf16 torch.compile"] = None  # listed, not run
    else:
        builders["bf16 torch.compile"] = torch_compiled
    builders["tex fp8 delayed"] = tex_mlp(tex.DelayedScaling())
    builders["tex fp8 current"] = tex_mlp(tex.Float8CurrentScaling())
    builders["tex fp8 block"] = tex_mlp(tex.Float8BlockScaling())
    native = set()
    if device == "cuda":
        from transformer_engine_torch import _device

        native = _device.native_gemm_formats(torch.cuda.current_device())
    builders["tex mxfp8" + ("" if "MXFP8Tensor" in native else EMULATED)] = tex_mlp(tex.MXFP8BlockScaling())
    builders["tex nvfp4" + ("" if "NVFP4Tensor" in native else EMULATED)] = tex_mlp(tex.NVFP4BlockScaling())
    if device == "cuda" and H.import_torchao()[0] is not None:  # installed, or third_party/wheels/'s wheel (its
        #                                                          float8 GEMM is torch._scaled_mm: CUDA only)
        builders["torchao float8 (compile)"] = torchao_float8
    return builders


def run_config(tex, act, tokens, args, device):
    """Rows of one (activation, tokens) configuration."""
    torch.manual_seed(0)
    ref = TorchMLP(args.hidden, args.ffn, act, torch.bfloat16, device)
    x = (torch.randn(tokens, args.hidden, device=device, dtype=torch.bfloat16) * 0.5).requires_grad_()
    dy = torch.randn(tokens, args.hidden, device=device, dtype=torch.bfloat16) * 1e-2
    base_out = step_fn(tex, ref, x, dy)().detach().float()
    ref.zero_grad(set_to_none=True)  # nothing of the reference's step stays in the variants' memory windows
    x.grad = None
    scale = base_out.abs().max().item()
    rows = []
    for name, build in variant_builders(tex, ref, act, args, device).items():
        row = {"act": act, "tokens": tokens, "variant": name, "ms": None, "vs_eager": None, "vs_compile": None,
               "peak_mb": None, "peak_vs_eager": None, "max_err": None, "valid": False, "note": ""}
        rows.append(row)
        if build is None:
            row.update(valid=True, note="skipped (--no-compile)")
            continue
        base = H.cuda_memory_reset(device)
        module = step = None
        try:
            module, recipe = build()
            step = step_fn(tex, module, x, dy, recipe)
            for _ in range(3):  # validate after three steps
                out = step().detach().float()
            row["max_err"] = (out - base_out).abs().max().item() / max(scale, 1e-6)
            del out
            bound = 0.5 if name.startswith("tex nvfp4") else 0.1
            row["valid"] = row["max_err"] <= bound
            if not row["valid"]:
                row["note"] = f"disagrees with bf16 eager: max error {row['max_err']:.3f} of the output's max"
                H.log(f"FAIL  {act} {tokens} {name}: {row['note']}")
            else:
                row["ms"] = H.step_ms(step, args.iters, device)
                peak = H.cuda_memory_peak(device, base)
                row["peak_mb"] = None if peak is None else peak / 1e6
                H.log(f"ok    {act} {tokens} {name}: {row['ms']:.2f} ms"
                      + ("" if peak is None else f", peak {row['peak_mb']:.0f} MB") + f", max err {row['max_err']:.4f}")
        except Exception as e:
            row["valid"] = False
            row["note"] = f"raised {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            H.log(f"FAIL  {act} {tokens} {name}: {row['note']}")
        del module, step
        H.release(device)
    by = {r["variant"]: r for r in rows}
    eager, compiled = by["bf16 eager"], by["bf16 torch.compile"]
    for r in rows:
        if r["ms"] is not None:
            r["vs_eager"] = eager["ms"] / r["ms"] if eager["ms"] else None
            r["vs_compile"] = compiled["ms"] / r["ms"] if compiled["ms"] else None
        if r["peak_mb"] is not None and eager["peak_mb"]:
            r["peak_vs_eager"] = r["peak_mb"] / eager["peak_mb"]
    del ref, x, dy, base_out
    return rows


COLUMNS = [
    ("act", "act", "{}"),
    ("tokens", "tokens", "{}"),
    ("variant", "variant", "{}"),
    ("step ms", "ms", "{:.2f}"),
    ("vs eager", "vs_eager", "{:.2f}x"),
    ("vs compile", "vs_compile", "{:.2f}x"),
    ("peak MB", "peak_mb", "{:.0f}"),
    ("peak / eager", "peak_vs_eager", "{:.2f}"),
    ("max err", "max_err", "{:.4f}"),
]


def evaluate_targets(report):
    for r in report.rows:
        if r["variant"] == "tex fp8 current":
            cfg = f"{r['act']} {r['tokens']}"
            report.at_least(f"{cfg}: fp8 current >= 1.4x bf16 eager", r["vs_eager"], 1.4, "{:.2f}x", ">= 1.4x")
            report.at_least(f"{cfg}: fp8 current faster than bf16 torch.compile", r["vs_compile"], 1.0 + 1e-9,
                            "{:.2f}x", "> 1x")


def queue_plot(report):
    rows = report.rows
    configs = list(dict.fromkeys(f"{r['act']}, {r['tokens']} tokens" for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))

    def series(key, unit=1.0):
        by = {(f"{r['act']}, {r['tokens']} tokens", r["variant"]): r for r in rows}
        return {v: [by[(c, v)][key] / unit if (c, v) in by and by[(c, v)][key] is not None else None
                    for c in configs] for v in variants}

    def draw(fig):
        for i, (key, unit, label) in enumerate((("ms", 1.0, "step time, ms (median)"),
                                                ("peak_mb", 1e3, "peak memory, GB (torch.cuda.max_memory_allocated "
                                                                 "above the shared inputs)"))):
            ax = fig.add_subplot(1, 2, i + 1)
            H.grouped_bars(ax, configs, series(key, unit))
            ax.set_ylabel(label, fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            if i == 0:
                ax.legend(fontsize=7)
        fig.suptitle(f"MLP({report.meta['hidden']}, {report.meta['ffn']}) forward + backward, bf16 activations; "
                     f"{EMULATED} = GEMMs emulated (no native kernel on this device)", fontsize=10)

    if rows:
        report.plot("mlp", draw, figsize=(15, 5.5))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tokens 8192 only, 10 iterations")
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--acts", nargs="+", default=["gelu", "swiglu"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=16384)
    p.add_argument("--no-compile", action="store_true", help="skip the bf16 torch.compile variant")
    H.add_output_args(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    device, tex = H.start(args, "bench_mlp")
    if tex is None:
        return 2
    full = args.acts == ["gelu", "swiglu"] and (args.quick or args.tokens == [8192, 16384])
    if args.quick:
        args.tokens, args.iters = [8192], 10
    if args.cpu_smoke:  # tiny shapes; Inductor's CPU compile is minutes on a small host
        args.tokens, args.iters, args.hidden, args.ffn, args.no_compile = [64], 2, 256, 512, True
    name = H.device_name(device)
    report = H.Report("mlp", {"device": name, "hidden": args.hidden, "ffn": args.ffn, "tokens": args.tokens,
                              "acts": args.acts, "iters": args.iters, "quick": args.quick,
                              "cpu_smoke": args.cpu_smoke})
    H.log(f"device {name}, torch {torch.__version__}, MLP({args.hidden}, {args.ffn}), tokens {args.tokens}")
    for act in args.acts:
        for tokens in args.tokens:
            report.rows += run_config(tex, act, tokens, args, device)

    report.emit()
    report.emit(f"MLP({args.hidden}, {args.ffn}) forward+backward, bf16 activations, {name}; step ms = median of "
                f"{args.iters} steps; peak MB = torch.cuda.max_memory_allocated over the variant's life above the "
                f"shared inputs (its weights, gradients, saved activations, quantized copies, workspaces); "
                f"{EMULATED} = GEMMs emulated (no native kernel for the format on this device)")
    report.table(COLUMNS, invalid_keep=3)
    evaluate_targets(report)
    report.print_targets("Targets (issue 5):")
    failed = [r for r in report.rows if not r["valid"]]
    for r in report.rows:
        if r["note"]:
            report.emit(f"{'note' if r['valid'] else 'FAILED'}: {r['act']} {r['tokens']} {r['variant']}: {r['note']}")
    report.summary("rows", time.perf_counter() - t_start, args.cpu_smoke)
    queue_plot(report)
    report.save(H.out_dir_of(args, partial=not full and not args.cpu_smoke), json_path=args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
