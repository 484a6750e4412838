"""Naive, independent pure-PyTorch references for SPEC §2 (FP8 encode), §3 (activations),
§4.2-§4.4 (per-tensor delayed / current scaling, delayed-scaling update) and §5 (fusion paths).

Every rounding step is spelled out:
- "fp32 op" means a float32 torch tensor op on CPU, which rounds once, to nearest even (IEEE).
- Activations are evaluated in float64 (the "math" value); a path that needs the FP32 activation
  rounds that float64 value to float32 once, which can differ from the kernel's own FP32 math by
  an ulp or two; that is why activation -> FP8 codes are compared with `assert_codes_rn_forgiving`.
- FP8 encode = clamp to +-fp8_max (saturate, Inf included), then torch's RNE `.to(float8)`, then
  NaN -> 0x7F whatever its sign.  `fp8_encode_scalar` is a second, torch-free float64
  implementation used to validate the tensor encoder (tests/test_reference.py).

Formats are named "e4m3" / "e5m2"; `fmt_of` converts torch dtypes, DType ints and names.
"""
import math

import torch

F32 = torch.float32
F64 = torch.float64
FLT_MAX = torch.finfo(torch.float32).max

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
FP8_TORCH = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MANT_BITS = {"e4m3": 3, "e5m2": 2}
FP8_EXP_BIAS = {"e4m3": 7, "e5m2": 15}
FP8_MAX_CODE = {"e4m3": 0x7E, "e5m2": 0x7B}
FP8_NAN_CODE = 0x7F
DTYPE_INT = {"e4m3": 7, "e5m2": 8}


def fmt_of(fp8_dtype):
    """'e4m3' / 'e5m2' from a name, a torch float8 dtype, or a DType int (7 / 8)."""
    if isinstance(fp8_dtype, str):
        s = fp8_dtype.lower()
        assert s in FP8_MAX, s
        return s
    if fp8_dtype is torch.float8_e4m3fn:
        return "e4m3"
    if fp8_dtype is torch.float8_e5m2:
        return "e5m2"
    v = int(fp8_dtype)
    if v == 7:
        return "e4m3"
    if v == 8:
        return "e5m2"
    raise ValueError(f"not an FP8 dtype: {fp8_dtype!r}")


def f32(v):
    """Python float rounded to float32 (as a Python float)."""
    return float(torch.tensor(v, dtype=F32))


# ----------------------------------------------------------------------------------------------
# FP8 encode / decode
# ----------------------------------------------------------------------------------------------
def fp8_encode(x, fmt):
    """FP32 tensor -> uint8 FP8 codes, SPEC §2: RNE, saturate to finite, NaN -> 0x7F, -tiny -> 0x80."""
    fmt = fmt_of(fmt)
    assert x.dtype == F32, "the encoder takes FP32 values; round to FP32 explicitly first"
    fmax = FP8_MAX[fmt]
    nan = torch.isnan(x)
    clamped = torch.clamp(x, -fmax, fmax)          # saturate (also +-Inf); sign of zero is kept
    codes = clamped.to(FP8_TORCH[fmt]).view(torch.uint8)
    return torch.where(nan, torch.full_like(codes, FP8_NAN_CODE), codes)


def fp8_decode(codes, fmt):
    """uint8 codes -> exact float32 values (NaN codes -> NaN, E5M2 Inf codes -> Inf)."""
    fmt = fmt_of(fmt)
    assert codes.dtype == torch.uint8
    return codes.view(FP8_TORCH[fmt]).to(F32)


def fp8_decode_scalar(code, fmt):
    """Torch-free float64 decode of one code."""
    fmt = fmt_of(fmt)
    mb, bias = FP8_MANT_BITS[fmt], FP8_EXP_BIAS[fmt]
    sign = -1.0 if code & 0x80 else 1.0
    e = (code & 0x7F) >> mb
    m = code & ((1 << mb) - 1)
    if fmt == "e4m3" and (code & 0x7F) == 0x7F:
        return math.nan
    if fmt == "e5m2" and e == 31:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mb)
    return sign * (1.0 + m / (1 << mb)) * 2.0 ** (e - bias)


def fp8_encode_scalar(v, fmt):
    """Torch-free float64 implementation of the SPEC §2 FP32 -> FP8 rule for one value."""
    fmt = fmt_of(fmt)
    if math.isnan(v):
        return FP8_NAN_CODE
    mb, bias, fmax = FP8_MANT_BITS[fmt], FP8_EXP_BIAS[fmt], FP8_MAX[fmt]
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0x00
    a = abs(v)
    if a >= fmax:                                   # saturate (Inf included)
        return sign | FP8_MAX_CODE[fmt]
    emin = 1 - bias                                 # exponent of the smallest normal
    e = max(math.frexp(a)[1] - 1, emin) if a > 0 else emin
    quantum = 2.0 ** (e - mb)                       # spacing of the grid around a
    r = round(a / quantum)                          # exact quotient; Python rounds half to even
    val = r * quantum
    if val > fmax:                                  # rounded past the largest finite: saturate
        return sign | FP8_MAX_CODE[fmt]
    if val == 0:
        return sign
    if val < 2.0 ** emin:                           # subnormal
        return sign | int(val / 2.0 ** (emin - mb))
    ev = math.frexp(val)[1] - 1
    mant = int((val / 2.0 ** ev - 1.0) * (1 << mb))
    return sign | ((ev + bias) << mb) | mant


def fp8_finite_values(fmt):
    """Sorted float64 list of the non-negative finite values of the format (code order)."""
    fmt = fmt_of(fmt)
    return [fp8_decode_scalar(c, fmt) for c in range(FP8_MAX_CODE[fmt] + 1)]


def fp8_boundary_values(fmt):
    """FP32 tensor: every finite code value, every midpoint, their FP32 neighbours, and values
    around the saturation point, the subnormal underflow point, +-Inf and NaN; both signs."""
    fmt = fmt_of(fmt)
    vals = fp8_finite_values(fmt)
    mids = [(a + b) / 2 for a, b in zip(vals[:-1], vals[1:])]
    fmax = FP8_MAX[fmt]
    step = vals[-1] - vals[-2]
    extra = [fmax + step / 2, fmax + step, fmax * 1.5, fmax * 2, 1e30, FLT_MAX,
             vals[1] / 2, vals[1] / 4, vals[1] * 0.75, 1e-30, 1e-38, 1e-45]
    base = torch.tensor(vals + mids + extra, dtype=F32)
    up = torch.nextafter(base, torch.full_like(base, math.inf))
    down = torch.nextafter(base, torch.zeros_like(base))
    pos = torch.cat([base, up, down])
    specials = torch.tensor([math.inf, math.nan], dtype=F32)
    allv = torch.cat([pos, specials])
    return torch.cat([allv, -allv])


