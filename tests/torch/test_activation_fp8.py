"""Activations with per-tensor FP8 quantizers (SPEC §5.1 / §5.2 fusion-path rules).

Delayed (FULLY_FUSED): q = fp8(fl(act_f32 * scale)) from the UNROUNDED FP32 activation,
amax <- max(amax, amax(act_f32)), scale_inv = fl(1/scale).
Current (FUSED_ACTIVATION_AMAX_FP8): amax over the unrounded FP32 activation, scale (§4.4),
q = fp8(fl(rnd_in(act) * scale)).
Transcendental activations are compared with the RN-forgiving rule (the reference's FP32 value is
a rounded float64 value); activations that are exact in FP32 for 16-bit inputs (relu/srelu family)
are compared bit for bit at inputs chosen so that the two rounding rules give different codes."""
import pytest
import torch

from tests import ref
from tests.torch.helpers import (DTYPE_PARAMS, call_act, call_dact, check_float8_tensor, column_sum_rtol, cpu,
                                 current_quantizer, delayed_quantizer, tex_module, uniform)

CASES = [
    pytest.param(("delayed", "e4m3", 3.5), id="delayed-e4m3-s3.5"),
    pytest.param(("delayed", "e5m2", -1.5), id="delayed-e5m2-s-1.5"),
    pytest.param(("current", "e4m3", False), id="current-e4m3"),
    pytest.param(("current", "e5m2", True), id="current-e5m2-pow2"),
]
AMAX0 = 0.125


def make_q(case, device="cpu", rowwise=True, columnwise=True):
    kind, fmt, p = case
    if kind == "delayed":
        return delayed_quantizer(p, fmt, device, amax_value=AMAX0, rowwise=rowwise, columnwise=columnwise)
    return current_quantizer(fmt, pow2=p, rowwise=rowwise, columnwise=columnwise), None, None


def expected(case, v64, dtype, scale=None, amax_before=None):
    kind, fmt, p = case
    if kind == "delayed":
        return ref.act_fp8_delayed_ref(v64, scale.cpu(), amax_before.cpu(), fmt)
    return ref.act_fp8_current_ref(v64, dtype, fmt, pow2=p)


def check_fp8_activation(qt, case, v64, v64_wrong, dtype, scale, amax_before, amax_after, msg,
                         rowwise=True, columnwise=True):
    kind, fmt, _ = case
    check_float8_tensor(qt, tuple(v64.shape), dtype, fmt, rowwise, columnwise)
    r = expected(case, v64, dtype, scale, amax_before)
    w = expected(case, v64_wrong, dtype, scale, amax_before)
    tcodes = cpu(qt._transpose) if columnwise else None
    if columnwise and v64.dim() == 0:
        tcodes = tcodes.reshape(1)      # 0-d: M = K = 1
    if rowwise:
        ref.assert_codes_rn_forgiving(qt._data, r.codes, fmt, msg + " rowwise", wrong=w.codes)
    if columnwise:
        ref.assert_codes_rn_forgiving(tcodes, r.t_codes, fmt, msg + " transpose", wrong=w.t_codes)
    if rowwise and columnwise:
        # the transposed copy is the bitwise transpose of the rowwise bytes
        ref.assert_bytes_equal(tcodes, ref.transpose_codes(cpu(qt._data)), msg + " _transpose")
    si = cpu(qt._scale_inv).reshape(1)
    if kind == "delayed":
        assert torch.equal(si, r.scale_inv), f"{msg}: scale_inv {si} != fl(1/scale) {r.scale_inv}"
        a = cpu(amax_after).reshape(1)
        assert ref.within_tol(a, r.amax, 5e-6, 0.0), f"{msg}: amax {a} vs {r.amax}"
    else:
        assert ref.within_tol(si, r.scale_inv, 5e-6, 0.0), f"{msg}: scale_inv {si} vs {r.scale_inv}"
    # dequantize = fl(decode(code) * scale_inv), rounded once to the nominal dtype
    codes = cpu(qt._data) if rowwise else cpu(qt._transpose)
    if not rowwise:
        K = v64.shape[-1]
        codes = codes.reshape(K, -1).t().contiguous().reshape(v64.shape)
    deq = qt.dequantize()
    assert deq.dtype == dtype and tuple(deq.shape) == tuple(v64.shape)
    assert ref.bits_equal(deq, ref.dequantize_ref(codes, si, fmt, dtype)), msg + " dequantize"
    return r


