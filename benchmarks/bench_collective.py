"""Collective GEMM benchmark (issue 22): all-gather + GEMM and GEMM + reduce-scatter, ours overlapped vs the same
exchanges and GEMMs not overlapped, the GEMM alone and the communication alone, and the overlap efficiency
(communication hidden ÷ communication time).

This run is the one-GPU loopback mode: one rank of tp is simulated, its ring exchanges copying the simulated peers'
chunks with the copy engine on a stream of their own, with the events of a real exchange (tex.collective.
all_gather_gemm_loopback / gemm_reduce_scatter_loopback). It times the overlap machinery — stream order, events,
chunked GEMMs — not NVLink or NCCL. Under torchrun (WORLD_SIZE > 1) the script runs the NCCL mode instead: one
process per GPU, ours (its reduce-scatter over the copy engine's symmetric-memory windows, the default, and over
NCCL send/receive) vs the same exchanges non-overlapped vs NCCL's collective alone vs the GEMM alone vs PyTorch's
symmetric-memory fused ops (bf16), timed interleaved on every rank.

Shapes: tokens 8192, hidden 8192, ffn 28672 (and tokens 2048, hidden 2048, ffn 8192) for tp = 2, 4, 8: the
all-gather is fc1's (x shard [tokens/tp, hidden], w [ffn/tp, hidden]), the reduce-scatter fc2's (x [tokens, ffn/tp],
w [hidden, ffn/tp] → [tokens/tp, hidden]); bf16 and FP8 current scaling (quantized once, outside the timing).
Validation: ours equals the non-overlapped run bit for bit, and the all-gather's output is within the bf16 (FP8:
E4M3) tolerance of one GEMM of the whole x. Target (issue 22): loopback AG+GEMM <= 1.1x the GEMM alone.

The JAX mode (--jax) runs in one process driving every visible GPU: the FFI form over NCCL (transformer_engine_jax.
collective_nccl) vs the same exchanges non-overlapped vs the pure-JAX ppermute ring in shard_map vs XLA's own sharded
einsum (its all-gather / reduce-scatter, then the GEMM) vs the GEMM alone.

Usage: python benchmarks/bench_collective.py [--quick] [--only SUBSTR] [--out-dir DIR]
       torchrun --nproc-per-node=N benchmarks/bench_collective.py [--quick] [--sm-margins 0,8,16,32] [--out-dir DIR]
       python benchmarks/bench_collective.py --jax [--quick] [--out-dir DIR]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

SHAPES = [(8192, 8192, 28672), (2048, 2048, 8192)]  # tokens, hidden, ffn
TPS = (2, 4, 8)
TARGET_AG = 1.1


def operands(tex, kind, shape, tp, fmt, device):
    tokens, hidden, ffn = shape
    g = torch.Generator(device="cpu").manual_seed(tp)
    rnd = lambda *s: ((torch.rand(*s, generator=g) * 2 - 1).to(torch.bfloat16)).to(device)  # noqa: E731
    if kind == "AG":
        x, w = rnd(tokens, hidden), rnd(ffn // tp, hidden) * hidden ** -0.5
    else:
        x, w = rnd(tokens, ffn // tp), rnd(hidden, ffn // tp) * (ffn // tp) ** -0.5
    if fmt == "fp8":
        q = lambda: tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, rowwise=True,  # noqa: E731
                                                      columnwise=False)
        x, w = tex.quantize(x, q()), tex.quantize(w, q())
    return x, w


def case(ctx, kind, shape, tp, fmt):
    tex, device, timer = ctx["tex"], ctx["device"], ctx["timer"]
    tokens, hidden, ffn = shape
    name = f"{kind} {fmt} tp={tp} {tokens}x{hidden}x{ffn}"
    row = {"case": name, "kind": kind, "format": fmt, "tp": tp, "tokens": tokens, "hidden": hidden, "ffn": ffn,
           "valid": False, "note": ""}
    x, w = operands(tex, kind, shape, tp, fmt, device)
    rank = tp // 2
    m = tokens // tp
    if kind == "AG":
        ours = lambda: tex.collective.all_gather_gemm_loopback(x, w, rank, tp)  # noqa: E731
        base = lambda: tex.collective.all_gather_gemm_loopback(x, w, rank, tp, comm_overlap=False)  # noqa: E731
        alone = lambda: tex.general_gemm(w, x, out_dtype=torch.bfloat16, layout="TN",  # noqa: E731
                                         use_split_accumulator=True)[0]
        chunk_bytes = m * hidden * (1 if fmt == "fp8" else 2)
    else:
        incoming = torch.rand(tp - 1, m, hidden, device=device)
        ours = lambda: tex.collective.gemm_reduce_scatter_loopback(x, w, incoming, rank, tp)  # noqa: E731
        base = lambda: tex.collective.gemm_reduce_scatter_loopback(x, w, incoming, rank, tp,  # noqa: E731
                                                                   comm_overlap=False)
        alone = lambda: tex.general_gemm(w, x, out_dtype=torch.bfloat16, layout="TN",  # noqa: E731
                                         use_split_accumulator=True)[0]
        chunk_bytes = m * hidden * 4
    src = torch.empty(tp - 1, chunk_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)

    def comm():
        for i in range(tp - 1):
            dst[i].copy_(src[i])

    try:
        a, b = ours(), base()
        if not torch.equal(a, b):
            raise ValueError("overlapped != non-overlapped")
        if kind == "AG":
            ref = alone().float()
            err = (a.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
            row["err_rel"] = err
            if err > (2 ** -3 if fmt == "fp8" else 2 ** -7):
                raise ValueError(f"relative error {err:.3g} against one GEMM of the whole x")
    except Exception as e:  # noqa: BLE001
        row["note"] = f"{type(e).__name__}: {e}"
        H.log(f"FAIL  {name}: {row['note']}")
        return row
    row["valid"] = True
    for key, fn in (("ours", ours), ("base", base), ("gemm", alone), ("comm", comm)):
        row[f"{key}_us"] = timer.gpu_us(fn)
    hidden_us = row["base_us"] - row["ours_us"]
    row["overlap_eff"] = max(0.0, min(1.0, hidden_us / row["comm_us"])) if row["comm_us"] > 0 else None
    row["ours_over_gemm"] = row["ours_us"] / row["gemm_us"]
    row["speedup_vs_base"] = row["base_us"] / row["ours_us"]
    H.log(f"ok    {name}: ours {row['ours_us']:.0f} us, base {row['base_us']:.0f}, gemm {row['gemm_us']:.0f}, "
          f"comm {row['comm_us']:.0f}; ours/gemm {row['ours_over_gemm']:.3f}, overlap {row['overlap_eff']:.2f}")
    return row


COLUMNS = [("case", "case", "{}"), ("ours us", "ours_us", "{:.1f}"), ("non-overlapped us", "base_us", "{:.1f}"),
           ("GEMM alone us", "gemm_us", "{:.1f}"), ("comm alone us", "comm_us", "{:.1f}"),
           ("ours / GEMM", "ours_over_gemm", "{:.3f}"), ("non-overlapped / ours", "speedup_vs_base", "{:.3f}"),
           ("overlap eff.", "overlap_eff", "{:.2f}")]


# ---- several GPUs: torchrun, one process per GPU, NCCL ---------------------------------------------------------
def interleaved_us(fns, rounds=12, warmup=2):
    """{name: median GPU time per call} over `rounds` rounds that each time every fn once (CUDA events), so that clock
    and thermal drift fall on every fn alike; every rank runs the same calls, and the slowest rank's median counts
    (the layer waits for it)."""
    import torch.distributed as dist

    for _ in range(warmup):
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    dist.barrier()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times[k].append(1000.0 * s.elapsed_time(e))
    med = torch.tensor([sorted(v)[len(v) // 2] for v in times.values()], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return dict(zip(fns, med.tolist()))


def with_transport(name, fn):
    """fn() with the reduce-scatter's transport set to `name` (NVTE_COLLECTIVE_GEMM_TRANSPORT, read at each call)."""
    key = "NVTE_COLLECTIVE_GEMM_TRANSPORT"
    old = os.environ.get(key)
    os.environ[key] = name
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def nccl_case(tex, kind, shape, fmt, tp, rank, group, margins=()):
    import torch.distributed as dist

    tokens, hidden, ffn = shape
    name = f"{kind} {fmt} tp={tp} {tokens}x{hidden}x{ffn}"
    row = {"case": name, "kind": kind, "format": fmt, "tp": tp, "valid": False, "note": ""}
    m = tokens // tp
    x, w = operands(tex, kind, shape, tp, fmt, "cuda")
    gname = group.group_name
    if kind == "AG":
        xs = x[rank * m:(rank + 1) * m] if fmt == "bf16" else None
        if fmt == "fp8":  # each rank quantizes its own shard
            q = tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)
            xs = tex.quantize(x.dequantize(torch.bfloat16)[rank * m:(rank + 1) * m].contiguous(), q)
        ours = lambda mg=None: tex.all_gather_gemm(xs, w, group, sm_margin=mg, validate=False)  # noqa: E731
        base = lambda: tex.all_gather_gemm(xs, w, group, comm_overlap=False, sm_margin=0,  # noqa: E731
                                           validate=False)
        alone = lambda: tex.general_gemm(w, x, out_dtype=torch.bfloat16, layout="TN",  # noqa: E731
                                         use_split_accumulator=True)[0]
        src = xs._data if fmt == "fp8" else xs
        dst = torch.empty((tp,) + tuple(src.shape), dtype=src.dtype, device="cuda")
        comm = lambda: dist.all_gather_into_tensor(dst, src, group=group)  # noqa: E731
        fused = None
        if fmt == "bf16":
            try:
                from torch.distributed import _symmetric_memory as symm

                symm.enable_symm_mem_for_group(gname)
                fused = lambda: torch.ops.symm_mem.fused_all_gather_matmul(xs, [w.t()], 0, gname)  # noqa: E731
            except Exception as e:  # noqa: BLE001
                row["note"] += f"torch fused op unavailable ({type(e).__name__}); "
    else:
        ours = lambda mg=None: tex.gemm_reduce_scatter(x, w, group, sm_margin=mg, validate=False)  # noqa: E731
        base = lambda: tex.gemm_reduce_scatter(x, w, group, comm_overlap=False, sm_margin=0,  # noqa: E731
                                               validate=False)
        alone = lambda: tex.general_gemm(w, x, out_dtype=torch.bfloat16, layout="TN",  # noqa: E731
                                         use_split_accumulator=True)[0]
        part = torch.empty(tokens, hidden, dtype=torch.float32, device="cuda")
        out = torch.empty(m, hidden, dtype=torch.float32, device="cuda")
        comm = lambda: dist.reduce_scatter_tensor(out, part, group=group)  # noqa: E731
        fused = None
        if fmt == "bf16":
            try:
                from torch.distributed import _symmetric_memory as symm

                symm.enable_symm_mem_for_group(gname)
                fused = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, gname)  # noqa
            except Exception as e:  # noqa: BLE001
                row["note"] += f"torch fused op unavailable ({type(e).__name__}); "
    try:
        a, b = ours(0), base()
        if not torch.equal(a, b):
            raise ValueError("overlapped != non-overlapped")
    except Exception as e:  # noqa: BLE001
        row["note"] += f"{type(e).__name__}: {e}"
        return row
    row["valid"] = True
    fns = {"ours": ours, "base": base, "gemm": alone, "comm": comm}
    if fused is not None:
        try:
            fused()
            fns["fused"] = fused
        except Exception as e:  # noqa: BLE001
            row["note"] += f"fused: {type(e).__name__}: {str(e)[:120]}; "
    if kind == "RS":  # ours = the default transport (the copy engine's windows); the same ring over NCCL send/receive
        fns["nccl"] = lambda: with_transport("nccl", ours)
        if not torch.equal(fns["nccl"](), a):
            row["note"] += "NCCL transport's bytes differ; "
    # The SMs the chunk GEMMs leave to NCCL (ours = the core's default; the sweep shows the choice).
    for mg in margins:
        fns[f"margin{mg}"] = (lambda v: lambda: ours(v))(mg)
    for k, us in interleaved_us(fns).items():
        row[f"ours_us_{k}" if k.startswith("margin") or k == "nccl" else f"{k}_us"] = us
    if "fused_us" in row:
        row["ours_over_fused"] = row["fused_us"] / row["ours_us"]
    row["speedup_vs_base"] = row["base_us"] / row["ours_us"]
    row["ours_over_gemm"] = row["ours_us"] / row["gemm_us"]
    row["overlap_eff"] = max(0.0, min(1.0, (row["base_us"] - row["ours_us"]) / row["comm_us"]))
    return row


