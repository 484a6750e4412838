"""FP8 E4M3 / E5M2 encode and decode (SPEC §2): the tensor encoder and a second, torch-free float64 implementation
that validates it (tests/ref/test_reference.py), the format's values, boundary inputs and code order.

FP8 encode = clamp to +-fp8_max (saturate, Inf included), then torch's RNE `.to(float8)`, then NaN -> 0x7F whatever
its sign. Formats are named "e4m3" / "e5m2"; `fmt_of` converts torch dtypes, DType ints and names."""
import math

import torch

from .common import F32, FLT_MAX

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
