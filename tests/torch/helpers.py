"""Shared helpers for the test files: devices, dtypes, input generators, quantizer builders."""
import math

import pytest
import torch

from tests import ref

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
DEVICE_PARAMS = [pytest.param("cpu", id="cpu"),
                 pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda])]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
DTYPE_PARAMS = [pytest.param(d, id=DTYPE_IDS[d]) for d in DTYPES]
FMTS = ["e4m3", "e5m2"]


def parametrize_grid(*marks):
    """One decorator for a case grid several tests share: applies the pytest.mark.parametrize marks as if stacked
    in this order above the test (the first outermost)."""
    def apply(test):
        for mark in reversed(marks):
            test = mark(test)
        return test
    return apply


def tex_module():
    import transformer_engine_torch as tex  # noqa: F401  (imported lazily so collection errors are clear)
    return tex


def fp8_dtype(fmt):
    tex = tex_module()
    return tex.DType.kFloat8E4M3 if ref.fmt_of(fmt) == "e4m3" else tex.DType.kFloat8E5M2


def gen():
    g = torch.Generator()
    g.manual_seed(20240607)
    return g


def uniform(shape, dtype=torch.float32, device="cpu", lo=-3.0, hi=3.0, g=None):
    """Values drawn on CPU in FP32 from [lo, hi), rounded to dtype, moved to device."""
    g = g or gen()
    x = torch.rand(tuple(shape), generator=g, dtype=torch.float32) * (hi - lo) + lo
    return x.to(dtype).to(device)


def wide_random(shape, dtype=torch.float32, device="cpu", g=None):
    """Half uniform in [-3, 3], half log-uniform magnitudes (both signs) spanning FP8
    underflow to saturation for the scales used in the tests, kept finite in `dtype`."""
    g = g or gen()
    shape = tuple(shape)
    n = int(math.prod(shape))
    u = torch.rand(n, generator=g) * 6 - 3
    lo, hi = (-26.0, 15.0) if dtype == torch.float16 else (-30.0, 17.0)
    mag = torch.exp2(torch.rand(n, generator=g) * (hi - lo) + lo)
    sgn = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    pick = torch.rand(n, generator=g) < 0.5
    x = torch.where(pick, u, sgn * mag)
    if dtype == torch.float16:
        x = x.clamp(-60000.0, 60000.0)
    return x.to(dtype).reshape(shape).to(device)


