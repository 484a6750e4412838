"""Bit-exact per-tensor FP8 quantization via tex.quantize (SPEC §2, §4.2, §4.4, §4.9, §4.10)
against the pure-PyTorch reference: data bytes, transposed copy, scale_inv, amax, dequantize.
Every comparison also checks that the reference of -x (a wrong answer) would fail."""
import math

import pytest
import torch

from tests import ref
from tests.torch.helpers import (DTYPE_PARAMS, check_float8_tensor, cpu, current_quantizer, delayed_quantizer,
                                 fp8_dtype, tex_module, uniform, wide_random)

SHAPES = [(), (311,), (7, 5, 3), (611, 782)]
SHAPE_IDS = ["0d", "311", "7x5x3", "611x782"]
SCALES = [0.375, 1.0, 3.5, -1.5]
AMAX0 = 0.5


def check_quantized(qt, r, x, fmt, msg, wrong=None, rowwise=True, columnwise=True):
    """Bit-exact comparison of a Float8Tensor with a reference QRef."""
    check_float8_tensor(qt, tuple(x.shape), x.dtype, fmt, rowwise, columnwise)
    if rowwise:
        ref.assert_bytes_equal(cpu(qt._data), r.codes, msg + " _data",
                               wrong=None if wrong is None else wrong.codes)
    if columnwise:
        t = cpu(qt._transpose)
        if x.dim() == 0:
            t = t.reshape(1)
        ref.assert_bytes_equal(t, r.t_codes, msg + " _transpose",
                               wrong=None if wrong is None else wrong.t_codes)
    si = cpu(qt._scale_inv).reshape(1)
    assert ref.bits_equal(si, r.scale_inv), f"{msg}: scale_inv {si.item()!r} != {r.scale_inv.item()!r}"
    # dequantize: fl(decode(code) * scale_inv), one rounding to the nominal dtype
    codes = r.codes
    deq = qt.dequantize()
    assert deq.dtype == x.dtype and tuple(deq.shape) == tuple(x.shape)
    assert ref.bits_equal(deq, ref.dequantize_ref(codes, r.scale_inv, fmt, x.dtype)), msg + " dequantize"


# ------------------------------------------------------------------------------------------------
# delayed scaling
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_delayed(fmt, scale, dtype, shape):
    tex = tex_module()
    x = wide_random(shape, dtype)
    q, s, amax = delayed_quantizer(scale, fmt, amax_value=AMAX0)
    qt = tex.quantize(x, q)
    r = ref.quantize_delayed_ref(x, s, torch.tensor([AMAX0]), fmt)
    w = ref.quantize_delayed_ref(-x, s, torch.tensor([AMAX0]), fmt)
    check_quantized(qt, r, x, fmt, f"delayed {fmt} s={scale} {dtype} {shape}", wrong=w)
    assert torch.equal(cpu(amax).reshape(1), r.amax), f"amax {amax} != {r.amax}"
    assert float(s) == scale, "the cast must not change the quantizer's scale"


# ------------------------------------------------------------------------------------------------
# current scaling
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("eps", [0.0, 1e-6], ids=["eps0", "eps1e-6"])
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32scale", "pow2"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_current(fmt, pow2, eps, dtype, shape):
    tex = tex_module()
    x = wide_random(shape, dtype)
    qt = tex.quantize(x, current_quantizer(fmt, pow2=pow2, eps=eps))
    r = ref.quantize_current_ref(x, fmt, pow2=pow2, eps=eps)
    w = ref.quantize_current_ref(-x, fmt, pow2=pow2, eps=eps)
    check_quantized(qt, r, x, fmt, f"current {fmt} pow2={pow2} eps={eps} {dtype} {shape}", wrong=w)


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32scale", "pow2"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_current_epsilon_floor(fmt, pow2):
    """amax below epsilon: the scale comes from epsilon (and differs from the eps=0 answer)."""
    tex = tex_module()
    x = uniform((64, 32), torch.float32) * 1e-8          # amax ~3e-8 < 1e-6
    qt = tex.quantize(x, current_quantizer(fmt, pow2=pow2, eps=1e-6))
    r = ref.quantize_current_ref(x, fmt, pow2=pow2, eps=1e-6)
    r0 = ref.quantize_current_ref(x, fmt, pow2=pow2, eps=0.0)
    assert not torch.equal(r.scale_inv, r0.scale_inv)
    check_quantized(qt, r, x, fmt, "eps floor", wrong=r0)


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32scale", "pow2"])
def test_current_tiny_amax_scale_flt_max(pow2):
    """fp8_max / amax overflows for a subnormal amax: scale = FLT_MAX (pow2: 2^127)."""
    tex = tex_module()
    x = torch.tensor([1e-45, -1e-45, 0.0, 5e-45], dtype=torch.float32)
    qt = tex.quantize(x, current_quantizer("e4m3", pow2=pow2))
    r = ref.quantize_current_ref(x, "e4m3", pow2=pow2)
    assert float(r.scale) == (2.0 ** 127 if pow2 else ref.FLT_MAX)
    check_quantized(qt, r, x, "e4m3", "tiny amax", wrong=ref.quantize_current_ref(-x, "e4m3", pow2=pow2))