def draw_times(title, series):
    """A draw(fig) for Report.plot: each valid row's times over the GEMM alone, one bar per series present.
    series: [(label, key)], the keys of the rows' times in us."""
    def draw(fig, rows):
        rows = [r for r in rows if r.get("valid")]
        ax = fig.add_subplot(111)
        bars = {label: [r[key] / r["gemm_us"] if r.get(key) else 0.0 for r in rows] for label, key in series
                if any(r.get(key) for r in rows)}
        H.grouped_bars(ax, [r["case"] for r in rows], bars, horizontal=True)
        ax.axvline(1.0, color="gray", ls="--", lw=1)
        ax.set_xlabel("time / the GEMM alone (lower is better; 1 = communication fully hidden)")
        ax.set_title(title)
        ax.legend()
    return draw


NCCL_SERIES = [("ours", "ours_us"), ("ours, RS over NCCL send/recv", "ours_us_nccl"), ("non-overlapped", "base_us"),
               ("torch symm-mem fused", "fused_us")]
JAX_SERIES = [("ours (FFI)", "ours_us"), ("ours, RS over NCCL send/recv", "nccl_us"), ("non-overlapped", "base_us"),
              ("ppermute ring", "ring_us"),
              ("XLA sharded einsum", "xla_us")]


def replot(path):
    """Re-renders a saved NCCL or JAX report's plot from its JSON (next to it), without a GPU."""
    import json

    with open(path) as f:
        data = json.load(f)
    report = H.Report(data.get("bench", os.path.splitext(os.path.basename(path))[0]), data.get("meta", {}))
    rows = data.get("rows", [])
    jax_mode = report.bench == "collective_jax"
    title = (f"Collective GEMM in JAX, {report.meta.get('device', '')}" if jax_mode else
             f"Collective GEMM over NCCL, {report.meta.get('device', '')}")
    draw = draw_times(title, JAX_SERIES if jax_mode else NCCL_SERIES)
    report.plot(os.path.splitext(os.path.basename(path))[0], lambda fig: draw(fig, rows), figsize=(10, 8))
    report._save_plots(os.path.dirname(os.path.abspath(path)))
    return 0