def random_bits(shape, dtype, g=None, device="cpu"):
    """Uniformly random bit patterns (NaN, Inf, subnormals included) of a float dtype."""
    g = g or gen()
    n = int(math.prod(shape))
    if dtype == torch.float32:
        b = torch.randint(-2**31, 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
        x = b.view(torch.float32)
    else:
        b = torch.randint(-2**15, 2**15 - 1, (n,), generator=g, dtype=torch.int32).to(torch.int16)
        x = b.view(dtype)
    return x.reshape(tuple(shape)).to(device)


def special_values(dtype):
    """A fixed vector of edge values in dtype: zeros, max finite, smallest subnormal, +-Inf, NaN."""
    fi = torch.finfo(dtype)
    vals = [0.0, -0.0, 1.0, -1.0, fi.max, -fi.max, fi.tiny, -fi.tiny, fi.smallest_normal / 4,
            -fi.smallest_normal / 8, math.inf, -math.inf, math.nan, 3.0, -3.0, 0.5, 7.0, -7.0, 8.0, -8.0,
            1e-3, -1e-3, 20.0, -20.0, 100.0, -100.0]
    t = torch.tensor(vals, dtype=torch.float64).to(dtype)
    sub = torch.tensor([1], dtype=torch.int16 if dtype != torch.float32 else torch.int32).view(dtype)
    return torch.cat([t, sub, -sub])


def mixed_values(shape, dtype, seed, bits=False):
    """Uniform [-3, 3] with as many of the dtype's special values as fit scattered in (a random permutation from
    `seed`), or, with bits=True, uniformly random bit patterns."""
    g = torch.Generator().manual_seed(seed)
    if bits:
        return random_bits(shape, dtype, g=g)
    x = uniform(shape, dtype, g=g).reshape(-1)
    sv = special_values(dtype)
    n = min(sv.numel(), x.numel())
    x[:n] = sv[:n]
    return x[torch.randperm(x.numel(), generator=g)].reshape(shape)


def column_sum_rtol(rows, dtype):
    """Relative tolerance of a column sum over `rows` rows (SPEC §1.1: the summation order is free): about
    sqrt(rows) FP32 roundings for float32, four output roundings for a 16-bit dtype (used with atol 1e-4)."""
    return 1.3e-6 * rows ** 0.5 if dtype == torch.float32 else 4 * ref.TOL[dtype][0]


def dbias_inputs(name, dtype, device, act_input, rows):
    """A dbias_d<act> test's inputs: (the activation's name, x = act_input(it, dtype, rows=rows), g uniform of x's
    shape from seed 9), x and g on `device`."""
    base = ref.DBIAS_NAMES[name]
    x = act_input(base, dtype, rows=rows).to(device)
    g = uniform(x.shape, dtype, g=torch.Generator().manual_seed(9)).to(device)
    return base, x, g


def check_grad_bias(gb, base, g, x, msg):
    """grad_bias of dbias_d<base>(g, x) within column_sum_rtol (atol 1e-4) of the float64 column sums of d<base>(g, x)
    rounded to x's dtype; returns that rounding."""
    gb64, _ = ref.dbias_ref(base, cpu(g), cpu(x))
    want = gb64.to(x.dtype)
    assert ref.within_tol(cpu(gb), want, column_sum_rtol(x.numel() // x.shape[-1], x.dtype), 1e-4), msg
    return want


def delayed_quantizer(scale_value, fmt, device="cpu", amax_value=0.0, rowwise=True, columnwise=True):
    """tex.Float8Quantizer with fresh float32 [1] scale / amax tensors; returns (q, scale, amax)."""
    tex = tex_module()
    scale = torch.tensor([scale_value], dtype=torch.float32, device=device)
    amax = torch.tensor([amax_value], dtype=torch.float32, device=device)
    q = tex.Float8Quantizer(scale, amax, fp8_dtype(fmt), rowwise=rowwise, columnwise=columnwise)
    return q, scale, amax


def current_quantizer(fmt, pow2=False, eps=0.0, rowwise=True, columnwise=True):
    tex = tex_module()
    return tex.Float8CurrentScalingQuantizer(fp8_dtype(fmt), rowwise=rowwise, columnwise=columnwise,
                                             force_pow_2_scales=pow2, amax_epsilon=eps)


def cpu(t):
    return None if t is None else t.detach().cpu()


def call_act(name, x, q, **params):
    tex = tex_module()
    return getattr(tex, name)(x, q, **params)


def call_dact(name, g, x, q, **params):
    tex = tex_module()
    return getattr(tex, ref.DACT_NAMES[name])(g, x, q, **params)


def check_float8_tensor(qt, shape, dtype, fmt, rowwise=True, columnwise=True):
    """Structural checks of a tex.Float8Tensor (SPEC §4.9)."""
    tex = tex_module()
    assert isinstance(qt, tex.Float8Tensor), type(qt)
    assert tuple(qt.shape) == tuple(shape)
    assert qt.dtype == dtype
    assert int(qt._fp8_dtype) == ref.DTYPE_INT[ref.fmt_of(fmt)]
    assert qt._scale_inv.dtype == torch.float32 and qt._scale_inv.numel() == 1
    if rowwise:
        assert qt._data is not None and qt._data.dtype == torch.uint8
        assert tuple(qt._data.shape) == tuple(shape)
        assert qt._data.is_contiguous()
    else:
        assert qt._data is None
    if columnwise:
        assert qt._transpose is not None and qt._transpose.dtype == torch.uint8
        if len(shape) >= 1:
            assert tuple(qt._transpose.shape) == (shape[-1],) + tuple(shape[:-1])
        else:
            assert qt._transpose.numel() == 1
        assert qt._transpose.is_contiguous()
    else:
        assert qt._transpose is None


# How many times capture_graph runs `fn` for real. The captured call only records kernels (nothing runs until
# replay), so state that `fn` updates on the device (delayed-scaling amax histories, scales) has advanced this many
# steps when capture_graph returns; an eager twin must take the same number of steps.
CAPTURE_WARMUPS = 2


def capture_graph(fn):
    """Warms `fn` up CAPTURE_WARMUPS times on a side stream (as torch.cuda.graphs recommends), then captures one
    call in a CUDA graph (recorded, not run). Returns (graph, fn's return value from the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(CAPTURE_WARMUPS):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def replay_on_new_inputs(graph, x_static, steps=3):
    """For step 0..steps-1: draws a new input of x_static's shape, dtype and device, uniform over a range that widens
    with the step (+-3·(step+1), seed 100+step), copies it into x_static (the captured graph's input), replays the
    graph and synchronizes; yields (step, the new input) for the caller's checks."""
    for step in range(steps):
        x_new = uniform(x_static.shape, x_static.dtype, x_static.device, lo=-3.0 * (step + 1), hi=3.0 * (step + 1),
                        g=torch.Generator().manual_seed(100 + step))
        x_static.copy_(x_new)
        graph.replay()
        torch.cuda.synchronize()
        yield step, x_new


def without_extra_state(state_dict):
    """A tex state_dict without its `_extra_state` entries (the delayed-scaling state), for a torch module."""
    return {k: v for k, v in state_dict.items() if not k.endswith("_extra_state")}


def opcheck_inputs(device, rows, cols):
    """The inputs the quantizer families' opcheck cases share: x float32 and xb bfloat16 [rows, cols], the gradients
    gu float32 [rows, cols] (of a plain activation) and gg bfloat16 [rows, cols/2] (of a gated one), and u8(*shape),
    a maker of zeroed uint8 output buffers."""
    x = uniform((rows, cols), torch.float32, device)
    xb = uniform((rows, cols), torch.bfloat16, device)
    gu = uniform((rows, cols), torch.float32, device, g=torch.Generator().manual_seed(2))
    gg = uniform((rows, cols // 2), torch.bfloat16, device, g=torch.Generator().manual_seed(3))
    return x, xb, gu, gg, lambda *s: torch.zeros(s, dtype=torch.uint8, device=device)


def run_opcheck(case):
    """torch.library.opcheck of one case (op name in torch.ops.te, args[, kwargs])."""
    tex_module()
    name, args, *kwargs = case
    torch.library.opcheck(getattr(torch.ops.te, name).default, args, *kwargs)


def check_block_tensor_api(qt, r):
    """The tensor API the block-scaled quantized tensors share, on qt of a 3-D shape [a, b, c] quantized with both
    copies, r its reference (rowwise codes r.row, columnwise scales r.col_scale): view and reshape over the leading
    dims (the same storage and values), a view splitting the last dim refused, clone (new storage, the same scales),
    .to("cpu") (the reference's rowwise codes), update_usage dropping the clone's columnwise copy. Returns
    (the [a*b, c] view, the clone, the CPU copy)."""
    a, b, c = qt.shape
    v = qt.view(a * b, c)
    assert tuple(v.shape) == (a * b, c) and v._rowwise_data.data_ptr() == qt._rowwise_data.data_ptr()
    assert ref.bits_equal(cpu(v.dequantize()), cpu(qt.dequantize()).reshape(a * b, c))
    assert tuple(qt.reshape(2, a * b // 2, c).shape) == (2, a * b // 2, c)
    with pytest.raises(ValueError, match="leading dims"):
        qt.view(a, b, 2, c // 2)
    clone = qt.clone()
    assert clone._rowwise_data.data_ptr() != qt._rowwise_data.data_ptr()
    assert torch.equal(cpu(clone._columnwise_scale_inv), r.col_scale)
    h = qt.to("cpu")
    assert h.device.type == "cpu" and torch.equal(h._rowwise_data.reshape(a * b, c), r.row)
    clone.update_usage(columnwise_usage=False)
    assert clone._columnwise_data is None and clone._columnwise_scale_inv is None
    return v, clone, h
