"""CUDA-only tests (marked cuda; skipped without a GPU): CPU/CUDA bit parity (SPEC §1.1 item 1),
CUDA-graph capture + replay (item 6), device errors. torch.compile with inductor: test_opcheck_compile.py."""
import math

import pytest
import torch

from tests import ref
from tests.torch.helpers import (DTYPE_PARAMS, FMTS, check_grad_bias, column_sum_rtol, cpu, current_quantizer,
                                 delayed_quantizer, mixed_values, random_bits, replay_on_new_inputs, tex_module,
                                 uniform, wide_random)

pytestmark = pytest.mark.cuda

QKINDS = [None, ("delayed", "e4m3", 3.5), ("delayed", "e5m2", -1.5), ("current", "e4m3", False),
          ("current", "e5m2", True)]


def mkq(k, device):
    if k is None:
        return None, None
    kind, fmt, p = k
    if kind == "delayed":
        q, s, a = delayed_quantizer(p, fmt, device, amax_value=0.0)
        return q, a
    return current_quantizer(fmt, pow2=p), None


def assert_same(o_cpu, o_cuda, msg):
    if isinstance(o_cpu, torch.Tensor):
        assert o_cuda.device.type == "cuda"
        assert ref.bits_equal(o_cpu, cpu(o_cuda)), msg
        return
    assert o_cuda._data.device.type == "cuda"
    for k in ["_data", "_transpose"]:
        a, b = getattr(o_cpu, k), getattr(o_cuda, k)
        assert (a is None) == (b is None), f"{msg} {k}"
        if a is not None:
            ref.assert_bytes_equal(cpu(b), a, f"{msg} {k}")
    assert ref.bits_equal(o_cpu._scale_inv, cpu(o_cuda._scale_inv)), f"{msg} scale_inv"


def _inputs(kind, shape, dtype, seed):
    return mixed_values(shape, dtype, seed, kind == "bits")


# Gated forward ops to plain outputs whose half rows hold at least 64 chunks of 8 take a 2-D grid of their own
# (producers/rowwise_kernels.cuh, act_gated_rows_kernel): ragged column blocks (800 = 1.56 blocks of 512), row counts that are not a
# multiple of the 4 rows per block, leading dims, and inputs with every special value.
@pytest.mark.parametrize("inp", ["uniform", "bits"])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", sorted(ref.GATED))
def test_parity_gated_rows_kernel(name, dtype, inp):
    for i, shape in enumerate([(37, 2 * 512), (5, 2 * 800), (3, 7, 2 * 1024)]):
        x = _inputs(inp, shape, dtype, 10 + i)
        y_cpu = getattr(tex_module(), name)(x, None)
        y_cuda = getattr(tex_module(), name)(x.cuda(), None)
        assert_same(y_cpu, y_cuda, f"{name} {dtype} {inp} {shape}")


def test_gated_rows_kernel_strides_past_grid_rows():
    """More row groups of 4 than a grid's 65535: blocks walk down the rows. Rows on both sides of the wrap and at the
    end against the CPU op on those rows (the op is row by row)."""
    rows, h = 65535 * 4 + 9, 512
    g = torch.Generator(device="cuda").manual_seed(5)
    x = (torch.rand(rows, 2 * h, device="cuda", generator=g) * 6 - 3).to(torch.bfloat16)
    y = tex_module().swiglu(x, None)
    for lo in (0, 65535 * 4 - 3, rows - 6):
        xs = x[lo:lo + 6].cpu()
        assert_same(tex_module().swiglu(xs, None), y[lo:lo + 6], f"rows {lo}..{lo + 5}")


def _fwd_bwd_parity(name, k, x, g, params, msg):
    """The activation `name` and its backward, with a fresh quantizer of kind k each, on the CPU and on CUDA: asserts
    both outputs hold the same bytes on the two devices and returns each device's (forward, backward) amax tensors
    (None for a quantizer without one)."""
    outs, amaxes = {}, {}
    for dev in ["cpu", "cuda"]:
        q, a = mkq(k, dev)
        y = getattr(tex_module(), name)(x.to(dev), q, **params)
        q2, a2 = mkq(k, dev)
        dx = getattr(tex_module(), ref.DACT_NAMES[name])(g.to(dev), x.to(dev), q2, **params)
        outs[dev] = (y, dx)
        amaxes[dev] = (a, a2)
    assert_same(outs["cpu"][0], outs["cuda"][0], msg + " fwd")
    assert_same(outs["cpu"][1], outs["cuda"][1], msg + " bwd")
    return amaxes


