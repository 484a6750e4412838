"""FP8 block scaling (SPEC §4.7 block rule, §4.8 scale shapes, §4.9 Float8BlockwiseQTensor, §5.1 UNFUSED path)
against the pure-PyTorch reference of tests/ref/ (quantize_fp8_block_ref), bit-exact (atol = rtol = 0) on
data bytes and on the whole padded float32 scale tensors.

Activations with an FP8 block quantizer are by definition "the plain op, then quantize" (SPEC §5.1 UNFUSED,
§5.2 "identical by construction"), so tex.<act>(x, block) must equal the reference quantization of
tex.<act>(x, None) byte for byte. Every exact comparison also checks that a wrong answer (the reference of -x)
would fail."""
import math

import pytest
import torch

from tests import ref
from tests.torch.helpers import (DTYPE_PARAMS, FMTS, capture_graph, check_block_tensor_api, check_grad_bias,
                                 column_sum_rtol, cpu, dbias_inputs, fp8_dtype, mixed_values, opcheck_inputs,
                                 parametrize_grid, replay_on_new_inputs, run_opcheck, tex_module, uniform, wide_random)

BLOCK_DIMS = [pytest.param(1, id="1x128"), pytest.param(2, id="128x128")]
SMALL_SHAPES = [(128, 128), (303, 300), (7, 5, 3), (37,), (), (0, 5), (5, 0), (2, 0, 3)]
SMALL_IDS = ["128x128", "303x300", "7x5x3", "37", "0d", "0x5", "5x0", "2x0x3"]
SCALE_OPTS = [(True, 0.0), (False, 0.0), (True, 1e-6), (False, 1e-6)]
USAGES = [(True, False), (False, True), (True, True)]
USAGE_IDS = ["row", "col", "both"]
# Every activation in every dtype with each block shape.
ACT_GRID = parametrize_grid(pytest.mark.parametrize("block_dim", BLOCK_DIMS),
                            pytest.mark.parametrize("dtype", DTYPE_PARAMS),
                            pytest.mark.parametrize("name", ref.ACT_NAMES))


def fbq(fmt="e4m3", block_dim=2, pow2=True, eps=0.0, rowwise=True, columnwise=True):
    return tex_module().Float8BlockQuantizer(fp8_dtype(fmt), rowwise=rowwise, columnwise=columnwise,
                                             amax_epsilon=eps, force_pow_2_scales=pow2, block_scaling_dim=block_dim)


def flat(shape):
    """(M, K) of the SPEC's flattened view (0-d: 1 x 1)."""
    shape = tuple(shape)
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


def block_ramps(shape, dtype, g=None):
    """Per-128-element ramps along the last dim with a different scale per block (both signs)."""
    g = g or torch.Generator().manual_seed(11)
    n = math.prod(shape)
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    nb = (n + 127) // 128
    base = torch.linspace(-1.0, 1.0, 128).repeat(nb)[:n]
    scale = torch.exp2(torch.randint(-12, 10, (nb,), generator=g).float()) * (1.0 + torch.rand(nb, generator=g))
    x = base * scale.repeat_interleave(128)[:n]
    if dtype == torch.float16:
        x = x.clamp(-60000, 60000)
    return x.to(dtype).reshape(shape)


def check_fb(qt, r, shape, dtype, fmt, block_dim, msg, wrong=None, rowwise=True, columnwise=True):
    """Structure and bytes of a tex.Float8BlockwiseQTensor against an FBRef."""
    tex = tex_module()
    assert isinstance(qt, tex.Float8BlockwiseQTensor), type(qt)
    assert tuple(qt.shape) == tuple(shape) and qt.dtype == dtype, msg
    assert int(qt._fp8_dtype) == ref.DTYPE_INT[ref.fmt_of(fmt)]
    assert qt._is_2D_scaled == (block_dim == 2)
    M, K = flat(shape)
    rs, cs = ref.fb_scale_shapes(M, K, block_dim)
    tshape = (shape[-1],) + tuple(shape[:-1]) if len(shape) else ()
    for on, data, scale, rdata, rscale, dshape, sshape, name in (
            (rowwise, qt._rowwise_data, qt._rowwise_scale_inv, r.row, r.row_scale, tuple(shape), rs, "rowwise"),
            (columnwise, qt._columnwise_data, qt._columnwise_scale_inv, r.col, r.col_scale, tshape, cs,
             "columnwise")):
        if not on:
            assert data is None and scale is None, f"{msg}: {name} copy should be absent"
            continue
        assert data.dtype == torch.uint8 and tuple(data.shape) == dshape and data.is_contiguous(), f"{msg} {name}"
        assert scale.dtype == torch.float32 and tuple(scale.shape) == sshape and scale.is_contiguous(), \
            f"{msg} {name} scale shape {tuple(scale.shape)} != {sshape}"
        wd = None if wrong is None else getattr(wrong, name[:3])
        ref.assert_bytes_equal(cpu(data).reshape(rdata.shape), rdata, f"{msg} {name} data", wrong=wd)
        # scales bit for bit (padding included): compared as raw bits
        ref.assert_bytes_equal(cpu(scale).view(torch.uint8), rscale.view(torch.uint8), f"{msg} {name} scale_inv")