def _in_shape(name):
    return (128, 258) if name in ref.GATED else (128, 129)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_forward_fp8(name, dtype, case):
    x = uniform(_in_shape(name), dtype)
    q, scale, amax = make_q(case)
    amax_before = None if amax is None else amax.clone()
    qt = call_act(name, x, q)
    check_fp8_activation(qt, case, ref.act_ref(name, x), ref.act_ref(name, -x), dtype, scale,
                         amax_before, amax, f"{name} {case}")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_backward_fp8(name, dtype, case):
    x = uniform(_in_shape(name), dtype)
    g = uniform(ref.out_shape(name, x.shape), dtype, g=torch.Generator().manual_seed(21))
    q, scale, amax = make_q(case)
    amax_before = None if amax is None else amax.clone()
    qt = call_dact(name, g, x, q)
    check_fp8_activation(qt, case, ref.dact_ref(name, g, x), ref.dact_ref(name, g, -x), dtype, scale,
                         amax_before, amax, f"d{name} {case}")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES))
def test_dbias_fp8(name, dtype, case):
    tex = tex_module()
    base = ref.DBIAS_NAMES[name]
    x = uniform((96, 130), dtype)
    g = uniform((96, 130), dtype, g=torch.Generator().manual_seed(31))
    q, scale, amax = make_q(case)
    amax_before = None if amax is None else amax.clone()
    gb, qt = getattr(tex, name)(g, x, q)
    rb, ri = ref.dbias_ref(base, g, x)
    _, ri_wrong = ref.dbias_ref(base, g, -x)
    assert tuple(gb.shape) == (130,) and gb.dtype == dtype
    rtol = column_sum_rtol(96, dtype)
    assert ref.within_tol(gb, rb, rtol, 1e-4), f"{name} grad_bias"
    check_fp8_activation(qt, case, ri, ri_wrong, dtype, scale, amax_before, amax, f"{name} {case}")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_usage_rowwise_only_and_columnwise_only(name, case):
    dtype = torch.bfloat16
    x = uniform((48, 64), dtype)
    v64, w64 = ref.act_ref(name, x), ref.act_ref(name, -x)
    for rowwise, columnwise in [(True, False), (False, True)]:
        q, scale, amax = make_q(case, rowwise=rowwise, columnwise=columnwise)
        amax_before = None if amax is None else amax.clone()
        qt = call_act(name, x, q)
        check_fp8_activation(qt, case, v64, w64, dtype, scale, amax_before, amax,
                             f"{name} {case} rowwise={rowwise}", rowwise, columnwise)


@pytest.mark.parametrize("case", CASES)
def test_zero_dim_and_empty_with_quantizer(case):
    tex = tex_module()
    kind, fmt, p = case
    x = torch.tensor(1.5)
    q, scale, amax = make_q(case)
    amax_before = None if amax is None else amax.clone()
    qt = tex.gelu(x, q)
    assert tuple(qt.shape) == () and qt._data.shape == ()
    check_fp8_activation(qt, case, ref.act_ref("gelu", x), ref.act_ref("gelu", -x), torch.float32,
                         scale, amax_before, amax, "gelu 0-d")
    for name, shape in [("gelu", (0, 7)), ("swiglu", (0, 8)), ("gelu", (5, 0))]:
        q, scale, amax = make_q(case)
        qt = call_act(name, torch.empty(shape, dtype=torch.bfloat16), q)
        oshape = ref.out_shape(name, shape)
        assert tuple(qt.shape) == oshape and tuple(qt._data.shape) == oshape
        assert tuple(qt._transpose.shape) == (oshape[-1],) + oshape[:-1]
        if kind == "delayed":
            assert float(amax) == AMAX0, "empty input must leave amax unchanged"
            assert torch.equal(cpu(qt._scale_inv).reshape(1), ref.reciprocal_f32(scale).reshape(1))
        else:
            assert float(qt._scale_inv) == 1.0