def fp8_ordinal(codes, fmt):
    """Position of each code in the real-line order of the format (+0 and -0 both 0)."""
    c = codes.to(torch.int32)
    mag = c & 0x7F
    return torch.where((c & 0x80) != 0, -mag, mag)


def fp8_is_nan_code(codes, fmt):
    fmt = fmt_of(fmt)
    mag = codes.to(torch.int32) & 0x7F
    if fmt == "e4m3":
        return mag == 0x7F
    return mag > 0x7C


# ----------------------------------------------------------------------------------------------
# amax and per-tensor scaling (SPEC §2 amax, §4.2, §4.4)
# ----------------------------------------------------------------------------------------------
def amax_ref(x):
    """max |x| in FP32, NaN ignored, empty -> 0. Returns a 0-d float32 tensor."""
    a = x.detach().to(F32).abs().reshape(-1)
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    if a.numel() == 0:
        return torch.zeros((), dtype=F32)
    return a.max()


def reciprocal_f32(s):
    """fl(1/s) in FP32."""
    return torch.ones((), dtype=F32) / s.to(F32)


def clear_mantissa(s):
    """Round a positive FP32 value down to a power of two (clear the 23 mantissa bits)."""
    bits = s.to(F32).reshape(()).view(torch.int32)
    return torch.bitwise_and(bits, torch.tensor(-8388608, dtype=torch.int32)).view(F32)  # 0xFF800000


def current_scale_ref(amax, fmt, pow2=False, eps=0.0):
    """SPEC §4.4 step 3. amax: 0-d float32 tensor. Returns a 0-d float32 scale."""
    fmt = fmt_of(fmt)
    a = amax.to(F32).reshape(())
    eps32 = torch.tensor(eps, dtype=F32)
    if bool(a < eps32):
        a = eps32
    if bool(a == 0) or bool(torch.isinf(a)) or bool(torch.isnan(a)):
        scale = torch.ones((), dtype=F32)
    else:
        scale = torch.tensor(FP8_MAX[fmt], dtype=F32) / a      # fp32 division
        if bool(torch.isinf(scale)):
            scale = torch.tensor(FLT_MAX, dtype=F32)
    if pow2:
        scale = clear_mantissa(scale)
    return scale


class QRef:
    """Result of a reference quantization: codes (input shape), transposed codes, scale_inv, amax."""

    def __init__(self, codes, scale_inv, amax=None, scale=None):
        self.codes = codes
        self.t_codes = transpose_codes(codes)
        self.scale_inv = scale_inv.reshape(1)
        self.amax = None if amax is None else amax.reshape(1)
        self.scale = scale


def transpose_codes(codes):
    """[d0..dn-2, K] -> the [K, M] bitwise transpose, reshaped to (K,) + shape[:-1].
    0-d -> shape (1,)."""
    if codes.dim() == 0:
        return codes.reshape(1).clone()
    K = codes.shape[-1]
    M = codes.numel() // K if K else int(torch.tensor(codes.shape[:-1]).prod().item())
    return codes.reshape(M, K).t().contiguous().reshape((K,) + tuple(codes.shape[:-1]))


def quantize_delayed_ref(x, scale, amax_old, fmt):
    """SPEC §4.2: q = fp8(fl(x * scale)), amax_new = max(amax_old, amax(x)), scale_inv = fl(1/scale)."""
    fmt = fmt_of(fmt)
    s = scale.to(F32).reshape(())
    xf = x.detach().to(F32)
    codes = fp8_encode(xf * s, fmt)                     # one fp32 multiply, then the encoder
    amax_new = torch.maximum(amax_old.to(F32).reshape(()), amax_ref(xf))
    return QRef(codes, reciprocal_f32(s), amax_new, s)


def quantize_current_ref(x, fmt, pow2=False, eps=0.0, amax=None, data=None):
    """SPEC §4.4: amax over `x` (or the given amax), scale rule, q = fp8(fl(data * scale)).
    `data` defaults to x (the fused activation path passes the rounded activation here)."""
    fmt = fmt_of(fmt)
    xf = x.detach().to(F32)
    a = amax_ref(xf) if amax is None else amax.to(F32).reshape(())
    scale = current_scale_ref(a, fmt, pow2, eps)
    d = xf if data is None else data.detach().to(F32)
    codes = fp8_encode(d * scale, fmt)
    return QRef(codes, reciprocal_f32(scale), a, scale)


def dequantize_ref(codes, scale_inv, fmt, otype):
    """fl(decode(code) * scale_inv) in FP32, rounded once to otype."""
    return (fp8_decode(codes, fmt) * scale_inv.to(F32).reshape(())).to(otype)


# ----------------------------------------------------------------------------------------------
# Delayed-scaling update (SPEC §4.3)
# ----------------------------------------------------------------------------------------------
def amax_and_scale_update_ref(buffer, histories, scales, algo, fmt, margin):
    """Returns new (histories, scales) lists; the inputs are not modified."""
    fmt = fmt_of(fmt)
    fmax_m = torch.tensor(FP8_MAX[fmt], dtype=F32) * torch.tensor(2.0 ** (-margin), dtype=F32)
    new_h, new_s = [], []
    off = 0
    for hist, scale in zip(histories, scales):
        h = hist.detach().to(F32).clone()
        s = scale.detach().to(F32).clone()
        L, n = h.shape
        for j in range(n):
            last = h[0, j].clone()
            if buffer is not None and float(buffer[off + j]) != 0.0:
                last = buffer[off + j].to(F32).clone()
            if float(last) != 0.0:
                old = h[:, j].clone()
                if algo == "max":
                    amax = torch.max(torch.cat([old[1:], last.reshape(1)]))
                else:
                    amax = last
                col = torch.zeros(L, dtype=F32)
                if L > 1:
                    col[1:L - 1] = old[2:L]
                    col[L - 1] = last
                h[:, j] = col
            else:
                amax = torch.zeros((), dtype=F32)
            if bool(torch.isfinite(amax)) and float(amax) > 0:
                sc = fmax_m / amax
                if bool(torch.isinf(sc)):
                    sc = torch.tensor(FLT_MAX, dtype=F32)
                s[j] = sc
        off += n
        new_h.append(h)
        new_s.append(s)
    return new_h, new_s


# ----------------------------------------------------------------------------------------------
# Activations in float64 (SPEC §3)
# ----------------------------------------------------------------------------------------------
C_SQRT_2_PI = f32(0.79788456)
C_GELU_CUBIC = f32(0.03567741)
C_GELU_D = f32(0.1070322243)
C_044715 = f32(0.044715)
C_QGELU = f32(1.702)

