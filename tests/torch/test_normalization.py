"""LayerNorm / RMSNorm (SPEC §11; docs/torch.md "Normalization"): statistics against the float64 references of
tests/ref/normalization.py, the output bit for bit against the FP32 output step of the kernel's own statistics
(norm_output_f32), each quantized format's bytes against tex.quantize of that FP32 y (an independent composition),
the backward against the float64 backward, CPU == CUDA bytes, opcheck / compile, and every bad-input rule."""
import math

import pytest
import torch

from tests.ref.normalization import layernorm_fwd_ref, norm_bwd_ref, norm_output_f32, rmsnorm_fwd_ref
from tests.torch.helpers import DTYPE_PARAMS, HAS_CUDA, tex_module, uniform

tex = tex_module()
EPS = 1e-5


def _inputs(shape, dtype, gdtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = uniform(shape, dtype, device, g=g)
    h = shape[-1]
    gamma = uniform((h,), gdtype, device, lo=-1.5, hi=1.5, g=g)
    beta = uniform((h,), gdtype, device, lo=-0.5, hi=0.5, g=g)
    return x, gamma, beta


def _fwd(kind, x, gamma, beta, q=None, otype=torch.float32, zc=False, eps=EPS, ln_out=None):
    if kind == "ln":
        return tex.layernorm_fwd(x, gamma, beta, eps, ln_out, q, otype, 0, zc)
    return tex.rmsnorm_fwd(x, gamma, eps, ln_out, q, otype, 0, zc)


def _y32(kind, x, mu, rsigma, gamma, beta, zc=False):
    """The FP32 y SPEC §11 prescribes from the kernel's own statistics (x's leading shape kept)."""
    h = x.shape[-1]
    lead = x.shape[:-1]
    return norm_output_f32(x, None if kind == "rms" else mu.reshape(lead), rsigma.reshape(lead), gamma,
                           None if kind == "rms" else beta, zc).reshape(*lead, h)


def _fields(qt):
    """The quantized tensor's buffers by attribute name (data, scales, amaxes)."""
    return {k: v for k, v in vars(qt).items() if isinstance(v, torch.Tensor)}


def _assert_same_quantized(a, b, what):
    assert type(a) is type(b), what
    fa, fb = _fields(a), _fields(b)
    assert fa.keys() == fb.keys(), what
    assert fa, what
    for k in fa:
        assert fa[k].dtype == fb[k].dtype and fa[k].shape == fb[k].shape, f"{what}: {k}"
        assert torch.equal(fa[k].cpu(), fb[k].cpu()), f"{what}: {k} differs"


# ---- forward: statistics and plain output ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("shape", [(3, 5, 40), (4, 1000)], ids=["h40", "h1000"])
def test_forward_plain(kind, dtype, shape):
    x, gamma, beta = _inputs(shape, dtype)
    for zc in (False, True):
        out, mu, rsigma = _fwd(kind, x, gamma, beta, zc=zc)
        rows = math.prod(shape[:-1])
        assert out.dtype == torch.float32 and out.shape == x.shape
        assert rsigma.dtype == torch.float32 and rsigma.shape == (rows,)
        if kind == "ln":
            y64, mu64, rs64 = layernorm_fwd_ref(x, gamma, beta, EPS, zc)
            assert mu.shape == (rows,)
            torch.testing.assert_close(mu.double(), mu64.reshape(-1), rtol=1e-5, atol=1e-6)
        else:
            assert mu is None
            y64, rs64 = rmsnorm_fwd_ref(x, gamma, EPS, zc)
        torch.testing.assert_close(rsigma.double(), rs64.reshape(-1), rtol=1e-5, atol=0)
        y = _y32(kind, x, mu, rsigma, gamma, beta, zc)
        assert torch.equal(out, y), "FP32 output differs from norm_output_f32 of the kernel's statistics"
        torch.testing.assert_close(out.double(), y64, rtol=1e-4, atol=1e-4)
        # otype = the input dtype (and as a tex.DType): y rounded once.
        out16, _, _ = _fwd(kind, x, gamma, beta, otype=tex.DType(int({torch.float32: 4, torch.float16: 5,
                                                                        torch.bfloat16: 6}[dtype])), zc=zc)
        assert out16.dtype == dtype and torch.equal(out16, y.to(dtype))
    # A wrong answer fails: the output of -x.
    assert not torch.equal(_fwd(kind, -x, gamma, beta)[0], _y32(kind, x, mu, rsigma, gamma, beta))


def test_forward_ln_out_and_gamma_dtype():
    x, gamma, beta = _inputs((6, 48), torch.bfloat16, gdtype=torch.bfloat16)
    ln_out = torch.empty(6, 48, dtype=torch.bfloat16)
    out, mu, rsigma = tex.layernorm_fwd(x, gamma, beta, EPS, ln_out, None, torch.bfloat16, 0, False)
    assert out is ln_out
    assert torch.equal(ln_out, _y32("ln", x, mu, rsigma, gamma, beta).to(torch.bfloat16))


# ---- forward: every format equals tex.quantize of the FP32 y -------------------------------------------------------
def _quantizers():
    def delayed(fmt, rw=True, cw=True):
        return tex.Float8Quantizer(torch.tensor([2.5]), torch.tensor([0.25]), fmt, rowwise=rw, columnwise=cw)

    e4, e5 = tex.DType.kFloat8E4M3, tex.DType.kFloat8E5M2
    return {
        "fp8_delayed": lambda: delayed(e4),
        "fp8_delayed_row_e5m2": lambda: delayed(e5, cw=False),
        "fp8_current": lambda: tex.Float8CurrentScalingQuantizer(e4),
        "fp8_current_row_pow2": lambda: tex.Float8CurrentScalingQuantizer(e5, columnwise=False, force_pow_2_scales=True),
        "mxfp8": lambda: tex.MXFP8Quantizer(e4),
        "mxfp8_row": lambda: tex.MXFP8Quantizer(e5, columnwise=False),
        "nvfp4": lambda: tex.NVFP4Quantizer(),
        "fp8_block_1d": lambda: tex.Float8BlockQuantizer(e4, block_scaling_dim=1),
        "fp8_block_2d": lambda: tex.Float8BlockQuantizer(e4, block_scaling_dim=2),
    }


QUANTIZERS = _quantizers()


@pytest.mark.parametrize("qname", list(QUANTIZERS))
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_formats_equal_quantize_of_y(qname, kind):
    x, gamma, beta = _inputs((32, 64), torch.bfloat16, seed=1)
    q, q_ref = QUANTIZERS[qname](), QUANTIZERS[qname]()
    zc = kind == "rms"
    out, mu, rsigma = _fwd(kind, x, gamma, beta, q=q, otype=torch.bfloat16, zc=zc)
    y = _y32(kind, x, mu, rsigma, gamma, beta, zc)
    ref = tex.quantize(y, q_ref)
    _assert_same_quantized(out, ref, qname)
    if hasattr(q, "amax") and isinstance(getattr(q, "amax"), torch.Tensor):
        assert torch.equal(q.amax, q_ref.amax)  # delayed scaling: the amax of y accumulated in place
    # ... and differs from the quantization of a wrong y.
    wrong = tex.quantize(-y, QUANTIZERS[qname]())
    assert any(not torch.equal(a, b) for a, b in zip(_fields(out).values(), _fields(wrong).values()))


def test_quantized_ln_out():
    x, gamma, beta = _inputs((16, 64), torch.float32, seed=2)
    q = tex.MXFP8Quantizer(tex.DType.kFloat8E4M3)
    ln_out = q.make_empty((16, 64), dtype=torch.float32, device="cpu")
    out, mu, rsigma = tex.layernorm_fwd(x, gamma, beta, EPS, ln_out, q, torch.float32, 0, False)
    assert out is ln_out
    _assert_same_quantized(out, tex.quantize(_y32("ln", x, mu, rsigma, gamma, beta), q), "ln_out")


# ---- backward ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_backward(kind, dtype):
    x, gamma, beta = _inputs((70, 72), dtype, seed=3)
    dz = uniform((70, 72), dtype, g=torch.Generator().manual_seed(9))
    tol = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1.6e-2, 2e-2)}[dtype]
    for zc in (False, True):
        _, mu, rsigma = _fwd(kind, x, gamma, beta, zc=zc)
        if kind == "ln":
            dx, dgamma, dbeta = tex.layernorm_bwd(dz, x, mu, rsigma, gamma, 0, zc)
        else:
            dx, dgamma = tex.rmsnorm_bwd(dz, x, rsigma, gamma, 0, zc)
        dx64, dg64, db64 = norm_bwd_ref(dz, x, mu, rsigma, gamma, zc)
        assert dx.dtype == dtype and dgamma.dtype == gamma.dtype
        torch.testing.assert_close(dx.double(), dx64, rtol=tol[0], atol=tol[1])
        torch.testing.assert_close(dgamma.double(), dg64, rtol=1e-4, atol=1e-3)
        if kind == "ln":
            torch.testing.assert_close(dbeta.double(), db64, rtol=1e-4, atol=1e-3)
    with pytest.raises(AssertionError):  # a wrong answer fails
        torch.testing.assert_close(dx.double(), -dx64, rtol=tol[0], atol=tol[1])


