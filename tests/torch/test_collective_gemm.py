"""tex.all_gather_gemm / tex.gemm_reduce_scatter (csrc/core/ops/collective_gemm_op.h) over torch.distributed with gloo:
2 and 4 processes on the CPU run the core's ring schedule with the CPU GEMM, and each rank checks its result bit for
bit against the non-overlapped computation it can redo alone — every rank builds the same full x and w from one seed,
so "all-gather then GEMM" is the GEMM of the full x (bf16, and FP8 per tensor with each rank's shard quantized on its
own, each chunk with its own scale), and "GEMM then reduce-scatter" is the FP32 partial products of every rank's K
shard added in the ring's order (chunk c: ranks c + 1, c + 2, …, c) and rounded once. Also against a float64
product, so that the reference itself is checked. On one GPU (tests marked cuda) the loopback transport runs the same
schedule with copy-engine exchanges: bit for bit the non-overlapped result, and under CUDA-graph capture.

The tensor-parallel tex.Linear (column + row) and tex.MLP: in plain precision against float64; under each recipe
against the unsharded layers under the same recipe and against float64 within the recipe's tolerance, overlapped =
non-overlapped bit for bit, and, for delayed scaling, the same scales on every rank (check_tp_recipes). The
tensor-parallel tex.TransformerLayer (test_transformer_layer.check_tp_transformer) runs in the same ranks."""
import collections
import contextlib
import math
import os
import tempfile
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from tests.torch.helpers import capture_graph, current_quantizer, tex_module
from tests.torch.test_transformer_layer import check_tp_transformer

M_PER_RANK, K, N = 24, 64, 48  # per rank: AG x shard [24, 64]; RS: K split tp ways, N 48


def full_operands(tp, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(tp * M_PER_RANK, K * tp, generator=g) * 4 - 2).bfloat16()
    w = (torch.rand(N, K * tp, generator=g) * 2 - 1).bfloat16()
    return x.to(device), w.to(device)


def ring_sum(partials, c, tp):
    """The reduce-scatter's FP32 sum for chunk c, in the ring's order: ranks c + 1, …, c."""
    acc = partials[(c + 1) % tp].clone()
    for i in range(2, tp + 1):
        acc = acc + partials[(c + i) % tp]
    return acc