# ------------------------------------------------------------------------------------------------
# Exact path rules (SPEC §5.2): where the delayed path casts the unrounded FP32 value and the
# current path the value rounded to the input dtype, chosen inputs make the two rules differ.
# relu/srelu-family ops are exact in FP32 for 16-bit inputs, so the comparison is bit-exact.
# ------------------------------------------------------------------------------------------------
PIVOT_AMAX = 256.0   # a pivot element whose activation is the amax: the current scale is known


def _candidates(op, dtype, n=40000):
    """Random candidate inputs and the FP32-exact activation values (as float64)."""
    g = torch.Generator().manual_seed(1001)
    if op in ("srelu", "dsrelu"):
        x = uniform((n,), dtype, lo=0.05, hi=3.0, g=g)
        if op == "srelu":
            return (x,), ref.act_ref("srelu", x)
        gr = uniform((n,), dtype, g=g)
        return (gr, x), ref.dact_ref("srelu", gr, x)
    if op in ("sreglu", "dsreglu"):
        x = uniform((n, 2), dtype, lo=-3.0, hi=3.0, g=g)
        if op == "sreglu":
            return (x,), ref.act_ref("sreglu", x)
        gr = uniform((n, 1), dtype, g=g)
        return (gr, x), ref.dact_ref("sreglu", gr, x)
    raise KeyError(op)


def _pivot(op, dtype):
    """Inputs whose activation magnitude is exactly PIVOT_AMAX (and dominates the candidates)."""
    t = lambda *v: torch.tensor(v, dtype=dtype)  # noqa: E731
    return {"srelu": (t(16.0),), "dsrelu": (t(16.0), t(8.0)),
            "sreglu": (t(16.0, 1.0).reshape(1, 2),),
            "dsreglu": (t(1.0).reshape(1, 1), t(8.0, 16.0).reshape(1, 2))}[op]


def _run(op, args, q):
    tex = tex_module()
    fn = getattr(tex, op)
    return fn(*args, q)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("op", ["srelu", "dsrelu", "sreglu", "dsreglu"])