def test_empty_rows():
    x, gamma, beta = _inputs((0, 32), torch.float32)
    out, mu, rsigma = _fwd("ln", x, gamma, beta)
    assert out.shape == (0, 32) and mu.shape == (0,) and rsigma.shape == (0,)
    dx, dgamma, dbeta = tex.layernorm_bwd(x, x, mu, rsigma, gamma, 0, False)
    assert dx.shape == (0, 32) and torch.equal(dgamma, torch.zeros(32)) and torch.equal(dbeta, torch.zeros(32))


# ---- CPU == CUDA -----------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("h", [40, 64, 1000, 3000, 4096, 8192, 20000])
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_cuda_equals_cpu(kind, h):
    rows = 33 if h < 10000 else 5
    for dtype in (torch.float32, torch.bfloat16):
        x, gamma, beta = _inputs((rows, h), dtype, seed=h)
        dz = uniform((rows, h), dtype, g=torch.Generator().manual_seed(h + 1))
        qnames = ["plain"] + ([n for n in QUANTIZERS if n != "nvfp4" or rows % 16 == 0] if h % 64 == 0 else
                              ["fp8_delayed", "fp8_delayed_row_e5m2", "fp8_current_row_pow2", "fp8_block_1d"])
        for qname in qnames:
            res = {}
            for dev in ("cpu", "cuda"):
                q = None if qname == "plain" else QUANTIZERS[qname]()
                if q is not None:
                    for k, v in vars(q).items():
                        if isinstance(v, torch.Tensor):
                            setattr(q, k, v.to(dev))
                args = [t.to(dev) for t in (x, gamma, beta)]
                res[dev] = _fwd(kind, *args, q=q, otype=dtype, zc=True)
            cpu_r, cuda_r = res["cpu"], res["cuda"]
            if qname == "plain":
                assert torch.equal(cpu_r[0], cuda_r[0].cpu()), f"{qname} h={h}"
            else:
                _assert_same_quantized(cpu_r[0], cuda_r[0], f"{qname} h={h}")
            assert torch.equal(cpu_r[2], cuda_r[2].cpu())
            if kind == "ln":
                assert torch.equal(cpu_r[1], cuda_r[1].cpu())
        _, mu, rsigma = _fwd(kind, x, gamma, beta)
        if kind == "ln":
            cpu_b = tex.layernorm_bwd(dz, x, mu, rsigma, gamma, 0, True)
            cuda_b = tex.layernorm_bwd(dz.cuda(), x.cuda(), mu.cuda(), rsigma.cuda(), gamma.cuda(), 0, True)
        else:
            cpu_b = tex.rmsnorm_bwd(dz, x, rsigma, gamma, 0, True)
            cuda_b = tex.rmsnorm_bwd(dz.cuda(), x.cuda(), rsigma.cuda(), gamma.cuda(), 0, True)
        for a, b in zip(cpu_b, cuda_b):
            assert torch.equal(a, b.cpu()), f"backward h={h} {dtype}"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_cuda_equals_cpu_bwd_reduce_groups(kind):
    """dgamma / dbeta over 75 partial rows (300 rows of 4): three reduction groups, the last one partial."""
    x, gamma, beta = _inputs((300, 64), torch.bfloat16, seed=3)
    dz = uniform((300, 64), torch.bfloat16, g=torch.Generator().manual_seed(4))
    _, mu, rsigma = _fwd(kind, x, gamma, beta)
    args = (dz, x, mu, rsigma, gamma) if kind == "ln" else (dz, x, rsigma, gamma)
    fn = tex.layernorm_bwd if kind == "ln" else tex.rmsnorm_bwd
    cpu_b, cuda_b = fn(*args, 0, False), fn(*(t.cuda() for t in args), 0, False)
    for a, b in zip(cpu_b, cuda_b):
        assert torch.equal(a, b.cpu())