def check_rank(tex, rank, tp, device):
    """Every reference GEMM has the shape of the ring's chunk GEMM (the same kernel on CUDA, hence the same bits)."""
    x_full, w_full = full_operands(tp, device)
    m = M_PER_RANK
    rows = slice(rank * m, (rank + 1) * m)
    # ---- all-gather + GEMM (column parallel: this rank's w is its own [N, K·tp] slice of output columns) --------
    xa = x_full[:, :K]                                   # [tp·m, K]; rank r holds rows r·m …
    wa = w_full[:, K * 0:K].roll(rank, 0).contiguous()   # a different w per rank
    want = torch.cat([tex.general_gemm(wa, xa[c * m:(c + 1) * m], out_dtype=torch.bfloat16, layout="TN",
                                       use_split_accumulator=True)[0] for c in range(tp)])
    for overlap in (True, False):
        y, gathered = tex.all_gather_gemm(xa[rows].contiguous(), wa, comm_overlap=overlap, return_gathered=True)
        assert torch.equal(y, want), f"rank {rank}: AG bf16 overlap={overlap} differs from all_gather -> GEMM"
        assert torch.equal(gathered, xa), f"rank {rank}: the gathered x differs"
    w64 = (xa.double() @ wa.double().t())
    assert (y.double() - w64).abs().max() <= 2 ** -7 * w64.abs().max(), "AG bf16 is far from float64"
    # FP8 per tensor: each rank quantizes its own shard (its own scale), the codes and scales travel together.
    q = current_quantizer("e4m3", columnwise=False)
    wq = tex.quantize(wa, current_quantizer("e4m3", columnwise=False))
    shards = [tex.quantize(xa[c * m:(c + 1) * m].contiguous(), q) for c in range(tp)]
    want8 = torch.cat([tex.general_gemm(wq, s, out_dtype=torch.bfloat16, layout="TN",
                                        use_split_accumulator=True)[0] for s in shards])
    y8, (codes, scales) = tex.all_gather_gemm(shards[rank], wq, return_gathered=True)
    assert torch.equal(y8, want8), f"rank {rank}: AG FP8 differs from all_gather -> per-chunk GEMM"
    assert torch.equal(scales, torch.cat([s._scale_inv for s in shards])), "the gathered scales differ"
    assert torch.equal(codes, torch.cat([s._data for s in shards])), "the gathered codes differ"
    y8q = tex.all_gather_gemm(xa[rows].contiguous(), wq, quantizer=q)
    assert torch.equal(y8q, want8), f"rank {rank}: AG with a quantizer differs"
    # ---- GEMM + reduce-scatter (row parallel: rank p holds x's and w's K shard p) -----------------------------
    ks = [slice(p * K, (p + 1) * K) for p in range(tp)]
    partials = [tex.general_gemm(w_full[:, k].contiguous(), x_full[rows, k].contiguous(), out_dtype=torch.float32,
                                 layout="TN", use_split_accumulator=True)[0] for k in ks]
    want_rs = ring_sum(partials, rank, tp).bfloat16()
    for overlap in (True, False):
        y = tex.gemm_reduce_scatter(x_full[:, ks[rank]].contiguous(), w_full[:, ks[rank]].contiguous(),
                                    comm_overlap=overlap)
        assert torch.equal(y, want_rs), f"rank {rank}: RS bf16 overlap={overlap} differs from GEMM -> reduce-scatter"
    r64 = (x_full.double() @ w_full.double().t())[rows]
    assert (y.double() - r64).abs().max() <= 2 ** -7 * r64.abs().max(), "RS bf16 is far from float64"
    # FP8: each rank's x and w shards quantized on their own.
    xq = [tex.quantize(x_full[:, k].contiguous(), q) for k in ks]
    wqs = [tex.quantize(w_full[:, k].contiguous(), q) for k in ks]
    xq_rows = [tex.quantize(x_full[rows, k].contiguous(), q) for k in ks]  # rows of xq[p]: the same codes, scale
    for p in range(tp):
        xq_rows[p]._scale_inv = xq[p]._scale_inv
        xq_rows[p]._data = xq[p]._data.reshape(tp * m, -1)[rows].contiguous()
    partials8 = [tex.general_gemm(wqs[p], xq_rows[p], out_dtype=torch.float32, layout="TN",
                                  use_split_accumulator=True)[0] for p in range(tp)]
    y = tex.gemm_reduce_scatter(xq[rank], wqs[rank])
    assert torch.equal(y, ring_sum(partials8, rank, tp).bfloat16()), f"rank {rank}: RS FP8 differs"
    # fp32 output: the FP32 ring sum itself
    y32 = tex.gemm_reduce_scatter(x_full[:, ks[rank]].contiguous(), w_full[:, ks[rank]].contiguous(),
                                  out_dtype=torch.float32)
    assert torch.equal(y32, ring_sum(partials, rank, tp)), f"rank {rank}: RS fp32 differs"
    # ---- autograd: the mirrored rings (dgrad of AG is an RS and vice versa), dw from the kept gather ---------------
    close = lambda got, want, what: _assert_close(got, want, f"rank {rank}: {what}")  # noqa: E731
    gen = torch.Generator().manual_seed(11)
    dys = [(torch.rand(tp * m, N, generator=gen) * 2 - 1).bfloat16().to(device) for _ in range(tp)]  # rank p's dy
    ws_all = [w_full[:, :K].roll(p, 0).contiguous() for p in range(tp)]                   # rank p's AG weight
    xs = xa[rows].clone().requires_grad_()
    wr = wa.clone().requires_grad_()
    tex.all_gather_gemm(xs, wr).backward(dys[rank])
    dx_full = sum(dys[p].double() @ ws_all[p].double() for p in range(tp))
    close(xs.grad, dx_full[rows], "AG dgrad (reduce-scatter ring)")
    close(wr.grad, dys[rank].double().t() @ xa.double(), "AG wgrad (kept gather)")
    g_full = (torch.rand(tp * m, N, generator=gen) * 2 - 1).bfloat16().to(device)  # RS: rank p's dy is rows p
    xr = x_full[:, ks[rank]].contiguous().requires_grad_()
    wr = w_full[:, ks[rank]].contiguous().requires_grad_()
    tex.gemm_reduce_scatter(xr, wr).backward(g_full[rows])
    close(xr.grad, g_full.double() @ w_full[:, ks[rank]].double(), "RS dgrad (all-gather ring)")
    close(wr.grad, g_full.double().t() @ x_full[:, ks[rank]].double(), "RS wgrad (the gathered dy)")
    # with a quantizer (x and w quantized per rank, FP8 forward): the forward's bytes are the non-autograd call's; dx
    # from the plain w, dw from the gathered FP8 x decoded (its codes and per-rank scales: no second all-gather)
    q8 = lambda: current_quantizer("e4m3", columnwise=False)  # noqa: E731
    xs, wr = xa[rows].clone().requires_grad_(), wa.clone().requires_grad_()
    y8 = tex.all_gather_gemm(xs, wr, quantizer=q8())
    assert torch.equal(y8, tex.all_gather_gemm(xa[rows].contiguous(), tex.quantize(wa, q8()), quantizer=q8())), \
        f"rank {rank}: the FP8 autograd forward differs from the plain call"
    y8.backward(dys[rank])
    close(xs.grad, dx_full[rows], "AG FP8 dgrad (plain w)")
    x8 = torch.cat([tex.quantize(xa[c * m:(c + 1) * m].contiguous(), q8()).dequantize(torch.float32).double()
                    for c in range(tp)])
    close(wr.grad, dys[rank].double().t() @ x8, "AG FP8 wgrad (the gathered codes, decoded)")
    xr = x_full[:, ks[rank]].contiguous().requires_grad_()
    wq = tex.quantize(w_full[:, ks[rank]].contiguous(), q8())  # an FP8 w without grad: dx from its values
    tex.gemm_reduce_scatter(xr, wq, quantizer=q8()).backward(g_full[rows])
    close(xr.grad, g_full.double() @ wq.dequantize(torch.float32).double(), "RS FP8 dgrad (FP8 w's values)")
    # ---- errors ----------------------------------------------------------------------------------------------
    # the op called directly with a DType code that is not the tensor's: refused by the core, never read as bf16
    group_name = __import__("torch.distributed", fromlist=["group"]).group.WORLD.group_name
    with pytest.raises(TypeError, match=r"operand B is Float but its DType code says bf16"):
        torch.ops.te.collective_gemm(xa[rows].float().contiguous(), None, 6, wa, None, 6, 1, group_name, 6)
    with pytest.raises(ValueError, match=rf"reduce-scatter splits x's {tp * m + 1} rows into tp = {tp} equal chunks"):
        tex.gemm_reduce_scatter(torch.zeros(tp * m + 1, K, dtype=torch.bfloat16, device=device),
                                torch.zeros(N, K, dtype=torch.bfloat16, device=device))