# ------------------------------------------------------------------------------------------------
# the scale rule itself (the reference against hand-computed values)
# ------------------------------------------------------------------------------------------------
def test_reference_scale_rule():
    f = lambda a, fmt="e4m3", pow2=False, eps=0.0, dt=torch.float32: float(  # noqa: E731
        ref.fb_block_scale(torch.tensor([a], dtype=torch.float32), fmt, pow2, eps, ref.input_max_finite(dt))[0])
    assert f(0.0) == 1.0 and f(math.inf) == 1.0 and f(0.0, pow2=True) == 1.0
    assert f(3.0) == ref.f32(448.0 / 3.0) and f(3.0, pow2=True) == 128.0
    assert f(3.0, "e5m2", pow2=True) == 16384.0
    assert f(0.0, eps=1e-6) == float(torch.tensor(448.0) / torch.tensor(1e-6))
    # a tiny amax overflows fp8_max / amax: the input dtype's max finite, not FLT_MAX (SPEC §4.7)
    assert f(1e-40) == torch.finfo(torch.float32).max
    assert f(1e-40, dt=torch.bfloat16) == torch.finfo(torch.bfloat16).max
    assert f(1e-40, dt=torch.float16) == 65504.0 and f(1e-40, dt=torch.float16, pow2=True) == 32768.0
    assert f(1e-40, pow2=True) == 2.0 ** 127


# ------------------------------------------------------------------------------------------------
# plain cast: shapes x formats x dtypes x (pow2, epsilon), both block layouts, bit-exact; dequantize
# ------------------------------------------------------------------------------------------------
def _check_quantize(device, fmt, dtype, shape, block_dim, opts, kinds):
    tex = tex_module()
    M, K = flat(shape)
    for kind in kinds:
        x = wide_random(shape, dtype) if kind == "wide" else block_ramps(shape, dtype)
        if kind == "scalar":
            x = torch.tensor(-2.75, dtype=dtype).reshape(shape) if not shape else x
        for pow2, eps in opts:
            qt = tex.quantize(x.to(device), fbq(fmt, block_dim, pow2, eps))
            r = ref.quantize_fp8_block_ref(x, fmt, block_dim, pow2, eps)
            w = ref.quantize_fp8_block_ref(-x, fmt, block_dim, pow2, eps) if x.numel() else None
            msg = f"{fmt} {dtype} {shape} {block_dim}D pow2={pow2} eps={eps} {kind}"
            check_fb(qt, r, shape, dtype, fmt, block_dim, msg, wrong=w)
            # dequantize: exactly the reference's, from either copy; near x for the ramps
            for columnwise in (False, True):
                t = qt.clone()
                if columnwise:
                    t.update_usage(rowwise_usage=False)
                for otype in (None, torch.float32):
                    d = t.dequantize() if otype is None else tex.dequantize(t, otype)
                    want = ref.dequantize_fp8_block_ref(r, fmt, block_dim, shape, otype or dtype, columnwise)
                    assert d.dtype == (otype or dtype) and tuple(d.shape) == tuple(shape)
                    assert ref.bits_equal(cpu(d), want), f"{msg} dequantize columnwise={columnwise}"
            if kind == "ramps" and x.numel():
                deq = cpu(qt.dequantize(torch.float32))
                assert ref.within_tol(deq, x.float(), *ref.FP8_TOL[fmt]), msg + " dequantize vs x"
                assert not ref.within_tol(-deq, x.float(), *ref.FP8_TOL[fmt])


@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=SMALL_IDS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("fmt", FMTS)
def test_quantize(device, fmt, dtype, shape, block_dim):
    _check_quantize(device, fmt, dtype, shape, block_dim, SCALE_OPTS, ("wide", "ramps", "scalar"))


@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_2000(device, fmt, dtype, block_dim):
    """(2000, 2000): 16 x 16 blocks with partial ones at both edges."""
    _check_quantize(device, fmt, dtype, (2000, 2000), block_dim, [(True, 0.0), (False, 1e-6)], ("wide",))


@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
@pytest.mark.parametrize("usage", USAGES, ids=USAGE_IDS)
def test_usages(device, usage, block_dim):
    tex = tex_module()
    x = wide_random((303, 300), torch.bfloat16)
    qt = tex.quantize(x.to(device), fbq("e4m3", block_dim, rowwise=usage[0], columnwise=usage[1]))
    r = ref.quantize_fp8_block_ref(x, "e4m3", block_dim, rowwise=usage[0], columnwise=usage[1])
    check_fb(qt, r, x.shape, x.dtype, "e4m3", block_dim, f"usage {usage}", rowwise=usage[0], columnwise=usage[1])


def test_two_d_columnwise_is_transpose(device):
    """128x128 tiles: the columnwise copy is the bitwise transpose of the rowwise one, scales transposed."""
    tex = tex_module()
    x = wide_random((300, 260), torch.float32)
    qt = tex.quantize(x.to(device), fbq("e5m2", 2))
    assert torch.equal(cpu(qt._columnwise_data), cpu(qt._rowwise_data).t())
    assert torch.equal(cpu(qt._columnwise_scale_inv)[:3, :3], cpu(qt._rowwise_scale_inv)[:3, :3].t())
    one_d = tex.quantize(x.to(device), fbq("e5m2", 1))
    assert not torch.equal(cpu(one_d._columnwise_data), cpu(one_d._rowwise_data).t()), \
        "1x128: the columnwise copy is quantized along the other dim"