@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_path_rounding_points_exact(kind, op, dtype, fmt):
    # v64 is the exact value (products of at most three 16-bit values fit in float64) and the
    # kernel's FP32 intermediates are exact too, so v32 is the kernel's one FP32 rounding.
    args, v64 = _candidates(op, dtype)
    v32 = v64.to(torch.float32)
    vr = ref.rnd_in(v32, dtype)
    if kind == "delayed":
        scale = torch.tensor([1.0])
    else:
        scale = ref.current_scale_ref(torch.tensor(PIVOT_AMAX), fmt, pow2=True).reshape(1)
    cu = ref.fp8_encode(v32 * scale, fmt)
    cr = ref.fp8_encode(vr * scale, fmt)
    diff = (cu != cr).reshape(cu.shape[0], -1).any(-1)
    assert int(diff.sum()) >= 4, "not enough discriminating candidates"
    sel = torch.nonzero(diff).reshape(-1)[:64]
    args = tuple(a[sel] for a in args)
    if kind == "current":
        args = tuple(torch.cat([a, p]) for a, p in zip(args, _pivot(op, dtype)))
    if op.startswith("d"):
        v64 = ref.dact_ref(op[1:], *args)
    else:
        v64 = ref.act_ref(op, *args)
    v32 = v64.to(torch.float32)
    if kind == "delayed":
        q, scale_t, amax = delayed_quantizer(1.0, fmt, amax_value=0.0)
        qt = _run(op, args, q)
        r = ref.quantize_delayed_ref(v32, scale_t, torch.zeros(1), fmt)                  # unrounded
        wrong = ref.quantize_delayed_ref(ref.rnd_in(v32, dtype), scale_t, torch.zeros(1), fmt)
        ref.assert_bytes_equal(cpu(qt._data), r.codes, f"{op} delayed", wrong=wrong.codes)
        ref.assert_bytes_equal(cpu(qt._transpose), r.t_codes, f"{op} delayed transpose")
        assert torch.equal(cpu(amax).reshape(1), r.amax), "amax over the unrounded FP32 activation"
        assert torch.equal(cpu(qt._scale_inv).reshape(1), r.scale_inv)
        # the unfused sequence quantize(act(x, None)) casts the rounded value (SPEC §5.2)
        q2, _, _ = delayed_quantizer(1.0, fmt)
        qt2 = tex_module().quantize(_run(op, args, None), q2)
        ref.assert_bytes_equal(cpu(qt2._data), wrong.codes, f"{op} unfused delayed")
    else:
        q = current_quantizer(fmt, pow2=True)
        qt = _run(op, args, q)
        r = ref.act_fp8_current_ref(v64, dtype, fmt, pow2=True)
        assert float(r.amax) == PIVOT_AMAX
        wrong = ref.quantize_current_ref(v32, fmt, pow2=True)                             # unrounded data
        ref.assert_bytes_equal(cpu(qt._data), r.codes, f"{op} current", wrong=wrong.codes)
        ref.assert_bytes_equal(cpu(qt._transpose), r.t_codes, f"{op} current transpose")
        assert torch.equal(cpu(qt._scale_inv).reshape(1), r.scale_inv)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_current_amax_from_unrounded_activation(dtype):
    """srelu(1 + eps) = 1 + 2 eps + eps^2 is exact in FP32 but not in the input dtype: the
    current-scaling amax (hence scale_inv) must come from the unrounded value."""
    tex = tex_module()
    eps = torch.finfo(dtype).eps
    x = torch.tensor([1.0 + eps], dtype=dtype)
    v32 = ref.act_ref("srelu", x).to(torch.float32)
    assert not torch.equal(ref.rnd_in(v32, dtype), v32)
    for fmt in ["e4m3", "e5m2"]:
        qt = tex.srelu(x, current_quantizer(fmt))
        r = ref.act_fp8_current_ref(v32.double(), dtype, fmt)
        wrong = ref.quantize_current_ref(ref.rnd_in(v32, dtype), fmt)
        assert not torch.equal(r.scale_inv, wrong.scale_inv)
        assert torch.equal(cpu(qt._scale_inv).reshape(1), r.scale_inv), \
            f"{fmt}: scale_inv {qt._scale_inv} (rounded-amax rule gives {wrong.scale_inv}, expected {r.scale_inv})"
        ref.assert_bytes_equal(cpu(qt._data), r.codes, f"srelu current {fmt}")
        # delayed: amax accumulates the unrounded value
        q, scale, amax = delayed_quantizer(1.0, fmt)
        tex.srelu(x, q)
        assert float(amax) == float(v32[0])


def test_quantized_output_with_requires_grad_input():
    """Quantized outputs are not differentiable, but a requires_grad input must not break the call."""
    tex = tex_module()
    x = uniform((8, 16), torch.float32).requires_grad_()
    q, scale, amax = delayed_quantizer(2.0, "e4m3")
    qt = tex.gelu(x, q)
    r = ref.act_fp8_delayed_ref(ref.act_ref("gelu", x.detach()), scale, torch.zeros(1), "e4m3")
    ref.assert_codes_rn_forgiving(cpu(qt._data), r.codes, "e4m3", "gelu requires_grad")
