#!/usr/bin/env python3
"""Tensor-parallel MLP training step (issues 22/23): tex.MLP(hidden, ffn, tp_group=<the world>,
sequence_parallel=True) forward + backward on N GPUs, comm_overlap=True (fc1's all-gather and fc2's reduce-scatter
run as the collective GEMM's rings, each chunk's exchange under another chunk's GEMM, the mirrored rings in the
backward) against comm_overlap=False (the same exchanges to completion first, then the same GEMMs), bf16 and FP8
current scaling under tex.autocast.

Shapes (tokens, hidden, ffn): 8192 x 8192 x 28672 and 2048 x 2048 x 8192; gelu (`--acts gelu swiglu` adds the gated
form). Per rank: x [tokens/tp, hidden] (sequence parallel), fc1 [ffn/tp, hidden], fc2 [hidden, ffn/tp].
Variants, each its own module with the same weights:
  overlap                  comm_overlap=True (the layer's default; the agreement check's default "once": each
                           operand signature exchanged once per group, so the timed steps skip it);
  no overlap               comm_overlap=False;
  overlap, check each call comm_overlap=True with NVTE_COLLECTIVE_GEMM_VALIDATE=always: the check's small all_gather
                           and, on a NCCL-only group, one host sync on every forward call, to show what it costs.
Validation first, per variant: after two steps, y and dx of this rank's tokens within tolerance of the unsharded bf16
MLP (tex.MLP without tp_group) on the whole input — max |err| / max |ref| <= 2^-5 for bf16, 0.1 for FP8 — and
whether overlap and no overlap gave the same bits. A recipe the tensor-parallel layers do not take yet
(NotImplementedError) gives a "not supported yet" row, not a failure.
Timing: rounds of one step per variant, the order alternating (A B C, C B A, ...), CUDA events around each step;
every rank runs the same steps; a row reports the slowest rank's median. `speedup` = no overlap / overlap.
Target: overlap faster than no overlap on the large shape.

Usage (one process per GPU; NVLink multicast is turned off unless the environment says otherwise):
    torchrun --nproc-per-node=N benchmarks/bench_tp_mlp.py [--quick] [--only SUBSTR] [--acts gelu swiglu]
    torchrun --nproc-per-node=2 benchmarks/bench_tp_mlp.py --cpu-smoke   # gloo on the CPU, tiny shapes
Report: benchmarks/results/<gpu>/tp_mlp.json, .md and tp_mlp.png (rank 0 writes them).
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

SHAPES = [(8192, 8192, 28672), (2048, 2048, 8192)]  # tokens, hidden, ffn
SMOKE_SHAPES = [(64, 64, 128)]
FORMATS = ("bf16", "fp8 current")
VARIANTS = {"overlap": (True, "once"), "no overlap": (False, "once"), "overlap, check each call": (True, "always")}
#           name: (comm_overlap, the collective GEMM's agreement check on)
TOL = {"bf16": 2 ** -5, "fp8 current": 0.1}
NOT_SUPPORTED = "not supported yet"


def case_name(shape, act, fmt):
    return f"{fmt} {act} {'x'.join(map(str, shape))}"


def cases(args):
    """The (shape, act, fmt) list of this run, in order (the same on every rank)."""
    if args.cpu_smoke:
        shapes = SMOKE_SHAPES
    elif args.shape:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shape]
    else:
        shapes = SHAPES[:1] if args.quick else SHAPES
    out = [(s, a, f) for s in shapes for a in args.acts for f in FORMATS]
    return [c for c in out if not args.only or any(o in case_name(*c) for o in args.only)]


def check_shape(shape, tp):
    """The reason a shape cannot be split over tp ranks, or None."""
    tokens, _, ffn = shape
    if tokens % tp or ffn % tp:
        return f"tokens {tokens} and ffn {ffn} must be multiples of tp = {tp}"
    return None


def full_problem(shape, act, device, gated):
    """The unsharded weights, input and output gradient, the same on every rank (one seeded generator)."""
    tokens, hidden, ffn = shape
    g = torch.Generator(device=device).manual_seed(1234)

    def rnd(*s, scale=1.0):
        return (torch.rand(*s, generator=g, device=device, dtype=torch.float32) * 2 - 1).mul_(scale).bfloat16()

    f1 = ffn * (2 if gated else 1)
    return {"fc1_weight": rnd(f1, hidden, scale=hidden ** -0.5), "fc1_bias": rnd(f1, scale=0.1),
            "fc2_weight": rnd(hidden, ffn, scale=ffn ** -0.5), "fc2_bias": rnd(hidden, scale=0.1),
            "x": rnd(tokens, hidden), "dy": rnd(tokens, hidden, scale=1e-2)}


def shard(full, shape, rank, tp, gated):
    """This rank's parameters (fc1: its ffn/tp rows of each half, fc2: its ffn/tp columns) and tokens."""
    tokens, _, ffn = shape
    f = ffn // tp
    rows = torch.cat([torch.arange(rank * f, (rank + 1) * f) + i * ffn for i in range(2 if gated else 1)])
    rows = rows.to(full["fc1_weight"].device)
    tok = slice(rank * tokens // tp, (rank + 1) * tokens // tp)
    return ({"fc1_weight": full["fc1_weight"][rows], "fc1_bias": full["fc1_bias"][rows],
             "fc2_weight": full["fc2_weight"][:, rank * f:(rank + 1) * f], "fc2_bias": full["fc2_bias"]}, tok)


def load(module, params):
    with torch.no_grad():
        for k, v in params.items():
            getattr(module, k).copy_(v)


def reference(tex, shape, act, full, tok, device):
    """y and dx of this rank's tokens from the unsharded bf16 MLP (plain PyTorch math outside autocast)."""
    tokens, hidden, ffn = shape
    m = tex.MLP(hidden, ffn, act, params_dtype=torch.bfloat16, device=device)
    load(m, {k: v for k, v in full.items() if k not in ("x", "dy")})
    x = full["x"].clone().requires_grad_()
    y = m(x)
    y.backward(full["dy"])
    out = (y[tok].detach().float(), x.grad[tok].float())
    del m, x, y
    return out


class Step:
    """One forward + backward of a variant's module on this rank's tokens, under the recipe of its format."""

    def __init__(self, tex, module, x, dy, fmt, check):
        self.tex, self.module, self.x, self.dy, self.fmt, self.check = tex, module, x, dy, fmt, check
        self.recipe = tex.Float8CurrentScaling() if fmt != "bf16" else None

    def __call__(self):
        for p in self.module.parameters():
            p.grad = None
        self.x.grad = None
        old = os.environ.get("NVTE_COLLECTIVE_GEMM_VALIDATE")
        os.environ["NVTE_COLLECTIVE_GEMM_VALIDATE"] = self.check  # "once" or "always", every rank alike
        try:
            with self.tex.autocast(enabled=self.recipe is not None, recipe=self.recipe):
                y = self.module(self.x)
            y.backward(self.dy)
        finally:
            if old is None:
                del os.environ["NVTE_COLLECTIVE_GEMM_VALIDATE"]
            else:
                os.environ["NVTE_COLLECTIVE_GEMM_VALIDATE"] = old
        return y


def rel_err(got, want):
    return (got.float() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)


def interleaved_steps(steps, rounds, device, warmup=2):
    """{name: [ms per step]}: round i runs one step of each variant, in order on even rounds and reversed on odd
    ones; CUDA events around each step (perf_counter on the CPU). Every rank runs the same steps in the same order."""
    names = list(steps)
    for _ in range(warmup):
        for n in names:
            steps[n]()
    H.synchronize(device)
    ms = {n: [] for n in names}
    cuda = str(device).startswith("cuda")
    for i in range(rounds):
        for n in (names if i % 2 == 0 else names[::-1]):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                steps[n]()
                b.record()
                b.synchronize()
                ms[n].append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                steps[n]()
                ms[n].append(1e3 * (time.perf_counter() - t0))
    return ms


def slowest(values, device):
    """The largest of each rank's values (the layer waits for its slowest rank), elementwise."""
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def run_case(tex, shape, act, fmt, ref, full, args, ctx):
    """One row: validate each variant, then time them; every rank runs this with the same arguments."""
    rank, tp, device, group = ctx["rank"], ctx["tp"], ctx["device"], ctx["group"]
    tokens, hidden, ffn = shape
    gated = tex.modules.ACTIVATIONS[act][3]
    row = {"case": case_name(shape, act, fmt), "format": fmt, "act": act, "tokens": tokens, "hidden": hidden,
           "ffn": ffn, "tp": tp, "valid": False, "status": "", "note": ""}
    params, tok = shard(full, shape, rank, tp, gated)
    x = full["x"][tok].clone().requires_grad_()
    dy = full["dy"][tok].contiguous()
    steps, outs = {}, {}
    try:
        for name, (overlap, check) in VARIANTS.items():
            m = tex.MLP(hidden, ffn, act, params_dtype=torch.bfloat16, device=device, tp_group=group,
                        sequence_parallel=True, comm_overlap=overlap)
            load(m, params)
            steps[name] = Step(tex, m, x, dy, fmt, check)
            for _ in range(2):
                y = steps[name]()
            outs[name] = (y.detach().clone(), x.grad.clone())
    except NotImplementedError as e:  # raised alike on every rank, before any exchange
        row.update(valid=True, status=NOT_SUPPORTED, note=f"{(str(e).splitlines() or [''])[0][:240]}")
        return row
    except Exception as e:  # noqa: BLE001
        row.update(status="FAILED", note=f"raised {type(e).__name__}: {(str(e).splitlines() or [''])[0][:240]}")
        return row
    y_ref, dx_ref = ref
    errs = [max(rel_err(y, y_ref), rel_err(dx, dx_ref)) for y, dx in outs.values()]
    same = all(torch.equal(a, b) for a, b in zip(outs["overlap"], outs["no overlap"]))
    errs_all, same_all = slowest([max(errs), 0.0 if same else 1.0], device)
    row["max_err"], row["same_bits"] = errs_all, same_all == 0.0
    if errs_all > TOL[fmt]:
        row.update(status="FAILED", note=f"max error {errs_all:.3g} of the reference's max > {TOL[fmt]:.3g}")
        return row
    del outs
    ms = interleaved_steps(steps, args.iters, device)
    med = slowest([statistics.median(ms[n]) for n in VARIANTS], device)
    row.update(valid=True, status="ok", ours_ms=med[0], base_ms=med[1], always_ms=med[2])
    row["speedup"] = row["base_ms"] / row["ours_ms"]
    row["check_cost"] = (row["always_ms"] - row["ours_ms"]) / row["ours_ms"]
    pairs = sorted(b / a for a, b in zip(ms["overlap"], ms["no overlap"]))
    row["speedup_p10"], row["speedup_p90"] = pairs[len(pairs) // 10], pairs[(len(pairs) * 9) // 10]
    return row


COLUMNS = [("case", "case", "{}"), ("tp", "tp", "{}"), ("overlap ms", "ours_ms", "{:.2f}"),
           ("no overlap ms", "base_ms", "{:.2f}"), ("speedup", "speedup", "{:.3f}x"),
           ("speedup p10-p90 (rank 0)", "speedup_range", "{}"), ("check each call ms", "always_ms", "{:.2f}"),
           ("per-call check cost", "check_cost", "{:+.1%}"), ("max err", "max_err", "{:.4f}"),
           ("same bits", "same_bits", "{}"), ("status", "status", "{}")]


def queue_plot(report):
    rows = [r for r in report.rows if r["status"] == "ok"]

    def draw(fig):
        ax = fig.add_subplot(111)
        H.grouped_bars(ax, [r["case"] for r in rows],
                       {"overlap": [r["ours_ms"] for r in rows], "no overlap": [r["base_ms"] for r in rows],
                        "overlap, check each call": [r["always_ms"] for r in rows]},
                       horizontal=True, value_fmt="{:.1f}")
        ax.set_xlabel("training step, ms (median, slowest rank; lower is better)")
        ax.set_title(f"tex.MLP tensor parallel (sequence parallel), tp = {report.meta['tp']}: forward + backward")
        ax.legend()

    if rows:
        report.plot("tp_mlp", draw, figsize=(10, 2 + 1.2 * len(rows)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the large shape only, 6 rounds")
    p.add_argument("--only", action="append", default=[], metavar="SUBSTR",
                   help="cases whose name holds SUBSTR (names such as 'bf16 gelu 8192x8192x28672')")
    p.add_argument("--acts", nargs="+", default=["gelu"], help="activations (gelu; swiglu etc. for the gated form)")
    p.add_argument("--shape", action="append", default=[], metavar="TxHxF", help="tokens x hidden x ffn (repeatable)")
    p.add_argument("--iters", type=int, default=20, help="timed rounds (one step of each variant per round)")
    p.add_argument("--list", action="store_true", help="print the case names and exit")
    H.add_output_args(p)
    args = p.parse_args(argv)
    for s in args.shape:
        parts = s.split("x")
        if len(parts) != 3 or not all(v.isdigit() and int(v) > 0 for v in parts):
            p.error(f"--shape {s!r}: expected TOKENSxHIDDENxFFN, e.g. 8192x8192x28672")
    if args.iters < 1:
        p.error("--iters must be at least 1")
    if args.quick:
        args.iters = min(args.iters, 6)
    if args.cpu_smoke:
        args.iters = 2
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        print("\n".join(case_name(*c) for c in cases(args)))
        return 0
    if "WORLD_SIZE" not in os.environ:
        print("bench_tp_mlp.py: run it under torchrun, one process per GPU: torchrun --nproc-per-node=N "
              "benchmarks/bench_tp_mlp.py (--cpu-smoke: gloo on the CPU)", file=sys.stderr)
        return 2
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)  # NVLink multicast off: the lent machines' rule; the rings do not use it
    import torch.distributed as dist

    rank, tp = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cpu_smoke:
        device = "cpu"
        dist.init_process_group("gloo")
    else:
        if not torch.cuda.is_available():
            print("bench_tp_mlp.py: CUDA is not available: this benchmark needs GPUs (or --cpu-smoke)",
                  file=sys.stderr)
            return 2
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = f"cuda:{torch.cuda.current_device()}"
        dist.init_process_group("nccl", device_id=torch.device(device))
    try:
        tex = H.import_tex()
    except ImportError as e:
        print(f"bench_tp_mlp.py: {e}", file=sys.stderr)
        return 2
    t0 = time.time()
    ctx = {"rank": rank, "tp": tp, "device": device, "group": dist.group.WORLD}
    report = H.Report("tp_mlp", {"device": f"{tp} x {H.device_name(device)}", "tp": tp, "quick": args.quick,
                                 "backend": "gloo" if args.cpu_smoke else "nccl", "iters": args.iters,
                                 "timing": "rounds of one step per variant, CUDA events, median, slowest rank"})
    say = report.emit if rank == 0 else (lambda *a: None)
    say(f"{report.meta['device']}, torch {torch.__version__}, {report.meta['backend']} through torch.distributed, "
        f"{args.iters} timed rounds")
    ref_key, ref = None, None
    for shape, act, fmt in cases(args):
        name = case_name(shape, act, fmt)
        why = check_shape(shape, tp)
        if why:
            report.rows.append({"case": name, "tp": tp, "valid": True, "status": "skipped", "note": why})
            continue
        gated = tex.modules.ACTIVATIONS[act][3]  # fc1 holds both halves: [activated rows; linear rows]
        full = full_problem(shape, act, device, gated)
        if ref_key != (shape, act):  # the unsharded bf16 reference, once per shape and activation
            ref_key, ref = (shape, act), None
            H.release(device)
            ref = reference(tex, shape, act, full, shard(full, shape, rank, tp, gated)[1], device)
        row = run_case(tex, shape, act, fmt, ref, full, args, ctx)
        if "speedup_p10" in row:
            row["speedup_range"] = f"{row['speedup_p10']:.3f}-{row['speedup_p90']:.3f}"
        report.rows.append(row)
        if rank == 0:
            H.log(f"{row['status'] or '?':<5} {name}: " + (f"overlap {row['ours_ms']:.2f} ms, no overlap "
                                                           f"{row['base_ms']:.2f} ms, speedup {row['speedup']:.3f}x"
                                                           if row.get("ours_ms") else row["note"]))
        del full
        H.release(device)
    say(f"\ntex.MLP(hidden, ffn, tp_group, sequence_parallel=True) forward + backward, tp = {tp} (overlap = "
        f"comm_overlap=True, no overlap = comm_overlap=False, check each call = NVTE_COLLECTIVE_GEMM_VALIDATE=always; speedup = "
        f"no overlap / overlap; max err = of y and dx against the unsharded bf16 MLP, over its max)")
    if rank == 0:
        report.table(COLUMNS)
        for r in report.rows:
            if r["status"] == "ok" and (r["tokens"], r["hidden"], r["ffn"]) == SHAPES[0]:
                report.at_least(f"{r['case']}: overlap faster than no overlap", r["speedup"], 1.0 + 1e-9, "{:.3f}x",
                                "> 1x")
        report.print_targets("Targets:")
        for r in report.rows:
            if r.get("note"):
                report.emit(f"{r['status']}: {r['case']}: {r['note']}")
        report.summary("cases", time.time() - t0, args.cpu_smoke)
        queue_plot(report)
        partial = bool(args.only or args.shape) or args.acts != ["gelu"]
        report.save(H.out_dir_of(args, partial=partial and not args.cpu_smoke), json_path=args.json)
    failed = any(r["status"] == "FAILED" for r in report.rows)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