def check_tp_layers(tex, rank, tp, device):
    """tex.Linear's tensor-parallel modes: a column layer then a row layer (an MLP's fc1 / fc2), with and without
    sequence parallelism, forward and backward, against the unsharded pair in float64. fp32 parameters and inputs."""
    import torch.distributed as dist

    s, b, h, f = 4 * tp, 3, 32, 16 * tp  # [seq, batch, hidden], ffn
    gen = torch.Generator().manual_seed(21)
    rnd = lambda *shape: (torch.rand(*shape, generator=gen) * 2 - 1).to(device)  # noqa: E731
    w1, b1, w2, b2, x, g = rnd(f, h), rnd(f), rnd(h, f), rnd(h), rnd(s, b, h), rnd(s, b, h)
    x64 = x.double().requires_grad_()
    w1_64, b1_64, w2_64, b2_64 = (t.double().requires_grad_() for t in (w1, b1, w2, b2))
    y64 = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x64, w1_64, b1_64)), w2_64, b2_64)
    (y64 * g.double()).sum().backward()
    fs, ss = slice(rank * f // tp, (rank + 1) * f // tp), slice(rank * s // tp, (rank + 1) * s // tp)
    group = dist.group.WORLD
    for sp in (True, False):
        fc1 = tex.Linear(h, f, tp_group=group, parallel_mode="column", sequence_parallel=sp, device=device)
        fc2 = tex.Linear(f, h, tp_group=group, parallel_mode="row", sequence_parallel=sp, device=device)
        with torch.no_grad():
            fc1.weight.copy_(w1[fs]), fc1.bias.copy_(b1[fs]), fc2.weight.copy_(w2[:, fs]), fc2.bias.copy_(b2)
        xin = (x[ss] if sp else x).clone().requires_grad_()
        y = fc2(torch.relu(fc1(xin)))
        rows = ss if sp else slice(None)
        assert y.shape == y64[rows].shape, f"sp={sp}: y {tuple(y.shape)}"
        what = f"rank {rank} TP Linear sp={sp}"
        _assert_close(y.detach(), y64[rows].detach(), f"{what}: y", rel=2 ** -20)
        (y * g[rows]).sum().backward()
        _assert_close(xin.grad, x64.grad[rows], f"{what}: dx", rel=2 ** -20)
        _assert_close(fc1.weight.grad, w1_64.grad[fs], f"{what}: d fc1.weight", rel=2 ** -20)
        _assert_close(fc1.bias.grad, b1_64.grad[fs], f"{what}: d fc1.bias", rel=2 ** -20)
        _assert_close(fc2.weight.grad, w2_64.grad[:, fs], f"{what}: d fc2.weight", rel=2 ** -20)
        _assert_close(fc2.bias.grad, b2_64.grad, f"{what}: d fc2.bias (summed over the group)", rel=2 ** -20)
    # tex.MLP's tensor-parallel mode: gelu, and swiglu (fc1's two halves sharded alike)
    for act, gated in (("gelu", False), ("swiglu", True)):
        a1 = rnd((2 if gated else 1) * f, h)
        c1 = rnd((2 if gated else 1) * f)
        x64 = x.double().requires_grad_()
        p64 = [t.double().requires_grad_() for t in (a1, c1, w2, b2)]
        h64 = torch.nn.functional.linear(x64, p64[0], p64[1])
        if gated:
            u, v = h64[..., :f], h64[..., f:]
            act64 = u * torch.sigmoid(u) * v
        else:
            act64 = 0.5 * h64 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h64 + 0.044715 * h64 ** 3)))
        y64 = torch.nn.functional.linear(act64, p64[2], p64[3])
        (y64 * g.double()).sum().backward()
        rows1 = torch.cat([torch.arange(f)[fs] + i * f for i in range(2 if gated else 1)])
        for sp in (True, False):
            mlp = tex.MLP(h, f, act, tp_group=group, sequence_parallel=sp, device=device)
            with torch.no_grad():
                mlp.fc1_weight.copy_(a1[rows1]), mlp.fc1_bias.copy_(c1[rows1])
                mlp.fc2_weight.copy_(w2[:, fs]), mlp.fc2_bias.copy_(b2)
            ss_ = ss if sp else slice(None)
            xin = x[ss_].clone().requires_grad_()
            y = mlp(xin)
            what = f"rank {rank} TP MLP {act} sp={sp}"
            _assert_close(y.detach(), y64[ss_].detach(), f"{what}: y", rel=2 ** -16)
            (y * g[ss_]).sum().backward()
            _assert_close(xin.grad, x64.grad[ss_], f"{what}: dx", rel=2 ** -16)
            _assert_close(mlp.fc1_weight.grad, p64[0].grad[rows1], f"{what}: d fc1_weight", rel=2 ** -16)
            _assert_close(mlp.fc2_weight.grad, p64[2].grad[:, fs], f"{what}: d fc2_weight", rel=2 ** -16)
            _assert_close(mlp.fc2_bias.grad, p64[3].grad, f"{what}: d fc2_bias", rel=2 ** -16)
    with pytest.raises(ValueError, match=r"parallel_mode='column' needs tp_group"):
        tex.Linear(h, f, parallel_mode="column")
    with pytest.raises(ValueError, match=rf"splits out_features={f + 1} over tp={tp} ranks"):
        tex.Linear(h, f + 1, tp_group=group, parallel_mode="column")
    # under a recipe the GEMM dims that must align are this rank's (in_features/tp = 16 here: not a multiple of 32)
    misaligned = r"MXFP8BlockScaling every GEMM dim must be a multiple of 32.*in_features/tp=16"
    with pytest.raises(ValueError, match=misaligned):
        with tex.autocast(recipe=tex.MXFP8BlockScaling()):
            tex.Linear(f, h, tp_group=group, parallel_mode="row", device=device)(torch.zeros(s, f // tp, device=device))


# ---- tensor-parallel layers under every recipe ------------------------------------------------------------------
# name -> (recipe, tolerance of the forward output, of the gradients, float64 factor): normwise, relative to
# max |reference|: the SPEC §9 rtol of the format each pass runs in (HYBRID: E4M3 forward, E5M2 gradients), times a
# factor against float64 — 1, except NVFP4's 2: each FP4 GEMM's two operands carry errors up to a sixth of their
# block's max and dx passes three such GEMMs (measured: up to 0.35 for the unsharded layer too).
RECIPES = {
    "delayed": (lambda tex: tex.DelayedScaling(amax_history_len=4), 0.125, 0.25, 1),
    "current": (lambda tex: tex.Float8CurrentScaling(), 0.125, 0.25, 1),
    "mxfp8": (lambda tex: tex.MXFP8BlockScaling(), 0.125, 0.125, 1),
    "fp8_block": (lambda tex: tex.Float8BlockScaling(), 0.125, 0.125, 1),
    "nvfp4": (lambda tex: tex.NVFP4BlockScaling(), 0.25, 0.25, 2),
}


@contextlib.contextmanager
def _count_collective_gemms(tex):
    """Counts the layers' calls of tex.collective.all_gather_gemm / gemm_reduce_scatter (looked up at each call)."""
    calls = collections.Counter()
    names = ("all_gather_gemm", "gemm_reduce_scatter")
    originals = {n: getattr(tex.collective, n) for n in names}

    def counting(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return originals[name](*args, **kwargs)
        return call

    for n in names:
        setattr(tex.collective, n, counting(n))
    try:
        yield calls
    finally:
        for n in names:
            setattr(tex.collective, n, originals[n])


def _gelu64(h):
    return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))


def _run_tp_model(tex, kind, recipe, params, x, g, steps, group=None, sp=False, overlap=True):
    """`kind` "pair" (column Linear → gelu → row Linear) or "mlp" (tex.MLP gelu), bf16, run `steps` training steps
    under `recipe` (unsharded when group is None, else this rank's shards). Returns (results of the last step: y and
    every gradient, the layers). Random bits (NVFP4's stochastic rounding) are seeded alike in every run."""
    import torch.distributed as dist

    w1, b1, w2, b2 = params
    f, h = w1.shape
    tp, rank = (1, 0) if group is None else (group.size(), dist.get_rank(group))
    fs = slice(rank * f // tp, (rank + 1) * f // tp)
    rows = slice(rank * x.shape[0] // tp, (rank + 1) * x.shape[0] // tp) if sp else slice(None)
    kw = dict(params_dtype=torch.bfloat16, device=x.device)
    if group is not None:
        kw.update(tp_group=group, sequence_parallel=sp, comm_overlap=overlap)
    if kind == "pair":
        fc1 = tex.Linear(h, f, parallel_mode=None if group is None else "column", **kw)
        fc2 = tex.Linear(f, h, parallel_mode=None if group is None else "row", **kw)
        layers = (fc1, fc2)
        ps = (fc1.weight, fc1.bias, fc2.weight, fc2.bias)
        model = lambda t: fc2(torch.nn.functional.gelu(fc1(t), approximate="tanh"))  # noqa: E731
    else:
        mlp = tex.MLP(h, f, "gelu", **kw)
        layers = (mlp,)
        ps = (mlp.fc1_weight, mlp.fc1_bias, mlp.fc2_weight, mlp.fc2_bias)
        model = mlp
    with torch.no_grad():
        for p, full, sl in zip(ps, params, ((fs,), (fs,), (slice(None), fs), (slice(None),))):
            p.copy_(full[sl])
    for _ in range(steps):
        for p in ps:
            p.grad = None
        torch.manual_seed(5)
        xin = x[rows].clone().requires_grad_()
        with tex.autocast(recipe=recipe):
            y = model(xin)
        y.backward(g[rows])
    return dict(y=y.detach(), dx=xin.grad, w1=ps[0].grad, b1=ps[1].grad, w2=ps[2].grad, b2=ps[3].grad), layers


def check_tp_recipes(tex, rank, tp, device, names=tuple(RECIPES)):
    """Tensor-parallel tex.Linear (column + row pair) and tex.MLP under each recipe, with and without sequence
    parallelism, forward and backward: against the unsharded layers under the same recipe and against float64, within
    the recipe's tolerance; comm_overlap=True bit for bit comm_overlap=False; under delayed scaling every rank holds
    the same scales after two steps, and the unsharded layers' (the TP-reduced amaxes are the unsharded ones)."""
    import torch.distributed as dist

    group = dist.group.WORLD
    s, b, h, f = 16 * tp, 2, 64, 64 * tp  # [seq, batch, hidden], ffn: ffn/tp = 64, tokens 32·tp
    gen = torch.Generator().manual_seed(31)
    rnd = lambda *shape: (torch.rand(*shape, generator=gen) * 2 - 1).bfloat16().to(device)  # noqa: E731
    params = (rnd(f, h), rnd(f) * 0.1, rnd(h, f) * 0.25, rnd(h) * 0.1)
    x, g = rnd(s, b, h), rnd(s, b, h)
    fs = slice(rank * f // tp, (rank + 1) * f // tp)
    ss = slice(rank * s // tp, (rank + 1) * s // tp)
    # float64 references of both models
    ref64 = {}
    for kind in ("pair", "mlp"):
        x64 = x.double().requires_grad_()
        p64 = [t.double().requires_grad_() for t in params]
        hh = torch.nn.functional.linear(x64, p64[0], p64[1])
        y64 = torch.nn.functional.linear(_gelu64(hh), p64[2], p64[3])
        (y64 * g.double()).sum().backward()
        ref64[kind] = dict(y=y64.detach(), dx=x64.grad, w1=p64[0].grad, b1=p64[1].grad, w2=p64[2].grad,
                           b2=p64[3].grad)
    failures = []
    for name in names:
        make, tol_fwd, tol_bwd, factor64 = RECIPES[name]
        recipe = make(tex)
        steps = 2 if name == "delayed" else 1
        try:
            for kind in ("pair", "mlp"):
                full, full_layers = _run_tp_model(tex, kind, recipe, params, x, g, steps)
                for sp in (True, False):
                    rows = ss if sp else slice(None)
                    pieces = dict(y=(rows,), dx=(rows,), w1=(fs,), b1=(fs,), w2=(slice(None), fs), b2=(slice(None),))
                    with _count_collective_gemms(tex) as calls:
                        got, layers = _run_tp_model(tex, kind, recipe, params, x, g, steps, group, sp, overlap=True)
                    what = f"rank {rank} {name} TP {kind} sp={sp}"
                    for key, sl in pieces.items():
                        tol = tol_fwd if key == "y" else tol_bwd
                        _assert_close(got[key], full[key][sl].double(), f"{what}: {key} vs the unsharded layer", tol)
                        _assert_close(got[key], ref64[kind][key][sl], f"{what}: {key} vs float64", tol * factor64)
                    # sequence parallel + per-tensor FP8: forward and backward on the collective GEMM core (one
                    # all-gather ring and one reduce-scatter ring each way per step); else torch.distributed's exchanges
                    ring = sp and name in ("delayed", "current")
                    want = {"all_gather_gemm": 2 * steps, "gemm_reduce_scatter": 2 * steps} if ring else {}
                    assert dict(calls) == want, f"{what}: collective GEMM calls {dict(calls)}, expected {want}"
                    if sp:  # the overlapped rings (per-tensor FP8) and the non-overlapped exchanges: the same bytes
                        again, _ = _run_tp_model(tex, kind, recipe, params, x, g, steps, group, sp, overlap=False)
                        for key in pieces:
                            assert torch.equal(got[key], again[key]), f"{what}: {key} comm_overlap True != False"
                    if name == "delayed":
                        for layer, ref in zip(layers, full_layers):
                            for buf in ("fp8_fwd_scale", "fp8_bwd_scale", "fp8_fwd_amax_history",
                                        "fp8_bwd_amax_history"):
                                mine = getattr(layer, buf)
                                every = [torch.empty_like(mine) for _ in range(tp)]
                                dist.all_gather(every, mine.contiguous(), group=group)
                                assert all(torch.equal(e, mine) for e in every), f"{what}: {buf} differs between ranks"
                            assert not torch.equal(layer.fp8_fwd_scale, torch.ones_like(layer.fp8_fwd_scale)), \
                                f"{what}: the forward scales were never updated"
                            assert not torch.equal(layer.fp8_bwd_scale, torch.ones_like(layer.fp8_bwd_scale)), \
                                f"{what}: the backward scales were never updated"
                            torch.testing.assert_close(layer.fp8_fwd_scale, ref.fp8_fwd_scale, rtol=2 ** -6, atol=0,
                                                       msg=lambda m: f"{what}: forward scales vs unsharded: {m}")
                            torch.testing.assert_close(layer.fp8_bwd_scale, ref.fp8_bwd_scale, rtol=2 ** -6, atol=0,
                                                       msg=lambda m: f"{what}: backward scales vs unsharded: {m}")
            if name == "current":
                # A sequence-parallel row layer whose input needs no gradient has no dgrad ring to gather dy through:
                # it gathers dy in bf16 and quantizes it whole. The ring's FP8 shards share the scale of the reduced
                # amax, so both hold the same codes and the weight gradients are equal bit for bit.
                a_full, dws = rnd(s, b, f // tp), []
                for needs_dx in (True, False):
                    row = tex.Linear(f, h, tp_group=group, parallel_mode="row", sequence_parallel=True,
                                     params_dtype=torch.bfloat16, device=device)
                    with torch.no_grad():
                        row.weight.copy_(params[2][:, fs])
                    with tex.autocast(recipe=recipe):
                        row(a_full.clone().requires_grad_(needs_dx)).backward(g[ss])
                    dws.append(row.weight.grad)
                assert torch.equal(dws[0], dws[1]), f"rank {rank} current: the row layer's dw differs without dx"
        except Exception:  # noqa: BLE001  (every recipe runs; the failures are reported together)
            failures.append(f"{name}:\n{traceback.format_exc()}")
    assert not failures, "\n".join(failures)


def _assert_close(got, want, what, rel=2 ** -7):
    err = (got.double() - want).abs().max().item()
    bound = rel * want.abs().max().item() + 1e-12
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"
    assert (got.double() - want.flip(0)).abs().max().item() > bound, f"{what}: the check would not catch it"


def check_transports(tex, rank, tp, device):
    """NCCL: the reduce-scatter over NCCL send/receive gives the bytes of the copy engine's windows (the default),
    overlapped or not; a call four times larger grows the window (every rank at once) and still gives the ring sum;
    an unknown transport name is refused on every rank before any data moves."""
    x_full, w_full = full_operands(tp, device, seed=3)
    ks = [slice(p * K, (p + 1) * K) for p in range(tp)]
    key = "NVTE_COLLECTIVE_GEMM_TRANSPORT"
    try:
        for x in (x_full, torch.cat([x_full] * 4)):
            m = x.shape[0] // tp
            parts = [tex.general_gemm(w_full[:, k].contiguous(), x[rank * m:(rank + 1) * m, k].contiguous(),
                                      out_dtype=torch.float32, layout="TN")[0] for k in ks]
            want = ring_sum(parts, rank, tp).bfloat16()
            for choice in ("copy_engine", "nccl"):
                os.environ[key] = choice
                for overlap in (True, False):
                    y = tex.gemm_reduce_scatter(x[:, ks[rank]].contiguous(), w_full[:, ks[rank]].contiguous(),
                                                comm_overlap=overlap)
                    assert torch.equal(y, want), f"rank {rank}: RS over {choice} (overlap={overlap}) differs"
        os.environ[key] = "bogus"
        with pytest.raises(ValueError, match=f"{key}='bogus' is not one of copy_engine, nccl"):
            tex.gemm_reduce_scatter(x_full[:, ks[rank]].contiguous(), w_full[:, ks[rank]].contiguous())
    finally:
        os.environ.pop(key, None)


def check_graph_capture(tex, rank, tp, device):
    """NCCL: the rings captured in one CUDA graph (the exchanges stream-ordered, no host sync) and replayed give the
    eager call's bytes, all-gather and reduce-scatter, with the agreement check off (it reads a value back)."""
    x_full, w_full = full_operands(tp, device)
    m = M_PER_RANK
    xa, wa = x_full[rank * m:(rank + 1) * m, :K].contiguous(), w_full[:, :K].contiguous()
    xr, wr = x_full[:, rank * K:(rank + 1) * K].contiguous(), w_full[:, rank * K:(rank + 1) * K].contiguous()
    calls = (lambda: tex.all_gather_gemm(xa, wa, validate=False),
             lambda: tex.gemm_reduce_scatter(xr, wr, validate=False))
    for name, fn in zip(("AG", "RS"), calls):
        graph, out = capture_graph(fn)
        want = fn()
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"rank {rank}: {name} graph replay differs from the eager call"


def worker(rank, tp, init_file, results, backend, base=True, recipes=()):
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        device = "cpu"
        if backend == "nccl":
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (the device tool's rule)
            torch.cuda.set_device(rank)
            device = f"cuda:{rank}"
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=tp,
                                **({"device_id": torch.device(device)} if backend == "nccl" else {}))
        if base:
            check_rank(tex_module(), rank, tp, device)
            check_tp_layers(tex_module(), rank, tp, device)
            check_tp_transformer(rank, tp, device)
        if recipes:
            check_tp_recipes(tex_module(), rank, tp, device, recipes)
        if backend == "nccl":
            check_transports(tex_module(), rank, tp, device)
            check_graph_capture(tex_module(), rank, tp, device)
        results[rank] = "ok"
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (reported to the parent, which fails the test with it)
        results[rank] = traceback.format_exc()


def run_ranks(tp, backend, base=True, recipes=()):
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d, ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=worker, args=(r, tp, os.path.join(d, "init"), results, backend, base,
                                                      recipes))
                 for r in range(tp)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=240)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
        assert not hung, f"ranks {hung} did not finish within 240 s"
        for r in range(tp):
            assert results.get(r) == "ok", f"rank {r} of {tp}:\n{results.get(r)}"


@pytest.mark.parametrize("tp", [2, 4])
def test_collective_gemm_gloo(tp):
    """The collective ops and the TP layers in plain precision; tp = 4 also runs the TP layers under DelayedScaling
    (the four-rank rings and the amax reduction over four ranks; the other recipes run at tp = 2 below)."""
    run_ranks(tp, "gloo", recipes=("delayed",) if tp == 4 else ())


def test_tp_layers_recipes_gloo():
    """Tensor-parallel tex.Linear and tex.MLP under every recipe, tp = 2 (check_tp_recipes)."""
    run_ranks(2, "gloo", base=False, recipes=tuple(RECIPES))


@pytest.mark.multigpu
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_collective_gemm_nccl(tp):
    """The same checks with NCCL, one process per GPU (torch.distributed's communicator carries the ring): the ops,
    the TP layers in plain precision and under every recipe, and the rings under CUDA-graph capture."""
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs, {torch.cuda.device_count()} visible")
    run_ranks(tp, "nccl", recipes=tuple(RECIPES))


# ---- one GPU: the loopback transport ------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_loopback_all_gather_gemm(fp8):
    """Every simulated rank of tp = 4: overlapped = non-overlapped bit for bit (the same chunk GEMMs), and equal to
    the per-chunk GEMMs of the full x; the same under CUDA-graph capture."""
    tex = tex_module()
    tp, m, k, n = 4, 256, 512, 384
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(tp * m, k, generator=g) * 2 - 1).bfloat16().cuda()
    w = (torch.rand(n, k, generator=g) * 2 - 1).bfloat16().cuda()
    if fp8:
        x, w = tex.quantize(x, current_quantizer("e4m3", columnwise=False)), \
            tex.quantize(w, current_quantizer("e4m3", columnwise=False))
    for rank in range(tp):
        a = tex.collective.all_gather_gemm_loopback(x, w, rank, tp)
        b = tex.collective.all_gather_gemm_loopback(x, w, rank, tp, comm_overlap=False)
        assert torch.equal(a, b), f"rank {rank}: overlapped != non-overlapped"
    ref = tex.general_gemm(w, x, out_dtype=torch.bfloat16, layout="TN", use_split_accumulator=True)[0]
    assert (a.float() - ref.float()).abs().max() <= 2 ** -7 * ref.float().abs().max() + 1e-3, "far from one GEMM"
    graph, out = capture_graph(lambda: tex.collective.all_gather_gemm_loopback(x, w, 1, tp))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, tex.collective.all_gather_gemm_loopback(x, w, 1, tp)), "graph replay differs"


@pytest.mark.cuda
def test_loopback_gemm_reduce_scatter():
    """Rank 2 of tp = 4: the incoming chunks are the other ranks' FP32 partials of this rank's output chunk (computed
    here); the result is bit for bit their sum in ring order, overlapped or not, and under CUDA-graph capture."""
    tex = tex_module()
    tp, m, k, n, rank = 4, 256, 512, 384, 2
    g = torch.Generator().manual_seed(4)
    xs = [((torch.rand(tp * m, k, generator=g) * 2 - 1).bfloat16().cuda()) for _ in range(tp)]
    ws = [((torch.rand(n, k, generator=g) * 2 - 1).bfloat16().cuda()) for _ in range(tp)]
    part = [[tex.general_gemm(ws[p], xs[p][c * m:(c + 1) * m].contiguous(), out_dtype=torch.float32,
                              layout="TN")[0] for c in range(tp)] for p in range(tp)]
    # exchange s (0 … tp-2) brings rank (rank - s - 1)'s partial of this rank's chunk
    incoming = torch.stack([part[(rank - s - 1) % tp][rank] for s in range(tp - 1)])
    want = ring_sum([part[p][rank] for p in range(tp)], rank, tp).bfloat16()
    for overlap in (True, False):
        y = tex.collective.gemm_reduce_scatter_loopback(xs[rank], ws[rank], incoming, rank, tp, comm_overlap=overlap)
        assert torch.equal(y, want), f"overlap={overlap}: differs from the ring sum"
    graph, out = capture_graph(lambda: tex.collective.gemm_reduce_scatter_loopback(xs[rank], ws[rank], incoming,
                                                                                   rank, tp))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