def test_noncontiguous_input(device):
    tex = tex_module()
    x = wide_random((300, 200), torch.float16).t()          # [200, 300], a transposed view
    for block_dim in (1, 2):
        qt = tex.quantize(x.to(device), fbq("e4m3", block_dim))
        check_fb(qt, ref.quantize_fp8_block_ref(x.contiguous(), "e4m3", block_dim), x.shape, x.dtype, "e4m3",
                 block_dim, "non-contiguous")


# ------------------------------------------------------------------------------------------------
# extremes (SPEC §4.7): zeros, the input dtype's max, tiny amax, Inf and NaN
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_zeros(device, dtype, block_dim):
    """All zeros: every real scale_inv is 1, every byte 0, padding 0 (epsilon 0)."""
    tex = tex_module()
    x = torch.zeros(130, 259, dtype=dtype)
    for fmt in FMTS:
        qt = tex.quantize(x.to(device), fbq(fmt, block_dim))
        check_fb(qt, ref.quantize_fp8_block_ref(x, fmt, block_dim), x.shape, dtype, fmt, block_dim, "zeros")
        assert bool((cpu(qt._rowwise_data) == 0).all()) and bool((cpu(qt._columnwise_data) == 0).all())
        rs, cs = cpu(qt._rowwise_scale_inv), cpu(qt._columnwise_scale_inv)
        if block_dim == 2:
            assert bool((rs[:, :3] == 1).all()) and bool((rs[:, 3:] == 0).all())
            assert bool((cs[:, :2] == 1).all()) and bool((cs[:, 2:] == 0).all())
        else:
            assert bool((rs[:, :130] == 1).all()) and bool((rs[:, 130:] == 0).all())
            assert bool((cs[:, :259] == 1).all()) and bool((cs[:, 259:] == 0).all())


@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_input_max(device, dtype, block_dim):
    """All equal to the input dtype's max X: scale_inv = 1/fl(fp8_max/X), with pow2 2^-floor(log2(fp8_max/X))."""
    tex = tex_module()
    X = torch.finfo(dtype).max
    x = torch.full((129, 130), X, dtype=dtype)
    x[3, :] = -X
    for fmt in FMTS:
        fmax = ref.FP8_MAX[fmt]
        for pow2 in (False, True):
            qt = tex.quantize(x.to(device), fbq(fmt, block_dim, pow2))
            check_fb(qt, ref.quantize_fp8_block_ref(x, fmt, block_dim, pow2), x.shape, dtype, fmt, block_dim,
                     f"max {fmt} pow2={pow2}", wrong=ref.quantize_fp8_block_ref(-x, fmt, block_dim, pow2))
            s = torch.tensor(fmax, dtype=torch.float32) / torch.tensor(X, dtype=torch.float32)
            if pow2:
                want = 2.0 ** -math.floor(math.log2(float(s)))
            else:
                want = float(torch.tensor(1.0) / s)
            got = cpu(qt._rowwise_scale_inv)
            assert float(got[0, 0]) == want, (float(got[0, 0]), want)
            codes = cpu(qt._rowwise_data)
            if not pow2:
                assert int(codes[0, 0]) == ref.FP8_MAX_CODE[fmt] and int(codes[3, 0]) == 0x80 | ref.FP8_MAX_CODE[fmt]


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")])
def test_tiny_amax_uses_input_max(device, dtype):
    """A block whose amax is subnormal makes fp8_max/amax overflow: the scale is the INPUT dtype's max finite
    (bf16: 0x7F7F0000, not FLT_MAX), or 2^127 with pow2."""
    tex = tex_module()
    tiny = torch.tensor(1e-40, dtype=torch.float32).to(dtype)
    x = torch.zeros(4, 256, dtype=dtype)
    x[:, 128:] = tiny
    x[:, :128] = 1.0
    for pow2 in (False, True):
        qt = tex.quantize(x.to(device), fbq("e4m3", 1, pow2))
        r = ref.quantize_fp8_block_ref(x, "e4m3", 1, pow2)
        check_fb(qt, r, x.shape, dtype, "e4m3", 1, f"tiny pow2={pow2}", wrong=ref.quantize_fp8_block_ref(-x, "e4m3", 1))
        scale = 2.0 ** 127 if pow2 else float(ref.input_max_finite(dtype))
        assert float(cpu(qt._rowwise_scale_inv)[1, 0]) == float(torch.tensor(1.0) / torch.tensor(scale))
        if not pow2 and dtype == torch.bfloat16:
            flt_max_inv = float(torch.tensor(1.0) / torch.tensor(torch.finfo(torch.float32).max))
            assert float(cpu(qt._rowwise_scale_inv)[1, 0]) != flt_max_inv, "bf16 must not use FLT_MAX"


@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_inf_nan(device, dtype, block_dim):
    """Inf in a block: amax Inf -> scale 1, Inf -> +-fp8_max, the other elements cast unscaled; NaN is ignored by
    the amax and encodes as 0x7F."""
    tex = tex_module()
    x = uniform((130, 260), dtype)
    x[0, 5] = math.inf
    x[10, 200] = -math.inf
    x[7, 7] = math.nan
    x[129, 259] = math.nan
    for fmt in FMTS:
        qt = tex.quantize(x.to(device), fbq(fmt, block_dim))
        check_fb(qt, ref.quantize_fp8_block_ref(x, fmt, block_dim), x.shape, dtype, fmt, block_dim,
                 f"inf/nan {fmt}", wrong=ref.quantize_fp8_block_ref(-x, fmt, block_dim))
        row = cpu(qt._rowwise_data)
        assert int(row[0, 5]) == ref.FP8_MAX_CODE[fmt] and int(row[10, 200]) == 0x80 | ref.FP8_MAX_CODE[fmt]
        assert int(row[7, 7]) == 0x7F and int(row[129, 259]) == 0x7F
        rs = cpu(qt._rowwise_scale_inv)
        assert float(rs[0, 0]) == 1.0                                     # the block holding the Inf
        assert float(rs[1, 2] if block_dim == 2 else rs[0, 7]) != 1.0      # NaN ignored: a real scale


