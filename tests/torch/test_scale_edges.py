"""Scale computation and dequantize at the edges of every format (issue 19 item 2; SPEC §2, §4.2-§4.7).

Each format (FP8 delayed, FP8 current with and without power-of-two scales, MXFP8 E4M3/E5M2 both copies, NVFP4
1-D / 2-D / RHT (bf16), FP8 block 1-D / 2-D with power-of-two scales and 1-D with FP32 scales) x input dtype
(fp32, bf16, fp16) x input kind:
  zeros       every element 0
  max         every element +-max finite of the dtype
  onemax      values in [-3, 3] with one +max finite
  subnormal   values of the dtype's subnormal range, both signs
  pinf / nan / ninf   values in [-3, 3] with one +Inf / NaN / -Inf at SPOT
is quantized on the CPU with tex.quantize and checked against the pure-PyTorch references of tests/ref/:
codes, scales and amaxes bit for bit, and the dequantized tensors (FP32 and the nominal dtype, each copy) bit for
bit. Then what the issue asks of the values:
- every finite input dequantizes to a finite value, except the documented power-of-two case: a power-of-two scale
  (MXFP8 always, FP8 current / block with force_pow_2_scales) maps the dtype's max m onto the FP8 grid just
  below a power of two, RNE rounds it up to that power (E4M3 256, E5M2 32768), and the product is m rounded up
  to a power of two: 2^128 for fp32 / bf16 (Inf in FP32), 65536 for fp16 (finite in FP32, Inf in fp16). Those
  elements, and only those, are asserted to be exactly that;
- NVFP4: TE's dequantize formula fl(fl(sf * amax) / 2688) would give Inf / NaN (asserted) where ours is finite;
- away from a single Inf / NaN the values stay within the format's tolerance of the input (per-tensor formats:
  SPEC §4.4 / §4.2 give scale 1 / the given scale, asserted), and the special element decodes to what the SPEC
  gives (asserted exactly).
A twin marked cuda checks CUDA bytes == CPU bytes and CUDA dequantize == CPU dequantize for the same cases, and
the fused relu path (relu is exact, so fused == quantize(relu(x))) on both devices.
"""
import math

import pytest
import torch

from tests import ref
from tests.torch.helpers import DTYPE_IDS, cpu, tex_module
from tests.ref import bits_equal