# ---- opcheck and torch.compile -----------------------------------------------------------------------------------
def test_opcheck():
    x, gamma, beta = _inputs((8, 64), torch.bfloat16)
    dz = uniform((8, 64), torch.bfloat16)
    spec_none = (0, 7, True, True)
    spec_mx = (3, 7, True, True)
    torch.library.opcheck(torch.ops.te.layernorm_fwd.default, (x, gamma, beta, EPS, 6, 0, False, *spec_none))
    torch.library.opcheck(torch.ops.te.rmsnorm_fwd.default, (x, gamma, EPS, 4, 0, True, *spec_mx))
    _, mu, rsigma = _fwd("ln", x, gamma, beta)
    torch.library.opcheck(torch.ops.te.layernorm_bwd.default, (dz, x, mu, rsigma, gamma, 0, False))
    torch.library.opcheck(torch.ops.te.rmsnorm_bwd.default, (dz, x, rsigma, gamma, 0, False))


def test_compile_fullgraph():
    x, gamma, beta = _inputs((8, 64), torch.float32)
    q = tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, columnwise=False)

    def f(x, gamma, beta):
        y, mu, rs = tex.layernorm_fwd(x, gamma, beta, EPS, None, None, torch.bfloat16, 0, False)
        yq, _, rs2 = tex.rmsnorm_fwd(x, gamma, EPS, None, q, torch.float32, 0, False)
        dx, dg, db = tex.layernorm_bwd(x, x, mu, rs, gamma, 0, False)
        return y, mu, rs, yq._data, yq._scale_inv, rs2, dx, dg, db

    eager = f(x, gamma, beta)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x, gamma, beta)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