# ------------------------------------------------------------------------------------------------
# activations (UNFUSED: the plain op, then the block quantize)
# ------------------------------------------------------------------------------------------------
def _act_input(name, dtype, rows=130):
    return uniform((rows, 260), dtype, g=torch.Generator().manual_seed(ref.ACT_CODE[name] + 71))


def _check_unfused(tex, qt, plain, q, fmt, block_dim, dtype, msg, rowwise=True, columnwise=True):
    r = ref.quantize_fp8_block_ref(plain, fmt, block_dim, q.force_pow_2_scales, q.amax_epsilon, rowwise, columnwise)
    w = ref.quantize_fp8_block_ref(-plain, fmt, block_dim, q.force_pow_2_scales, q.amax_epsilon, rowwise, columnwise)
    check_fb(qt, r, plain.shape, dtype, fmt, block_dim, msg, wrong=w, rowwise=rowwise, columnwise=columnwise)


@ACT_GRID
def test_activation_forward(device, name, dtype, block_dim):
    tex = tex_module()
    fmt = "e4m3" if block_dim == 2 else "e5m2"
    params_list = [{}] + ([dict(limit=0.5, alpha=1.25, glu_linear_offset=0.0)] if name == "clamped_swiglu" else [])
    x = _act_input(name, dtype).to(device)
    for params in params_list:
        q = fbq(fmt, block_dim, pow2=bool(ref.ACT_CODE[name] % 2))
        qt = getattr(tex, name)(x, q, **params)
        plain = getattr(tex, name)(x, None, **params)            # rnd_in(act(x))
        _check_unfused(tex, qt, cpu(plain), q, fmt, block_dim, dtype, f"{name} {dtype} {params}")
        v64 = ref.act_ref(name, cpu(x), **{k.replace("glu_linear_offset", "offset"): v for k, v in params.items()})
        assert ref.within_tol(cpu(qt.dequantize(torch.float32)), v64, *ref.FP8_TOL[fmt]), f"{name} vs float64"


@ACT_GRID
def test_activation_backward(device, name, dtype, block_dim):
    tex = tex_module()
    fmt = "e5m2" if block_dim == 2 else "e4m3"
    x = _act_input(name, dtype).to(device)
    g = uniform(ref.out_shape(name, x.shape), dtype, g=torch.Generator().manual_seed(5)).to(device)
    dname = ref.DACT_NAMES[name]
    q = fbq(fmt, block_dim, eps=1e-6)
    qt = getattr(tex, dname)(g, x, q)
    plain = getattr(tex, dname)(g, x, None)
    _check_unfused(tex, qt, cpu(plain), q, fmt, block_dim, dtype, f"{dname} {dtype}")
    v64 = ref.dact_ref(name, cpu(g), cpu(x))
    assert ref.within_tol(cpu(qt.dequantize(torch.float32)), v64, *ref.FP8_TOL[fmt])


@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES))
def test_dbias(device, name, dtype, block_dim):
    tex = tex_module()
    base, x, g = dbias_inputs(name, dtype, device, _act_input, 201)
    gb_plain, plain = getattr(tex, name)(g, x, None)
    for fmt in FMTS:
        for usage in USAGES:
            q = fbq(fmt, block_dim, rowwise=usage[0], columnwise=usage[1])
            gb, qt = getattr(tex, name)(g, x, q)
            _check_unfused(tex, qt, cpu(plain), q, fmt, block_dim, dtype, f"{name} {dtype} {fmt} {usage}", *usage)
            assert gb.dtype == dtype and tuple(gb.shape) == (260,)
            assert torch.equal(cpu(gb), cpu(gb_plain)), "dbias comes from the plain path"
    check_grad_bias(gb, base, g, x, f"{name} grad_bias")


@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_bgrad_quantize(device, dtype, block_dim):
    tex = tex_module()
    x = uniform((177, 300), dtype).to(device)
    q = fbq("e5m2", block_dim)
    gb, qt = tex.bgrad_quantize(x, q)
    _check_unfused(tex, qt, cpu(x), q, "e5m2", block_dim, dtype, "bgrad_quantize")
    rtol = column_sum_rtol(177, dtype)
    assert gb.dtype == dtype and ref.within_tol(cpu(gb), cpu(x).double().sum(0).to(dtype), rtol, 1e-4)
    assert not ref.within_tol(-cpu(gb), cpu(x).double().sum(0).to(dtype), rtol, 1e-4)


# ------------------------------------------------------------------------------------------------
# in-place quantize, noop, tensor API, quantizer
# ------------------------------------------------------------------------------------------------
PIECES = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


