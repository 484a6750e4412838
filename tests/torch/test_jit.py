"""transformer_engine_torch.jit (SPEC §7): each helper against its formula in float64, compiled
(NVTE_TORCH_COMPILE=1, the default) and eager (NVTE_TORCH_COMPILE=0, module reloaded), and the decorators."""
import importlib
import math
import warnings

import pytest
import torch

from tests.torch.helpers import DEVICE_PARAMS, tex_module

tex_module()
import transformer_engine_torch.jit as jit_default  # noqa: E402

# bf16: eager rounds every intermediate to bf16 (SPEC §7), so the dbias-style x4 rtol and a wider atol.
TOL = {torch.float32: dict(rtol=1.3e-6 * 4, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2 * 4, atol=4e-2)}
C = math.sqrt(2 / math.pi)


@pytest.fixture(params=["compiled", "eager"], scope="module")
def jitmod(request):
    """The jit module with NVTE_TORCH_COMPILE=1 (as imported) or =0 (a reloaded copy)."""
    if request.param == "compiled":
        assert jit_default.TORCH_COMPILE and getattr(jit_default.gelu_fused_, "_te_lazy_compile", False)
        yield jit_default
        return
    mp = pytest.MonkeyPatch()
    mp.setenv("NVTE_TORCH_COMPILE", "0")
    spec = importlib.util.find_spec("transformer_engine_torch.jit")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # a separate copy: the imported module keeps its compiled helpers
    mp.undo()
    assert not mod.TORCH_COMPILE and not hasattr(mod.gelu_fused_, "_te_lazy_compile")
    yield mod


def acts64():
    sig = torch.sigmoid
    return {
        "gelu": (lambda x: 0.5 * x * (1 + torch.tanh(C * (x + 0.044715 * x ** 3))),
                 lambda x: 0.5 * (1 + torch.tanh(C * (x + 0.044715 * x ** 3)))
                 + 0.5 * x * (1 - torch.tanh(C * (x + 0.044715 * x ** 3)) ** 2) * C * (1 + 3 * 0.044715 * x ** 2)),
        "silu": (lambda x: x * sig(x), lambda x: sig(x) * (1 + x * (1 - sig(x)))),
        "relu": (torch.relu, lambda x: (x > 0).double()),
        "qgelu": (lambda x: x * sig(1.702 * x), lambda x: sig(1.702 * x) * (1 + 1.702 * x * (1 - sig(1.702 * x)))),
        "srelu": (lambda x: torch.relu(x) ** 2, lambda x: 2 * torch.relu(x)),
    }


def data(shape, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 6 - 3).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["gelu", "silu", "relu", "qgelu", "srelu"])
def test_bias_act_helpers_match_formula(jitmod, device, name, dtype):
    f, df = acts64()[name]
    x = data((33, 40), dtype, 1, device)
    b = data((40,), dtype, 2, device)
    g = data((33, 40), dtype, 3, device)
    z = x.double() + b.double()
    tol = TOL[dtype]
    if dtype == torch.bfloat16:  # eager rounds every intermediate to bf16: compare against the rounded input sum
        z = (x + b).double()
    torch.testing.assert_close(getattr(jitmod, f"bias_{name}_fused")(x, b).double(), f(z), **tol)
    torch.testing.assert_close(getattr(jitmod, f"bias_{name}_fused")(x, None).double(), f(x.double()), **tol)
    torch.testing.assert_close(getattr(jitmod, f"{name}_fused_")(x).double(), f(x.double()), **tol)
    bgrad, dx = getattr(jitmod, f"bgrad_d{name}_fused")(g, x, b)
    want = df(z) * g.double()
    torch.testing.assert_close(dx.double(), want, **tol)
    torch.testing.assert_close(bgrad.double(), want.sum(0), rtol=tol["rtol"] * 4, atol=tol["atol"] * 33)
    none, dx0 = getattr(jitmod, f"bgrad_d{name}_fused")(g, x, torch.empty(0, dtype=dtype, device=device))
    assert none is None
    torch.testing.assert_close(dx0.double(), df(x.double()) * g.double(), **tol)
    torch.testing.assert_close(getattr(jitmod, f"d{name}_fused_")(g, x).double(), df(x.double()) * g.double(), **tol)
    # Wrong answer fails: the derivative of -x.
    with pytest.raises(AssertionError):
        torch.testing.assert_close(dx.double(), df(-z) * g.double(), **tol)


def test_exact_points(jitmod):
    z = torch.zeros(4)
    assert torch.equal(jitmod.bias_gelu_fused(z, None), z)
    assert torch.equal(jitmod.bgrad_dgelu_fused(torch.ones(4), z, None)[1], torch.full((4,), 0.5))
    assert torch.equal(jitmod.bgrad_drelu_fused(torch.ones(4), z, None)[1], z)
    assert torch.equal(jitmod.bgrad_dsrelu_fused(torch.ones(4), -torch.ones(4), None)[1], z)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_l2normalization(jitmod, device, dtype):
    x = data((3, 5, 64), dtype, 4, device)
    dy = data((3, 5, 64), dtype, 5, device)
    eps = 1e-6
    xd, dyd = x.double(), dy.double()
    s = (xd * xd).sum(-1, keepdim=True) + eps
    r = s.rsqrt()
    tol = TOL[dtype]
    y = jitmod.l2normalization_fused(x, eps)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), xd * r, **tol)
    y2, rn = jitmod.l2normalization_fwd_fused(x, eps)
    assert rn.dtype == torch.float32 and rn.shape == (3, 5, 1)
    torch.testing.assert_close(y2, y)
    torch.testing.assert_close(rn.double(), r, rtol=1e-6, atol=0)
    dx = jitmod.l2normalization_backward_fused(dy, x, rn, eps)
    want = r * (dyd - xd * (xd * dyd).sum(-1, keepdim=True) / s)
    torch.testing.assert_close(dx.double(), want, **tol)
    # Against autograd of the float64 forward.
    xr = xd.clone().requires_grad_()
    (xr * ((xr * xr).sum(-1, keepdim=True) + eps).rsqrt()).backward(dyd)
    torch.testing.assert_close(dx.double(), xr.grad, **tol)