ACT_NAMES = ["gelu", "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu",
             "silu", "swiglu", "glu", "clamped_swiglu"]
DACT_NAMES = {n: ("clamped_dswiglu" if n == "clamped_swiglu" else "d" + n) for n in ACT_NAMES}
GATED = {"geglu", "qgeglu", "reglu", "sreglu", "swiglu", "glu", "clamped_swiglu"}
# gated op -> the nonlinearity applied to the first half
BASE = {"gelu": "gelu", "geglu": "gelu", "qgelu": "qgelu", "qgeglu": "qgelu", "relu": "relu",
        "reglu": "relu", "srelu": "srelu", "sreglu": "srelu", "silu": "silu", "swiglu": "silu",
        "glu": "sigmoid"}
DBIAS_NAMES = {"dbias_dgelu": "gelu", "dbias_dsilu": "silu", "dbias_drelu": "relu",
               "dbias_dqgelu": "qgelu", "dbias_dsrelu": "srelu"}
ACT_CODE = {"gelu": 0, "geglu": 1, "glu": 2, "silu": 3, "swiglu": 4, "relu": 5, "reglu": 6,
            "qgelu": 7, "qgeglu": 8, "srelu": 9, "sreglu": 10, "clamped_swiglu": 11}


def _sig(z):
    return 1.0 / (1.0 + torch.exp(-z))


def _f(base, x):
    if base == "gelu":
        return x * (0.5 + 0.5 * torch.tanh(x * (C_SQRT_2_PI + C_GELU_CUBIC * x * x)))
    if base == "qgelu":
        return x * _sig(C_QGELU * x)
    if base == "relu":
        return torch.where(x > 0, x, torch.zeros_like(x))
    if base == "srelu":
        return torch.where(x > 0, x * x, torch.zeros_like(x))
    if base == "silu":
        return x * _sig(x)
    if base == "sigmoid":
        return _sig(x)
    raise KeyError(base)


def _df(base, x):
    if base == "gelu":
        t = torch.tanh(C_SQRT_2_PI * x * (1.0 + C_044715 * x * x))
        return 0.5 * x * (1.0 - t * t) * (C_SQRT_2_PI + C_GELU_D * x * x) + 0.5 * (1.0 + t)
    if base == "qgelu":
        s = _sig(C_QGELU * x)
        return C_QGELU * x * s * (1.0 - s) + s
    if base == "relu":
        return (x > 0).to(x.dtype)
    if base == "srelu":
        return torch.clamp(2.0 * x, min=0.0)
    if base == "silu":
        s = _sig(x)
        return x * s * (1.0 - s) + s
    if base == "sigmoid":
        s = _sig(x)
        return s * (1.0 - s)
    raise KeyError(base)


def _halves(x):
    H = x.shape[-1] // 2
    return x[..., :H], x[..., H:]


def act_ref(name, x, limit=7.0, alpha=1.702, offset=1.0):
    """float64 forward of tex.<name>; x is converted exactly to float64 (differentiable)."""
    x = x.to(F64)
    if name == "clamped_swiglu":
        a, b = _halves(x)
        L, al, c = f32(limit), f32(alpha), f32(offset)
        ac = torch.clamp(a, max=L)
        act = ac * _sig(al * ac)
        return act * (torch.clamp(b, -L, L) + c)
    base = BASE[name]
    if name in GATED:
        a, b = _halves(x)
        return _f(base, a) * b
    return _f(base, x)


def dact_ref(name, g, x, limit=7.0, alpha=1.702, offset=1.0):
    """float64 backward of tex.d<name>(g, x): [d_a | d_b] for gated ops."""
    x = x.detach().to(F64)
    g = g.detach().to(F64)
    if name == "clamped_swiglu":
        a, b = _halves(x)
        L, al, c = f32(limit), f32(alpha), f32(offset)
        ac = torch.clamp(a, max=L)
        s = _sig(al * ac)
        act = ac * s
        bp = torch.clamp(b, -L, L) + c
        dact = torch.where(a <= L, s + al * ac * s * (1.0 - s), torch.zeros_like(a))
        da = g * bp * dact
        db = g * act * ((b >= -L) & (b <= L)).to(F64)
        return torch.cat([da, db], dim=-1)
    base = BASE[name]
    if name in GATED:
        a, b = _halves(x)
        return torch.cat([g * b * _df(base, a), g * _f(base, a)], dim=-1)
    return g * _df(base, x)


def dbias_ref(base, g, x):
    """(grad_bias float64 [K], grad_input float64) for dbias_d<base>."""
    gi = g.detach().to(F64) * _df(base, x.detach().to(F64))
    K = gi.shape[-1] if gi.dim() else 1
    return gi.reshape(-1, K).sum(0), gi