@pytest.mark.parametrize("shape", [(196, 260), (200, 264)])  # CUDA: the tile kernel, the pipelined one
@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
def test_quantize_into_and_noop(device, block_dim, shape):
    tex = tex_module()
    q = fbq("e4m3", block_dim)
    x1, x2 = wide_random(shape, torch.bfloat16), uniform(shape, torch.bfloat16)
    out = q.make_empty(x1.shape, dtype=x1.dtype, device=device)
    ptrs = [getattr(out, k).data_ptr() for k in PIECES]
    res = tex.quantize(x1.to(device), q, output=out)
    assert res is out
    check_fb(out, ref.quantize_fp8_block_ref(x1, "e4m3", block_dim), x1.shape, x1.dtype, "e4m3", block_dim, "into")
    assert ptrs == [getattr(out, k).data_ptr() for k in PIECES]
    snap = [getattr(out, k).clone() for k in PIECES]
    tex.quantize(x2.to(device), q, output=out, noop=torch.ones(1, device=device))
    for k, b in zip(PIECES, snap):
        assert torch.equal(getattr(out, k), b), f"noop = 1 must leave {k} untouched"
    q.update_quantized(x2.to(device), out, noop_flag=torch.zeros(1, device=device))
    check_fb(out, ref.quantize_fp8_block_ref(x2, "e4m3", block_dim), x2.shape, x2.dtype, "e4m3", block_dim, "noop=0")
    assert ptrs == [getattr(out, k).data_ptr() for k in PIECES]
    # noop = 1 on a fresh output: nothing written, not even the scale padding
    fresh = q.make_empty(x1.shape, dtype=x1.dtype, device=device)
    for k in PIECES:
        getattr(fresh, k).fill_(0xAB if getattr(fresh, k).dtype == torch.uint8 else 7.0)
    snap = [getattr(fresh, k).clone() for k in PIECES]
    tex.quantize(x1.to(device), q, output=fresh, noop=torch.ones(1, device=device))
    for k, b in zip(PIECES, snap):
        assert torch.equal(getattr(fresh, k), b), f"noop = 1: {k}"
    # a rowwise-only quantizer drops the columnwise buffers of the output
    tex.quantize(x1.to(device), fbq("e4m3", block_dim, columnwise=False), output=out)
    check_fb(out, ref.quantize_fp8_block_ref(x1, "e4m3", block_dim, columnwise=False), x1.shape, x1.dtype, "e4m3",
             block_dim, "into row", columnwise=False)
    # and a later both-usage quantize allocates the columnwise pieces again
    tex.quantize(x2.to(device), q, output=out)
    check_fb(out, ref.quantize_fp8_block_ref(x2, "e4m3", block_dim), x2.shape, x2.dtype, "e4m3", block_dim, "realloc")


def test_quantize_into_empty_and_0d(device):
    tex = tex_module()
    for shape in [(), (0, 5), (5, 0), (37,)]:
        for block_dim in (1, 2):
            x = wide_random(shape, torch.float32)
            q = fbq("e5m2", block_dim)
            out = q.make_empty(shape, dtype=torch.float32, device=device)
            tex.quantize(x.to(device), q, output=out)
            check_fb(out, ref.quantize_fp8_block_ref(x, "e5m2", block_dim), shape, torch.float32, "e5m2", block_dim,
                     f"into {shape}")


@pytest.mark.parametrize("block_dim", BLOCK_DIMS)
def test_tensor_api(device, block_dim):
    tex = tex_module()
    x = wide_random((4, 70, 260), torch.float16)
    qt = tex.quantize(x.to(device), fbq("e5m2", block_dim))
    r = ref.quantize_fp8_block_ref(x, "e5m2", block_dim)
    assert qt.rowwise_data.dtype == torch.float8_e5m2 and qt.columnwise_data.dtype == torch.float8_e5m2
    assert qt.rowwise_scale_inv.dtype == torch.float32
    assert qt.size() == torch.Size((4, 70, 260)) and qt.numel() == 4 * 70 * 260 and qt.device.type == device
    assert tuple(qt._columnwise_data.shape) == (260, 4, 70)
    v, c, h = check_block_tensor_api(qt, r)
    assert tuple(v._columnwise_data.shape) == (260, 280)
    assert tuple(qt.reshape(2, 140, 260)._columnwise_data.shape) == (260, 2, 140)
    assert h._is_2D_scaled == (block_dim == 2)
    with pytest.raises(RuntimeError, match="no data"):
        c.update_usage(rowwise_usage=False)
    if block_dim == 1:
        with pytest.raises(RuntimeError, match="cannot be derived"):
            c.update_usage(columnwise_usage=True)
    else:
        # 128x128: the columnwise copy is the transpose, so it can be rebuilt from the rowwise one, and back
        c.update_usage(columnwise_usage=True)
        assert torch.equal(cpu(c._columnwise_data).reshape(260, 280), r.col)
        assert torch.equal(cpu(c._columnwise_scale_inv), r.col_scale)
        c.update_usage(rowwise_usage=False)
        c.update_usage(rowwise_usage=True)
        assert torch.equal(cpu(c._rowwise_data).reshape(280, 260), r.row)
        assert torch.equal(cpu(c._rowwise_scale_inv), r.row_scale)
    e = tex.create_empty_quantized_tensor(fbq("e4m3", block_dim), (2000, 300), torch.bfloat16, device)
    want = ((16, 4), (3, 16)) if block_dim == 2 else ((3, 2000), (16, 300))
    assert (tuple(e._rowwise_scale_inv.shape), tuple(e._columnwise_scale_inv.shape)) == want
    assert tuple(e._columnwise_data.shape) == (300, 2000) and e._is_2D_scaled == (block_dim == 2)