@pytest.mark.parametrize("inp", ["uniform", "bits"])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_parity_activations(name, dtype, inp):
    x = _inputs(inp, (64, 130), dtype, 1)
    gshape = ref.out_shape(name, x.shape)
    g = _inputs(inp, gshape, dtype, 2)
    params_list = [{}]
    if name == "clamped_swiglu":
        params_list.append(dict(limit=3.0, alpha=1.25, glu_linear_offset=0.0))
    for params in params_list:
        for k in QKINDS:
            msg = f"{name} {dtype} {inp} {k} {params}"
            amaxes = _fwd_bwd_parity(name, k, x, g, params, msg)
            for ac, ag in zip(amaxes["cpu"], amaxes["cuda"]):
                if ac is not None:
                    assert ref.bits_equal(ac, cpu(ag)), msg + " amax"


@pytest.mark.parametrize("inp", ["uniform", "bits"])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES))
def test_parity_dbias(name, dtype, inp):
    tex = tex_module()
    x = _inputs(inp, (96, 130), dtype, 3)
    g = _inputs(inp, (96, 130), dtype, 4)
    for k in QKINDS:
        res = {}
        for dev in ["cpu", "cuda"]:
            q, a = mkq(k, dev)
            res[dev] = getattr(tex, name)(g.to(dev), x.to(dev), q) + (a,)
        gb_c, gi_c, a_c = res["cpu"]
        gb_g, gi_g, a_g = res["cuda"]
        assert_same(gi_c, gi_g, f"{name} {k} grad_input")
        if a_c is not None:
            assert ref.bits_equal(a_c, cpu(a_g))
        if inp == "uniform":   # sums: tolerance-compared (summation order is free)
            rtol = column_sum_rtol(96, dtype)
            assert ref.within_tol(cpu(gb_g), gb_c, rtol, 1e-4)