F32 = torch.float32
SHAPE = (64, 256)
SPOT = (5, 37)
KINDS = ["zeros", "max", "onemax", "subnormal", "pinf", "nan", "ninf"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# name -> (family, options)
FORMATS = {
    "delayed": ("delayed", {}),
    "current": ("current", {"pow2": False}),
    "current_pow2": ("current", {"pow2": True}),
    "mxfp8_e4m3": ("mx", {"fmt": "e4m3"}),
    "mxfp8_e5m2": ("mx", {"fmt": "e5m2"}),
    "nvfp4_1d": ("nv", {"two_d": False, "rht": False}),
    "nvfp4_2d": ("nv", {"two_d": True, "rht": False}),
    "nvfp4_rht": ("nv", {"two_d": False, "rht": True}),
    "block_1d": ("fb", {"block_dim": 1, "pow2": True}),
    "block_2d": ("fb", {"block_dim": 2, "pow2": True}),
    "block_1d_fp32": ("fb", {"block_dim": 1, "pow2": False}),
}
DELAYED_SCALE = 3.5
POW2 = {"current_pow2", "mxfp8_e4m3", "mxfp8_e5m2", "block_1d", "block_2d"}


def cases():
    for name in FORMATS:
        for dtype in DTYPES:
            if name == "nvfp4_rht" and dtype != torch.bfloat16:
                continue  # the Hadamard transform takes bf16 only (SPEC §4.6)
            for kind in KINDS:
                yield pytest.param(name, dtype, kind, id=f"{name}-{DTYPE_IDS[dtype]}-{kind}")


CASES = list(cases())


def edge_input(kind, dtype):
    """The SHAPE input of `kind` in `dtype` (CPU), the same for every call."""
    g = torch.Generator()
    g.manual_seed(19)
    fi = torch.finfo(dtype)
    x = torch.rand(SHAPE, generator=g, dtype=torch.float64) * 6 - 3
    if kind == "zeros":
        x = torch.zeros(SHAPE, dtype=torch.float64)
    elif kind == "max":
        x = torch.full(SHAPE, fi.max, dtype=torch.float64)
        x[1::3] = -fi.max
        x[:, 5::7] *= -1
    elif kind == "onemax":
        x[SPOT] = fi.max
    elif kind == "subnormal":
        u = torch.rand(SHAPE, generator=g, dtype=torch.float64) * (0.98 * fi.smallest_normal)  # stays below
        x = torch.where(torch.rand(SHAPE, generator=g) < 0.5, -u, u)
    elif kind in ("pinf", "nan", "ninf"):
        x[SPOT] = {"pinf": math.inf, "nan": math.nan, "ninf": -math.inf}[kind]
    x = x.to(dtype)
    if kind == "subnormal":
        assert bool((x.abs() < fi.smallest_normal).all()) and int((x != 0).sum()) > SHAPE[0] * SHAPE[1] // 2
    return x


def make_quantizer(name, device="cpu"):
    """A fresh quantizer (delayed: with its own scale and zeroed amax tensors)."""
    tex = tex_module()
    fam, o = FORMATS[name]
    if fam == "delayed":
        return tex.Float8Quantizer(torch.tensor([DELAYED_SCALE], device=device), torch.zeros(1, device=device),
                                   tex.DType.kFloat8E4M3)
    if fam == "current":
        return tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, force_pow_2_scales=o["pow2"])
    if fam == "mx":
        return tex.MXFP8Quantizer(tex.DType.kFloat8E4M3 if o["fmt"] == "e4m3" else tex.DType.kFloat8E5M2)
    if fam == "nv":
        kw = {"with_rht": True, "with_post_rht_amax": True} if o["rht"] else {}
        return tex.NVFP4Quantizer(with_2d_quantization=o["two_d"], **kw)
    return tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, block_scaling_dim=o["block_dim"],
                                    force_pow_2_scales=o["pow2"])