# ---- bad input ---------------------------------------------------------------------------------------------------
def test_bad_inputs():
    x, gamma, beta = _inputs((4, 64), torch.float32)
    ln_out = torch.full((4, 64), 7.0)
    amax = torch.tensor([0.5])
    qd = tex.Float8Quantizer(torch.tensor([1.0]), amax, tex.DType.kFloat8E4M3)
    cases = [
        (lambda: tex.layernorm_fwd(x, gamma[:32], beta, EPS, ln_out, None, torch.float32, 0, False),
         ValueError, r"weight \(gamma\) has shape \[32\].*is 64"),
        (lambda: tex.layernorm_fwd(x, gamma, beta[:8], EPS, ln_out, None, torch.float32, 0, False),
         ValueError, r"bias \(beta\) has shape \[8\]"),
        (lambda: tex.rmsnorm_fwd(x, gamma, 0.0, ln_out, qd, torch.float32, 0, False), ValueError, "eps must be"),
        (lambda: tex.rmsnorm_fwd(x, gamma, -1e-5, ln_out, None, torch.float32, 0, False), ValueError, "eps must be"),
        (lambda: tex.rmsnorm_fwd(x, gamma, float("nan"), ln_out, None, torch.float32, 0, False), ValueError,
         "eps must be"),
        (lambda: tex.rmsnorm_fwd(x[:, :48], gamma[:48], EPS, None, tex.MXFP8Quantizer(tex.DType.kFloat8E4M3),
                                 torch.float32, 0, False), ValueError, "MXFP8 E4M3.*multiple of 32.*hidden size 48"),
        (lambda: tex.rmsnorm_fwd(x[:, :24], gamma[:24], EPS, None, tex.NVFP4Quantizer(), torch.float32, 0, False),
         ValueError, "NVFP4.*multiple of 16.*hidden size 24"),
        (lambda: tex.layernorm_fwd(x, gamma, beta.half(), EPS, ln_out, None, torch.float32, 0, False), TypeError,
         r"bias \(beta\) dtype Half must match weight \(gamma\) dtype Float"),
        (lambda: tex.layernorm_fwd(x.double(), gamma, beta, EPS, ln_out, None, torch.float32, 0, False), TypeError,
         "input must be float32"),
        (lambda: tex.layernorm_fwd(x, gamma, beta, EPS, ln_out, None, torch.int32, 0, False), TypeError, "otype"),
        (lambda: tex.layernorm_fwd(x, gamma, beta, EPS, torch.empty(4, 32), None, torch.float32, 0, False),
         ValueError, "ln_out must be"),
        (lambda: tex.layernorm_fwd(x[0, 0], gamma[:1], beta[:1], EPS, None, None, torch.float32, 0, False),
         ValueError, "rank >= 1"),
    ]
    _, mu, rsigma = _fwd("ln", x, gamma, beta)
    cases += [
        (lambda: tex.layernorm_bwd(x.half(), x, mu, rsigma, gamma, 0, False), TypeError, "dz dtype Half must match x"),
        (lambda: tex.layernorm_bwd(x[:2], x, mu, rsigma, gamma, 0, False), ValueError, r"dz has shape \[2, 64\]"),
        (lambda: tex.layernorm_bwd(x, x, mu.half(), rsigma, gamma, 0, False), TypeError, "mu must be Float"),
        (lambda: tex.layernorm_bwd(x, x, mu, rsigma[:3], gamma, 0, False), ValueError, r"rsigma has shape \[3\]"),
        (lambda: tex.rmsnorm_bwd(x, x, rsigma, gamma[:5], 0, False), ValueError, r"gamma has shape \[5\]"),
    ]
    for fn, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            fn()
    assert torch.equal(ln_out, torch.full((4, 64), 7.0)) and torch.equal(amax, torch.tensor([0.5]))  # nothing written