def out_shape(name, shape):
    shape = tuple(shape)
    if name in GATED:
        return shape[:-1] + (shape[-1] // 2,)
    return shape


# ----------------------------------------------------------------------------------------------
# Fusion paths (SPEC §5.1): activation -> FP8 references
# ----------------------------------------------------------------------------------------------
def rnd_in(v32, dtype):
    """Round an FP32 tensor to the input dtype and widen back (identity for FP32)."""
    return v32.to(dtype).to(F32)


def act_fp8_delayed_ref(v64, scale, amax_old, fmt):
    """FULLY_FUSED delayed: q = fp8(fl(act_f32 * scale)) on the UNROUNDED FP32 activation."""
    v32 = v64.to(F32)
    return quantize_delayed_ref(v32, scale, amax_old, fmt)


def act_fp8_current_ref(v64, in_dtype, fmt, pow2=False, eps=0.0):
    """FUSED_ACTIVATION_AMAX_FP8: amax of the unrounded FP32 activation, data rounded to the
    input dtype before scaling."""
    v32 = v64.to(F32)
    return quantize_current_ref(v32, fmt, pow2, eps, amax=amax_ref(v32), data=rnd_in(v32, in_dtype))


# ----------------------------------------------------------------------------------------------
# Comparisons
# ----------------------------------------------------------------------------------------------
TOL = {F32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
       F64: (1e-7, 1e-7)}
FP8_TOL = {"e4m3": (0.125, 0.0675), "e5m2": (0.25, 0.125)}


def within_tol(test, ref, rtol, atol):
    """Boolean: |t - r| <= atol + rtol*|r| everywhere (NaNs must match)."""
    t = test.detach().to(F64).cpu()
    r = ref.detach().to(F64).cpu()
    if t.shape != r.shape:
        return False
    nan_t, nan_r = torch.isnan(t), torch.isnan(r)
    if not torch.equal(nan_t, nan_r):
        return False
    t, r = t[~nan_t], r[~nan_r]
    inf = torch.isinf(r) | torch.isinf(t)
    if not torch.equal(t[inf], r[inf]):
        return False
    t, r = t[~inf], r[~inf]
    return bool(((t - r).abs() <= atol + rtol * r.abs()).all())


def assert_close_tol(test, ref, dtype, msg=""):
    rtol, atol = TOL[dtype]
    t = test.detach().to(F64).cpu()
    r = ref.detach().to(F64).cpu()
    assert t.shape == r.shape, f"{msg}: shape {tuple(t.shape)} != {tuple(r.shape)}"
    if not within_tol(t, r, rtol, atol):
        err = (t - r).abs()
        bound = atol + rtol * r.abs()
        i = int(torch.argmax((err - bound).reshape(-1)))
        raise AssertionError(
            f"{msg}: tolerance (rtol={rtol}, atol={atol}) exceeded on "
            f"{int((err > bound).sum())}/{t.numel()} elements; worst at flat index {i}: "
            f"test={t.reshape(-1)[i].item()!r} ref={r.reshape(-1)[i].item()!r}")


def codes_mismatch_report(test, ref, fmt, max_fraction=0.005):
    """Returns None if `test` matches `ref` under the RN-forgiving rule of SPEC §9/§5.2, else a
    message. Rule: equal codes (+0 == -0), or the two codes are neighbours in the format's
    real-line order (one code apart, same side of zero) on at most max(1, 0.5 %) of the
    elements; NaN codes must match exactly as NaN."""
    test = test.detach().cpu()
    ref = ref.detach().cpu()
    if test.shape != ref.shape:
        return f"shape {tuple(test.shape)} != {tuple(ref.shape)}"
    if test.dtype != torch.uint8 or ref.dtype != torch.uint8:
        return f"dtypes {test.dtype}, {ref.dtype} (expected uint8)"
    n = test.numel()
    if n == 0:
        return None
    nt, nr = fp8_is_nan_code(test, fmt), fp8_is_nan_code(ref, fmt)
    if not torch.equal(nt, nr):
        return f"NaN codes differ at {int((nt != nr).sum())} elements"
    ot = fp8_ordinal(test, fmt)[~nt]
    orf = fp8_ordinal(ref, fmt)[~nr]
    diff = (ot - orf).abs()
    if diff.numel() and int(diff.max()) > 1:
        i = int(torch.argmax(diff))
        return (f"a code differs by {int(diff[i])} steps (test 0x{int(test[~nt][i]):02x}, "
                f"ref 0x{int(ref[~nr][i]):02x}); only one-code RN differences are forgiven")
    sign_change = ((ot > 0) & (orf < 0)) | ((ot < 0) & (orf > 0))
    if bool(sign_change.any()):
        return "sign change"
    nbad = int((diff == 1).sum())
    cap = max(1, int(max_fraction * n))
    if nbad > cap:
        return f"{nbad}/{n} elements differ by one code (cap {cap} = 0.5 %)"
    return None


def assert_codes_rn_forgiving(test, ref, fmt, msg="", wrong=None):
    """RN-forgiving FP8 code comparison; if `wrong` (codes of a wrong answer) is given, also
    asserts that the wrong answer would NOT pass the same comparison."""
    rep = codes_mismatch_report(test, ref, fmt)
    assert rep is None, f"{msg}: {rep}"
    if wrong is not None:
        assert codes_mismatch_report(wrong, ref, fmt) is not None, \
            f"{msg}: the comparison cannot tell a wrong answer apart"


def assert_bytes_equal(test, ref, msg="", wrong=None):
    """Bit-exact uint8 comparison; `wrong` (reference bytes of a wrong answer) must differ."""
    test = test.detach().cpu()
    ref = ref.detach().cpu()
    assert test.dtype == ref.dtype, f"{msg}: dtype {test.dtype} != {ref.dtype}"
    assert tuple(test.shape) == tuple(ref.shape), f"{msg}: shape {tuple(test.shape)} != {tuple(ref.shape)}"
    if not torch.equal(test, ref):
        ne = (test != ref)
        i = int(torch.nonzero(ne.reshape(-1))[0])
        raise AssertionError(f"{msg}: {int(ne.sum())}/{test.numel()} bytes differ; first at flat "
                             f"index {i}: test 0x{int(test.reshape(-1)[i]):02x} "
                             f"ref 0x{int(ref.reshape(-1)[i]):02x}")
    if wrong is not None:
        assert not torch.equal(wrong.detach().cpu(), ref), f"{msg}: a wrong answer would pass"


def bits_equal(a, b):
    """Bitwise equality of float tensors, NaNs compared as NaN (payloads may differ)."""
    a = a.detach().cpu()
    b = b.detach().cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    ibits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
             torch.float64: torch.int64}[a.dtype]
    return torch.equal(a[~na].view(ibits), b[~nb].view(ibits)) if a.numel() else True


# ----------------------------------------------------------------------------------------------
# MXFP8 (SPEC §2 E8M0 encode, §4.5 block rule, §4.8 scale shapes and swizzled layout)
# ----------------------------------------------------------------------------------------------
MX_BLOCK = 32
# fl(1/fp8_max): one FP32 division, done here once; the block rule MULTIPLIES by it.
MX_INV_MAX = {fmt: torch.tensor(1.0, dtype=F32) / torch.tensor(m, dtype=F32) for fmt, m in FP8_MAX.items()}
# Largest exponent of the format (the OCP rule's emax): 448 = 1.75 * 2^8, 57344 = 1.75 * 2^15.
FP8_EMAX = {"e4m3": 8, "e5m2": 15}


def ceil_div(a, b):
    return (a + b - 1) // b


def roundup(a, b):
    return ceil_div(a, b) * b


def mx_scale_shapes(M, K):
    """(rowwise, columnwise) padded scale shapes of SPEC §4.8."""
    return (roundup(M, 128), roundup(ceil_div(K, MX_BLOCK), 4)), (roundup(ceil_div(M, MX_BLOCK), 4), roundup(K, 128))


def e8m0_encode(v):
    """SPEC §2 E8M0 encode of a non-negative FP32 tensor, rounding UP, on its bit fields E and F:
    NaN -> 0xFF, +Inf -> 0xFE, E = 0 -> (0 if F <= 0x400000 else 1), E = 0xFE -> 0xFE, else E + (F != 0)."""
    assert v.dtype == F32
    bits = v.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    E = (bits >> 23) & 0xFF
    Fm = bits & 0x7FFFFF
    code = E + (Fm != 0).to(torch.int64)
    code = torch.where(E == 0, torch.where(Fm <= 0x400000, 0, 1), code)
    code = torch.where(E == 0xFE, 0xFE, code)
    code = torch.where(E == 0xFF, torch.where(Fm == 0, 0xFE, 0xFF), code)
    return code.to(torch.uint8)