@pytest.mark.parametrize("inp", ["wide", "bits"])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("fmt", FMTS)
def test_parity_quantize(fmt, dtype, inp):
    tex = tex_module()
    g = torch.Generator().manual_seed(5)
    x = wide_random((611, 782), dtype, g=g) if inp == "wide" else random_bits((611, 782), dtype, g=g)
    ks = [("delayed", fmt, s) for s in [0.375, 1.0, 3.5, -1.5]] + [("current", fmt, p) for p in [False, True]]
    for k in ks:
        res = {}
        for dev in ["cpu", "cuda"]:
            q, a = mkq(k, dev)
            res[dev] = (tex.quantize(x.to(dev), q), a)
        assert_same(res["cpu"][0], res["cuda"][0], f"quantize {k}")
        if res["cpu"][1] is not None:
            assert ref.bits_equal(res["cpu"][1], cpu(res["cuda"][1]))
        # and both equal the reference
        xr = x
        r = (ref.quantize_delayed_ref(xr, torch.tensor([k[2]]), torch.zeros(1), fmt) if k[0] == "delayed"
             else ref.quantize_current_ref(xr, fmt, pow2=k[2]))
        ref.assert_bytes_equal(cpu(res["cuda"][0]._data), r.codes, f"cuda vs reference {k}")
        ref.assert_bytes_equal(cpu(res["cuda"][0]._transpose), r.t_codes, f"cuda vs reference {k} T")


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_parity_cast_helpers(dtype):
    tex = tex_module()
    x = wide_random((257, 259), dtype)
    xb = random_bits((257, 259), dtype)
    for inp in [x, xb]:
        a_c, a_g = torch.zeros(1), torch.zeros(1, device="cuda")
        tex.compute_amax(inp, a_c)
        tex.compute_amax(inp.cuda(), a_g)
        assert ref.bits_equal(a_c, cpu(a_g))
    q_c, s_c, am_c = delayed_quantizer(2.0, "e4m3")
    q_g, s_g, am_g = delayed_quantizer(2.0, "e4m3", "cuda")
    gb_c, qt_c = tex.bgrad_quantize(x, q_c)
    gb_g, qt_g = tex.bgrad_quantize(x.cuda(), q_g)
    # Column sums are order-dependent (SPEC §1.1): compare them on the [-3, 3] data the SPEC tolerance row is
    # defined for; wide_random's cancellation makes the result-relative tolerance meaningless.
    xs = uniform((257, 259), dtype)
    gb_c = tex.bgrad_quantize(xs, delayed_quantizer(2.0, "e4m3")[0])[0]
    gb_g = tex.bgrad_quantize(xs.cuda(), delayed_quantizer(2.0, "e4m3", "cuda")[0])[0]
    assert_same(qt_c, qt_g, "bgrad_quantize")
    assert ref.bits_equal(am_c, cpu(am_g))
    rtol = column_sum_rtol(257, dtype)
    assert ref.within_tol(cpu(gb_g), gb_c, rtol, 1e-4)
    t_c = tex.fp8_transpose(qt_c._data, tex.DType.kFloat8E4M3)
    t_g = tex.fp8_transpose(qt_g._data, tex.DType.kFloat8E4M3)
    assert torch.equal(t_c, cpu(t_g))
    for algo in ["max", "most_recent"]:
        hs = [torch.rand(6, 5) * 10, torch.rand(6, 3)]
        hs[0][0, 2] = 0.0
        hs[1][0, 0] = 1e-45
        ss = [torch.ones(5), torch.ones(3) * 2]
        hg, sg = [h.cuda() for h in hs], [s.cuda() for s in ss]
        buf = torch.tensor([0.0, 3.0, 0.0, 0.0, 9.0, 0.0, 0.0, 4.0])
        tex.fused_amax_and_scale_update_after_reduction(buf, hs, ss, algo, tex.DType.kFloat8E5M2, 1.0)
        tex.fused_amax_and_scale_update_after_reduction(buf.cuda(), hg, sg, algo, tex.DType.kFloat8E5M2, 1.0)
        for a, b in zip(hs + ss, hg + sg):
            assert ref.bits_equal(a, cpu(b))


# ------------------------------------------------------------------------------------------------
# CUDA graphs
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_cuda_graph_gelu_fp8(kind, fmt):
    tex = tex_module()
    dev = "cuda"
    dtype = torch.bfloat16

    def make():
        if kind == "delayed":
            return delayed_quantizer(3.5, fmt, dev, amax_value=0.0)
        return current_quantizer(fmt), None, None

    x_static = uniform((256, 384), dtype, dev)
    q_g, _, a_g = make()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            tex.gelu(x_static, q_g)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    if a_g is not None:
        a_g.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = tex.gelu(x_static, q_g)
    torch.cuda.synchronize()
    if a_g is not None:
        assert float(a_g) == 0.0, "capture must not run the kernels"
    for step, x_new in replay_on_new_inputs(graph, x_static):
        if step == 0:
            q_e, _, a_e = make()
        y_e = tex.gelu(x_new, q_e)
        torch.cuda.synchronize()
        ref.assert_bytes_equal(cpu(y_static._data), cpu(y_e._data), f"graph step {step} data")
        ref.assert_bytes_equal(cpu(y_static._transpose), cpu(y_e._transpose), f"graph step {step} T")
        assert ref.bits_equal(cpu(y_static._scale_inv), cpu(y_e._scale_inv))
        if a_g is not None:
            assert ref.bits_equal(cpu(a_g), cpu(a_e)), "amax accumulates identically"