# ------------------------------------------------------------------------------------------------
# structured inputs: every code, every midpoint, FP32 neighbours, saturation, underflow
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("kind", ["delayed1", "delayed0.375", "current"])
def test_structured_grid(kind, fmt, dtype):
    tex = tex_module()
    fmax = ref.FP8_MAX[fmt]
    b = ref.fp8_boundary_values(fmt)
    b = b[torch.isfinite(b)]
    if kind == "current":
        b = b[b.abs() <= fmax]       # amax = fp8_max -> scale exactly 1, ties stay ties
    else:
        b = b[b.abs() <= torch.finfo(dtype).max]
    x = b.to(dtype)
    if kind == "current":
        assert float(x.float().abs().max()) == fmax
        qt = tex.quantize(x, current_quantizer(fmt))
        r = ref.quantize_current_ref(x, fmt)
        assert float(r.scale) == 1.0
        w = ref.quantize_current_ref(-x, fmt)
    else:
        sv = 1.0 if kind == "delayed1" else 0.375
        xs = (b / sv).to(dtype)      # x * scale lands on/near the boundaries
        x = xs
        q, s, amax = delayed_quantizer(sv, fmt)
        qt = tex.quantize(x, q)
        r = ref.quantize_delayed_ref(x, s, torch.zeros(1), fmt)
        w = ref.quantize_delayed_ref(-x, s, torch.zeros(1), fmt)
        assert torch.equal(cpu(amax).reshape(1), r.amax)
    check_quantized(qt, r, x, fmt, f"grid {kind} {fmt} {dtype}", wrong=w)


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_ties_round_to_even(dtype):
    """Exact midpoints between FP8 neighbours go to the even code (scale 1)."""
    tex = tex_module()
    vals = torch.tensor([1.0625, 1.1875, 3.125, 3.375, 0.0029296875, 2.0 ** -10, 464.0, -1.0625], dtype=dtype)
    q, _, _ = delayed_quantizer(1.0, "e4m3")
    qt = tex.quantize(vals, q)
    expect = torch.tensor([0x38, 0x3A, 0x44, 0x46, 0x02, 0x00, 0x7E, 0xB8], dtype=torch.uint8)
    assert torch.equal(ref.fp8_encode(vals.float(), "e4m3"), expect)
    ref.assert_bytes_equal(cpu(qt._data), expect, "ties")


# ------------------------------------------------------------------------------------------------
# amax semantics (delayed): accumulate by max, never reset by a cast; NaN ignored
# ------------------------------------------------------------------------------------------------
def test_delayed_amax_accumulates_never_reset():
    tex = tex_module()
    q, s, amax = delayed_quantizer(2.0, "e4m3", amax_value=0.0)
    x1 = uniform((50,), torch.float32, lo=-2.0, hi=2.0)
    tex.quantize(x1, q)
    a1 = float(ref.amax_ref(x1))
    assert float(amax) == a1
    tex.quantize(x1 * 0.25, q)                 # smaller: unchanged
    assert float(amax) == a1
    tex.quantize(torch.zeros(10), q)           # zeros: unchanged
    assert float(amax) == a1
    x3 = x1 * 3
    tex.quantize(x3, q)                        # larger: updated
    assert float(amax) == float(ref.amax_ref(x3))
    # an initial amax larger than anything in the input is kept
    q, s, amax = delayed_quantizer(2.0, "e4m3", amax_value=1000.0)
    tex.quantize(x1, q)
    assert float(amax) == 1000.0
    # activations accumulate into the same buffer
    q, s, amax = delayed_quantizer(2.0, "e4m3", amax_value=0.0)
    tex.quantize(x3, q)
    tex.gelu(x1, q)
    assert float(amax) == float(ref.amax_ref(x3))