def test_constructor_keywords():
    """SPEC §4.9 constructor keywords; the shape of a columnwise-only tensor is read off the transposed copy."""
    tex = tex_module()
    x = wide_random((40, 300), torch.float32)
    r = ref.quantize_fp8_block_ref(x, "e4m3", 1)
    t = tex.Float8BlockwiseQTensor(shape=(40, 300), dtype=torch.float32, rowwise_data=r.row, columnwise_data=r.col,
                                   rowwise_scale_inv=r.row_scale, columnwise_scale_inv=r.col_scale,
                                   fp8_dtype=tex.DType.kFloat8E4M3, quantizer=None, is_2D_scaled=False)
    assert ref.bits_equal(t.dequantize(), ref.dequantize_fp8_block_ref(r, "e4m3", 1, (40, 300), torch.float32))
    c = tex.Float8BlockwiseQTensor(columnwise_data=r.col, columnwise_scale_inv=r.col_scale, fp8_dtype=7,
                                   is_2D_scaled=False)
    assert tuple(c.shape) == (40, 300)
    assert ref.bits_equal(c.dequantize(), ref.dequantize_fp8_block_ref(r, "e4m3", 1, (40, 300), torch.float32, True))


def test_quantizer_value_object():
    tex = tex_module()
    a, b = fbq("e4m3"), fbq("e4m3")
    assert a == b and hash(a) == hash(b)
    assert a != fbq("e5m2") and a != fbq("e4m3", columnwise=False) and a != fbq("e4m3", 1)
    assert a != fbq("e4m3", pow2=False) and a != fbq("e4m3", eps=1e-6)
    c = a.copy()
    assert c == a and c is not a
    d = tex.Float8BlockQuantizer(torch.float8_e4m3fn)
    assert d == a and d.block_scaling_dim == 2 and d.force_pow_2_scales and d.amax_epsilon == 0.0
    assert d.rowwise_usage and d.columnwise_usage and d.block_len == 128
    assert tex.Float8BlockQuantizer(7, block_scaling_dim=1) == fbq("e4m3", 1)


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
def test_error_bad_config(device):
    tex = tex_module()
    x = uniform((4, 32)).to(device)
    with pytest.raises(ValueError, match=r"block_scaling_dim must be 1 \(1x128 blocks\) or 2 \(128x128 tiles\), got 3"):
        tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, block_scaling_dim=3)
    with pytest.raises(ValueError, match="kFloat8E4M3 or kFloat8E5M2"):
        tex.Float8BlockQuantizer(tex.DType.kBFloat16)
    with pytest.raises(ValueError, match=r"amax_epsilon must be finite and >= 0, got -1"):
        tex.Float8BlockQuantizer(7, amax_epsilon=-1.0)
    with pytest.raises(ValueError, match="neither rowwise nor columnwise"):
        tex.quantize(x, fbq("e4m3", rowwise=False, columnwise=False))
    # the op boundary checks what a hand-made spec could get wrong
    with pytest.raises(ValueError, match=r"block_scaling_dim \(spec block_dim\) must be 1 .* or 2 .*got 3"):
        torch.ops.te.quantize.default(x, 5, 7, True, True, 0, 0.0, 3)
    with pytest.raises(ValueError, match=r"bit1 \(2-D blocks\) = 0 disagrees with block_dim = 2"):
        torch.ops.te.quantize.default(x, 5, 7, True, True, 0, 0.0, 2)
    with pytest.raises(NotImplementedError, match=r"FP8 block 1x128 E5M2 supports only .*qflags=32"):
        torch.ops.te.quantize.default(x, 5, 8, True, True, 32, 0.0, 1)
    with pytest.raises(ValueError, match=r"FP8 block 128x128 E4M3 amax_epsilon must be finite and >= 0"):
        torch.ops.te.quantize.default(x, 5, 7, True, True, 2, -0.5, 2)
    with pytest.raises(ValueError, match=r"kFloat8E4M3 \(7\) or kFloat8E5M2 \(8\), got 6"):
        torch.ops.te.quantize.default(x, 5, 6, True, True, 0, 0.0, 1)


def test_error_inputs(device):
    tex = tex_module()
    q = fbq("e4m3")
    with pytest.raises(TypeError, match=r"float32, float16 or bfloat16, got torch.int32"):
        tex.quantize(torch.zeros(4, 4, dtype=torch.int32, device=device), q)
    with pytest.raises(TypeError, match=r"Float8BlockwiseQTensor for Float8BlockQuantizer, got MXFP8Tensor"):
        tex.quantize(uniform((4, 32)).to(device), q,
                     output=tex.quantize(uniform((4, 32)).to(device), tex.MXFP8Quantizer(7)))
    with pytest.raises(ValueError, match=r"output has shape \(4, 32\) but the input has shape \(4, 64\)"):
        tex.quantize(uniform((4, 64)).to(device), q, output=q.make_empty((4, 32), device=device))
    with pytest.raises(ValueError, match=r"holds 1x128-block scales but the quantizer uses block_scaling_dim=2"):
        tex.quantize(uniform((4, 32)).to(device), q, output=fbq("e4m3", 1).make_empty((4, 32), device=device))
    # a caller-made buffer of the wrong shape is named with its expected shape
    bad = q.make_empty((4, 32), device=device)
    bad._rowwise_scale_inv = torch.zeros(1, 1, device=device)
    with pytest.raises(ValueError, match=r"_rowwise_scale_inv must be a contiguous Float tensor of shape \[1, 4\]"):
        tex.quantize(uniform((4, 32)).to(device), q, output=bad)
    with pytest.raises(RuntimeError, match="neither a rowwise nor a columnwise"):
        tex.Float8BlockwiseQTensor(shape=(4, 4), fp8_dtype=7).dequantize()
    with pytest.raises(ValueError, match="give `shape` or a data buffer"):
        tex.Float8BlockwiseQTensor(fp8_dtype=7)