@pytest.mark.parametrize("name", ["gelu", "swiglu", "quantize"])
def test_cuda_graph_current_one_launch(name):
    """Capture and replay of the one-launch current scaling (rowwise, small: a cooperative launch with a grid
    barrier): each replay's bytes, scale_inv and amax-derived scale equal an eager call on the same input."""
    tex = tex_module()
    dev = "cuda"
    shape = (256, 1024)
    x_static = uniform(shape, torch.bfloat16, dev)
    q = current_quantizer("e4m3", columnwise=False)
    run = (lambda t: tex.quantize(t, q)) if name == "quantize" else (lambda t: getattr(tex, name)(t, q))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run(x_static)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = run(x_static)
    for step in range(3):
        x_new = uniform(shape, torch.bfloat16, dev, lo=-2.0 * (step + 1), hi=2.0 * (step + 1),
                        g=torch.Generator().manual_seed(200 + step))
        x_static.copy_(x_new)
        graph.replay()
        y_e = run(x_new)
        torch.cuda.synchronize()
        ref.assert_bytes_equal(cpu(y_static._data), cpu(y_e._data), f"{name} graph step {step} data")
        assert ref.bits_equal(cpu(y_static._scale_inv), cpu(y_e._scale_inv)), f"{name} step {step} scale_inv"
        if name == "quantize":  # (the activations' eager bytes are checked against the CPU's elsewhere)
            r = ref.quantize_current_ref(cpu(x_new), "e4m3")
            ref.assert_bytes_equal(cpu(y_static._data), r.codes, f"graph step {step} vs reference")


# Rowwise current scaling of tensors small enough for one cooperative launch (and just past it on an H100/H200,
# where the launcher falls back to the amax pass): bytes and scale_inv equal the CPU's, for every way in (unary,
# gated, backward with one and two outputs, the plain cast) and for the three input dtypes.
ONE_LAUNCH_SHAPES = [(1, 8), (3, 40), (256, 4096), (1000, 1040), (2300, 1024), (0, 64)]


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ["gelu", "swiglu", "dgelu", "dswiglu", "clamped_dswiglu", "quantize"])
def test_parity_current_one_launch(name, dtype):
    tex = tex_module()
    for i, shape in enumerate(ONE_LAUNCH_SHAPES):
        big = math.prod(shape) >= 256  # room for the special values (NaN, Inf, zeros, ...) among uniform ones
        x = _inputs("uniform", shape, dtype, 30 + i) if big else uniform(shape, dtype, g=torch.Generator().manual_seed(i))
        outs = {}
        for dev in ["cpu", "cuda"]:
            q = current_quantizer("e4m3", pow2=(i % 2 == 1), columnwise=False)
            xd = x.to(dev)
            if name == "quantize":
                outs[dev] = tex.quantize(xd, q)
            elif name in ("gelu", "swiglu"):
                outs[dev] = getattr(tex, name)(xd, q)
            else:
                fwd = {"dgelu": "gelu", "dswiglu": "swiglu", "clamped_dswiglu": "clamped_swiglu"}[name]
                gshape = ref.out_shape(fwd, shape)
                gd = (_inputs("uniform", gshape, dtype, 60 + i) if big
                      else uniform(gshape, dtype, g=torch.Generator().manual_seed(50 + i))).to(dev)
                outs[dev] = getattr(tex, name)(gd, xd, q)
        assert_same(outs["cpu"], outs["cuda"], f"{name} {dtype} {shape}")


def test_current_one_launch_noop_and_into():
    """quantize into given buffers with a noop flag, on the one-launch path: noop=1 leaves every buffer as it was,
    noop=0 writes what a fresh call writes."""
    tex = tex_module()
    dev = "cuda"
    q = current_quantizer("e4m3", columnwise=False)
    x0 = uniform((128, 256), torch.bfloat16, dev)
    out = tex.quantize(x0, q)
    x1 = uniform((128, 256), torch.bfloat16, dev, lo=-9, hi=9, g=torch.Generator().manual_seed(7))
    noop = torch.ones(1, device=dev)
    snap = [out._data.clone(), out._scale_inv.clone()]
    tex.quantize(x1, q, output=out, noop=noop)
    torch.cuda.synchronize()
    assert torch.equal(out._data, snap[0]) and torch.equal(out._scale_inv, snap[1])
    noop.zero_()
    tex.quantize(x1, q, output=out, noop=noop)
    fresh = tex.quantize(x1, q)
    torch.cuda.synchronize()
    ref.assert_bytes_equal(cpu(out._data), cpu(fresh._data), "into vs fresh")
    assert ref.bits_equal(cpu(out._scale_inv), cpu(fresh._scale_inv))
    r = ref.quantize_current_ref(cpu(x1), "e4m3")
    ref.assert_bytes_equal(cpu(out._data), r.codes, "into vs reference")