def test_delayed_scale_inv_and_quantizer_untouched():
    tex = tex_module()
    for sv in [0.375, 1.0, 3.5, -1.5, 1e-3, 12345.678]:
        q, s, amax = delayed_quantizer(sv, "e4m3")
        qt = tex.quantize(uniform((9, 4)), q)
        expect = (torch.tensor(1.0) / torch.tensor(sv, dtype=torch.float32)).reshape(1)
        assert torch.equal(cpu(qt._scale_inv).reshape(1), expect), sv
        assert float(s) == float(torch.tensor(sv, dtype=torch.float32))


def test_delayed_scale_zero():
    """scale = 0: scale_inv = +Inf; finite inputs give zero codes, +-Inf inputs give NaN."""
    tex = tex_module()
    x = torch.tensor([1.0, -2.0, 0.0, math.inf, -math.inf, math.nan])
    q, s, amax = delayed_quantizer(0.0, "e4m3")
    qt = tex.quantize(x, q)
    r = ref.quantize_delayed_ref(x, s, torch.zeros(1), "e4m3")
    assert float(r.scale_inv) == math.inf
    check_quantized(qt, r, x, "e4m3", "scale 0")
    assert r.codes.tolist() == [0x00, 0x80, 0x00, 0x7F, 0x7F, 0x7F]