def buffers(name, qt, q):
    """Every buffer a quantization wrote (CPU), by name."""
    fam = FORMATS[name][0]
    if fam in ("delayed", "current"):
        out = {"data": qt._data, "transpose": qt._transpose, "scale_inv": qt._scale_inv}
        if fam == "delayed":
            out["amax"] = q.amax
    else:
        out = {"row": qt._rowwise_data, "row_scale": qt._rowwise_scale_inv, "col": qt._columnwise_data,
               "col_scale": qt._columnwise_scale_inv}
        if fam == "nv":
            out.update(amax_row=qt._amax_rowwise, amax_col=qt._amax_columnwise)
            out["row"] = out["row"].reshape(SHAPE[0], SHAPE[1] // 2)
    return {k: cpu(v) for k, v in out.items()}


def reference(name, x):
    """(expected buffers, FP32 dequantized rowwise, FP32 dequantized columnwise (None for per-tensor), the
    reference's own result) of the reference quantizer of `name` on x."""
    fam, o = FORMATS[name]
    if fam == "delayed":
        r = ref.quantize_delayed_ref(x, torch.tensor([DELAYED_SCALE]), torch.zeros(1), "e4m3")
        return ({"data": r.codes, "transpose": r.t_codes, "scale_inv": r.scale_inv, "amax": r.amax},
                ref.dequantize_ref(r.codes, r.scale_inv, "e4m3", F32), None, r)
    if fam == "current":
        r = ref.quantize_current_ref(x, "e4m3", pow2=o["pow2"])
        return ({"data": r.codes, "transpose": r.t_codes, "scale_inv": r.scale_inv},
                ref.dequantize_ref(r.codes, r.scale_inv, "e4m3", F32), None, r)
    if fam == "mx":
        r = ref.quantize_mxfp8_ref(x, o["fmt"])
        return ({"row": r.row, "row_scale": r.row_scale, "col": r.col, "col_scale": r.col_scale},
                ref.dequantize_mxfp8_ref(r.row, r.row_scale, o["fmt"], False, F32),
                ref.dequantize_mxfp8_ref(r.col, r.col_scale, o["fmt"], True, F32), r)
    if fam == "nv":
        r = ref.quantize_nvfp4_ref(x, two_d=o["two_d"], rht=o["rht"])
        col = None if o["rht"] else ref.dequantize_nvfp4_ref(r.col, r.col_scale, r.amax_col).t()
        return ({"row": r.row, "row_scale": r.row_scale, "col": r.col, "col_scale": r.col_scale,
                 "amax_row": r.amax_row, "amax_col": r.amax_col},
                ref.dequantize_nvfp4_ref(r.row, r.row_scale, r.amax_row), col, r)
    r = ref.quantize_fp8_block_ref(x, "e4m3", o["block_dim"], o["pow2"])
    return ({"row": r.row, "row_scale": r.row_scale, "col": r.col, "col_scale": r.col_scale},
            ref.dequantize_fp8_block_ref(r, "e4m3", o["block_dim"], SHAPE, F32),
            ref.dequantize_fp8_block_ref(r, "e4m3", o["block_dim"], SHAPE, F32, columnwise=True), r)


def columnwise_only(qt):
    """A view of a two-copy tensor holding only its columnwise copy (dequantize then reads that copy)."""
    y = qt._map(lambda t: t)
    y._rowwise_data = None
    return y


def dequantized(name, qt):
    """(rowwise FP32, rowwise nominal dtype, columnwise FP32 or None) dequantized values on qt's device."""
    col = None if FORMATS[name][0] in ("delayed", "current") else columnwise_only(qt).dequantize(F32)
    return qt.dequantize(F32), qt.dequantize(), col


def documented_overflow(name, x):
    """Elements that the documented power-of-two case sends past the dtype's max: |x| = max finite of the dtype,
    quantized with a power-of-two scale."""
    if name not in POW2:
        return torch.zeros(x.shape, dtype=torch.bool)
    return x.abs() == torch.finfo(x.dtype).max


def assert_finite_or_documented(name, x, d32, dnom, what):
    """Finite input -> finite output, except the documented elements, which are exactly +-2^128 (fp32/bf16: Inf in
    FP32) or +-65536 (fp16: finite in FP32, Inf in fp16)."""
    fin = torch.isfinite(x)
    doc = documented_overflow(name, x)
    bad32 = fin & ~doc & ~torch.isfinite(d32)
    badn = fin & ~doc & ~torch.isfinite(dnom)
    assert not bool(bad32.any()) and not bool(badn.any()), \
        f"{what}: {int(bad32.sum())} finite inputs dequantize to Inf/NaN in FP32, {int(badn.sum())} in {x.dtype}"
    if bool(doc.any()):
        sign = torch.sign(x[doc].float())
        big = math.inf if x.dtype != torch.float16 else 65536.0
        assert torch.equal(d32[doc], sign * big), f"{what}: documented elements are not exactly +-{big} in FP32"
        assert torch.equal(dnom[doc].float(), sign * math.inf), f"{what}: documented elements are not +-Inf"


def tolerance(name):
    """SPEC §9 (rtol, atol) after dequantize: E4M3 formats, E5M2 / NVFP4."""
    wide = FORMATS[name][0] == "nv" or name == "mxfp8_e5m2"
    return (0.25, 0.125) if wide else (0.125, 0.0675)


def block_of_spot(name):
    """Mask of the elements that share the rowwise scale of SPOT (per-tensor formats: SPOT alone)."""
    fam, o = FORMATS[name]
    m = torch.zeros(SHAPE, dtype=torch.bool)
    r, c = SPOT
    if fam in ("delayed", "current"):
        m[SPOT] = True
    elif fam == "mx":
        m[r, c // 32 * 32:c // 32 * 32 + 32] = True
    elif fam == "nv":
        r0 = r // 16 * 16 if o["two_d"] else r
        m[r0:r0 + (16 if o["two_d"] else 1), c // 16 * 16:c // 16 * 16 + 16] = True
    else:
        if o["block_dim"] == 2:
            m[r // 128 * 128:r // 128 * 128 + 128, c // 128 * 128:c // 128 * 128 + 128] = True
        else:
            m[r, c // 128 * 128:c // 128 * 128 + 128] = True
    return m


def spot_value(name, kind, qt):
    """What the SPEC gives for the Inf / NaN element at SPOT in FP32 (NaN: compared with isnan)."""
    fam = FORMATS[name][0]
    sign = -1.0 if kind == "ninf" else 1.0
    if kind == "nan":
        if fam == "nv":   # NaN -> code 0x7 (+6) times the block's factor (SPEC §2)
            sf = ref.fp8_decode(cpu(qt._rowwise_scale_inv)[SPOT[0], SPOT[1] // 16].reshape(1), "e4m3")
            return float(6.0 * ref.nv_decode_factors_ref(sf, cpu(qt._amax_rowwise))[0])
        return math.nan   # FP8 NaN code 0x7F
    if fam == "delayed":  # saturates to 448, times scale_inv = fl(1/3.5)
        return sign * float(torch.tensor(448.0) * (torch.tensor(1.0) / torch.tensor(DELAYED_SCALE)))
    if fam in ("current", "fb"):   # amax Inf -> scale 1 (SPEC §4.4, §4.7): Inf -> +-448
        return sign * 448.0
    if fam == "mx":       # block amax Inf -> E8M0 0xFE (2^127); +-fp8_max * 2^127 overflows: Inf stays Inf
        return sign * math.inf
    return sign * 2688.0  # NVFP4: global amax Inf -> S_enc = 1; block scale 448, code 6


# ------------------------------------------------------------------------------------------------
# CPU: bit-exact against the references, and the value checks
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,dtype,kind", CASES)
def test_edge_case(name, dtype, kind):
    tex = tex_module()
    x = edge_input(kind, dtype)
    q = make_quantizer(name)
    qt = tex.quantize(x, q)
    what = f"{name} {dtype} {kind}"
    got, (want, d32_ref, dcol_ref, r) = buffers(name, qt, q), reference(name, x)
    assert set(got) == set(want)
    for k in want:
        assert bits_equal(got[k], want[k]), f"{what}: {k} differs from the reference"
    wrong = reference(name, -x)[0]
    data_key = "data" if "data" in want else "row"
    assert not torch.equal(wrong[data_key], want[data_key]), f"{what}: the reference of -x would pass"

    d32, dnom, dcol = dequantized(name, qt)
    assert bits_equal(d32, d32_ref), f"{what}: dequantize(float32)"
    assert bits_equal(dnom, d32_ref.to(dtype)), f"{what}: dequantize() in the nominal dtype"
    if dcol_ref is not None:
        assert bits_equal(dcol, dcol_ref), f"{what}: dequantize of the columnwise copy"
    assert_finite_or_documented(name, x, d32, dnom, what)
    if dcol is not None:
        rht_overflow = name == "nvfp4_rht" and kind == "max"
        if rht_overflow:
            # The transform grows magnitudes up to 4x (SPEC §4.6): bf16's max overflows in it, so the columnwise
            # amax is Inf; the copy then decodes with S_dec = 1 (finite, but not the input: documented).
            assert float(cpu(qt._amax_columnwise)[0]) == math.inf
        fin = torch.isfinite(x) & ~documented_overflow(name, x)
        assert bool(torch.isfinite(dcol[fin]).all()), f"{what}: columnwise dequantize not finite"

    if kind == "max":
        assert bool(documented_overflow(name, x).any()) == (name in POW2)
    if kind in ("pinf", "nan", "ninf"):
        check_away_from_spot(name, kind, x, q, qt, d32, what)
    if FORMATS[name][0] == "nv":
        check_nvfp4_against_te_formula(kind, dtype, x, r, d32, what)


def check_away_from_spot(name, kind, x, q, qt, d32, what):
    """Elements outside SPOT's block decode within the format's tolerance; SPOT decodes to what the SPEC gives."""
    fam = FORMATS[name][0]
    away = ~block_of_spot(name)
    rtol, atol = tolerance(name)
    err = (d32[away].double() - x[away].double()).abs()
    assert bool((err <= atol + rtol * x[away].double().abs()).all()), \
        f"{what}: values away from the {kind} are off by up to {float(err.max())}"
    want = spot_value(name, kind, qt)
    got = float(d32[SPOT])
    assert (math.isnan(got) and math.isnan(want)) or got == want, f"{what}: the {kind} decodes to {got}, not {want}"
    if fam == "current":   # SPEC §4.4: amax Inf -> scale 1; NaN is ignored by the amax
        si = float(cpu(qt._scale_inv)[0])
        assert (si == 1.0) == (kind != "nan"), f"{what}: scale_inv {si}"
    if fam == "delayed":   # SPEC §4.2: the quantizer's amax max-accumulates, Inf included, NaN ignored
        a = float(cpu(q.amax)[0])
        assert (a == math.inf) == (kind != "nan"), f"{what}: delayed amax {a}"


def check_nvfp4_against_te_formula(kind, dtype, x, r, d32, what):
    """NVFP4: where TE's formula is finite and the quantizer's scale, our bits are TE's; where it overflows (amax
    above 7.6e35) or amax is Inf, it gives Inf/NaN (asserted: the old answer fails); subnormal-only fp32/bf16
    tensors (amax below 7.9e-36) it decodes to almost nothing, ours to within half an E2M1 step of 2^-128."""
    te = ref.dequantize_nvfp4_ref(r.row, r.row_scale, r.amax_row, formula="te")
    fin = torch.isfinite(x)
    amax = float(r.amax_row[0])
    if kind in ("max", "onemax") and dtype != torch.float16 or kind in ("pinf", "ninf"):
        assert not bool(torch.isfinite(te[fin]).all()), f"{what}: TE's formula was expected to overflow"
        assert bool(torch.isfinite(d32[fin]).all())
    elif kind == "subnormal" and dtype != torch.float16:
        assert amax < 7.9e-36
        step = 2.0 ** -128            # the quantizer's element multiplier is FLT_MAX: codes of x * FLT_MAX
        err = (d32.double() - x.double()).abs()
        assert float(err.max()) <= 0.5 * step * (1 + 1e-6), f"{what}: subnormal values decode {float(err.max())} away"
        assert float((te.double() - x.double()).abs().max()) > 0.5 * step, f"{what}: TE's formula would pass"
        assert float(te.abs().max()) < 1e-3 * amax
    else:
        assert bits_equal(d32, te), f"{what}: TE's formula is finite and regular here; the bits must be TE's"
    if kind == "max":
        # all +-max: codes 0x7/0xF with block scale 448, and the values come back exactly
        assert torch.equal(d32.to(dtype), x), f"{what}: max-finite values do not round-trip"


# ------------------------------------------------------------------------------------------------
# NVFP4 decode factor and GEMM alpha at the edges (the functions the tensor and the native GEMM use)
# ------------------------------------------------------------------------------------------------
def test_nvfp4_decode_factor_rule():
    """nvfp4_decode_factors against the reference over every E4M3 scale and amaxes across the cases: TE's bits in
    the regular range, the quantizer's reciprocal outside it; never Inf or NaN, and 6 * D never overflows."""
    from transformer_engine_torch.formats.nvfp4 import nvfp4_decode_factors
    sf = ref.fp8_decode(torch.arange(0, 0x7F, dtype=torch.uint8), "e4m3").reshape(1, -1)   # 0 .. 448
    flt_max = torch.finfo(F32).max
    amaxes = [0.0, 1e-45, 1e-40, 1.1754942e-38, 5e-36, 7.9e-36, 1e-35, 1e-33, 4e-33, 1.0, 3.0, 65504.0, 7.5e35,
              7.6e35, 1e36, 3.3895314e38, flt_max, math.inf]
    for a in amaxes:
        amax = torch.tensor([[a]], dtype=F32)
        got = nvfp4_decode_factors(sf, amax)
        want = ref.nv_decode_factors_ref(sf, amax)
        assert bits_equal(got, want), a
        assert bool(torch.isfinite(got).all()) and bool(torch.isfinite(6.0 * got).all()), a
        te = ref.nv_decode_factors_ref(sf, amax, formula="te")
        if 1e-32 <= a <= 7.5e35:   # enc is clamped for sf = 2^-9 below 2688 * 2^-119, about 4e-33
            assert bits_equal(got, te), a
        if a >= 1e36:
            assert not bool(torch.isfinite(te).all()), a
    # every FP32 amax in [2^126, FLT_MAX]: the largest decoded value fl(6 * D(448)) stays finite
    bits = torch.arange(0x7E800000, 0x7F800000, 97, dtype=torch.int64).to(torch.int32)
    amax = torch.cat([bits.view(F32), torch.tensor([flt_max])]).reshape(-1, 1)
    top = 6.0 * nvfp4_decode_factors(torch.full_like(amax, 448.0), amax)
    assert bool(torch.isfinite(top).all())


def _alpha_ref(amax_a, amax_b, alpha):
    """alpha' of SPEC §6.7 spelled out in numpy: TE's fl(fl(amax_a * amax_b) * fl(alpha / (6*6*448*448))) where that
    is finite and both amaxes are regular (fl(2688 / amax) finite and > 0) or 0; else fl(alpha * g_a * g_b) from
    float64 with g = amax / 2688 (regular) or S_dec = fl(1 / S_enc) (S_enc = min(fl(2688 / amax), FLT_MAX), 1 for
    amax 0 or Inf)."""
    import numpy as np
    f = np.float32
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        te = f(f(amax_a) * f(amax_b)) * f(alpha / (6.0 * 6.0 * 448.0 * 448.0))
        g, keep = [], bool(np.isfinite(te))
        for a in (f(amax_a), f(amax_b)):
            s_enc = f(2688.0) / a
            regular = bool(a > 0 and np.isfinite(s_enc) and s_enc > 0)
            keep = keep and (regular or a == 0)
            s_enc = f(1.0) if (a == 0 or s_enc == 0) else min(s_enc, f(np.finfo(np.float32).max))
            g.append(float(a) / 2688.0 if regular else float(f(1.0) / s_enc))
    return float(te) if keep else float(f(g[0] * g[1] * alpha))


@pytest.mark.parametrize("amaxes,alpha", [((3.0, 5.0), 1.5), ((0.0, 5.0), 1.0), ((3e20, 3e20), 1e-10),
                                          ((math.inf, 2688.0), 2.0), ((1e-37, 2688.0), 1.0)],
                         ids=["regular", "zero", "product-overflows", "amax-inf", "s_enc-clamped"])
def test_nvfp4_gemm_alpha(amaxes, alpha):
    """The core's NVFP4 alpha' (the global decode scales folded into alpha, SPEC §6.7) through the CPU GEMM: copies of
    ones (every code 6 with block scale 448, so each product of the decoded blocks is 2688^2 and K of them sum exactly
    to 32 * 2688^2) with their amaxes overwritten; the output is fl(alpha' * acc) exactly. TE's bits where finite and
    regular, the overflow-safe product elsewhere (amax Inf: S_dec 1; clamped S_enc: 2^-128)."""
    import numpy as np
    tex = tex_module()
    q = tex.NVFP4Quantizer()
    x = tex.quantize(torch.ones(16, 32, dtype=torch.bfloat16), q)
    w = tex.quantize(torch.ones(16, 32, dtype=torch.bfloat16), q)
    x._amax_rowwise.fill_(amaxes[1])
    w._amax_rowwise.fill_(amaxes[0])
    out = tex.general_gemm(w, x, out_dtype=torch.float32, alpha=alpha)[0]
    acc = np.float32(32 * 2688.0 ** 2)
    want = np.float32(np.float32(_alpha_ref(*amaxes, alpha)) * acc)
    assert out.shape == (16, 16)
    assert math.isfinite(float(want)) and bits_equal(out, torch.full((16, 16), float(want)))
    if amaxes[0] == math.inf:
        assert math.isfinite(float(want)) and float(want) == float(np.float32(2.0 * acc))


# ------------------------------------------------------------------------------------------------
# The fused activation path at the edges: relu is exact, so tex.relu(x, q) == tex.quantize(relu(x), q)
# ------------------------------------------------------------------------------------------------
def relu_exact(x):
    return torch.where(x <= 0, torch.zeros_like(x), x)   # NaN stays NaN, -0 -> +0 (the functor's !(x <= 0))


def fused_vs_unfused(name, x, device):
    tex = tex_module()
    qa, qb = make_quantizer(name, device), make_quantizer(name, device)
    a = tex.relu(x.to(device), qa)
    b = tex.quantize(relu_exact(x).to(device), qb)
    return buffers(name, a, qa), buffers(name, b, qb)


RELU_CASES = [c for c in CASES if c.values[2] in ("max", "subnormal", "pinf", "nan") and c.values[1] != torch.float16]


@pytest.mark.parametrize("name,dtype,kind", RELU_CASES)
def test_relu_fused_edges(name, dtype, kind):
    a, b = fused_vs_unfused(name, edge_input(kind, dtype), "cpu")
    for k in a:
        assert bits_equal(a[k], b[k]), f"{name} {dtype} {kind}: fused relu {k}"


# ------------------------------------------------------------------------------------------------
# CUDA: the same cases, bytes and dequantized values equal to the CPU's
# ------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("name,dtype,kind", CASES)
def test_edge_case_cuda_matches_cpu(name, dtype, kind):
    tex = tex_module()
    x = edge_input(kind, dtype)
    qc, qg = make_quantizer(name), make_quantizer(name, "cuda")
    tc, tg = tex.quantize(x, qc), tex.quantize(x.cuda(), qg)
    bc, bg = buffers(name, tc, qc), buffers(name, tg, qg)
    for k in bc:
        assert bits_equal(bg[k], bc[k]), f"{name} {dtype} {kind}: CUDA {k} != CPU"
    (c32, cn, ccol), (g32, gn, gcol) = dequantized(name, tc), dequantized(name, tg)
    assert bits_equal(cpu(g32), c32) and bits_equal(cpu(gn), cn), f"{name} {dtype} {kind}: dequantize"
    if ccol is not None:
        # RHT too: in a block every decoded value is a multiple of D/2 of at most 6 D and R^T's entries are +-1/4,
        # so the float64 sums are exact in any order and CPU and CUDA round the same value.
        assert bits_equal(cpu(gcol), ccol), f"{name} {dtype} {kind}: columnwise dequantize"


@pytest.mark.cuda
@pytest.mark.parametrize("name,dtype,kind", RELU_CASES)
def test_relu_fused_edges_cuda(name, dtype, kind):
    x = edge_input(kind, dtype)
    a, b = fused_vs_unfused(name, x, "cuda")
    c, _ = fused_vs_unfused(name, x, "cpu")
    for k in a:
        assert bits_equal(a[k], b[k]), f"{name} {dtype} {kind}: fused relu {k} (CUDA)"
        assert bits_equal(a[k], c[k]), f"{name} {dtype} {kind}: fused relu {k} CUDA != CPU"


# ------------------------------------------------------------------------------------------------
# The NVFP4 GEMM (CPU, and emulated on sm_90) dequantizes its operands: an operand of amax above 7.6e35 or Inf
# gave NaN/Inf outputs with TE's formula
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("big", [1e36, math.inf], ids=["amax1e36", "amaxinf"])
def test_nvfp4_gemm_large_amax(device, big):
    tex = tex_module()
    g = torch.Generator()
    g.manual_seed(5)
    w = torch.rand(32, 64, generator=g) * 6 - 3
    x = torch.rand(48, 64, generator=g) * 6 - 3
    w[3, 7] = big
    W = tex.quantize(w.to(device), tex.NVFP4Quantizer())
    X = tex.quantize(x.to(device), tex.NVFP4Quantizer())
    r = ref.quantize_nvfp4_ref(w)
    old = ref.dequantize_nvfp4_ref(r.row, r.row_scale, r.amax_row, formula="te")
    assert not bool(torch.isfinite(old).all()), "TE's formula was expected to give Inf/NaN for this operand"
    y = cpu(tex.general_gemm(W, X, out_dtype=torch.float32, layout="TN")[0]).double()
    want = cpu(X.dequantize(F32)).double() @ cpu(W.dequantize(F32)).double().t()
    assert bool(torch.isfinite(y).all()) and bool(torch.isfinite(want).all())
    rtol = 1e-6 if device == "cpu" else 2e-2   # sm_90 emulation: operands rounded to bf16, bf16 GEMM
    assert bool(((y - want).abs() <= rtol * want.abs().max()).all())