def test_cuda_graph_quantize_noop():
    """A captured quantize with a device-side noop flag: replay with noop=1 writes nothing."""
    tex = tex_module()
    dev = "cuda"
    q, s, amax = delayed_quantizer(2.0, "e4m3", dev)
    x_static = uniform((64, 96), torch.float16, dev)
    noop = torch.zeros(1, device=dev)
    out = tex.quantize(x_static, q)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tex.quantize(x_static, q, output=out, noop=noop)
    x1 = uniform((64, 96), torch.float16, dev, lo=-10, hi=10, g=torch.Generator().manual_seed(3))
    x_static.copy_(x1)
    noop.fill_(1.0)
    snap = [out._data.clone(), out._transpose.clone(), out._scale_inv.clone(), amax.clone()]
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip([out._data, out._transpose, out._scale_inv, amax], snap):
        assert torch.equal(a, b)
    noop.fill_(0.0)
    graph.replay()
    torch.cuda.synchronize()
    r = ref.quantize_delayed_ref(cpu(x1), torch.tensor([2.0]), cpu(snap[3]), "e4m3")
    ref.assert_bytes_equal(cpu(out._data), r.codes, "graph noop=0")
    assert torch.equal(cpu(amax), r.amax)


# ------------------------------------------------------------------------------------------------
# device errors
# ------------------------------------------------------------------------------------------------
def test_scale_on_wrong_device():
    tex = tex_module()
    x = uniform((4, 8), torch.float32, "cuda")
    with pytest.raises((TypeError, ValueError, RuntimeError), match=r"(?i)device|cuda|cpu"):
        q = tex.Float8Quantizer(torch.ones(1), torch.zeros(1), tex.DType.kFloat8E4M3)   # CPU scale
        tex.quantize(x, q)
        tex.gelu(x, q)
    with pytest.raises((TypeError, ValueError, RuntimeError), match=r"(?i)device|cuda|cpu"):
        q = tex.Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1), tex.DType.kFloat8E4M3)  # CPU amax
        tex.gelu(x, q)


def test_grad_on_wrong_device():
    tex = tex_module()
    x = uniform((4, 8), torch.float32, "cuda")
    with pytest.raises((TypeError, ValueError, RuntimeError), match=r"(?i)device|cuda|cpu"):
        tex.dgelu(uniform((4, 8)), x, None)


def test_compute_amax_wrong_device():
    tex = tex_module()
    with pytest.raises((TypeError, ValueError, RuntimeError), match=r"(?i)device|cuda|cpu"):
        tex.compute_amax(uniform((4, 8), torch.float32, "cuda"), torch.zeros(1))


def test_create_empty_on_cuda_and_pinned():
    tex = tex_module()
    q, s, a = delayed_quantizer(3.5, "e4m3", "cuda")
    qt = tex.create_empty_quantized_tensor(q, [7, 5, 3], torch.bfloat16, "cuda")
    assert qt._data.device.type == "cuda" and qt._transpose.device.type == "cuda"
    assert float(qt._scale_inv) == float(ref.reciprocal_f32(torch.tensor(3.5)))
    qc = current_quantizer("e4m3")
    qt = tex.create_empty_quantized_tensor(qc, [8, 4], torch.float32, "cpu", pin_memory=True)
    assert qt._data.is_pinned()