# ------------------------------------------------------------------------------------------------
# zeros, Inf/NaN, empty, non-contiguous
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_all_zero_input(fmt, dtype):
    tex = tex_module()
    x = torch.zeros(13, 17, dtype=dtype)
    qt = tex.quantize(x, current_quantizer(fmt))
    assert torch.all(cpu(qt._data) == 0) and torch.all(cpu(qt._transpose) == 0)
    assert float(qt._scale_inv) == 1.0
    check_quantized(qt, ref.quantize_current_ref(x, fmt), x, fmt, "zeros current", wrong=ref.quantize_current_ref(-x, fmt))
    for pow2 in [False, True]:
        qt = tex.quantize(x, current_quantizer(fmt, pow2=pow2))
        assert float(qt._scale_inv) == 1.0
    # epsilon: amax = eps
    qt = tex.quantize(x, current_quantizer(fmt, eps=1e-6))
    check_quantized(qt, ref.quantize_current_ref(x, fmt, eps=1e-6), x, fmt, "zeros current eps",
                    wrong=ref.quantize_current_ref(-x, fmt, eps=1e-6))
    # delayed: bytes 0 (negative scale: -0 -> 0x80), amax stays 0
    for sv in [3.5, -1.5]:
        q, s, amax = delayed_quantizer(sv, fmt)
        qt = tex.quantize(x, q)
        check_quantized(qt, ref.quantize_delayed_ref(x, s, torch.zeros(1), fmt), x, fmt, f"zeros delayed {sv}",
                        wrong=ref.quantize_delayed_ref(-x, s, torch.zeros(1), fmt))
        assert float(amax) == 0.0


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_all_max_finite_input(fmt, dtype):
    tex = tex_module()
    fmax_in = torch.finfo(dtype).max
    x = torch.full((4, 8), fmax_in, dtype=dtype)
    x[1] = -fmax_in
    for pow2 in [False, True]:
        qt = tex.quantize(x, current_quantizer(fmt, pow2=pow2))
        check_quantized(qt, ref.quantize_current_ref(x, fmt, pow2=pow2), x, fmt, f"max finite pow2={pow2}",
                        wrong=ref.quantize_current_ref(-x, fmt, pow2=pow2))
    q, s, amax = delayed_quantizer(1.0, fmt)
    qt = tex.quantize(x, q)
    r = ref.quantize_delayed_ref(x, s, torch.zeros(1), fmt)
    check_quantized(qt, r, x, fmt, "max finite delayed", wrong=ref.quantize_delayed_ref(-x, s, torch.zeros(1), fmt))
    mc = ref.FP8_MAX_CODE[fmt]
    assert set(cpu(qt._data).reshape(-1).tolist()) == {mc, 0x80 | mc}      # saturated
    assert torch.equal(cpu(amax).reshape(1), r.amax)


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_inf_nan_inputs(fmt, dtype):
    """Inf -> +-fp8_max, NaN -> NaN (0x7F); amax ignores NaN (and sees Inf)."""
    tex = tex_module()
    x = uniform((6, 10), dtype)
    x[0, 0], x[1, 3], x[2, 5], x[3, 7] = math.inf, -math.inf, math.nan, -math.nan
    mc = ref.FP8_MAX_CODE[fmt]
    # delayed
    q, s, amax = delayed_quantizer(2.0, fmt)
    qt = tex.quantize(x, q)
    r = ref.quantize_delayed_ref(x, s, torch.zeros(1), fmt)
    check_quantized(qt, r, x, fmt, "inf/nan delayed", wrong=ref.quantize_delayed_ref(-x, s, torch.zeros(1), fmt))
    d = cpu(qt._data)
    assert int(d[0, 0]) == mc and int(d[1, 3]) == 0x80 | mc
    assert int(d[2, 5]) == 0x7F and int(d[3, 7]) == 0x7F
    assert float(amax) == math.inf
    deq = qt.dequantize()
    assert math.isnan(float(deq[2, 5])) and math.isnan(float(deq[3, 7]))
    assert float(deq[0, 0]) == ref.FP8_MAX[fmt] / 2.0
    # NaN only (no Inf): amax ignores NaN
    y = uniform((6, 10), dtype)
    y[2, 5] = math.nan
    q, s, amax = delayed_quantizer(2.0, fmt)
    tex.quantize(y, q)
    assert float(amax) == float(ref.amax_ref(y)) and not math.isnan(float(amax))
    # current: amax = Inf -> scale 1; Inf saturates, NaN -> NaN
    for pow2 in [False, True]:
        qt = tex.quantize(x, current_quantizer(fmt, pow2=pow2))
        r = ref.quantize_current_ref(x, fmt, pow2=pow2)
        assert float(r.scale) == 1.0
        check_quantized(qt, r, x, fmt, "inf/nan current", wrong=ref.quantize_current_ref(-x, fmt, pow2=pow2))
        qt = tex.quantize(y, current_quantizer(fmt, pow2=pow2))
        r = ref.quantize_current_ref(y, fmt, pow2=pow2)
        assert float(r.scale) != 1.0
        check_quantized(qt, r, y, fmt, "nan current", wrong=ref.quantize_current_ref(-y, fmt, pow2=pow2))