# ------------------------------------------------------------------------------------------------
# opcheck (torch.compile of every quantizer kind: test_opcheck_compile.py)
# ------------------------------------------------------------------------------------------------
def _fb_spec(fmt=7, rowwise=True, columnwise=True, block_dim=2, pow2=True, eps=0.0, noop=None):
    flags = (1 if pow2 else 0) | (2 if block_dim == 2 else 0)
    return (5, fmt, rowwise, columnwise, flags, eps, block_dim, None, None, noop)


def _opcheck_cases(device):
    x, xb, gu, gg, u8 = opcheck_inputs(device, 140, 260)
    f32 = lambda *s: torch.zeros(s, dtype=torch.float32, device=device)  # noqa: E731
    return {
        "act_quantize-gelu-2d": ("act_quantize", (x, 0, 7.0, 1.702, 1.0) + _fb_spec()),
        "act_quantize-swiglu-1d": ("act_quantize", (xb, 4, 7.0, 1.702, 1.0) + _fb_spec(8, block_dim=1)),
        "act_quantize-rowonly": ("act_quantize", (xb, 11, 7.0, 1.702, 1.0) + _fb_spec(7, True, False, 1, False)),
        "dact_quantize-dsilu": ("dact_quantize", (gu, x, 3, 7.0, 1.702, 1.0) + _fb_spec(7, False, True, 2)),
        "dact_quantize-dgeglu": ("dact_quantize", (gg, xb, 1, 7.0, 1.702, 1.0) + _fb_spec(8, block_dim=1)),
        "dbias_dact-drelu": ("dbias_dact", (gu, x, 5) + _fb_spec(block_dim=1, eps=1e-6)),
        "quantize-1d": ("quantize", (xb,) + _fb_spec(8, block_dim=1)),
        "quantize-0d": ("quantize", (torch.tensor(1.5, device=device),) + _fb_spec(7, block_dim=1)),
        "quantize-spec-prefix": ("quantize", (x, 5, 7, True, True, 3, 0.0, 2)),
        "quantize-noop": ("quantize", (x,) + _fb_spec(noop=torch.zeros(1, device=device))),
        "bgrad_quantize": ("bgrad_quantize", (xb,) + _fb_spec()),
        "quantize_into-2d": ("quantize_into", (x,) + _fb_spec() + (u8(140, 260), f32(2, 4), u8(260, 140),
                                                                  f32(3, 4))),
        "quantize_into-1d": ("quantize_into", (x,) + _fb_spec(block_dim=1) + (u8(140, 260), f32(3, 140),
                                                                             u8(260, 140), f32(2, 260))),
    }


@pytest.mark.parametrize("case", list(_opcheck_cases("cpu")))
def test_opcheck(device, case):
    run_opcheck(_opcheck_cases(device)[case])


# ------------------------------------------------------------------------------------------------
# CUDA: CPU/CUDA byte parity (SPEC §1.1 item 1), unaligned buffers, CUDA graphs (item 6)
# ------------------------------------------------------------------------------------------------
def assert_fb_same(a, b, msg):
    """Two Float8BlockwiseQTensors (CPU, CUDA) hold identical bytes in every piece."""
    for k in PIECES:
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None), f"{msg} {k}"
        if x is not None:
            assert y.device.type == "cuda", f"{msg} {k} on {y.device}"
            assert tuple(x.shape) == tuple(y.shape), f"{msg} {k}"
            ref.assert_bytes_equal(cpu(y).reshape(-1).view(torch.uint8), x.reshape(-1).view(torch.uint8),
                                   f"{msg} {k}")


# (136, 264) and (8, 24): rows and cols multiples of 8, so the pipelined CUDA kernel, with ragged tiles.
CUDA_SHAPES = SMALL_SHAPES + [(1, 4100), (4100, 1), (129, 8), (8, 129), (3, 127, 264), (136, 264), (8, 24)]
CUDA_BIG_SHAPES = [(2000, 2000), (4096, 1536)]


@pytest.mark.cuda
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_cuda_parity_quantize(dtype, block_dim):
    """Every shape (ragged, 0-d, empty, tall, wide), both formats, pow2 on/off, epsilon 0/1e-6, every usage (the big
    shapes: two scale options, both copies); wide-range values, special values and random bit patterns (NaN, Inf,
    subnormals)."""
    tex = tex_module()
    for shape in CUDA_SHAPES + CUDA_BIG_SHAPES:
        big = shape in CUDA_BIG_SHAPES
        for inp in ("wide", "mixed", "bits"):
            x = wide_random(shape, dtype) if inp == "wide" else mixed_values(shape, dtype, 3, inp == "bits")
            xc = x.cuda()
            for fmt in FMTS:
                for pow2, eps in (SCALE_OPTS[1:3] if big else SCALE_OPTS):
                    for usage in ([(True, True)] if big else USAGES):
                        q = fbq(fmt, block_dim, pow2, eps, *usage)
                        msg = f"{shape} {dtype} {inp} {fmt} {block_dim}D pow2={pow2} eps={eps} {usage}"
                        assert_fb_same(tex.quantize(x, q), tex.quantize(xc, q), msg)