# ---- bf16 lookup-table path ------------------------------------------------------------------------------------
# For bf16 inputs the CUDA kernels look exp-based functors up in tables the functor fills; large tensors switch to
# them on their own, TE_FORCE_TABLES=1 forces them at any size. Inputs: every bf16 bit pattern.
def _every_bf16(shape, seed):
    """All 65536 bf16 bit patterns (NaN, Inf, zeros, subnormals included) in runs of 8 consecutive codes, the runs
    shuffled, tiled to `shape`: most 8-element chunks lie inside the table range, some straddle its edges."""
    g = torch.Generator().manual_seed(seed)
    runs = torch.arange(65536, dtype=torch.int32).reshape(-1, 8)[torch.randperm(8192, generator=g)].reshape(-1)
    n = math.prod(shape)
    codes = runs.repeat((n + 65535) // 65536)[:n].to(torch.int16)
    return codes.view(torch.bfloat16).reshape(shape)


def _table_parity(name, k, shape, params=None):
    params = params or {}
    x = _every_bf16(shape, 11)
    g = uniform(ref.out_shape(name, x.shape), torch.bfloat16, g=torch.Generator().manual_seed(12))
    _fwd_bwd_parity(name, k, x, g, params, f"{name} {k}")


@pytest.mark.parametrize("k", [None, ("delayed", "e4m3", 3.5), ("current", "e5m2", False)])
@pytest.mark.parametrize("name", ["gelu", "qgelu", "silu", "geglu", "qgeglu", "swiglu", "glu", "clamped_swiglu"])
def test_parity_bf16_tables_forced(name, k, monkeypatch):
    monkeypatch.setenv("TE_FORCE_TABLES", "1")
    _table_parity(name, k, (256, 1024))
    if name == "clamped_swiglu":
        _table_parity(name, k, (256, 1024), dict(limit=3.0, alpha=1.25, glu_linear_offset=0.0))


@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_parity_bf16_tables_by_size(name):
    # Large enough that the kernels choose the tables themselves (>= 4 steps per resident block).
    _table_parity(name, ("delayed", "e4m3", 3.5), (8192, 4096) if name == "gelu" else (8192, 8192))


@pytest.mark.parametrize("forced", [True, False])
@pytest.mark.parametrize("name", ["dbias_dgelu", "dbias_dsilu", "dbias_dqgelu"])
def test_parity_bf16_tables_dbias(name, forced, monkeypatch):
    if forced:
        monkeypatch.setenv("TE_FORCE_TABLES", "1")
    shape = (512, 1024) if forced else (32768, 4096)  # the latter: dbias row blocks of 64 rows, tables by size
    x = _every_bf16(shape, 13)
    g = uniform(shape, torch.bfloat16, g=torch.Generator().manual_seed(14))
    xf = x.float()
    keep = torch.isfinite(xf) & (xf.abs() < 8)  # sums of finite, moderate values only
    x = torch.where(keep, x, torch.zeros_like(x))
    res = {}
    for dev in ["cpu", "cuda"]:
        q, _ = mkq(("delayed", "e4m3", 2.0), dev)
        res[dev] = getattr(tex_module(), name)(g.to(dev), x.to(dev), q)
    assert_same(res["cpu"][1], res["cuda"][1], f"{name} grad_input")
    rtol = 4 * ref.TOL[torch.bfloat16][0]
    assert ref.within_tol(cpu(res["cuda"][0]), res["cpu"][0], rtol, 1e-4)



@pytest.mark.parametrize("shape", [(16424, 72), (131072, 64)])  # dbias row blocks of 16 (ragged tiles) and 128 rows
@pytest.mark.parametrize("k", [("delayed", "e4m3", 3.5), ("current", "e5m2", True)])
def test_parity_dbias_transposed_tiles(k, shape):
    """dbias with the transposed FP8 copy on shapes whose dbias row blocks hold a warp's 16 rows (the pipelined
    tiles): both copies and the amax equal to the CPU's, grad_bias within the column-sum tolerance of the float64
    sums."""
    tex = tex_module()
    x = uniform(shape, torch.bfloat16, g=torch.Generator().manual_seed(21))
    g = uniform(shape, torch.bfloat16, g=torch.Generator().manual_seed(22))
    res = {}
    for dev in ["cpu", "cuda"]:
        q, a = mkq(k, dev)
        res[dev] = tex.dbias_dgelu(g.to(dev), x.to(dev), q) + (a,)
    assert_same(res["cpu"][1], res["cuda"][1], f"{k} {shape} grad_input")
    if res["cpu"][2] is not None:
        assert ref.bits_equal(res["cpu"][2], cpu(res["cuda"][2])), f"{k} {shape} amax"
    check_grad_bias(res["cuda"][0], "gelu", g, x, f"{k} {shape} grad_bias")

# ---- amax pass by shape ----------------------------------------------------------------------------------------
# The read-only amax pass of a unary forward op on bf16 keeps per-run candidates of x and evaluates the functor only
# at them (act_amax_shape_kernel). Inputs that make the answer come from each run: huge negatives (the tails where
# the exp clamps and |f| rises again), the valleys and peaks of |f| on the negative side, tiny positives.
AMAX_REGIMES = {
    "neg": [(0x8000, 0xFF80)],                                  # every negative, -inf included
    "valleys": [(0xC100, 0xC1FF), (0xC240, 0xC2BF), (0x0000, 0x3C00)],
    "peaks": [(0xBF00, 0xBFCF), (0xC2A0, 0xC2C0), (0x3000, 0x3800)],
    "huge_neg": [(0xC300, 0xFF7F)],
    "neg_and_tiny": [(0x8000, 0xFF7F), (0x0000, 0x0080)],
    "any": [(0x0000, 0xFFFF)],                                  # NaN and Inf included
}


def _amax_regime(regime, shape, seed):
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    ranges = AMAX_REGIMES[regime]
    pick = torch.randint(0, len(ranges), (n,), generator=g)
    codes = torch.empty(n, dtype=torch.int32)
    for i, (lo, hi) in enumerate(ranges):
        sel = pick == i
        codes[sel] = torch.randint(lo, hi + 1, (int(sel.sum()),), generator=g, dtype=torch.int32)
    return codes.to(torch.int16).view(torch.bfloat16).reshape(shape)


AMAX_SHAPES = [(8,), (40,), (64, 1024), (512, 1024)]  # 1 to 64 blocks of the pass


@pytest.mark.parametrize("one_launch", [False, True], ids=["amax_pass", "one_launch"])
@pytest.mark.parametrize("regime", sorted(AMAX_REGIMES))
@pytest.mark.parametrize("name", ["gelu", "qgelu", "silu", "relu", "srelu", "quantize"])
def test_parity_amax_pass_by_shape(name, regime, one_launch, monkeypatch):
    # These rowwise casts are small enough for the one-launch current scaling; TE_ONE_LAUNCH=0 keeps them on the
    # amax pass this test is about, and the other half runs the same adversarial inputs through the one launch.
    monkeypatch.setenv("TE_ONE_LAUNCH", "1" if one_launch else "0")
    tex = tex_module()
    for shape in AMAX_SHAPES:
        for seed in range(6 if math.prod(shape) < 1024 else 1):
            x = _amax_regime(regime, shape, seed)
            outs = {}
            for dev in ["cpu", "cuda"]:
                q = current_quantizer("e4m3", columnwise=False)
                xd = x.to(dev)
                outs[dev] = tex.quantize(xd, q) if name == "quantize" else getattr(tex, name)(xd, q)
            assert_same(outs["cpu"], outs["cuda"], f"{name} {regime} {shape} seed {seed}")


@pytest.mark.parametrize("regime", sorted(AMAX_REGIMES))
def test_parity_compute_amax_and_nvfp4_amax_by_shape(regime):
    tex = tex_module()
    for shape in AMAX_SHAPES:
        for seed in range(3 if math.prod(shape) < 1024 else 1):
            x = _amax_regime(regime, shape, seed)
            amax = {dev: torch.zeros(1, device=dev) for dev in ["cpu", "cuda"]}
            for dev in amax:
                tex.compute_amax(x.to(dev), amax[dev])
            assert ref.bits_equal(amax["cpu"], cpu(amax["cuda"])), f"compute_amax {regime} {shape} seed {seed}"
            if shape[-1] % 16 == 0:
                n = {dev: tex.gelu(x.to(dev), tex.NVFP4Quantizer(rowwise=True, columnwise=False))
                     for dev in ["cpu", "cuda"]}
                assert ref.bits_equal(n["cpu"]._amax_rowwise, cpu(n["cuda"]._amax_rowwise)), \
                    f"NVFP4 gelu amax {regime} {shape} seed {seed}"