@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0), (2, 0, 3)])
@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_empty_input(kind, shape):
    tex = tex_module()
    x = torch.empty(shape, dtype=torch.bfloat16)
    if kind == "delayed":
        q, s, amax = delayed_quantizer(-1.5, "e4m3", amax_value=0.75)
    else:
        q = current_quantizer("e5m2", pow2=True)
    qt = tex.quantize(x, q)
    fmt = "e4m3" if kind == "delayed" else "e5m2"
    check_float8_tensor(qt, shape, torch.bfloat16, fmt)
    assert qt._data.numel() == 0 and qt._transpose.numel() == 0
    if kind == "delayed":
        assert float(amax) == 0.75, "empty input leaves amax unchanged"
        assert torch.equal(cpu(qt._scale_inv).reshape(1), ref.reciprocal_f32(torch.tensor(-1.5)).reshape(1))
    else:
        assert float(qt._scale_inv) == 1.0
    assert tuple(qt.dequantize().shape) == shape


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_non_contiguous_input(kind, dtype):
    tex = tex_module()
    base = wide_random((70, 33), dtype)
    x = base.t()                                      # [33, 70] transposed view
    assert not x.is_contiguous()
    x3 = wide_random((6, 8, 10), dtype).permute(2, 0, 1)  # 3-D permuted view
    for xx in [x, x3, base[:, ::2]]:
        if kind == "delayed":
            q, s, amax = delayed_quantizer(3.5, "e4m3")
            qt = tex.quantize(xx, q)
            r = ref.quantize_delayed_ref(xx.contiguous(), s, torch.zeros(1), "e4m3")
            w = ref.quantize_delayed_ref(-xx.contiguous(), s, torch.zeros(1), "e4m3")
            assert torch.equal(cpu(amax).reshape(1), r.amax)
        else:
            qt = tex.quantize(xx, current_quantizer("e4m3"))
            r = ref.quantize_current_ref(xx.contiguous(), "e4m3")
            w = ref.quantize_current_ref(-xx.contiguous(), "e4m3")
        check_quantized(qt, r, xx, "e4m3", f"non-contiguous {kind} {tuple(xx.shape)}", wrong=w)


# ------------------------------------------------------------------------------------------------
# usages, dtype spellings, typed views, dequantize
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_rowwise_only_and_columnwise_only(kind):
    tex = tex_module()
    x = wide_random((24, 40), torch.bfloat16)
    for rowwise, columnwise in [(True, False), (False, True), (True, True)]:
        if kind == "delayed":
            q, s, _ = delayed_quantizer(3.5, "e5m2", rowwise=rowwise, columnwise=columnwise)
            r = ref.quantize_delayed_ref(x, s, torch.zeros(1), "e5m2")
        else:
            q = current_quantizer("e5m2", rowwise=rowwise, columnwise=columnwise)
            r = ref.quantize_current_ref(x, "e5m2")
        qt = tex.quantize(x, q)
        check_float8_tensor(qt, (24, 40), torch.bfloat16, "e5m2", rowwise, columnwise)
        w = ref.quantize_current_ref(-x, "e5m2") if kind == "current" else \
            ref.quantize_delayed_ref(-x, s, torch.zeros(1), "e5m2")
        if rowwise:
            ref.assert_bytes_equal(cpu(qt._data), r.codes, "rowwise", wrong=w.codes)
        if columnwise:
            ref.assert_bytes_equal(cpu(qt._transpose), r.t_codes, "columnwise", wrong=w.t_codes)
        assert torch.equal(cpu(qt._scale_inv).reshape(1), r.scale_inv)
        # dequantize uses the rowwise copy when present, else the transposed-back columnwise one
        assert ref.bits_equal(qt.dequantize(), ref.dequantize_ref(r.codes, r.scale_inv, "e5m2", torch.bfloat16))


def test_quantizer_attributes_changed_after_construction_apply():
    """The spec that crosses into C++ is rebuilt from the quantizer's attributes at every call, and leaves out
    only fields at their schema defaults: set_usage, force_pow_2_scales and amax_epsilon set on an existing
    quantizer take effect, and setting them back does too."""
    tex = tex_module()
    x = wide_random((24, 40), torch.bfloat16)
    q = current_quantizer("e4m3")
    previous_scaling = None
    for change, rowwise, columnwise, pow2, eps in [
            (lambda: None, True, True, False, 0.0),
            (lambda: q.set_usage(columnwise=False), True, False, False, 0.0),
            (lambda: setattr(q, "force_pow_2_scales", True), True, False, True, 0.0),
            (lambda: setattr(q, "amax_epsilon", 1e6), True, False, True, 1e6),
            (lambda: (setattr(q, "force_pow_2_scales", False), setattr(q, "amax_epsilon", 0.0),
                      q.set_usage(rowwise=False, columnwise=True)), False, True, False, 0.0)]:
        change()
        r = ref.quantize_current_ref(x, "e4m3", pow2=pow2, eps=eps)
        # The result the quantizer's previous scaling settings would give, where this step changed them.
        stale = None
        if previous_scaling not in (None, (pow2, eps)):
            stale = ref.quantize_current_ref(x, "e4m3", pow2=previous_scaling[0], eps=previous_scaling[1])
        msg = f"rowwise={rowwise} columnwise={columnwise} pow2={pow2} eps={eps}"
        check_quantized(tex.quantize(x, q), r, x, "e4m3", msg, wrong=stale, rowwise=rowwise, columnwise=columnwise)
        check_float8_tensor(tex.gelu(x, q), x.shape, x.dtype, "e4m3", rowwise, columnwise)
        previous_scaling = (pow2, eps)