def e8m0_encode_scalar(v):
    """Torch-free: the smallest power of two 2^(e-127) >= v (float64 math on an FP32 value), e clamped
    to [0, 254]; NaN -> 255, Inf -> 254. Validates `e8m0_encode`."""
    if math.isnan(v):
        return 255
    if math.isinf(v):
        return 254
    if v <= 2.0 ** -127:
        return 0
    m, ex = math.frexp(v)                   # v = m * 2^ex, 0.5 <= m < 1
    log2_up = ex - 1 if m == 0.5 else ex    # ceil(log2(v))
    return min(log2_up + 127, 254)


def e8m0_floor_rule(amax, fmt):
    """The OCP-MX rule SPEC §4.5 says NOT to use: floor(log2 amax) - emax (a wrong answer for tests)."""
    a = amax.to(F64)
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))) - FP8_EMAX[fmt_of(fmt)] + 127
    return torch.where(a > 0, e, torch.zeros_like(e)).clamp(0, 254).to(torch.uint8)


def e8m0_multiplier(codes):
    """2^(127 - e) as exact FP32 (e = 254 -> 2^-127, a subnormal), via float64 powers of two; 255 -> NaN."""
    c = codes.to(F64)
    m = torch.pow(torch.tensor(2.0, dtype=F64), 127.0 - c)
    return torch.where(codes == 255, torch.full_like(m, math.nan), m).to(F32)


def e8m0_value(codes):
    """2^(e - 127) as exact FP32; 255 -> NaN."""
    c = codes.to(F64)
    m = torch.pow(torch.tensor(2.0, dtype=F64), c - 127.0)
    return torch.where(codes == 255, torch.full_like(m, math.nan), m).to(F32)


def _mx_blocks(v, fmt):
    """Per-row 1x32 block rule on an FP32 [R, K] tensor: (codes [R, K], scale bytes [R, K/32])."""
    R, K = v.shape
    blocks = v.reshape(R, K // MX_BLOCK, MX_BLOCK)
    a = blocks.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)      # NaN ignored, Inf kept
    amax = a.amax(dim=-1) if K else torch.zeros(R, 0, dtype=F32)
    e = e8m0_encode(amax * MX_INV_MAX[fmt_of(fmt)])          # one fp32 multiply, then round up
    q = fp8_encode(blocks * e8m0_multiplier(e)[..., None], fmt)  # one fp32 multiply, then the encoder
    return q.reshape(R, K), e


class MXRef:
    """Reference MXFP8 result: data [M, K] uint8 per copy (None if absent), compact padded scales."""

    def __init__(self, row, row_scale, col, col_scale):
        self.row, self.row_scale, self.col, self.col_scale = row, row_scale, col, col_scale


