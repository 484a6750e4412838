"""GEMM (SPEC §6): layouts, epilogues, FP8 operands and outputs, grouped lists, empty shapes, errors, opcheck,
torch.compile and CUDA graphs. References are float64 products of the (dequantized) operands; the accuracy rule
is SPEC §9's: our error is at most twice PyTorch's own low-precision error (plus a small atol), and on the CPU,
which rounds once, within the output dtype's tolerance of the float64 product."""
import pytest
import torch

from tests import ref
from tests.torch.helpers import DEVICE_PARAMS, cpu, current_quantizer, delayed_quantizer, tex_module, uniform

F64 = torch.float64
LAYOUTS = ["TN", "NN", "NT"]
DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def shapes_for(layout, m, n, k):
    """(A shape, B shape) giving D [n, m] with contraction k in `layout` (SPEC §6.1)."""
    ta, tb = layout[0] == "T", layout[1] == "T"
    return ((m, k) if ta else (k, m)), ((k, n) if tb else (n, k))


def op(x, t):
    x = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    return x.t() if t else x


def ref_gemm(A, B, layout):
    """float64 op(B)·op(A) of plain or dequantized operands."""
    deq = lambda x: x.dequantize(torch.float32) if hasattr(x, "_scale_inv") else x  # noqa: E731
    a = cpu(deq(A)).to(F64)
    b = cpu(deq(B)).to(F64)
    return op(b, layout[1] == "T") @ op(a, layout[0] == "T")


def torch_lowp(A, B, layout, dtype):
    """PyTorch's own computation of the product in `dtype` on the operands' device (the error baseline)."""
    return (op(B, layout[1] == "T").to(dtype) @ op(A, layout[0] == "T").to(dtype)).to(F64).cpu()


def assert_gemm_close(ours, ref64, base, dtype, msg="", extra_atol=0.0):
    """SPEC §9 GEMM rule: error vs float64 <= 2 x PyTorch's low-precision error + atol; and a wrong answer fails."""
    o = cpu(ours).to(F64).reshape(ref64.shape)
    err = (o - ref64).abs().max().item() if o.numel() else 0.0
    base_err = (base.reshape(ref64.shape) - ref64).abs().max().item() if o.numel() else 0.0
    scale = ref64.abs().max().item() if o.numel() else 0.0
    atol = ref.TOL[dtype][1] + 1e-6 * scale + extra_atol
    assert err <= 2 * base_err + atol, f"{msg}: max err {err} > 2 x {base_err} + {atol}"
    if o.numel() and scale > 0:
        wrong = (o - ref64.flip(-1)).abs().max().item() if ref64.shape[-1] > 1 else (o + ref64).abs().max().item()
        assert wrong > 2 * base_err + atol, f"{msg}: the check would not catch a wrong answer"