def test_op_result_has_the_fields_of_a_constructed_tensor():
    """Quantizing ops build their Float8Tensor without the public constructor (Float8Tensor._from_op); it must
    hold the same fields with the same values."""
    tex = tex_module()
    x = uniform((6, 16), torch.bfloat16)
    for rowwise, columnwise in [(True, False), (False, True), (True, True)]:
        q = current_quantizer("e5m2", rowwise=rowwise, columnwise=columnwise)
        made = tex.quantize(x, q)
        built = tex.Float8Tensor(shape=x.shape, dtype=x.dtype, data=made._data, fp8_scale_inv=made._scale_inv,
                                 fp8_dtype=q.dtype, data_transpose=made._transpose, quantizer=q)
        assert vars(made).keys() == vars(built).keys()
        for k, v in vars(built).items():
            assert type(vars(made)[k]) is type(v) and (vars(made)[k] is v or vars(made)[k] == v), k


def test_fp8_dtype_spellings_equivalent():
    tex = tex_module()
    x = wide_random((16, 16), torch.float32)
    outs = []
    for spelling in [tex.DType.kFloat8E4M3, torch.float8_e4m3fn, 7]:
        q = tex.Float8Quantizer(torch.tensor([3.5]), torch.zeros(1), spelling)
        outs.append(cpu(tex.quantize(x, q)._data))
        qc = tex.Float8CurrentScalingQuantizer(spelling)
        outs.append(cpu(tex.quantize(x, qc)._data))
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[2], outs[4])
    assert torch.equal(outs[1], outs[3]) and torch.equal(outs[3], outs[5])


def test_dtype_enum_values():
    tex = tex_module()
    D = tex.DType
    assert (int(D.kByte), int(D.kInt32), int(D.kFloat32), int(D.kFloat16), int(D.kBFloat16),
            int(D.kFloat8E4M3), int(D.kFloat8E5M2), int(D.kFloat4E2M1)) == (0, 2, 4, 5, 6, 7, 8, 10)
    assert D.kFloat8E4M3 == 7


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_typed_views(fmt):
    tex = tex_module()
    x = wide_random((12, 20), torch.float16)
    qt = tex.quantize(x, current_quantizer(fmt))
    tdt = ref.FP8_TORCH[fmt]
    assert qt.rowwise_data.dtype == tdt and qt.columnwise_data.dtype == tdt
    assert torch.equal(qt.rowwise_data.view(torch.uint8), qt._data)
    assert torch.equal(qt.columnwise_data.view(torch.uint8), qt._transpose)
    assert qt._data.dtype == torch.uint8 and qt._transpose.dtype == torch.uint8
    assert str(qt.device) == "cpu"


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_dequantize_otypes(fmt):
    tex = tex_module()
    x = wide_random((33, 17), torch.bfloat16)
    q, s, _ = delayed_quantizer(-1.5, fmt)
    qt = tex.quantize(x, q)
    r = ref.quantize_delayed_ref(x, s, torch.zeros(1), fmt)
    for otype in [torch.float32, torch.float16, torch.bfloat16]:
        e = ref.dequantize_ref(r.codes, r.scale_inv, fmt, otype)
        assert ref.bits_equal(qt.dequantize(dtype=otype), e), otype
        assert ref.bits_equal(tex.dequantize(qt, otype), e), otype
    D = tex.DType
    for otype, tdt in [(D.kFloat32, torch.float32), (D.kFloat16, torch.float16), (D.kBFloat16, torch.bfloat16)]:
        out = tex.dequantize(qt, otype)
        assert out.dtype == tdt
        assert ref.bits_equal(out, ref.dequantize_ref(r.codes, r.scale_inv, fmt, tdt))
    # default: nominal dtype
    assert qt.dequantize().dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------------