def main_nccl(args):
    margins = [int(v) for v in args.sm_margins.split(",") if v] if args.sm_margins else []
    import torch.distributed as dist

    rank, tp = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    tex = H.import_tex()
    t0 = time.time()
    report = H.Report("collective_nccl", {"device": f"{tp} x {H.device_name('cuda')}", "mode": "torchrun + NCCL",
                                          "timing": "median of 10 calls per rank (CUDA events), slowest rank"})
    if rank == 0:
        report.emit(f"{report.meta['device']}, torch {torch.__version__}, NCCL through torch.distributed")
    for shape in SHAPES[:1] if args.quick else SHAPES:
        for kind in ("AG", "RS"):
            for fmt in ("bf16", "fp8"):
                report.rows.append(nccl_case(tex, kind, shape, fmt, tp, rank, dist.group.WORLD, margins))
                if rank == 0:
                    H.log(f"{report.rows[-1]['case']}: {report.rows[-1]}")
    if rank == 0:
        report.emit("\nCollective GEMM over NCCL (ours = overlapped ring, the reduce-scatter's partials moved by the "
                    "copy engine into symmetric-memory windows; ours over NCCL = the same over NCCL send/receive; "
                    "non-overlapped = the same exchanges and chunk GEMMs one after another; GEMM alone = the rank's whole GEMM; comm alone = NCCL all_gather_into_tensor / "
                    "reduce_scatter_tensor (FP32) of the same bytes; torch fused = symm_mem fused_all_gather_matmul "
                    "/ fused_matmul_reduce_scatter)")
        report.table(COLUMNS + [("ours over NCCL us", "ours_us_nccl", "{:.1f}")] +
                     [(f"ours sm_margin={mg} us", f"ours_us_margin{mg}", "{:.1f}") for mg in margins] +
                     [("torch fused us", "fused_us", "{:.1f}"), ("torch fused / ours", "ours_over_fused",
                                                                          "{:.3f}"), ("note", "note", "{}")])
        for r in report.rows:
            if r["valid"]:
                report.at_least(f"{r['case']}: overlap efficiency", r.get("overlap_eff"), 0.9, "{:.2f}", ">= 0.9")
                report.at_least(f"{r['case']}: non-overlapped / ours", r.get("speedup_vs_base"), 1.15, "{:.3f}x",
                                ">= 1.15x")
                if r.get("ours_over_fused") is not None:
                    report.at_least(f"{r['case']}: torch fused / ours", r["ours_over_fused"], 1.05, "{:.3f}x",
                                    ">= 1.05x")
        report.print_targets("Targets (issue 23):")
        report.summary("cases", time.time() - t0)
        draw = draw_times(f"Collective GEMM over NCCL, {report.meta['device']}", NCCL_SERIES)
        report.plot("collective_nccl", lambda fig: draw(fig, report.rows), figsize=(10, 8))
        report.save(H.out_dir_of(args, partial=bool(args.only)), json_path=args.json)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ---- JAX: one process driving every GPU ------------------------------------------------------------------------