def quantize_mxfp8_ref(v, fmt, rowwise=True, columnwise=True):
    """SPEC §4.5 on the FP32 values `v` (any shape, last dim % 32 == 0): each copy from `v` independently.
    Columnwise blocks are 32 consecutive rows of one column; a partial last block covers the rows that exist
    (zero rows added for the amax only). Scales are compact, padded with zeros to the §4.8 shapes."""
    fmt = fmt_of(fmt)
    v = v.detach().to(F32).cpu()
    K = v.shape[-1]
    M = v.numel() // K if K else math.prod(v.shape[:-1])
    v2 = v.reshape(M, K)
    (rr, rc), (cr, cc) = mx_scale_shapes(M, K)
    row = row_scale = col = col_scale = None
    if rowwise:
        row, e = _mx_blocks(v2, fmt)
        row_scale = torch.zeros(rr, rc, dtype=torch.uint8)
        row_scale[:M, :K // MX_BLOCK] = e
    if columnwise:
        nb = ceil_div(M, MX_BLOCK)
        padded = torch.zeros(nb * MX_BLOCK, K, dtype=F32)
        padded[:M] = v2
        t = padded.reshape(nb, MX_BLOCK, K).permute(0, 2, 1).reshape(nb * K, MX_BLOCK)  # blocks as rows
        q, e = _mx_blocks(t, fmt)
        col = q.reshape(nb, K, MX_BLOCK).permute(0, 2, 1).reshape(nb * MX_BLOCK, K)[:M].contiguous()
        col_scale = torch.zeros(cr, cc, dtype=torch.uint8)
        col_scale[:nb, :K] = e.reshape(nb, K)
    return MXRef(row, row_scale, col, col_scale)


def swizzle_ref(compact):
    """SPEC §4.8 swizzle of a compact [R, C] matrix (multiples of 128 x 4), element by element: (r, c) goes to byte
    (tile_row * C/4 + tile_col) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4. Returns a flat uint8 tensor."""
    R, C = compact.shape
    r = torch.arange(R).reshape(R, 1).expand(R, C)
    c = torch.arange(C).reshape(1, C).expand(R, C)
    off = ((r // 128) * (C // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    out = torch.zeros(R * C, dtype=torch.uint8)
    out[off.reshape(-1)] = compact.reshape(-1)
    return out


def swizzle_mx_ref(scale, columnwise):
    """Swizzled bytes of a compact MXFP8 scale tensor in its storage shape: columnwise scales are swizzled as
    their transpose [roundup(K, 128), roundup(ceil(M/32), 4)]."""
    return swizzle_ref(scale.t() if columnwise else scale).reshape(scale.shape)


def dequantize_mxfp8_ref(codes, scale, fmt, columnwise, otype):
    """fl(decode(code) * 2^(e - 127)) in FP32, rounded once to otype; `scale` compact."""
    M, K = codes.shape
    if columnwise:
        f = e8m0_value(scale[:ceil_div(M, MX_BLOCK), :K]).repeat_interleave(MX_BLOCK, 0)[:M]
    else:
        f = e8m0_value(scale[:M, :K // MX_BLOCK]).repeat_interleave(MX_BLOCK, 1)
    return (fp8_decode(codes, fmt) * f).to(otype)


# ----------------------------------------------------------------------------------------------
# FP8 block scaling (SPEC §4.7 block rule, §4.8 scale shapes, §4.9 transposed columnwise copy)
# ----------------------------------------------------------------------------------------------
FB_BLOCK = 128


def input_max_finite(dtype):
    """The input dtype's largest finite value as an FP32 0-d tensor (bf16: 0x7F7F0000, fp16: 65504)."""
    return torch.tensor(torch.finfo(dtype).max, dtype=F64).to(F32)


def fb_scale_shapes(M, K, block_dim):
    """(rowwise, columnwise) padded scale shapes of SPEC §4.8."""
    mb, kb = ceil_div(M, FB_BLOCK), ceil_div(K, FB_BLOCK)
    if block_dim == 2:
        return (mb, roundup(kb, 4)), (kb, roundup(mb, 4))
    return (kb, roundup(M, 4)), (mb, roundup(K, 4))


def fb_block_scale(amax, fmt, pow2, eps, in_max):
    """SPEC §4.4 step 3 with §4.7's change, elementwise on an FP32 tensor of block amaxes (NaN already ignored):
    amax < eps -> eps; amax 0 or Inf -> 1; else fl(fp8_max / amax) (one FP32 division), Inf -> in_max;
    pow2 clears the 23 mantissa bits."""
    a = torch.where(amax < torch.tensor(eps, dtype=F32), torch.tensor(eps, dtype=F32), amax)
    special = (a == 0) | torch.isinf(a) | torch.isnan(a)
    safe = torch.where(special, torch.ones_like(a), a)
    s = torch.tensor(FP8_MAX[fmt_of(fmt)], dtype=F32) / safe
    s = torch.where(torch.isinf(s), in_max.expand_as(s), s)
    s = torch.where(special, torch.ones_like(s), s)
    if pow2:
        s = torch.bitwise_and(s.contiguous().view(torch.int32), torch.tensor(-8388608, dtype=torch.int32)).view(F32)
    return s


def _fb_amax(blocks, dims):
    """max |v| over `dims`, NaN ignored (padding zeros never raise it)."""
    a = blocks.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.amax(dim=dims)


def _fb_rows_1x128(v, fmt, pow2, eps, in_max):
    """1x128 blocks along the rows of an FP32 [R, C] matrix: (codes [R, C], scale_inv [R, ceil(C/128)])."""
    R, C = v.shape
    nb = ceil_div(C, FB_BLOCK)
    padded = torch.zeros(R, nb * FB_BLOCK, dtype=F32)
    padded[:, :C] = v
    blocks = padded.reshape(R, nb, FB_BLOCK)
    scale = fb_block_scale(_fb_amax(blocks, -1), fmt, pow2, eps, in_max)      # [R, nb]
    q = fp8_encode(blocks * scale[..., None], fmt).reshape(R, nb * FB_BLOCK)[:, :C]
    return q.contiguous(), torch.ones((), dtype=F32) / scale


class FBRef:
    """Reference FP8 block result: row [M, K] uint8, col [K, M] uint8 (the stored transposed copy), compact padded
    float32 scales; None for an absent copy."""

    def __init__(self, row, row_scale, col, col_scale):
        self.row, self.row_scale, self.col, self.col_scale = row, row_scale, col, col_scale


def quantize_fp8_block_ref(x, fmt, block_dim=2, pow2=True, eps=0.0, rowwise=True, columnwise=True):
    """SPEC §4.7 on `x` (any shape, float32/float16/bfloat16; its dtype sets the Inf-scale replacement): flattened
    to [M, K] (0-d: [1, 1]); q = fp8(fl(x * scale)), scale_inv = fl(1 / scale). 1-D: rowwise 1x128 blocks along K;
    columnwise = x^T [K, M] quantized with 1x128 blocks along its rows. 2-D: one scale per 128x128 tile; the
    columnwise copy is the bitwise transpose. Partial edge blocks use the elements that exist."""
    fmt = fmt_of(fmt)
    in_max = input_max_finite(x.dtype)
    v = x.detach().cpu().to(F32)
    K = v.shape[-1] if v.dim() else 1
    M = math.prod(v.shape[:-1]) if v.dim() else 1
    v = v.reshape(M, K)
    (rr, rc), (cr, cc) = fb_scale_shapes(M, K, block_dim)
    row = row_scale = col = col_scale = None
    if block_dim == 2:
        mb, kb = ceil_div(M, FB_BLOCK), ceil_div(K, FB_BLOCK)
        padded = torch.zeros(mb * FB_BLOCK, kb * FB_BLOCK, dtype=F32)
        padded[:M, :K] = v
        tiles = padded.reshape(mb, FB_BLOCK, kb, FB_BLOCK)
        scale = fb_block_scale(_fb_amax(tiles, (1, 3)), fmt, pow2, eps, in_max)   # [mb, kb]
        q = fp8_encode(tiles * scale[:, None, :, None], fmt).reshape(mb * FB_BLOCK, kb * FB_BLOCK)[:M, :K]
        sinv = torch.ones((), dtype=F32) / scale
        if rowwise:
            row = q.contiguous()
            row_scale = torch.zeros(rr, rc, dtype=F32)
            row_scale[:, :kb] = sinv
        if columnwise:
            col = q.t().contiguous()
            col_scale = torch.zeros(cr, cc, dtype=F32)
            col_scale[:, :mb] = sinv.t()
        return FBRef(row, row_scale, col, col_scale)
    if rowwise:
        row, sinv = _fb_rows_1x128(v, fmt, pow2, eps, in_max)                       # sinv [M, kb]
        row_scale = torch.zeros(rr, rc, dtype=F32)
        row_scale[:, :M] = sinv.t()
    if columnwise:
        col, sinv = _fb_rows_1x128(v.t().contiguous(), fmt, pow2, eps, in_max)      # [K, M], sinv [K, mb]
        col_scale = torch.zeros(cr, cc, dtype=F32)
        col_scale[:, :K] = sinv.t()
    return FBRef(row, row_scale, col, col_scale)


def dequantize_fp8_block_ref(r, fmt, block_dim, shape, otype, columnwise=False):
    """fl(decode(code) * scale_inv[block]) in FP32, rounded once to otype, element by element through explicit
    block indices; the columnwise copy is transposed back to `shape`."""
    fmt = fmt_of(fmt)
    codes, scale = (r.col, r.col_scale) if columnwise else (r.row, r.row_scale)
    R, C = codes.shape
    ri = torch.arange(R).reshape(R, 1).expand(R, C)
    ci = torch.arange(C).reshape(1, C).expand(R, C)
    if block_dim == 2:
        f = scale[ri // FB_BLOCK, ci // FB_BLOCK]   # the stored copy's own tile grid (transposed for columnwise)
    else:
        f = scale[ci // FB_BLOCK, ri]               # [block along the stored row, stored row]
    out = (fp8_decode(codes, fmt) * f).to(otype)
    return (out.t() if columnwise else out).reshape(shape)


# ----------------------------------------------------------------------------------------------
# NVFP4 (SPEC §2 E2M1, §4.6 two-level scaling, SR and RHT, §4.8 scale shapes)
# ----------------------------------------------------------------------------------------------
NV_BLOCK = 16
NV_INV6 = torch.tensor(1.0, dtype=F32) / torch.tensor(6.0, dtype=F32)         # fl(1/6)
NV_INV2688 = torch.tensor(1.0, dtype=F32) / torch.tensor(2688.0, dtype=F32)   # fl(1/2688)
E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
RHT_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]   # SPEC §4.6, as a list


def nv_scale_shapes(M, K):
    return (roundup(M, 128), roundup(K // NV_BLOCK, 4)), (roundup(K, 128), roundup(M // NV_BLOCK, 4))


def e2m1_encode(x):
    """FP32 tensor -> E2M1 nibbles (uint8), SPEC §2: thresholds with ties to even, saturate at 6, sign bit of x
    (-0.0 -> 0x8), NaN -> 0x7."""
    assert x.dtype == F32
    a = x.abs()
    c = torch.full(x.shape, 7, dtype=torch.uint8)
    for thr, code, inclusive in ((5.0, 6, True), (3.5, 5, False), (2.5, 4, True), (1.75, 3, False),
                                 (1.25, 2, True), (0.75, 1, False), (0.25, 0, True)):
        hit = (a <= thr) if inclusive else (a < thr)
        c = torch.where(hit, torch.full_like(c, code), c)
    c = torch.where(torch.signbit(x), c | 0x8, c)
    return torch.where(torch.isnan(x), torch.full_like(c, 0x7), c)


def e2m1_decode(nibbles):
    lut = torch.tensor(E2M1_GRID + [-v for v in E2M1_GRID], dtype=F32)
    return lut[nibbles.long()]


def e2m1_encode_sr(x, r):
    """Stochastic rounding of SPEC §4.6 with random bytes r (int tensor, same shape): a = |x|, u = r/256,
    t = fmaf(u, step(a), a) (exact in float64, then one rounding to FP32), q = min(floor(t/step(t))*step(t), 6)."""
    a = x.abs()
    step = lambda v: torch.where(v < 2, torch.full_like(v, 0.5), torch.where(v < 4, torch.ones_like(v),  # noqa: E731
                                                                                torch.full_like(v, 2.0)))
    u = r.to(F64) / 256.0
    t = (u * step(a).to(F64) + a.to(F64)).to(F32)  # the fused multiply-add: exact product and sum, one rounding
    st = step(t)
    q = torch.clamp(torch.floor(t / st) * st, max=6.0)
    c = e2m1_encode(q)
    c = torch.where(torch.signbit(x), c | 0x8, c)
    return torch.where(torch.isnan(x), torch.full_like(c, 0x7), c)


def nv_pack(codes):
    """[R, K] nibbles -> [R, K/2] bytes, even element in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def nv_unpack(packed):
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)


def nv_global_scale(amax):
    """S_enc = min(fl(2688 / amax), FLT_MAX); 1 when amax == 0 or S_enc == 0 (FP32 tensor ops)."""
    amax = torch.as_tensor(amax, dtype=F32)
    s = torch.tensor(2688.0, dtype=F32) / amax
    s = torch.clamp(s, max=FLT_MAX)
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


def philox4x32_10(ctr, key):
    """Philox4x32-10 on Python ints (4 counter words, 2 key words)."""
    m = 0xFFFFFFFF
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & m, p1 & m, ((p0 >> 32) ^ c3 ^ k1) & m, p0 & m
        k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
    return [c0, c1, c2, c3]


def nv_block_random_bytes(seed, offset, n_blocks, copy):
    """[n_blocks, 16] random bytes: block b of copy 0 (rowwise) / 1 (columnwise) draws Philox at counter
    (b lo, b hi | copy << 31, offset lo, offset hi), key (seed lo, seed hi); byte j drives element j."""
    out = torch.zeros(n_blocks, 16, dtype=torch.int64)
    for b in range(n_blocks):
        w = philox4x32_10([b & 0xFFFFFFFF, (b >> 32) | (copy << 31), offset & 0xFFFFFFFF, offset >> 32],
                          [seed & 0xFFFFFFFF, seed >> 32])
        for j in range(16):
            out[b, j] = (w[j // 4] >> (8 * (j % 4))) & 0xFF
    return out


def rht_ref(v, sign_mask_on=True):
    """SPEC §4.6 transform of each contiguous 16-vector of the rows of v [R, C] (FP32, C % 16 == 0):
    w_i = fl(v_i * s_i / 4) (exact), y_j = w_0 * H[0][j] + w_1 * H[1][j] + ... in FP32 in index order, rounded
    to bf16 (returned widened to FP32)."""
    R, C = v.shape
    s = torch.tensor(RHT_SIGNS if sign_mask_on else [1] * 16, dtype=F32)
    idx = torch.arange(16)
    h = torch.tensor([[(-1.0) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], dtype=F32)
    w = v.reshape(R, C // 16, 16) * s * 0.25
    acc = w[..., 0:1] * h[0]
    for i in idx[1:].tolist():
        acc = acc + w[..., i:i + 1] * h[i]
    return acc.to(torch.bfloat16).to(F32).reshape(R, C)


def rht_matrix_ref(sign_mask_on=True):
    """R = diag(s) * H16 / 4 in float64."""
    s = torch.tensor(RHT_SIGNS if sign_mask_on else [1] * 16, dtype=F64)
    h = torch.tensor([[(-1.0) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], dtype=F64)
    return s[:, None] * h / 4


def _nv_copy(v, amax, two_d_tile_amax=None, rbytes=None):
    """1x16 blocks along the rows of the FP32 [R, C] values v with global amax `amax`: (packed [R, C/2],
    scale bytes [R, C/16]). `two_d_tile_amax` [R, C/16] replaces the block amaxes (2-D tiles); `rbytes`
    [R * C/16, 16] random bytes switch to stochastic rounding."""
    R, C = v.shape
    s_enc = nv_global_scale(amax)
    s_dec = torch.tensor(1.0, dtype=F32) / s_enc
    blocks = v.reshape(R, C // NV_BLOCK, NV_BLOCK)
    a = torch.where(torch.isnan(blocks), torch.zeros_like(blocks), blocks.abs())
    bamax = a.amax(dim=-1) if two_d_tile_amax is None else two_d_tile_amax
    sf = fp8_encode(bamax * (s_enc * NV_INV6), "e4m3")                       # two fp32 ops, then RNE E4M3
    enc = torch.tensor(1.0, dtype=F32) / (fp8_decode(sf, "e4m3") * s_dec)      # fl(1 / fl(sf * S_dec))
    enc = torch.clamp(enc, max=FLT_MAX)
    scaled = blocks * enc[..., None]
    if rbytes is None:
        codes = e2m1_encode(scaled)
    else:
        codes = e2m1_encode_sr(scaled, rbytes.reshape(R, C // NV_BLOCK, NV_BLOCK))
    return nv_pack(codes.reshape(R, C)), sf


class NVRef:
    def __init__(self, row, row_scale, col, col_scale, amax_row, amax_col):
        self.row, self.row_scale, self.col, self.col_scale = row, row_scale, col, col_scale
        self.amax_row, self.amax_col = amax_row, amax_col


def quantize_nvfp4_ref(x, rowwise=True, columnwise=True, two_d=False, rht=False, sign_mask_on=True, amax=None,
                       data=None, seed=None, offset=0):
    """SPEC §4.6 on x (any shape, last dim % 16 == 0): data packed, scales compact and zero-padded to §4.8.
    `data` (default x) are the values encoded; `amax` (default amax(x)) the global amax of both copies when no RHT
    (the fused activation path passes the unrounded activation's amax). `seed` switches on stochastic rounding
    with the Philox stream of (seed, offset). Returns NVRef with float32 [1] amaxes."""
    x = x.detach().cpu().to(F32)
    K = x.shape[-1]
    M = x.numel() // K if K else 0
    v = (x if data is None else data.detach().cpu().to(F32)).reshape(M, K)
    g_row = amax_ref(x) if amax is None else torch.as_tensor(amax, dtype=F32).reshape(())
    (rr, rc), (cr, cc) = nv_scale_shapes(M, K)
    tile = None
    if two_d:
        nb = ceil_div(M, NV_BLOCK)
        pad = torch.zeros(nb * NV_BLOCK, K, dtype=F32)
        pad[:M] = torch.where(torch.isnan(v), torch.zeros_like(v), v.abs())
        tile = pad.reshape(nb, NV_BLOCK, K // NV_BLOCK, NV_BLOCK).amax(dim=(1, 3))     # [M/16, K/16]
    out = NVRef(None, None, None, None, None, None)
    if rowwise:
        t = None if tile is None else tile.repeat_interleave(NV_BLOCK, 0)[:M]
        rb = None if seed is None else nv_block_random_bytes(seed, offset, M * (K // NV_BLOCK), 0)
        out.row, sf = _nv_copy(v, g_row, t, rb)
        out.row_scale = torch.zeros(rr, rc, dtype=torch.uint8)
        out.row_scale[:M, :K // NV_BLOCK] = sf
        out.amax_row = g_row.reshape(1).clone()
    if columnwise:
        vt = v.t().contiguous()                       # [K, M]
        if rht:
            vt = rht_ref(vt, sign_mask_on)
            g_col = amax_ref(vt)
        else:
            g_col = g_row
        t = None if tile is None else tile.t().repeat_interleave(NV_BLOCK, 0)
        rb = None if seed is None else nv_block_random_bytes(seed, offset, K * (M // NV_BLOCK), 1)
        out.col, sf = _nv_copy(vt, g_col, t, rb)
        out.col_scale = torch.zeros(cr, cc, dtype=torch.uint8)
        out.col_scale[:K, :M // NV_BLOCK] = sf
        out.amax_col = g_col.reshape(1).clone()
    return out


NV_INV_FLT_MAX = torch.tensor(1.0, dtype=F32) / torch.tensor(FLT_MAX, dtype=F32)   # fl(1/FLT_MAX) = 2^-128


def nv_decode_factors_ref(sf, amax, formula="ours"):
    """Per-block FP32 decode factor D of one NVFP4 copy (dequantized x = fl(e2m1 * D)); sf: float32 block scales
    (decoded E4M3), amax: the copy's global amax.
    formula="te": TE's D = fl(fl(sf * amax) * fl(1/2688)) (SPEC §4.6), which overflows once sf * amax does (amax
    above FLT_MAX/448, about 7.6e35) and is Inf/NaN for every block when amax is Inf.
    formula="ours" (the rule NVFP4Tensor.dequantize follows): D = the TE value where the quantizer's scales are
    the ones TE's formula assumes and that value is finite -- amax finite and > 0, fl(2688 / amax) finite (S_enc
    not clamped to FLT_MAX), the block's element multiplier enc = min(fl(1 / fl(sf * S_dec)), FLT_MAX) not clamped
    -- and the reciprocal of the multiplier the quantizer applied everywhere else, case by case:
      sf = 0 (a block of zeros / NaNs)                 -> D = 0 (the codes are 0 or NaN's 0x7)
      enc clamped to FLT_MAX                           -> D = fl(1 / enc) = fl(1/FLT_MAX) = 2^-128
      otherwise                                        -> D = fl(sf * S_dec), S_dec = fl(1 / S_enc) of the quantizer
    (amax 0 or Inf: S_enc = 1, so D = sf)."""
    sf = sf.to(F32)
    amax = torch.as_tensor(amax, dtype=F32).reshape(())
    te = (sf * amax) * NV_INV2688                                  # two fp32 multiplies
    if formula == "te":
        return te
    assert formula == "ours", formula
    s_enc = nv_global_scale(amax)
    s_dec = torch.tensor(1.0, dtype=F32) / s_enc
    y = sf * s_dec                                                 # fl(sf * S_dec)
    enc = torch.clamp(torch.tensor(1.0, dtype=F32) / y, max=FLT_MAX)   # the quantizer's multiplier (as in _nv_copy)
    enc_clamped = enc == FLT_MAX
    global_ok = bool(torch.isfinite(amax)) and float(amax) > 0 and \
        bool(torch.isfinite(torch.tensor(2688.0, dtype=F32) / amax))
    recip = torch.where(sf == 0, torch.zeros_like(y), torch.where(enc_clamped, NV_INV_FLT_MAX.expand_as(y), y))
    keep_te = torch.isfinite(te) & ~enc_clamped & global_ok
    return torch.where(keep_te, te, recip)


def dequantize_nvfp4_ref(packed, scale, amax, otype=F32, formula="ours"):
    """x = fl(e2m1 * D) on one copy [R, C/2], rounded once to otype; D per block from `nv_decode_factors_ref`
    (formula "te": TE's fl(fl(float(sf) * amax) * fl(1/2688)) of SPEC §4.6 everywhere)."""
    R, C = packed.shape[0], packed.shape[1] * 2
    sf = fp8_decode(scale[:R, :C // NV_BLOCK].contiguous(), "e4m3")
    f = nv_decode_factors_ref(sf, amax, formula).repeat_interleave(NV_BLOCK, 1)
    return (e2m1_decode(nv_unpack(packed)) * f).to(otype)