# output= reuse and the noop flag (SPEC §4.10)
# ------------------------------------------------------------------------------------------------
def _snapshot(qt, amax=None):
    snap = {k: getattr(qt, k).clone() for k in ["_data", "_transpose", "_scale_inv"] if getattr(qt, k) is not None}
    if amax is not None:
        snap["amax"] = amax.clone()
    return snap


def _assert_unchanged(qt, snap, amax=None):
    for k, v in snap.items():
        cur = amax if k == "amax" else getattr(qt, k)
        assert ref.bits_equal(cur, v) if cur.is_floating_point() else torch.equal(cur, v), f"{k} changed"


@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_output_reuse_and_noop(kind):
    tex = tex_module()
    x1 = wide_random((31, 24), torch.bfloat16)
    x2 = uniform((31, 24), torch.bfloat16, lo=-50.0, hi=50.0)
    if kind == "delayed":
        q, s, amax = delayed_quantizer(3.5, "e4m3")
        ref_fn = lambda x, a0: ref.quantize_delayed_ref(x, s, a0, "e4m3")  # noqa: E731
    else:
        q, s, amax = current_quantizer("e4m3"), None, None
        ref_fn = lambda x, a0: ref.quantize_current_ref(x, "e4m3")  # noqa: E731
    out = tex.quantize(x1, q)
    ptrs = (out._data.data_ptr(), out._transpose.data_ptr(), out._scale_inv.data_ptr())
    snap = _snapshot(out, amax)
    # noop == 1: nothing written (data, transpose, scale_inv, amax)
    res = tex.quantize(x2, q, output=out, noop=torch.ones(1))
    assert res is None or res is out or res._data.data_ptr() == ptrs[0]
    _assert_unchanged(out, snap, amax)
    # noop == 0: normal cast into the same buffers
    a0 = amax.clone() if amax is not None else None
    res = tex.quantize(x2, q, output=out, noop=torch.zeros(1))
    assert (out._data.data_ptr(), out._transpose.data_ptr(), out._scale_inv.data_ptr()) == ptrs
    r = ref_fn(x2, a0)
    ref.assert_bytes_equal(cpu(out._data), r.codes, "output= data", wrong=ref_fn(-x2, a0).codes)
    ref.assert_bytes_equal(cpu(out._transpose), r.t_codes, "output= transpose")
    assert torch.equal(cpu(out._scale_inv).reshape(1), r.scale_inv)
    if amax is not None:
        assert torch.equal(cpu(amax).reshape(1), r.amax)
    # no noop argument: normal cast, buffers reused
    x3 = uniform((31, 24), torch.bfloat16, lo=-0.5, hi=0.5)
    a0 = amax.clone() if amax is not None else None
    tex.quantize(x3, q, output=out)
    assert (out._data.data_ptr(), out._transpose.data_ptr(), out._scale_inv.data_ptr()) == ptrs
    ref.assert_bytes_equal(cpu(out._data), ref_fn(x3, a0).codes, "output= no noop")


def test_output_from_create_empty_and_noop_on_fresh():
    tex = tex_module()
    q, s, amax = delayed_quantizer(2.0, "e5m2")
    out = tex.create_empty_quantized_tensor(q, [9, 16], torch.float16, "cpu")
    out._data.fill_(0x11)
    out._transpose.fill_(0x22)
    out._scale_inv.fill_(7.0)
    snap = _snapshot(out, amax)
    x = wide_random((9, 16), torch.float16)
    tex.quantize(x, q, output=out, noop=torch.ones(1))
    _assert_unchanged(out, snap, amax)
    tex.quantize(x, q, output=out)
    r = ref.quantize_delayed_ref(x, s, torch.zeros(1), "e5m2")
    ref.assert_bytes_equal(cpu(out._data), r.codes, "create_empty + quantize")
    ref.assert_bytes_equal(cpu(out._transpose), r.t_codes, "create_empty + quantize transpose")
    assert torch.equal(cpu(out._scale_inv).reshape(1), r.scale_inv)