@pytest.mark.cuda
@pytest.mark.parametrize("block_dim", [1, 2])
def test_cuda_matches_reference_large(block_dim):
    tex = tex_module()
    for shape in [(2000, 2000), (4096, 1536)]:
        x = wide_random(shape, torch.bfloat16)
        qt = tex.quantize(x.cuda(), fbq("e4m3", block_dim))
        check_fb(qt, ref.quantize_fp8_block_ref(x, "e4m3", block_dim), shape, torch.bfloat16, "e4m3", block_dim,
                 f"cuda {shape}", wrong=ref.quantize_fp8_block_ref(-x, "e4m3", block_dim))


@pytest.mark.cuda
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_cuda_parity_activations(name, dtype, block_dim):
    tex = tex_module()
    for rows in (256, 45):
        x = mixed_values((rows, 264), dtype, 1)
        g = mixed_values(ref.out_shape(name, x.shape), dtype, 2)
        for fmt in FMTS:
            q = fbq(fmt, block_dim, pow2=fmt == "e4m3")
            a = (getattr(tex, name)(x, q), getattr(tex, ref.DACT_NAMES[name])(g, x, q))
            b = (getattr(tex, name)(x.cuda(), q), getattr(tex, ref.DACT_NAMES[name])(g.cuda(), x.cuda(), q))
            assert_fb_same(a[0], b[0], f"{name} {dtype} rows={rows} {fmt} fwd")
            assert_fb_same(a[1], b[1], f"{name} {dtype} rows={rows} {fmt} bwd")


@pytest.mark.cuda
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES) + ["bgrad_quantize"])
def test_cuda_parity_dbias(name, block_dim):
    tex = tex_module()
    dtype = torch.bfloat16
    x, g = uniform((301, 264), dtype), uniform((301, 264), dtype, g=torch.Generator().manual_seed(6))
    res = {}
    for dev in ("cpu", "cuda"):
        q = fbq("e4m3", block_dim)
        if name == "bgrad_quantize":
            res[dev] = tex.bgrad_quantize(x.to(dev), q)
        else:
            res[dev] = getattr(tex, name)(g.to(dev), x.to(dev), q)
    assert_fb_same(res["cpu"][1], res["cuda"][1], name)
    assert ref.within_tol(cpu(res["cuda"][0]), res["cpu"][0], 4 * ref.TOL[dtype][0], 1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("block_dim", [1, 2])
def test_cuda_unaligned_buffers(block_dim):
    """An input 2 bytes into its storage (no 16-byte loads), K not a multiple of 8, and output buffers of a
    quantize_into at odd offsets: the element-wise paths, same bytes."""
    tex = tex_module()
    base = wide_random((260 * 300 + 1,), torch.bfloat16)
    x = base[1:].reshape(260, 300)
    q = fbq("e4m3", block_dim)
    a = tex.quantize(x, q)
    xc = base.cuda()[1:].reshape(260, 300)
    assert xc.data_ptr() % 16 != 0
    assert_fb_same(a, tex.quantize(xc, q), "unaligned input")
    assert_fb_same(tex.quantize(x[:, :299].contiguous(), q), tex.quantize(xc[:, :299].contiguous(), q), "K=299")
    rs, cs = ref.fb_scale_shapes(260, 300, block_dim)
    raw = torch.zeros(260 * 300 * 2 + 3, dtype=torch.uint8, device="cuda")
    out = tex.Float8BlockwiseQTensor(shape=(260, 300), dtype=torch.bfloat16,
                                     rowwise_data=raw[1:1 + 260 * 300].view(260, 300),
                                     columnwise_data=raw[3 + 260 * 300:].view(300, 260),
                                     rowwise_scale_inv=torch.zeros(rs, device="cuda"),
                                     columnwise_scale_inv=torch.zeros(cs, device="cuda"),
                                     fp8_dtype=tex.DType.kFloat8E4M3, is_2D_scaled=block_dim == 2)
    tex.quantize(xc, q, output=out)
    assert_fb_same(a, out, "unaligned outputs")


@pytest.mark.cuda
@pytest.mark.parametrize("block_dim", [1, 2])
def test_cuda_graph_quantize(block_dim):
    """A block quantize (and gelu -> block) captured in a CUDA graph replays the eager bytes for new inputs; with
    noop = 1 the replay writes nothing."""
    tex = tex_module()
    q = fbq("e4m3", block_dim)
    x_static = uniform((300, 520), torch.bfloat16, "cuda")
    noop = torch.zeros(1, device="cuda")
    out = tex.quantize(x_static, q)
    graph, y_static = capture_graph(lambda: (tex.quantize(x_static, q, output=out, noop=noop),
                                             tex.gelu(x_static, q))[1])
    for step, x_new in replay_on_new_inputs(graph, x_static):
        assert_fb_same(tex.quantize(x_new.cpu(), q), out, f"graph quantize step {step}")
        assert_fb_same(tex.gelu(x_new.cpu(), q), y_static, f"graph gelu step {step}")
    noop.fill_(1.0)
    snap = [getattr(out, k).clone() for k in PIECES]
    x_static.copy_(uniform((300, 520), torch.bfloat16, "cuda", lo=-50, hi=50, g=torch.Generator().manual_seed(9)))
    graph.replay()
    torch.cuda.synchronize()
    for k, b in zip(PIECES, snap):
        assert torch.equal(getattr(out, k), b), f"noop = 1 replay wrote {k}"