def _jax_interleaved_us(fns, rounds=12, warmup=2):
    """{name: median wall time of one synchronised call, us}, every fn timed once per round (drift falls alike)."""
    for _ in range(warmup):
        for fn, args in fns.values():
            fn(*args).block_until_ready()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, (fn, args) in fns.items():
            t = time.perf_counter()
            fn(*args).block_until_ready()
            times[k].append(1e6 * (time.perf_counter() - t))
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def jax_case(kind, shape, fmt, tp):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import transformer_engine_jax as tej
    from transformer_engine_jax import collective as C, collective_nccl as N

    tokens, hidden, ffn = shape
    name = f"{kind} {fmt} tp={tp} {tokens}x{hidden}x{ffn}"
    row = {"case": name, "kind": kind, "format": fmt, "tp": tp, "valid": False, "note": ""}
    mesh = Mesh(np.array(jax.devices()[:tp]), ("tp",))
    key = jax.random.PRNGKey(tp)
    q = (lambda: tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.CURRENT_TENSOR_SCALING,
                                             q_dtype=jnp.float8_e4m3fn, q_layout=tej.QuantizeLayout.ROWWISE)) \
        if fmt == "fp8" else (lambda: None)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    if kind == "AG":  # fc1: x [tokens, hidden] sequence-sharded, w [ffn, hidden] sharded along ffn
        x = put(jax.random.uniform(key, (tokens, hidden), jnp.bfloat16, -1, 1), P("tp", None))
        w = put(jax.random.uniform(key, (ffn, hidden), jnp.bfloat16, -1, 1) * hidden ** -0.5, P("tp", None))
        ours = jax.jit(lambda x, w: N.all_gather_gemm(x, w, mesh, "tp", x_quantizer=q(), w_quantizer=q()))
        base = jax.jit(lambda x, w: N.all_gather_gemm(x, w, mesh, "tp", x_quantizer=q(), w_quantizer=q(),
                                                      comm_overlap=False, sm_margin=0))
        ring = jax.jit(lambda x, w: C.all_gather_gemm_sharded(x, w, mesh, "tp", x_quantizer=q(), w_quantizer=q()))
        xla = jax.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w, preferred_element_type=jnp.bfloat16),
                      out_shardings=NamedSharding(mesh, P(None, "tp")))
        gather = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P(None, None)))
        local_x = jax.device_put(jnp.zeros((tokens, hidden), jnp.bfloat16), jax.devices()[0])
        local_w = jax.device_put(jnp.zeros((ffn // tp, hidden), jnp.bfloat16), jax.devices()[0])
        comm_args = (x,)
    else:  # fc2: x [tokens, ffn] and w [hidden, ffn] sharded along ffn -> y sequence-sharded
        x = put(jax.random.uniform(key, (tokens, ffn), jnp.bfloat16, -1, 1), P(None, "tp"))
        w = put(jax.random.uniform(key, (hidden, ffn), jnp.bfloat16, -1, 1) * ffn ** -0.5, P(None, "tp"))
        ours = jax.jit(lambda x, w: N.gemm_reduce_scatter(x, w, mesh, "tp", x_quantizer=q(), w_quantizer=q()))
        base = jax.jit(lambda x, w: N.gemm_reduce_scatter(x, w, mesh, "tp", x_quantizer=q(), w_quantizer=q(),
                                                          comm_overlap=False, sm_margin=0))
        ring = jax.jit(lambda x, w: C.gemm_reduce_scatter_sharded(x, w, mesh, "tp")) if fmt == "bf16" else None
        xla = jax.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w, preferred_element_type=jnp.bfloat16),
                      out_shardings=NamedSharding(mesh, P("tp", None)))
        gather = None  # XLA's reduce-scatter alone is part of the XLA row
        local_x = jax.device_put(jnp.zeros((tokens, ffn // tp), jnp.bfloat16), jax.devices()[0])
        local_w = jax.device_put(jnp.zeros((hidden, ffn // tp), jnp.bfloat16), jax.devices()[0])
        comm_args = None
    try:
        a, b = np.asarray(ours(x, w).astype(jnp.float32)), np.asarray(base(x, w).astype(jnp.float32))
        if not np.array_equal(a, b):
            raise ValueError("overlapped != non-overlapped")
    except Exception as e:  # noqa: BLE001
        row["note"] = f"{type(e).__name__}: {str(e)[:300]}"
        H.log(f"FAIL  {name}: {row['note']}")
        return row
    row["valid"] = True
    gemm1 = jax.jit(lambda x, w: tej.gemm(x, w, ((1,), (1,))))
    fns = {"ours": (ours, (x, w)), "base": (base, (x, w)), "gemm": (gemm1, (local_x, local_w))}
    if kind == "RS":  # ours = the copy engine's windows (one process: the default); the same over NCCL send/recv
        ours_nccl = jax.jit(lambda x, w: N.gemm_reduce_scatter(x, w, mesh, "tp", x_quantizer=q(), w_quantizer=q()))
        if not np.array_equal(np.asarray(with_transport("nccl", lambda: ours_nccl(x, w)).astype(jnp.float32)), a):
            row["note"] += "NCCL transport's bytes differ; "
        fns["nccl"] = (ours_nccl, (x, w))
    if ring is not None:
        fns["ring"] = (ring, (x, w))
    if fmt == "bf16":
        fns["xla"] = (xla, (x, w))
    if gather is not None:
        fns["comm"] = (gather, comm_args)
    for k, us in _jax_interleaved_us(fns).items():
        row[f"{k}_us"] = us
    row["speedup_vs_base"] = row["base_us"] / row["ours_us"]
    row["ours_over_gemm"] = row["ours_us"] / row["gemm_us"]
    if "ring_us" in row:
        row["ring_over_ours"] = row["ring_us"] / row["ours_us"]
    if "xla_us" in row:
        row["xla_over_ours"] = row["xla_us"] / row["ours_us"]
    if "comm_us" in row:
        row["overlap_eff"] = max(0.0, min(1.0, (row["base_us"] - row["ours_us"]) / row["comm_us"]))
    H.log(f"ok    {name}: {row}")
    return row


JAX_COLUMNS = [("case", "case", "{}"), ("ours (FFI) us", "ours_us", "{:.1f}"),
               ("ours, RS over NCCL us", "nccl_us", "{:.1f}"),
               ("non-overlapped us", "base_us", "{:.1f}"), ("ppermute ring us", "ring_us", "{:.1f}"),
               ("XLA sharded einsum us", "xla_us", "{:.1f}"), ("GEMM alone us", "gemm_us", "{:.1f}"),
               ("non-overlapped / ours", "speedup_vs_base", "{:.3f}"), ("ring / ours", "ring_over_ours", "{:.3f}"),
               ("XLA / ours", "xla_over_ours", "{:.3f}"), ("ours / GEMM", "ours_over_gemm", "{:.3f}"),
               ("overlap eff.", "overlap_eff", "{:.2f}"), ("note", "note", "{}")]


def main_jax(args):
    import jax

    n = len(jax.devices())
    tps = [t for t in TPS if t <= n]
    if not tps or jax.devices()[0].platform != "gpu":
        print(f"bench_collective.py --jax: needs 2 or more GPUs, found {n} {jax.devices()[0].platform} devices",
              file=sys.stderr)
        return 2
    t0 = time.time()
    report = H.Report("collective_jax", {"device": f"{n} x {jax.devices()[0].device_kind}",
                                         "mode": "JAX, one process driving every GPU, NCCL and the copy engine "
                                                 "through the FFI",
                                         "timing": "median of 10 synchronised calls (wall clock)"})
    report.emit(f"{report.meta['device']}, jax {jax.__version__}")
    for shape in SHAPES[:1] if args.quick else SHAPES:
        for kind in ("AG", "RS"):
            for fmt in ("bf16", "fp8"):
                for tp in tps:
                    report.rows.append(jax_case(kind, shape, fmt, tp))
    report.emit("\nCollective GEMM in JAX (ours = te_collective_gemm: the core's ring, the all-gather over NCCL, the "
                "reduce-scatter's partials moved by the copy engine into windows every GPU maps; ours over NCCL = the "
                "reduce-scatter over NCCL send/receive; non-overlapped = the same exchanges and GEMMs one after "
                "another; ppermute ring = transformer_engine_jax.collective in "
                "shard_map; XLA = a sharded einsum, XLA's own all-gather / reduce-scatter; comm alone (AG) = XLA's "
                "all-gather of x)")
    report.table(JAX_COLUMNS)
    for r in report.rows:
        if r["valid"]:
            report.at_least(f"{r['case']}: non-overlapped / ours", r.get("speedup_vs_base"), 1.15, "{:.3f}x",
                            ">= 1.15x")
            if r.get("ring_over_ours") is not None:
                report.at_least(f"{r['case']}: ppermute ring / ours", r["ring_over_ours"], 1.0, "{:.3f}x", ">= 1x")
    report.print_targets("Targets (issues 22/23, JAX):")
    report.summary("cases", time.time() - t0)
    draw = draw_times(f"Collective GEMM in JAX, {report.meta['device']}", JAX_SERIES)
    report.plot("collective_jax", lambda fig: draw(fig, report.rows), figsize=(10, 8))
    report.save(H.out_dir_of(args, partial=bool(args.only)), json_path=args.json)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the large shape and tp = 4 only")
    p.add_argument("--only", action="append", default=[], metavar="SUBSTR", help="cases whose name holds SUBSTR")
    p.add_argument("--sm-margins", default="", metavar="LIST",
                   help="NCCL mode: also time ours with these SM margins, e.g. 0,8,16,32")
    H.add_output_args(p)
    p.add_argument("--jax", action="store_true", help="the JAX mode: one process driving every visible GPU")
    p.add_argument("--replot", metavar="JSON", help="re-render a saved NCCL or JAX report's plot (no GPU needed)")
    args = p.parse_args()
    if args.replot:
        return replot(args.replot)
    if args.jax:
        return main_jax(args)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return main_nccl(args)
    device, tex = H.start(args, "bench_collective.py")
    if device is None:
        return 2
    if device == "cpu":
        print("bench_collective.py: the loopback mode needs a GPU; --cpu-smoke checks nothing here", file=sys.stderr)
        return 2
    t0 = time.time()
    timer = H.Timer(quick=args.quick, device=device)
    ctx = {"tex": tex, "device": device, "timer": timer}
    report = H.Report("collective", {"device": H.device_name(device), "mode": "one-GPU loopback",
                                     "timing": timer.method, "quick": args.quick})
    report.emit(f"device {report.meta['device']}, torch {torch.__version__}, one-GPU loopback, {timer.method}")
    shapes = SHAPES[:1] if args.quick else SHAPES
    tps = (4,) if args.quick else TPS
    for shape in shapes:
        for kind in ("AG", "RS"):
            for fmt in ("bf16", "fp8"):
                for tp in tps:
                    name = f"{kind} {fmt} tp={tp} {'x'.join(map(str, shape))}"
                    if args.only and not any(s in name for s in args.only):
                        continue
                    report.rows.append(case(ctx, kind, shape, tp, fmt))
                    H.release(device)
    report.emit("\nCollective GEMM, one-GPU loopback (ours = overlapped ring; non-overlapped = the same exchanges, "
                "then the same chunk GEMMs; GEMM alone = one GEMM of the rank's whole problem; comm alone = the "
                "tp-1 chunk copies; overlap eff. = (non-overlapped - ours) / comm)")
    report.table(COLUMNS)
    for r in report.rows:
        if r["valid"] and r["kind"] == "AG":
            report.at_most(f"{r['case']}: loopback AG+GEMM / GEMM alone", r["ours_over_gemm"], TARGET_AG, "{:.3f}x",
                           f"<= {TARGET_AG}x")
    report.print_targets("Targets (issue 22, one GPU):")
    report.summary("cases", time.time() - t0)

    def draw(fig):
        rows = [r for r in report.rows if r["valid"]]
        ax = fig.add_subplot(111)
        H.grouped_bars(ax, [r["case"] for r in rows],
                       {"ours / GEMM alone": [r["ours_over_gemm"] for r in rows],
                        "non-overlapped / GEMM alone": [r["base_us"] / r["gemm_us"] for r in rows]},
                       horizontal=True)
        ax.axvline(TARGET_AG, color="gray", ls="--", lw=1)
        ax.set_xlabel("time / the GEMM alone (lower is better)")
        ax.set_title("Collective GEMM, one-GPU loopback")
        ax.legend()

    report.plot("collective", draw, figsize=(10, 12))
    report.save(H.out_dir_of(args, partial=bool(args.only)), json_path=args.json)
    return 0 if all(r["valid"] for r in report.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
