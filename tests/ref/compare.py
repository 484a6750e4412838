"""Comparisons: tolerances (SPEC §9), the RN-forgiving FP8 code rule (§5.2), exact bytes and bitwise equality. Each
assertion can also be handed a wrong answer, which it must reject."""
import torch

from .common import F32, F64
from .fp8 import fp8_is_nan_code, fp8_ordinal

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