def rnd(shape, dtype, device, seed):
    return uniform(shape, dtype, device, g=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def tex():
    return tex_module()


# ---- layouts and dtypes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(DT.values()), ids=list(DT))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts(tex, device, layout, dtype):
    m, n, k = 48, 40, 64
    sa, sb = shapes_for(layout, m, n, k)
    A, B = rnd(sa, dtype, device, 1), rnd(sb, dtype, device, 2)
    out, bgrad, pre, extra = tex.general_gemm(A, B, layout=layout)
    assert out.shape == (n, m) and out.dtype == dtype and out.device.type == device
    assert bgrad is None and pre is None and extra is None
    r = ref_gemm(A, B, layout)
    assert_gemm_close(out, r, torch_lowp(A, B, layout, dtype), dtype, f"{layout} {dtype}")
    if device == "cpu":  # one rounding of an FP64-accumulated product
        ref.assert_close_tol(out, r.to(dtype), dtype, f"{layout} {dtype} cpu rounding")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp32_output_of_bf16(tex, device, layout):
    sa, sb = shapes_for(layout, 32, 24, 80)
    A, B = rnd(sa, torch.bfloat16, device, 3), rnd(sb, torch.bfloat16, device, 4)
    out = tex.general_gemm(A, B, out_dtype=torch.float32, layout=layout)[0]
    assert out.dtype == torch.float32
    assert_gemm_close(out, ref_gemm(A, B, layout), torch_lowp(A, B, layout, torch.float32), torch.float32, layout)


def test_leading_dims(tex, device):
    """TN with a 3-D activation keeps B's leading dims; NT flattens them (the wgrad)."""
    W = rnd((32, 16), torch.float32, device, 5)
    X = rnd((2, 3, 16), torch.float32, device, 6)
    Y = tex.general_gemm(W, X, layout="TN")[0]
    assert Y.shape == (2, 3, 32)
    torch.testing.assert_close(cpu(Y), (cpu(X).double() @ cpu(W).double().t()).float(), rtol=1.3e-6, atol=1e-5)
    dY = rnd((2, 3, 32), torch.float32, device, 7)
    dW = tex.general_gemm(X, dY, layout="NT")[0]
    assert dW.shape == (32, 16)
    torch.testing.assert_close(cpu(dW), (cpu(dY).reshape(6, 32).double().t() @ cpu(X).reshape(6, 16).double()).float(),
                               rtol=1.3e-6, atol=1e-5)


def test_generic_gemm_positional(tex, device):
    """TE's positional order and return list."""
    A, B = rnd((16, 32), torch.bfloat16, device, 8), rnd((8, 32), torch.bfloat16, device, 9)
    res = tex.generic_gemm(A, True, B, False, None, None, tex.DType.kFloat32, None, tex.DType.kBFloat16, False, None,
                           False, None, 0, False, False)
    assert isinstance(res, list) and len(res) == 4
    assert res[0].dtype == torch.float32 and res[0].shape == (8, 16)
    torch.testing.assert_close(cpu(res[0]).double(), ref_gemm(A, B, "TN"), rtol=1e-5, atol=1e-5)


# ---- epilogues -------------------------------------------------------------------------------------------
EPI_DT = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", EPI_DT, ids=["fp32", "bf16"])
def test_bias(tex, device, dtype):
    A, B = rnd((48, 32), dtype, device, 10), rnd((40, 32), dtype, device, 11)
    bias = rnd((48,), dtype, device, 12)
    out = tex.general_gemm(A, B, bias=bias, alpha=0.5)[0]
    r = 0.5 * ref_gemm(A, B, "TN") + cpu(bias).to(F64)
    base = 0.5 * torch_lowp(A, B, "TN", dtype) + cpu(bias).to(F64)
    assert_gemm_close(out, r, base, dtype, "bias")


@pytest.mark.parametrize("dtype", EPI_DT, ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu_aux(tex, device, dtype, with_bias):
    A, B = rnd((32, 48), dtype, device, 13), rnd((24, 48), dtype, device, 14)
    bias = rnd((32,), dtype, device, 15) if with_bias else None
    out, bgrad, pre, _ = tex.general_gemm(A, B, gelu=True, bias=bias)
    assert bgrad is None and pre is not None and pre.shape == out.shape and pre.dtype == dtype
    r = ref_gemm(A, B, "TN") + (cpu(bias).to(F64) if with_bias else 0)
    base = torch_lowp(A, B, "TN", dtype) + (cpu(bias).to(F64) if with_bias else 0)
    assert_gemm_close(pre, r, base, dtype, "pre_gelu_out")
    g = ref._f("gelu", r)
    assert_gemm_close(out, g, ref._f("gelu", base), dtype, "gelu(D)")
    # D is gelu of the pre-activation, not the pre-activation itself.
    assert not ref.within_tol(out, r, *ref.TOL[dtype])


@pytest.mark.parametrize("dtype", EPI_DT, ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_bgrad", [False, True])
def test_dgelu(tex, device, dtype, with_bgrad):
    """dgrad NN: dX = (dY·W) ⊙ gelu'(gelu_in), bias_grad = Σ_rows dX."""
    W, dY = rnd((32, 48), dtype, device, 16), rnd((24, 32), dtype, device, 17)
    gelu_in = rnd((24, 48), dtype, device, 18)
    bias = torch.zeros(48, dtype=dtype, device=device) if with_bgrad else None
    out, bgrad, pre, _ = tex.general_gemm(W, dY, layout="NN", gelu=True, gelu_in=gelu_in, grad=True, bias=bias)
    assert pre is None and out.shape == (24, 48)
    dgelu = ref._df("gelu", cpu(gelu_in).to(F64))
    r = ref_gemm(W, dY, "NN") * dgelu
    # cuBLASLt evaluates gelu' in its DGELU epilogue with its own approximation: 5.2e-6 of the output's scale
    # in FP32 on an H200 (measured), far below 16-bit rounding; allowed 1e-5 of the scale on CUDA.
    extra = 1e-5 * r.abs().max().item() if device == "cuda" and dtype == torch.float32 else 0.0
    assert_gemm_close(out, r, torch_lowp(W, dY, "NN", dtype) * dgelu, dtype, "dgelu", extra_atol=extra)
    if with_bgrad:
        assert bgrad.shape == (48,) and bgrad.dtype == dtype
        rtol, atol = ref.TOL[dtype]
        # The epilogue's per-element allowance (above) grows like the SPEC dbias rule, with sqrt(rows).
        torch.testing.assert_close(cpu(bgrad).to(F64), r.sum(0), rtol=4 * rtol * 24 ** 0.5,
                                   atol=1e-4 + 4 * atol + extra * 24 ** 0.5)
    else:
        assert bgrad is None


@pytest.mark.parametrize("dtype", EPI_DT, ids=["fp32", "bf16"])
def test_bias_grad_wgrad(tex, device, dtype):
    """wgrad NT with a bias: bias_grad = Σ_rows dY, length dY.shape[-1]."""
    X, dY = rnd((64, 48), dtype, device, 19), rnd((64, 32), dtype, device, 20)
    out, bgrad, pre, _ = tex.general_gemm(X, dY, layout="NT", grad=True, bias=torch.empty(32, dtype=dtype,
                                                                                           device=device))
    assert out.shape == (32, 48) and bgrad.shape == (32,)
    assert_gemm_close(out, ref_gemm(X, dY, "NT"), torch_lowp(X, dY, "NT", dtype), dtype, "wgrad")
    rtol, atol = ref.TOL[dtype]
    torch.testing.assert_close(cpu(bgrad).to(F64), cpu(dY).to(F64).sum(0), rtol=4 * rtol * 8, atol=1e-4)


@pytest.mark.parametrize("dtype", EPI_DT, ids=["fp32", "bf16"])
def test_accumulate(tex, device, dtype):
    A, B = rnd((32, 16), dtype, device, 21), rnd((16, 16), dtype, device, 22)
    D = rnd((16, 32), dtype, device, 23)
    D0 = cpu(D).to(F64)
    out = tex.general_gemm(A, B, out=D, accumulate=True)[0]
    assert out.data_ptr() == D.data_ptr()
    assert_gemm_close(out, D0 + ref_gemm(A, B, "TN"), D0 + torch_lowp(A, B, "TN", dtype), dtype, "accumulate")
    D2 = D.clone()
    tex.general_gemm(A, B, out=D2, accumulate=True, beta=0.25, alpha=2.0)
    r = 0.25 * cpu(D).to(F64) + 2.0 * ref_gemm(A, B, "TN")
    assert_gemm_close(D2, r, 0.25 * cpu(D).to(F64) + 2 * torch_lowp(A, B, "TN", dtype), dtype, "beta")


def test_out_without_accumulate_overwrites(tex, device):
    A, B = rnd((16, 16), torch.float32, device, 24), rnd((16, 16), torch.float32, device, 25)
    D = torch.full((16, 16), float("nan"), device=device)
    tex.general_gemm(A, B, out=D)
    torch.testing.assert_close(cpu(D).double(), ref_gemm(A, B, "TN"), rtol=1e-5, atol=1e-5)


# ---- empty shapes ----------------------------------------------------------------------------------------
def test_m_zero(tex, device):
    A, B = rnd((32, 16), torch.bfloat16, device, 26), torch.empty(0, 16, dtype=torch.bfloat16, device=device)
    out = tex.general_gemm(A, B)[0]
    assert out.shape == (0, 32)
    out, _, pre, _ = tex.general_gemm(A, B, gelu=True, bias=torch.ones(32, dtype=torch.bfloat16, device=device))
    assert out.shape == (0, 32) and pre.shape == (0, 32)


@pytest.mark.parametrize("dtype", EPI_DT, ids=["fp32", "bf16"])
def test_k_zero(tex, device, dtype):
    A, B = torch.empty(32, 0, dtype=dtype, device=device), torch.empty(8, 0, dtype=dtype, device=device)
    D = rnd((8, 32), dtype, device, 27)
    before = D.clone()
    tex.general_gemm(A, B, out=D, accumulate=True)
    assert torch.equal(cpu(D), cpu(before))
    out = tex.general_gemm(A, B)[0]
    assert torch.equal(cpu(out), torch.zeros(8, 32, dtype=dtype))
    bias = rnd((32,), dtype, device, 28)
    out = tex.general_gemm(A, B, bias=bias)[0]  # the mathematical limit: D = bias
    assert torch.equal(cpu(out), cpu(bias).expand(8, 32))
    # wgrad over zero tokens: bias gradient 0.
    X, dY = torch.empty(0, 16, dtype=dtype, device=device), torch.empty(0, 32, dtype=dtype, device=device)
    dW, bgrad, _, _ = tex.general_gemm(X, dY, layout="NT", grad=True, bias=torch.empty(32, dtype=dtype, device=device))
    assert torch.equal(cpu(dW), torch.zeros(32, 16, dtype=dtype))
    assert torch.equal(cpu(bgrad), torch.zeros(32, dtype=dtype))


# ---- FP8 operands ----------------------------------------------------------------------------------------
FP8_PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]


def q8(x, fmt, kind="current", rowwise=True, columnwise=True, scale=2.0):
    if kind == "current":
        return current_quantizer(fmt, rowwise=rowwise, columnwise=columnwise)(x)
    q, _, _ = delayed_quantizer(scale, fmt, x.device, rowwise=rowwise, columnwise=columnwise)
    return q(x)


@pytest.mark.parametrize("kind", ["current", "delayed"])
@pytest.mark.parametrize("pair", FP8_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_operands(tex, device, layout, pair, kind):
    m, n, k = 48, 32, 64
    sa, sb = shapes_for(layout, m, n, k)
    x_a, x_b = rnd(sa, torch.bfloat16, device, 30), rnd(sb, torch.bfloat16, device, 31)
    A, B = q8(x_a, pair[0], kind), q8(x_b, pair[1], kind)
    for split in (False, True):
        out = tex.general_gemm(A, B, layout=layout, out_dtype=torch.float32, use_split_accumulator=split)[0]
        r = ref_gemm(A, B, layout)  # float64 product of the dequantized operands
        assert out.shape == (n, m) and out.dtype == torch.float32
        # Exact decode + FP32 accumulation: far inside the E4M3 tolerance of the dequantized product.
        rtol, atol = ref.FP8_TOL["e4m3"]
        torch.testing.assert_close(cpu(out).to(F64), r, rtol=rtol, atol=atol)
        if device == "cpu":
            ref.assert_close_tol(out, r.float(), torch.float32, "cpu fp8 rounding")
        # Against the unquantized product the error is the quantization error: a tolerance-sized check fails for
        # the wrong layout.
        assert not ref.within_tol(cpu(out).to(F64), r.flip(0), rtol, atol)


def test_fp8_bf16_out_and_bias(tex, device):
    W, X = q8(rnd((32, 64), torch.bfloat16, device, 32), "e4m3"), q8(rnd((16, 64), torch.bfloat16, device, 33), "e4m3")
    bias = rnd((32,), torch.bfloat16, device, 34)
    out, _, pre, _ = tex.general_gemm(W, X, out_dtype=torch.bfloat16, bias=bias, gelu=True)
    assert out.dtype == torch.bfloat16 and pre.dtype == torch.bfloat16
    r = ref_gemm(W, X, "TN") + cpu(bias).to(F64)
    torch.testing.assert_close(cpu(pre).to(F64), r, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(cpu(out).to(F64), ref._f("gelu", r), rtol=1.6e-2, atol=1e-2)


def test_fp8_wgrad_bias_grad(tex, device):
    """FP8 NT: bias_grad from the dequantized dY (a separate reduction where cuBLASLt has no FP8 BGRADB)."""
    X = q8(rnd((64, 32), torch.bfloat16, device, 35), "e4m3")
    dY = q8(rnd((64, 48), torch.bfloat16, device, 36), "e5m2")
    out, bgrad, _, _ = tex.general_gemm(X, dY, layout="NT", out_dtype=torch.float32, grad=True,
                                        bias=torch.empty(48, dtype=torch.float32, device=device))
    # The CPU kernel accumulates exactly; the GPU's FP8 tensor cores (fast accumulation) within the E4M3 tolerance.
    rtol, atol = (1e-5, 1e-4) if device == "cpu" else ref.FP8_TOL["e4m3"]
    torch.testing.assert_close(cpu(out).to(F64), ref_gemm(X, dY, "NT"), rtol=rtol, atol=atol)
    torch.testing.assert_close(cpu(bgrad).to(F64), cpu(dY.dequantize(torch.float32)).to(F64).sum(0), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("rowwise", [True, False])
def test_fp8_output_delayed(tex, device, rowwise):
    """Float8Quantizer output with FP8 operands: D = fp8(r·scale), scale_inv = 1/scale, amax max-merged."""
    W, X = q8(rnd((32, 64), torch.bfloat16, device, 37), "e4m3"), q8(rnd((16, 64), torch.bfloat16, device, 38), "e4m3")
    q, scale, amax = delayed_quantizer(3.5, "e4m3", device, amax_value=1e6 if not rowwise else 0.0, rowwise=rowwise)
    out = tex.general_gemm(W, X, out_dtype=torch.bfloat16, quantizer=q)[0]
    assert isinstance(out, tex.Float8Tensor) and out.shape == (16, 32) and out.dtype == torch.bfloat16
    assert (out._data is not None) == rowwise and out._transpose is not None
    r32 = tex.general_gemm(W, X, out_dtype=torch.float32)[0]
    expect = ref.fp8_encode(cpu(r32) * 3.5, "e4m3")
    data = cpu(out._data) if rowwise else cpu(out._transpose).t()
    if device == "cpu":  # the same FP32 result, encoded by the same rule
        ref.assert_bytes_equal(data, expect, "fp8 out")
    else:  # cuBLASLt's FP8 epilogue vs its own FP32 output: accumulation order may move a code by one
        torch.testing.assert_close(ref.fp8_decode(data, "e4m3").double(), ref.fp8_decode(expect, "e4m3").double(),
                                   rtol=0.125, atol=0.0675)
    assert torch.equal(cpu(out._transpose), data.t().contiguous())
    assert cpu(out._scale_inv).item() == ref.reciprocal_f32(torch.tensor(3.5)).item()
    expected_amax = 1e6 if not rowwise else cpu(r32).abs().max().item()
    torch.testing.assert_close(cpu(amax).item(), expected_amax, rtol=1e-5, atol=0)


def test_fp8_output_other_quantizer(tex, device):
    """A current-scaling output quantizer: GEMM to the output dtype, then quantize."""
    W, X = q8(rnd((32, 64), torch.bfloat16, device, 39), "e4m3"), q8(rnd((16, 64), torch.bfloat16, device, 40), "e4m3")
    cs = current_quantizer("e4m3")
    out = tex.general_gemm(W, X, out_dtype=torch.bfloat16, quantizer=cs)[0]
    hp = tex.general_gemm(W, X, out_dtype=torch.bfloat16)[0]
    expect = tex.quantize(hp, cs)
    assert torch.equal(cpu(out._data), cpu(expect._data)) and torch.equal(cpu(out._scale_inv), cpu(expect._scale_inv))
    # bf16 operands with a delayed quantizer: also GEMM then quantize.
    a, b = rnd((32, 16), torch.bfloat16, device, 41), rnd((8, 16), torch.bfloat16, device, 42)
    q, _, amax = delayed_quantizer(1.0, "e4m3", device)
    out = tex.general_gemm(a, b, quantizer=q)[0]
    hp = tex.general_gemm(a, b)[0]
    assert torch.equal(cpu(out._data), ref.fp8_encode(cpu(hp).float(), "e4m3"))


# ---- grouped ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_grouped_equals_loop(tex, device, layout):
    dt = torch.bfloat16
    specs = [(32, 16, 48), (32, 0, 48), (32, 24, 48)]  # (m, n, k) per group; the middle group is empty
    if layout == "NT":
        specs = [(32, 48, 16), (32, 48, 0), (32, 48, 24)]  # wgrad: empty group = zero tokens
    A, B = [], []
    for i, (m, n, k) in enumerate(specs):
        sa, sb = shapes_for(layout, m, n, k)
        A.append(rnd(sa, dt, device, 50 + i))
        B.append(rnd(sb, dt, device, 60 + i))
    D = [torch.full((n, m), 7.0, dtype=dt, device=device) for (m, n, k) in specs]
    bias = [rnd((m,), dt, device, 70 + i) for i, (m, n, k) in enumerate(specs)] if layout == "TN" else []
    tex.te_general_grouped_gemm(A, layout[0] == "T", B, layout[1] == "T", D, dt, [s[1] for s in specs], bias, dt,
                                False, [], False, [], 0, False, False, 0)
    for i in range(len(specs)):
        single = tex.general_gemm(A[i], B[i], layout=layout, bias=bias[i] if bias else None)[0]
        assert torch.equal(cpu(D[i]), cpu(single)), f"group {i}"
    if layout == "NT":
        assert torch.equal(cpu(D[1]), torch.zeros(48, 32, dtype=dt))


def test_grouped_single_output_and_python_form(tex, device):
    dt = torch.float32
    W = [rnd((32, 16), dt, device, 80 + i) for i in range(3)]
    splits = [5, 0, 7]
    X = [rnd((s, 16), dt, device, 90 + i) for i, s in enumerate(splits)]
    D = torch.empty(12, 32, dtype=dt, device=device)
    tex.te_general_grouped_gemm(W, True, X, False, [D], dt, splits, [], dt, True, [], False, [], 0, False, False, 0)
    loop = torch.cat([tex.general_gemm(W[i], X[i])[0] for i in range(3)])
    if device == "cpu":
        assert torch.equal(cpu(D), cpu(loop))
    else:  # a row slice of D[0] is less aligned than a fresh tensor: cuBLASLt may pick another kernel
        torch.testing.assert_close(cpu(D), cpu(loop), rtol=1e-5, atol=1e-5)
    out, bias, gelu_in = tex.general_grouped_gemm(W, X, None, None, dt, m_splits=splits, gelu=True)
    for i in range(3):
        o, _, pre, _ = tex.general_gemm(W[i], X[i], gelu=True)
        assert torch.equal(cpu(out[i]), cpu(o)) and torch.equal(cpu(gelu_in[i]), cpu(pre))


# ---- errors ----------------------------------------------------------------------------------------------
def test_errors(tex, device):
    bf = torch.bfloat16
    a, b = rnd((32, 24), bf, device, 100), rnd((32, 24), bf, device, 101)
    with pytest.raises(ValueError, match=r"inner dims do not agree.*A \[32, 24\] bf16, B \[24, 16\] bf16, layout NN"):
        tex.general_gemm(a, rnd((24, 16), bf, device, 1), layout="NN")
    with pytest.raises(ValueError, match=r"inner dims"):
        tex.general_gemm(a, rnd((8, 16), bf, device, 1))
    qa = q8(rnd((32, 24), bf, device, 102), "e4m3")
    qb = q8(rnd((32, 24), bf, device, 103), "e4m3")
    with pytest.raises(ValueError, match=r"K to be a multiple of 16, got K=24.*E4M3.*Pad K to 32 or keep this layer "
                                         r"in bf16"):
        tex.general_gemm(qa, qb)
    qn = q8(rnd((24, 32), bf, device, 104), "e4m3")
    with pytest.raises(ValueError, match=r"last dim N to be a multiple of 16, got N=24"):
        tex.general_gemm(qn, q8(rnd((16, 32), bf, device, 105), "e4m3"))
    e5a, e5b = q8(rnd((32, 32), bf, device, 106), "e5m2"), q8(rnd((16, 32), bf, device, 107), "e5m2")
    with pytest.raises(ValueError, match=r"E5M2 x E5M2"):
        tex.general_gemm(e5a, e5b)
    with pytest.raises(ValueError, match=r"FP4 output is not supported"):
        tex.general_gemm(a, b, out_dtype=tex.DType.kFloat4E2M1, layout="NT")
    with pytest.raises(TypeError, match=r"mixed operands"):
        tex.general_gemm(e5a, rnd((16, 32), bf, device, 1))
    with pytest.raises(ValueError, match=r"workspace must be a contiguous uint8 tensor.*workspace_size=4096"):
        tex.generic_gemm(a, False, b, True, None, None, None, None, None, False, None, False,
                         torch.empty(16, dtype=torch.uint8, device=device), 4096, False, False)
    with pytest.raises(ValueError, match=r"beta=0.5 reads D"):
        tex.general_gemm(a, b, layout="NT", beta=0.5)
    with pytest.raises(ValueError, match=r"accumulate=True needs D"):
        tex.general_gemm(a, b, layout="NT", accumulate=True)
    with pytest.raises(ValueError, match=r"layout must be one of"):
        tex.general_gemm(a, b, layout="XX")
    with pytest.raises(ValueError, match=r"needs gelu_in"):
        tex.general_gemm(a, b, layout="NT", gelu=True, grad=True)
    with pytest.raises(ValueError, match=r"wgrad case"):
        tex.general_gemm(a, b, layout="TN", grad=True, bias=torch.empty(32, dtype=bf, device=device))
    with pytest.raises(TypeError, match=r"must be float32, float16, bfloat16"):
        tex.general_gemm(a.to(torch.int32), b)
    with pytest.raises(NotImplementedError, match=r"comm\+GEMM overlap"):
        tex.generic_gemm(a, False, b, True, None, None, None, None, None, False, None, False, None, 0, False, False,
                         comm_overlap=object())
    # A missing copy: A used non-transposed (NN) needs the columnwise copy.
    rowonly = q8(rnd((32, 32), bf, device, 108), "e4m3", columnwise=False)
    with pytest.raises(ValueError, match=r"A \(Float8Tensor\[32, 32\] E4M3\) is used non-transposed \(layout NN\).*"
                                         r"columnwise copy.*columnwise=True"):
        tex.general_gemm(rowonly, q8(rnd((16, 32), bf, device, 109), "e4m3"), layout="NN")
    with pytest.raises(ValueError, match=r"bias must be a contiguous 1-D tensor of length 24"):
        tex.general_gemm(a, b, layout="NT", bias=torch.zeros(7, dtype=bf, device=device))
    with pytest.raises(TypeError, match=r"bias must be BFloat16 \(the output dtype\), got Float"):
        tex.general_gemm(a, b, layout="NT", bias=torch.zeros(24, dtype=torch.float32, device=device))


def test_op_level_errors(tex, device):
    """The checks of te::gemm itself, for callers that bypass the Python wrapper."""
    g = torch.ops.te.gemm.default
    bf = torch.bfloat16
    a, b = rnd((32, 16), bf, device, 300), rnd((8, 16), bf, device, 301)
    q = q8(rnd((32, 16), bf, device, 302), "e4m3")
    e = lambda *s, dt=bf: torch.empty(s, dtype=dt, device=device)  # noqa: E731
    one = lambda v=1.0: torch.tensor([v], device=device)  # noqa: E731
    with pytest.raises(ValueError, match=r"D must be a contiguous tensor of 256 elements with last dim 32"):
        g(a, None, 6, True, b, None, 6, False, e(8, 16), 6)
    with pytest.raises(TypeError, match=r"operand A is BFloat16 but its DType code says fp16"):
        g(a, None, 5, True, b, None, 6, False, e(8, 32), 6)
    with pytest.raises(ValueError, match=r"quantized operand A needs its scale_inv"):
        g(q._data, None, 7, True, q._data, q._scale_inv, 7, False, e(32, 32), 6)
    with pytest.raises(ValueError, match=r"FP8 per-tensor operands run as TN.*layout NN"):
        g(q._transpose, q._scale_inv, 7, False, q._data, q._scale_inv, 7, False, e(32, 32), 6)
    with pytest.raises(ValueError, match=r"FP8 output needs per-tensor FP8 operands"):
        g(a, None, 6, True, b, None, 6, False, e(8, 32, dt=torch.uint8), 7, D_scale=one(), D_amax=one(0.0),
          D_scale_inv=one())
    with pytest.raises(ValueError, match=r"accumulating into an FP8 output is not supported"):
        g(q._data, q._scale_inv, 7, True, q._data, q._scale_inv, 7, False, e(32, 32, dt=torch.uint8), 7,
          D_scale=one(), D_amax=one(0.0), D_scale_inv=one(), beta=1.0)
    with pytest.raises(ValueError, match=r"FP8 output needs the quantizer's scale and amax"):
        g(q._data, q._scale_inv, 7, True, q._data, q._scale_inv, 7, False, e(32, 32, dt=torch.uint8), 7)
    with pytest.raises(ValueError, match=r"FP4 output is not supported"):
        g(a, None, 6, True, b, None, 6, False, e(8, 16, dt=torch.uint8), 10)
    with pytest.raises(TypeError, match=r"pre_gelu_out must be fp32, fp16 or bf16 \(never FP8\)"):
        g(a, None, 6, True, b, None, 6, False, e(8, 32), 6, pre_gelu_out=e(8, 32, dt=torch.uint8), gelu=True)
    with pytest.raises(ValueError, match=r"gelu=True needs the pre_gelu_out buffer"):
        g(a, None, 6, True, b, None, 6, False, e(8, 32), 6, gelu=True)
    # FP8 block operands (A_scaling/B_scaling 4 = 1x128, 5 = 128x128): scale matrices of the SPEC §4.8 shapes
    codes = torch.zeros(32, 256, dtype=torch.uint8, device=device)
    s1, s2 = e(2, 32, dt=torch.float32), e(1, 4, dt=torch.float32)  # 1x128 and 128x128 scales of [32, 256]
    with pytest.raises(ValueError, match=r"A_scaling must be 1 \(per-tensor\), 2 \(MXFP8\), 4 .* or 5 .*got 3"):
        g(codes, s1, 7, True, codes, s1, 7, False, e(32, 32), 6, A_scaling=3, B_scaling=4)
    with pytest.raises(ValueError, match=r"B_scaling=4 is for quantized operands, but B is bf16"):
        g(a, None, 6, True, b, None, 6, False, e(8, 32), 6, B_scaling=4)
    with pytest.raises(ValueError, match=r"A \(FP8 block 1x128, stored \[32, 256\]\) needs a contiguous Float scale "
                                         r"tensor \[2, 32\].*got Float \[1, 4\]"):
        g(codes, s2, 7, True, codes, s1, 7, False, e(32, 32), 6, A_scaling=4, B_scaling=4)
    with pytest.raises(ValueError, match=r"A is FP8 per-tensor and B is FP8 block 1x128.*one recipe"):
        g(codes, one(), 7, True, codes, s1, 7, False, e(32, 32), 6, B_scaling=4)
    with pytest.raises(ValueError, match=r"128x128 x 128x128 has no kernel.*block_scaling_dim=1"):
        g(codes, s2, 7, True, codes, s2, 7, False, e(32, 32), 6, A_scaling=5, B_scaling=5)
    if device == "cpu":
        with pytest.raises(ValueError, match=r"alpha_beta must be a contiguous float32 \[2\] tensor .* CUDA device"):
            g(a, None, 6, True, b, None, 6, False, e(8, 32), 6, alpha_beta=torch.ones(2))
    # MXFP8 (2, E8M0 bytes, GEMM-swizzled) and NVFP4 (3, E2M1 codes two per byte, E4M3 scales)
    mx_row, mx_col = e(128, 8, dt=torch.uint8), e(4, 256, dt=torch.uint8)  # scales of [32, 256] rowwise / colwise
    with pytest.raises(ValueError, match=r"B \(MXFP8, stored \[32, 256\]\) needs a contiguous Byte scale tensor "
                                         r"\[128, 8\].*got Byte \[4, 256\]"):
        g(codes, mx_row, 7, True, codes, mx_col, 7, False, e(32, 32), 6, A_scaling=2, B_scaling=2)
    with pytest.raises(ValueError, match=r"A_scaling must be 3 \(NVFP4\) for E2M1 codes, got 2"):
        g(codes, mx_row, 10, True, codes, mx_row, 10, False, e(32, 512), 6, A_scaling=2, B_scaling=3)
    nv_s = e(128, 32, dt=torch.uint8)  # NVFP4 scales of [32, 512] E2M1 codes ([32, 256] bytes)
    with pytest.raises(ValueError, match=r"NVFP4 GEMMs write bf16 or fp32, got fp16"):
        g(codes, nv_s, 10, True, codes, nv_s, 10, False, e(32, 32, dt=torch.float16), 5, A_scaling=3, B_scaling=3)
    c2, nv_s2 = torch.zeros(32, 16, dtype=torch.uint8, device=device), e(128, 4, dt=torch.uint8)  # E2M1 [32, 32]
    with pytest.raises(ValueError, match=r"NVFP4 operands run as TN"):
        g(c2, nv_s2, 10, False, c2, nv_s2, 10, False, e(32, 32), 6, A_scaling=3, B_scaling=3)
    with pytest.raises(TypeError, match=r"A and B must both be FP8 or both the same plain dtype.*E4M3.*E2M1"):
        g(codes, mx_row, 7, True, codes, nv_s, 10, False, e(32, 32), 6, A_scaling=2, B_scaling=3)


def test_error_devices(tex):
    """Operands on different devices: 'meta' stands in for a second device on CPU-only machines."""
    a = torch.zeros(16, 16)
    with pytest.raises(ValueError, match=r"operands must be on one device.*A .* on cpu, B .* on meta"):
        tex.general_gemm(a, torch.zeros(16, 16, device="meta"))


@pytest.mark.cuda
def test_error_devices_cuda(tex):
    a = torch.zeros(16, 16)
    with pytest.raises(ValueError, match=r"operands must be on one device"):
        tex.general_gemm(a, a.cuda())
    with pytest.raises(ValueError, match=r"operands must be on one device"):  # the op's own check
        torch.ops.te.gemm.default(a.cuda(), None, 4, True, a, None, 4, False, torch.empty(16, 16, device="cuda"), 4)


class _FakeMX(tex_module().QuantizedTensor):
    def __init__(self):
        super().__init__((32, 32), torch.bfloat16)

    @property
    def device(self):
        return torch.device("cpu")


def test_not_yet_supported_format(tex):
    b = torch.zeros(16, 32, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=r"not yet supported: _FakeMX operand A"):
        tex.general_gemm(_FakeMX(), b)


def _fake_block_tensor(cls_name, row, col, is_2d=False):
    """A stand-in for a block-format tensor class (MXFP8Tensor, ...): its two "copies" hold plain values that
    differ, so the test sees which copy the GEMM used. Real classes dequantize codes; the GEMM only calls
    dequantize() on a view (_map) holding the copy it picked (SPEC §6.7)."""
    tex = tex_module()

    def dequantize(self, dtype=None):
        src = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        return src.to(dtype or self.dtype)

    def _map(self, fn):  # the same tensor with fn applied to each buffer (the GEMM takes views this way)
        m = lambda t: None if t is None else fn(t)  # noqa: E731
        return _fake_block_tensor(cls_name, m(self._rowwise_data), m(self._columnwise_data), self._is_2D_scaled)

    cls = type(cls_name, (tex.QuantizedTensor,), {
        "dequantize": dequantize,
        "_map": _map,
        "device": property(lambda self: (self._rowwise_data if self._rowwise_data is not None
                                         else self._columnwise_data).device)})
    t = cls(row.shape if row is not None else col.shape, torch.bfloat16)
    t._rowwise_data, t._columnwise_data, t._is_2D_scaled = row, col, is_2d
    return t


@pytest.mark.parametrize("fmt", ["MXFP8Tensor", "NVFP4Tensor", "Float8BlockwiseQTensor"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_block_format_emulation_picks_copy(tex, device, layout, fmt):
    """SPEC §6.7: A uses its rowwise copy iff transA, B iff not transB; then a plain GEMM."""
    sa, sb = shapes_for(layout, 32, 16, 64)
    ar, ac = rnd(sa, torch.float32, device, 200), rnd(sa, torch.float32, device, 201)
    br, bc = rnd(sb, torch.float32, device, 202), rnd(sb, torch.float32, device, 203)
    A, B = _fake_block_tensor(fmt, ar, ac), _fake_block_tensor(fmt, br, bc)
    out = tex.general_gemm(A, B, layout=layout, out_dtype=torch.float32)[0]
    a_used = ar if layout[0] == "T" else ac
    b_used = br if layout[1] == "N" else bc
    if device == "cuda":  # bf16 on the GPU
        a_used, b_used = a_used.to(torch.bfloat16), b_used.to(torch.bfloat16)
    expect = tex.general_gemm(a_used, b_used, layout=layout, out_dtype=torch.float32)[0]
    assert torch.equal(cpu(out), cpu(expect))
    wrong = tex.general_gemm(ac if layout[0] == "T" else ar, b_used.float(), layout=layout, out_dtype=torch.float32)[0]
    assert not torch.allclose(cpu(out), cpu(wrong), rtol=1e-2, atol=1e-2)


def _emulated_product(A, B, layout, device, other_copies=False):
    """(float64 op(B)·op(A) of the dequantized copies SPEC §6.4 picks, or of the other copies; the same product
    rounded as the emulation's plain GEMM would: bf16 on the GPU, fp32 on the CPU)."""
    def used(t, rowwise):  # dequantized values of one copy, as the GEMM sees them
        only = t.clone()
        only.update_usage(rowwise_usage=rowwise, columnwise_usage=not rowwise)
        return cpu(only.dequantize(torch.float32)).to(F64)

    a, b = used(A, (layout[0] == "T") != other_copies), used(B, (layout[1] == "N") != other_copies)
    r = op(b, layout[1] == "T") @ op(a, layout[0] == "T")
    return r, (r.to(torch.bfloat16).to(F64) if device == "cuda" else r.to(torch.float32).to(F64))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mxfp8_operands(tex, device, layout):
    """Real MXFP8 tensors (both copies) through the emulation: op(B)·op(A) of the copies SPEC §6.4 picks, within the
    GEMM rule of the float64 product of those dequantized copies (bf16 on the GPU, fp32 on the CPU)."""
    sa, sb = shapes_for(layout, 64, 32, 96)
    q = tex.MXFP8Quantizer(tex.DType.kFloat8E4M3)
    A, B = tex.quantize(rnd(sa, torch.bfloat16, device, 210), q), tex.quantize(rnd(sb, torch.bfloat16, device, 211), q)
    out = tex.general_gemm(A, B, layout=layout, out_dtype=torch.float32)[0]
    assert out.shape == (32, 64)
    r, base = _emulated_product(A, B, layout, device)
    assert_gemm_close(out, r, base, torch.float32, "mxfp8")


@pytest.mark.parametrize("dims", [(1, 1), (2, 1), (1, 2)], ids=["1Dx1D", "2Dx1D", "1Dx2D"])
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_fp8_block_operands(tex, device, layout, dims):
    """Real FP8 block tensors (both copies; ragged 128-blocks: m = 160, k = 272) through the emulation: op(B)·op(A)
    of the copies SPEC §6.4 picks (1x128 copies differ from each other, so the right one matters), within the GEMM
    rule of the float64 product of those dequantized copies (bf16 on the GPU, fp32 on the CPU)."""
    sa, sb = shapes_for(layout, 160, 48, 272)
    qa = tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, block_scaling_dim=dims[0], force_pow_2_scales=False)
    qb = tex.Float8BlockQuantizer(tex.DType.kFloat8E5M2, block_scaling_dim=dims[1])

    def ranged(shape, seed):  # rows of different magnitudes: rowwise and columnwise blocks get different scales
        rows = torch.exp2(torch.linspace(-3.0, 3.0, shape[0], device=device))[:, None]
        return (rnd(shape, torch.float32, device, seed) * rows).to(torch.bfloat16)

    A, B = tex.quantize(ranged(sa, 220), qa), tex.quantize(ranged(sb, 221), qb)
    out = tex.general_gemm(A, B, layout=layout, out_dtype=torch.float32)[0]
    assert out.shape == (48, 160)
    r, base = _emulated_product(A, B, layout, device)
    assert_gemm_close(out, r, base, torch.float32, f"fp8 block {dims}")
    if dims == (1, 1):  # the other copies give another product: the copy choice is really tested
        r2, _ = _emulated_product(A, B, layout, device, other_copies=True)
        assert (r2 - r).abs().max().item() > 1e-3 * r.abs().max().item()


def _native_block_available(tex):
    from transformer_engine_torch import _device

    return torch.cuda.is_available() and "Float8BlockwiseQTensor" in _device.native_gemm_formats(
        torch.cuda.current_device())


def _exact_block_product(A, B, layout):
    """(float64 op(B)·op(A) of the dequantized copies SPEC §6.4 picks, float64 op(|B|)·op(|A|)): the native block
    GEMM multiplies the codes exactly and accumulates in FP32, so its error is a few FP32 ulps of the second."""
    def used(t, rowwise):
        only = t.clone()
        only.update_usage(rowwise_usage=rowwise, columnwise_usage=not rowwise)
        return cpu(only.dequantize(torch.float32)).to(F64)

    a, b = used(A, layout[0] == "T"), used(B, layout[1] == "N")
    ta, tb = layout[0] == "T", layout[1] == "T"
    return op(b, tb) @ op(a, ta), op(b, tb).abs() @ op(a, ta).abs()


@pytest.mark.cuda
@pytest.mark.parametrize("dims", [(1, 1), (2, 1), (1, 2)], ids=["1Dx1D", "2Dx1D", "1Dx2D"])
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("mnk", [(160, 48, 272), (384, 200, 1024)], ids=["ragged", "large"])
def test_cuda_fp8_block_native(tex, monkeypatch, layout, dims, mnk):
    """SPEC §6.6: on sm_90 FP8 block operands run natively through cuBLASLt's block-scale modes (1x128 and
    128x128 float32 scales, split accumulation): the op receives the codes with their scaling modes, and the result
    is within the tensor cores' FP8 accumulation error (partial sums of a 128-long K block carry about 14 bits,
    promoted to FP32 per block) of the exact float64 product of the picked copies, with non-power-of-two scales."""
    if not _native_block_available(tex):
        pytest.skip("native FP8 block GEMM needs sm_90 and cuBLASLt >= 12.9")
    m, n, k = mnk
    sa, sb = shapes_for(layout, m, n, k)
    qa = tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, block_scaling_dim=dims[0], force_pow_2_scales=False)
    qb = tex.Float8BlockQuantizer(tex.DType.kFloat8E5M2, block_scaling_dim=dims[1], force_pow_2_scales=False)

    def ranged(shape, seed):  # rows of different magnitudes: rowwise and columnwise blocks get different scales
        rows = torch.exp2(torch.linspace(-3.0, 3.0, shape[0], device="cuda"))[:, None]
        return (rnd(shape, torch.float32, "cuda", seed) * rows).to(torch.bfloat16)

    A, B = tex.quantize(ranged(sa, 230), qa), tex.quantize(ranged(sb, 231), qb)
    r, mag = _exact_block_product(A, B, layout)
    from transformer_engine_torch import gemm as G

    seen = []
    real = G.call
    monkeypatch.setattr(G, "call", lambda op, args, *k: (seen.append(args[-5:-3]), real(op, args, *k))[1])
    out = cpu(tex.general_gemm(A, B, layout=layout, out_dtype=torch.float32)[0]).to(F64)
    assert seen == [(3 + dims[0], 3 + dims[1])], "the op did not get the block codes with their scaling modes"
    assert out.shape == (n, m)
    bound = 2.0 ** -11 * mag + 1e-30
    assert ((out - r).abs() <= bound).all(), f"max err/bound {((out - r).abs() / bound).max().item():.3g}"
    assert ((out + r).abs() > bound).any(), "a wrong answer would pass"


def _unswizzle(swizzled, R, C):
    """Compact [R, C] matrix of SPEC §4.8's swizzled bytes (the inverse of reference.swizzle_ref)."""
    r = torch.arange(R).reshape(R, 1).expand(R, C)
    c = torch.arange(C).reshape(1, C).expand(R, C)
    off = ((r // 128) * (C // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return swizzled.reshape(-1)[off.reshape(-1)].reshape(R, C)


def _decode_native(data, scale, code, scaling, k_cols):
    """float64 values of an operand as cuBLASLt's block-scaled GEMM reads it: codes times the block scale taken
    from the GEMM-swizzled scale bytes (MXFP8: E8M0 per 32 along K; NVFP4: E4M3 per 16 along the rows)."""
    if scaling == 3:  # NVFP4: [rows, K/2] packed E2M1, scales [roundup(rows,128), roundup(K/16,4)] E4M3
        v = ref.e2m1_decode(ref.nv_unpack(data)).to(F64)
        rows, k = v.shape
        f = ref.fp8_decode(_unswizzle(scale, *scale.shape), "e4m3").to(F64)[:rows, :k // 16]
        return v * f.repeat_interleave(16, 1)
    fmt = "e4m3" if code == int(tex_module().DType.kFloat8E4M3) else "e5m2"
    v = ref.fp8_decode(data, fmt).to(F64)
    rows, cols = v.shape
    if k_cols:
        f = ref.e8m0_value(_unswizzle(scale, *scale.shape)).to(F64)[:rows, :cols // 32].repeat_interleave(32, 1)
    else:  # columnwise scales are swizzled as their transpose
        r4, c128 = scale.shape
        compact = _unswizzle(scale, c128, r4).t()
        f = ref.e8m0_value(compact).to(F64)[:ref.ceil_div(rows, 32), :cols].repeat_interleave(32, 0)[:rows]
    return v * f


@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_native_mx_nvfp4_operands(tex, layout, fmt, swizzled):
    """SPEC §6.6 (sm_100+, no such GPU here): what the native MXFP8 / NVFP4 path hands to cuBLASLt - the picked
    copies' codes, GEMM-swizzled scales, the kernel flags (MXFP8 keeps the layout, NVFP4 runs as TN) and NVFP4's
    global amaxes (the core's alpha' = alpha·amax_A·amax_B/(6·6·448·448)) - decodes to alpha times the float64
    product of the copies SPEC §6.4 picks."""
    from transformer_engine_torch import gemm as G

    ta, tb = layout[0] == "T", layout[1] == "T"
    sa, sb = shapes_for(layout, 160, 64, 256)  # 160 rows: padded scale tiles
    q = (tex.MXFP8Quantizer(tex.DType.kFloat8E4M3) if fmt == "mxfp8" else tex.NVFP4Quantizer())
    q.optimize_for_gemm = swizzled
    A, B = tex.quantize(rnd(sa, torch.bfloat16, "cpu", 250), q), tex.quantize(rnd(sb, torch.bfloat16, "cpu", 251), q)
    copies = G._block_copies(A, ta, B, tb, layout)
    (a, sca, ca, ka, ma), (b, scb, cb, kb, mb), amaxes = G._native_operands(copies, ta, tb)
    if fmt == "nvfp4":
        assert (ka, kb, ma, mb, ca, cb) == (True, False, 3, 3, 10, 10)
        alpha = 1.5 * amaxes[0].double().item() * amaxes[1].double().item() / (6.0 * 6.0 * 448.0 * 448.0)
    else:
        assert (ka, kb, ma, mb) == (ta, tb, 2, 2) and amaxes == (None, None)
        alpha = 1.5
    dec_a = _decode_native(a, sca, ca, ma, ka if fmt == "mxfp8" else True)
    dec_b = _decode_native(b, scb, cb, mb, (not kb) if fmt == "mxfp8" else True)
    got = alpha * (op(dec_b, kb) @ op(dec_a, ka))
    want, mag = _exact_block_product(A, B, layout)
    assert got.shape == (64, 160)
    assert ((got - 1.5 * want).abs() <= 1e-5 * 1.5 * mag + 1e-30).all()
    assert not torch.allclose(got, -1.5 * want, rtol=1e-2, atol=1e-2), "a wrong answer would pass"


@pytest.mark.cuda
def test_cuda_fp8_block_native_epilogues(tex):
    """Native FP8 block GEMM with each epilogue (SPEC §6.2: bias and DGELU fused in cuBLASLt; GELU-aux and the
    wgrad bias gradient run apart) and 3-D operands (the columnwise copy stored (K,) + shape[:-1])."""
    if not _native_block_available(tex):
        pytest.skip("native FP8 block GEMM needs sm_90 and cuBLASLt >= 12.9")
    q2 = tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, block_scaling_dim=2)
    q1 = tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, block_scaling_dim=1)
    qg = tex.Float8BlockQuantizer(tex.DType.kFloat8E5M2, block_scaling_dim=1)
    out_f, hid = 256, 384
    w = rnd((out_f, hid), torch.bfloat16, "cuda", 240)
    x = rnd((2, 96, hid), torch.bfloat16, "cuda", 241)
    dy = rnd((2, 96, out_f), torch.bfloat16, "cuda", 242)
    bias = rnd((out_f,), torch.bfloat16, "cuda", 243)
    W, X, DY = tex.quantize(w, q2), tex.quantize(x, q1), tex.quantize(dy, qg)

    def copy64(t, rowwise):
        only = t.clone()
        only.update_usage(rowwise_usage=rowwise, columnwise_usage=not rowwise)
        return cpu(only.dequantize(torch.float32)).to(F64).reshape(-1, t.shape[-1])

    w64, x64, dy64, b64 = copy64(W, True), copy64(X, True), copy64(DY, True), cpu(bias).to(F64)

    def close(got, want, what):
        got = cpu(got).to(F64).reshape(want.shape)
        err = (got - want).abs().max().item()
        assert err <= 1e-2 * want.abs().max().item() + 1e-2, f"{what}: max err {err}"

    # fprop TN + bias (cuBLASLt BIAS), and + GELU (GELU-aux runs apart)
    y = tex.general_gemm(W, X, layout="TN", bias=bias)[0]
    assert y.shape == (2, 96, out_f)
    close(y, x64 @ w64.t() + b64, "TN bias")
    y, _, pre, _ = tex.general_gemm(W, X, layout="TN", bias=bias, gelu=True)
    close(pre, x64 @ w64.t() + b64, "TN gelu pre")
    close(y, torch.nn.functional.gelu(x64 @ w64.t() + b64, approximate="tanh"), "TN gelu")
    # dgrad NN (W columnwise) with DGELU against a saved pre-activation
    gelu_in = rnd((2, 96, hid), torch.bfloat16, "cuda", 244)
    dx = tex.general_gemm(W, DY, layout="NN", gelu=True, gelu_in=gelu_in, grad=True)[0]
    g64 = cpu(gelu_in).to(F64).reshape(-1, hid)
    t = torch.tanh(0.7978845608028654 * (g64 + 0.044715 * g64 ** 3))
    dgelu = 0.5 * (1 + t) + 0.5 * g64 * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * g64 ** 2)
    close(dx, (dy64 @ copy64(W, False)) * dgelu, "NN dgelu")
    # wgrad NT (X and dY columnwise, 3-D) with the bias gradient
    dw, db, _, _ = tex.general_gemm(X, DY, layout="NT", grad=True, bias=bias)
    xc, dyc = copy64(X, False), copy64(DY, False)
    close(dw, dyc.t() @ xc, "NT wgrad")
    close(db, dyc.sum(0), "NT bias grad")


@pytest.mark.parametrize("layout", ["TN", "NN", "NT", "TT"])
def test_nvfp4_operands(tex, device, layout):
    """Real NVFP4 tensors (both copies; the columnwise one stored transposed [K, M/2]) through the emulation, against
    the float64 product of the dequantized copies SPEC §6.4 picks; also with 2-D tiles (weights)."""
    sa, sb = shapes_for(layout, 64, 32, 96)
    for kw in (dict(), dict(with_2d_quantization=True)):
        q = tex.NVFP4Quantizer(**kw)
        A = tex.quantize(rnd(sa, torch.bfloat16, device, 212), q)
        B = tex.quantize(rnd(sb, torch.bfloat16, device, 213), q)
        out = tex.general_gemm(A, B, layout=layout, out_dtype=torch.float32)[0]
        assert out.shape == (32, 64)
        r, base = _emulated_product(A, B, layout, device)
        assert_gemm_close(out, r, base, torch.float32, f"nvfp4 {kw}")
        assert not torch.allclose(out.cpu().to(F64), -r, rtol=1e-2, atol=1e-2), "a wrong answer would pass"


def test_block_format_emulation_errors(tex):
    x = lambda *s: torch.zeros(*s)  # noqa: E731
    mx = lambda r, c=None: _fake_block_tensor("MXFP8Tensor", r, c)  # noqa: E731
    with pytest.raises(ValueError, match=r"MXFP8 GEMM needs the contraction dim K to be a multiple of 32, got K=48"):
        tex.general_gemm(mx(x(32, 48)), mx(x(16, 48)))
    with pytest.raises(ValueError, match=r"NVFP4 GEMM needs the output's last dim N to be a multiple of 16, got N=24"):
        tex.general_gemm(_fake_block_tensor("NVFP4Tensor", x(24, 32), None),
                         _fake_block_tensor("NVFP4Tensor", x(16, 32), None))
    with pytest.raises(ValueError, match=r"A \(MXFP8Tensor\[32, 32\]\) is used non-transposed \(layout NN\) in a MXFP8 "
                                         r"GEMM on cpu, which needs A's columnwise copy"):
        tex.general_gemm(mx(x(32, 32)), mx(x(16, 32)), layout="NN")
    with pytest.raises(ValueError, match=r"FP8 block 2-D x 2-D has no kernel.*block_scaling_dim=1"):
        tex.general_gemm(_fake_block_tensor("Float8BlockwiseQTensor", x(32, 32), None, True),
                         _fake_block_tensor("Float8BlockwiseQTensor", x(16, 32), None, True))
    with pytest.raises(TypeError, match=r"must use one scaling format"):
        tex.general_gemm(mx(x(32, 32)), _fake_block_tensor("NVFP4Tensor", x(16, 32), None))


def test_versions(tex):
    v = tex.get_cublasLt_version()
    assert isinstance(v, int) and v >= 0
    if torch.cuda.is_available():
        assert v >= 120000, v
    assert tex.get_num_cublas_streams() >= 1


# ---- opcheck, torch.compile ------------------------------------------------------------------------------
def _op_cases(device):
    f32, bf = torch.float32, torch.bfloat16
    A, B = rnd((32, 16), bf, device, 110), rnd((8, 16), bf, device, 111)
    qa, qb = q8(rnd((32, 16), bf, device, 112), "e4m3"), q8(rnd((16, 16), bf, device, 113), "e5m2")
    e = lambda *s, dt=bf: torch.empty(s, dtype=dt, device=device)  # noqa: E731
    return [
        ((A, None, 6, True, B, None, 6, False, e(8, 32), 6), {}),
        ((A, None, 6, True, B, None, 6, False, e(8, 32, dt=f32), 4), dict(bias=rnd((32,), f32, device, 1))),
        ((A, None, 6, True, B, None, 6, False, e(8, 32), 6), dict(bias=rnd((32,), bf, device, 2),
                                                                   pre_gelu_out=e(8, 32), gelu=True)),
        ((A, None, 6, False, rnd((8, 32), bf, device, 3), None, 6, False, e(8, 16), 6),
         dict(bias_grad=e(16), gelu_in=rnd((8, 16), bf, device, 4), gelu=True, grad=True)),
        ((qa._data, qa._scale_inv, 7, True, qb._data, qb._scale_inv, 8, False, e(16, 32), 6), dict(alpha=0.5)),
        ((qa._data, qa._scale_inv, 7, True, qb._data, qb._scale_inv, 8, False, e(16, 32, dt=torch.uint8), 7),
         dict(D_scale=torch.tensor([2.0], device=device), D_amax=torch.zeros(1, device=device),
              D_scale_inv=torch.empty(1, device=device))),
    ]


@pytest.mark.parametrize("i", range(6))
def test_opcheck(tex, device, i):
    args, kwargs = _op_cases(device)[i]
    torch.library.opcheck(torch.ops.te.gemm.default, args, kwargs)


@pytest.mark.slow
def test_compile_fullgraph(tex, device):
    W, X = rnd((32, 16), torch.bfloat16, device, 120), rnd((8, 16), torch.bfloat16, device, 121)
    bias = rnd((32,), torch.bfloat16, device, 122)

    def f(w, x, b):
        out, _, pre, _ = tex.general_gemm(w, x, bias=b, gelu=True)
        return out * 2, pre

    torch._dynamo.reset()
    eager = f(W, X, bias)
    comp = torch.compile(f, fullgraph=True)(W, X, bias)
    for e_, c_ in zip(eager, comp):
        assert torch.equal(cpu(e_), cpu(c_))


# ---- GPU only --------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("fast_accum", [True, False])
@pytest.mark.parametrize("shape", [(256, 128, 512), (64, 48, 32), (1024, 2048, 1024)])
def test_fp8_equals_scaled_mm(tex, shape, fast_accum):
    """Same bytes, same scales, same fast-accumulation flag, bf16 out: bit-identical to torch._scaled_mm."""
    m, n, k = shape
    W = q8(rnd((m, k), torch.bfloat16, "cuda", 130), "e4m3")
    X = q8(rnd((n, k), torch.bfloat16, "cuda", 131), "e4m3")
    ours = tex.general_gemm(W, X, out_dtype=torch.bfloat16, use_split_accumulator=not fast_accum)[0]
    theirs = torch._scaled_mm(X.rowwise_data, W.rowwise_data.t(), scale_a=X._scale_inv, scale_b=W._scale_inv,
                              out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
    assert torch.equal(ours, theirs)
    # SPEC §9 GEMM rule against float64, PyTorch's own error as the baseline (fast accumulation over K = 1024 moves
    # a few small outputs by more than the E4M3 tolerance, in both).
    assert_gemm_close(ours, ref_gemm(W, X, "TN"), cpu(theirs).to(F64), torch.bfloat16, "fp8 vs float64")


@pytest.mark.cuda
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpu_cuda_agree(tex, layout):
    sa, sb = shapes_for(layout, 64, 48, 96)
    A, B = rnd(sa, torch.float32, "cpu", 140), rnd(sb, torch.float32, "cpu", 141)
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # full FP32 on the GPU too (no TF32)
    try:
        c = tex.general_gemm(A, B, layout=layout)[0]
        g = tex.general_gemm(A.cuda(), B.cuda(), layout=layout)[0]
    finally:
        torch.set_float32_matmul_precision(prev)
    torch.testing.assert_close(cpu(g), c, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_cuda_graph_replay(tex):
    W = q8(rnd((256, 512), torch.bfloat16, "cuda", 150), "e4m3")
    X = q8(rnd((128, 512), torch.bfloat16, "cuda", 151), "e4m3")
    A, B = rnd((256, 128), torch.bfloat16, "cuda", 152), rnd((64, 128), torch.bfloat16, "cuda", 153)
    bias = rnd((256,), torch.bfloat16, "cuda", 154)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # eager results on the capture stream
        e1 = tex.general_gemm(W, X, out_dtype=torch.bfloat16)[0]
        e2, _, e3, _ = tex.general_gemm(A, B, bias=bias, gelu=True)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        o1 = tex.general_gemm(W, X, out_dtype=torch.bfloat16)[0]
        o2, _, o3, _ = tex.general_gemm(A, B, bias=bias, gelu=True)
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(o1, e1) and torch.equal(o2, e2) and torch.equal(o3, e3)


@pytest.mark.cuda
def test_capture_on_a_fresh_stream_without_warm_up(tex):
    """No GEMM ran on the capture stream before: the workspace is torch's cuBLASLt workspace of that stream, which
    torch's caching allocator provides inside the capture too; replays equal the eager result."""
    A, B = rnd((64, 128), torch.bfloat16, "cuda", 160), rnd((32, 128), torch.bfloat16, "cuda", 161)
    expect = tex.general_gemm(A, B)[0]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        out = tex.general_gemm(A, B)[0]
    for _ in range(2):
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expect)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_cuda_block_decode_gemm(tex, layout, fmt):
    """SPEC §6.7 on a GPU without the native MXFP8 / NVFP4 GEMM (sm_90): the core decodes each operand once to bf16
    in the GEMM's workspace and runs the bf16 GEMM. Against the float64 product of the decoded copies SPEC §6.4
    picks (NVFP4's global factors included); MXFP8 also byte-equal to the bf16 GEMM of the dequantized copies (both
    decodes are exact in bf16, one kernel); bias, GELU, and the wgrad bias gradient of a block B (decoded first)."""
    from transformer_engine_torch import _device

    if _device.gemm_is_native("MXFP8Tensor", torch.cuda.current_device()):
        pytest.skip("this GPU runs MXFP8 / NVFP4 GEMMs natively; the decode path is sm_90's")
    ta, tb = layout[0] == "T", layout[1] == "T"
    sa, sb = shapes_for(layout, 160, 96, 256)
    q = tex.MXFP8Quantizer(tex.DType.kFloat8E4M3) if fmt == "mxfp8" else tex.NVFP4Quantizer()
    A = tex.quantize(rnd(sa, torch.bfloat16, "cuda", 260), q)
    B = tex.quantize(rnd(sb, torch.bfloat16, "cuda", 261), q)
    want, mag = _exact_block_product(A, B, layout)
    for out_dtype in (torch.float32, torch.bfloat16):
        out = tex.general_gemm(A, B, layout=layout, out_dtype=out_dtype)[0]
        got = cpu(out).to(F64).reshape(want.shape)
        # FP32 accumulation of exact products (K = 256), NVFP4's alpha' rounded once; bf16: one more rounding.
        tol = 2.0 ** -16 * mag + (2.0 ** -8 * want.abs() if out_dtype == torch.bfloat16 else 0) + 1e-30
        assert ((got - want).abs() <= tol).all(), f"{fmt} {layout} {out_dtype}"
        assert not torch.allclose(got, -want, rtol=1e-2, atol=1e-2), "a wrong answer would pass"

    def copy_bf16(t, rowwise):
        only = t.clone()
        only.update_usage(rowwise_usage=rowwise, columnwise_usage=not rowwise)
        return only.dequantize(torch.bfloat16)

    if fmt == "mxfp8":
        a16, b16 = copy_bf16(A, ta), copy_bf16(B, not tb)
        same = tex.general_gemm(a16, b16, layout=layout, out_dtype=torch.bfloat16)[0]
        assert torch.equal(tex.general_gemm(A, B, layout=layout, out_dtype=torch.bfloat16)[0], same)
    # Epilogues: bias (+GELU) on the fprop layout, the bias gradient of a block B on wgrad.
    if layout == "TN":
        bias = rnd((sa[0],), torch.bfloat16, "cuda", 262)
        y, _, pre, _ = tex.general_gemm(A, B, layout="TN", bias=bias, gelu=True)
        pre64 = want + cpu(bias).to(F64)
        assert ((cpu(pre).to(F64) - pre64).abs() <= 4 * 2.0 ** -8 * (mag + pre64.abs()) + 1e-2).all()
        g64 = torch.nn.functional.gelu(cpu(pre).to(F64), approximate="tanh")
        assert ((cpu(y).to(F64) - g64).abs() <= 2.0 ** -7 * g64.abs() + 1e-2).all()
    if layout == "NT" and fmt == "nvfp4":
        with pytest.raises(NotImplementedError, match=r"the bias gradient of a NVFP4 B operand"):
            tex.general_gemm(A, B, layout="NT", grad=True, bias=rnd((sb[1],), torch.bfloat16, "cuda", 263))
    if layout == "NT" and fmt == "mxfp8":
        bias = rnd((sb[1],), torch.bfloat16, "cuda", 263)
        dw, db, _, _ = tex.general_gemm(A, B, layout="NT", grad=True, bias=bias)
        b64 = copy_bf16(B, False).to(F64).cpu()
        assert ((cpu(db).to(F64) - b64.sum(0)).abs() <= 2.0 ** -7 * b64.abs().sum(0) + 1e-2).all()
        assert ((cpu(dw).to(F64) - want).abs() <= 2.0 ** -16 * mag + 2.0 ** -8 * want.abs() + 1e-30).all()


def test_nvfp4_raw_op_needs_amaxes(tex):
    """The core's rule for the raw te::gemm op: NVFP4 operands need both copies' global amaxes (float32 [1]) and take
    alpha as a number (the core folds the global decode scales into it); a clear ValueError, nothing written."""
    from transformer_engine_torch import gemm as G

    q = tex.NVFP4Quantizer()
    A = tex.quantize(rnd((32, 64), torch.bfloat16, "cpu", 260), q)
    B = tex.quantize(rnd((16, 64), torch.bfloat16, "cpu", 261), q)
    (a, sa, ca, ta, ma), (b, sb, cb, tb, mb), (amax_a, amax_b) = G._native_operands(
        G._block_copies(A, True, B, False, "TN"), True, False)
    d = torch.full((16, 32), 7.0)

    def call(alpha_beta=None, a_amax=None, b_amax=None):
        torch.ops.te.gemm(a, sa, ca, ta, b, sb, cb, tb, d, int(tex.DType.kFloat32), A_scaling=ma, B_scaling=mb,
                          alpha_beta=alpha_beta, A_amax=a_amax, B_amax=b_amax)

    with pytest.raises(ValueError, match=r"NVFP4 operands need both copies' global amaxes.*A \[32, 32\] E2M1"):
        call(a_amax=amax_a)
    with pytest.raises(ValueError, match=r"B's global amax must be a one-element float32 tensor, got BFloat16"):
        call(a_amax=amax_a, b_amax=amax_b.bfloat16())
    with pytest.raises(ValueError, match=r"fold the global decode scales into alpha themselves"):
        call(torch.tensor([1.0, 0.0]), amax_a, amax_b)
    assert bool((d == 7.0).all()), "a refused call wrote D"
    call(a_amax=amax_a, b_amax=amax_b)
    want = A.dequantize(torch.float32).double() @ B.dequantize(torch.float32).double().t()
    assert torch.allclose(d.t().double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