def test_bias_dropout_add(jitmod, device):
    x = data((8, 2, 64), torch.float32, 6, device)
    b = data((64,), torch.float32, 7, device)
    res = data((8, 2, 64), torch.float32, 8, device)
    want = res + x + b
    torch.testing.assert_close(jitmod.bias_dropout_add_fused_inference(x, b, res, 0.3), want)
    torch.testing.assert_close(jitmod.get_bias_dropout_add(False)(x, b, res, 0.3), want)
    torch.testing.assert_close(jitmod.bias_dropout_add(x, b, res, 0.3, False), want)
    for fn in (jitmod.bias_dropout_add_fused_train, jitmod.get_bias_dropout_add(True)):
        out = fn(x, b, res, 0.5)
        kept = (out - res)
        nz = kept != 0
        # Kept values are (x + b) / (1 - p); about half are dropped.
        torch.testing.assert_close(kept[nz], ((x + b) / 0.5)[nz], rtol=1e-6, atol=1e-6)
        assert 0.35 < nz.float().mean().item() < 0.65
    xg = x.clone().requires_grad_()
    with torch.no_grad():  # the train wrapper enables grad itself
        out = jitmod.bias_dropout_add_fused_train(xg, b, res, 0.0)
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(xg.grad, torch.ones_like(x))


def test_compiled_and_eager_agree():
    """NVTE_TORCH_COMPILE=0 gives the same results within dtype tolerance (fp32 here: bitwise in practice)."""
    spec = importlib.util.find_spec("transformer_engine_torch.jit")
    mp = pytest.MonkeyPatch()
    mp.setenv("NVTE_TORCH_COMPILE", "0")
    eager = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eager)
    mp.undo()
    x, b, g = data((16, 32), torch.float32, 9, "cpu"), data((32,), torch.float32, 10, "cpu"), data(
        (16, 32), torch.float32, 11, "cpu")
    for name in ("gelu", "silu", "relu", "qgelu", "srelu"):
        a = getattr(jit_default, f"bias_{name}_fused")(x, b)
        e = getattr(eager, f"bias_{name}_fused")(x, b)
        torch.testing.assert_close(a, e, **TOL[torch.float32])
        torch.testing.assert_close(getattr(jit_default, f"bgrad_d{name}_fused")(g, x, b)[1],
                                   getattr(eager, f"bgrad_d{name}_fused")(g, x, b)[1], **TOL[torch.float32])


def test_lazy_compile_inlines_when_compiling():
    calls = []

    @jit_default.lazy_compile
    def f(x):
        calls.append(torch.compiler.is_compiling())
        return x * 2

    @torch.compile(fullgraph=True)
    def outer(x):
        return f(x) + 1

    x = torch.arange(4.0)
    assert torch.equal(outer(x), x * 2 + 1)
    assert calls and all(calls)  # traced inside the outer graph, not compiled separately


def test_no_torch_dynamo():
    seen = []

    @jit_default.no_torch_dynamo()
    def plain(x):
        seen.append(torch.compiler.is_compiling())
        return x + 1

    @jit_default.no_torch_dynamo(when=lambda args: "big" if args["n"] > 2 else None)
    def cond(x, n=1):
        seen.append(torch.compiler.is_compiling())
        return x * n

    @torch.compile
    def outer(x, n):
        return cond(plain(x), n)

    x = torch.ones(3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert torch.equal(outer(x, 1), x + 1)
        assert seen == [False, True]  # plain ran outside dynamo, cond (no reason) inside
        seen.clear()
        assert torch.equal(cond(x, n=5), x * 5)
        cond(x, 7)
    assert sum("big" in str(m.message) for m in w) == 1  # warned once per reason
    with pytest.raises(TypeError, match=r"\*args"):
        jit_default.no_torch_dynamo(when=lambda a: None)(lambda *a: a)


def test_set_jit_fusion_options_and_warmups():
    assert jit_default.set_jit_fusion_options() is None
    # No CUDA: the warm-ups return without doing anything (with CUDA they run; see the cuda test).
    if not torch.cuda.is_available():
        for fn in (jit_default.warmup_jit_bias_dropout_add_all_dtypes, jit_default.warmup_jit_bias_gelu_all_dtypes,
                   jit_default.warmup_jit_l2normalization_all_dtypes):
            assert fn(64, 8, 2) is None


@pytest.mark.cuda
def test_cuda_warmups_keep_rng_state():
    state = torch.cuda.get_rng_state()
    jit_default.warmup_jit_bias_dropout_add_all_dtypes(64, 8, 2)
    jit_default.warmup_jit_bias_gelu_all_dtypes(64, 8, 2)
    jit_default.warmup_jit_l2normalization_all_dtypes(64, 8, 2)
    assert torch.equal(torch.cuda.get_rng_state(), state)
    x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.float16):  # the wrappers run with CUDA autocast off
        assert jit_default.bias_gelu_fused(x, b).dtype == torch.bfloat16
