"""Activations (SPEC §3) with plain outputs: every forward and derivative against the float64
reference, gated layout, clamped SwiGLU semantics, exact values, dbias variants, autograd."""
import math
import sys

import pytest
import torch

from tests import ref
from tests.torch.helpers import DTYPES, DTYPE_PARAMS, call_act, call_dact, parametrize_grid, tex_module, uniform

SHAPES = [(37,), (2, 13), (32, 1, 32), (257, 259), (128, 129)]
SHAPE_IDS = ["37", "2x13", "32x1x32", "257x259", "128x129"]
# Every activation in every dtype and shape.
ACT_GRID = parametrize_grid(pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS),
                            pytest.mark.parametrize("dtype", DTYPE_PARAMS),
                            pytest.mark.parametrize("name", ref.ACT_NAMES))


def in_shape(name, shape):
    """Gated ops need an even last dim: the last dim is doubled."""
    if name in ref.GATED:
        return tuple(shape[:-1]) + (2 * shape[-1],)
    return tuple(shape)


def _grad(name, x, dtype, seed=99):
    g = torch.Generator().manual_seed(seed)
    return uniform(ref.out_shape(name, x.shape), dtype, x.device, g=g)


@ACT_GRID
def test_forward_vs_float64(name, dtype, shape):
    x = uniform(in_shape(name, shape), dtype)
    y = call_act(name, x, None)
    assert isinstance(y, torch.Tensor)
    assert y.dtype == dtype and y.is_contiguous()
    assert tuple(y.shape) == ref.out_shape(name, x.shape)
    r = ref.act_ref(name, x)
    ref.assert_close_tol(y, r, dtype, f"{name} {dtype} {shape}")
    # the comparison would catch the reference of -x
    assert not ref.within_tol(y, ref.act_ref(name, -x), *ref.TOL[dtype])


@ACT_GRID
def test_backward_vs_float64(name, dtype, shape):
    x = uniform(in_shape(name, shape), dtype)
    g = _grad(name, x, dtype)
    dx = call_dact(name, g, x, None)
    assert isinstance(dx, torch.Tensor)
    assert dx.dtype == dtype and dx.is_contiguous()
    assert tuple(dx.shape) == tuple(x.shape)
    r = ref.dact_ref(name, g, x)
    ref.assert_close_tol(dx, r, dtype, f"d{name} {dtype} {shape}")
    assert not ref.within_tol(dx, ref.dact_ref(name, g, -x), *ref.TOL[dtype])


@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_zero_dim_and_empty(name):
    dtype = torch.float32
    if name not in ref.GATED:
        x = torch.tensor(1.25)
        y = call_act(name, x, None)
        assert y.shape == () and y.dtype == dtype
        ref.assert_close_tol(y, ref.act_ref(name, x), dtype, name)
        g = torch.tensor(-0.75)
        dx = call_dact(name, g, x, None)
        assert dx.shape == ()
        ref.assert_close_tol(dx, ref.dact_ref(name, g, x), dtype, name)
    for shape in [(0,), (0, 6), (3, 0, 4)] if name not in ref.GATED else [(0, 6), (3, 0, 4)]:
        x = torch.empty(shape, dtype=dtype)
        y = call_act(name, x, None)
        assert tuple(y.shape) == ref.out_shape(name, shape) and y.numel() == 0
        dx = call_dact(name, torch.empty(ref.out_shape(name, shape)), x, None)
        assert tuple(dx.shape) == shape


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_non_contiguous_input(name, dtype):
    base = uniform((40, 18), dtype)
    x = base.t()                       # [18, 40] transposed view; last dim even for gated ops
    assert not x.is_contiguous()
    y = call_act(name, x, None)
    y_c = call_act(name, x.contiguous(), None)
    assert y.is_contiguous() and ref.bits_equal(y, y_c)
    gbase = uniform(tuple(reversed(ref.out_shape(name, x.shape))), dtype, g=torch.Generator().manual_seed(5))
    g = gbase.t()
    dx = call_dact(name, g, x, None)
    dx_c = call_dact(name, g.contiguous(), x.contiguous(), None)
    assert dx.is_contiguous() and ref.bits_equal(dx, dx_c)


# ------------------------------------------------------------------------------------------------
# gated layout (first half through the nonlinearity)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_gated_layout_first_half_is_activated(dtype):
    tex = tex_module()
    a = uniform((16, 24), dtype, g=torch.Generator().manual_seed(1))
    b = uniform((16, 24), dtype, g=torch.Generator().manual_seed(2))
    x = torch.cat([a, b], -1)
    swapped = torch.cat([b, a], -1)
    af, bf = a.double(), b.double()
    silu = torch.nn.functional.silu
    expect = {
        "geglu": torch.nn.functional.gelu(af, approximate="tanh") * bf,
        "swiglu": silu(af) * bf,
        "reglu": torch.relu(af) * bf,
        "sreglu": torch.relu(af) ** 2 * bf,
        "qgeglu": af * torch.sigmoid(1.702 * af) * bf,
        # torch's glu gates with the SECOND half: tex.glu([a|b]) == F.glu([b|a])
        "glu": torch.nn.functional.glu(torch.cat([bf, af], -1), dim=-1),
    }
    for name, e in expect.items():
        y = getattr(tex, name)(x, None)
        rtol, atol = ref.TOL[dtype]
        ref.assert_close_tol(y, e, dtype, name)
        y_sw = getattr(tex, name)(swapped, None)
        assert not ref.within_tol(y_sw, e, rtol, atol), f"{name}: halves not distinguished"
    # backward layout: [d_a | d_b]
    g = uniform((16, 24), dtype, g=torch.Generator().manual_seed(3))
    dx = tex.dswiglu(g, x, None)
    s = torch.sigmoid(af)
    gd = g.double()
    ref.assert_close_tol(dx[:, :24], gd * bf * (s + af * s * (1 - s)), dtype, "dswiglu d_a")
    ref.assert_close_tol(dx[:, 24:], gd * silu(af), dtype, "dswiglu d_b")


# ------------------------------------------------------------------------------------------------
# clamped SwiGLU (SPEC §3.3)
# ------------------------------------------------------------------------------------------------
A_VALS = [-10.0, -7.5, -7.0, -1.0, 0.0, 1.0, 6.5, 7.0, 7.5, 10.0, 100.0]
B_VALS = [-100.0, -7.5, -7.0, -3.0, 0.0, 3.0, 7.0, 7.5, 100.0]


def _clamped_grid(scale=1.0):
    a = torch.tensor(A_VALS).repeat_interleave(len(B_VALS)) * scale
    b = torch.tensor(B_VALS).repeat(len(A_VALS)) * scale
    return torch.stack([a, b], -1)  # [n, 2]: a first, b second


def test_clamped_swiglu_boundaries_default_params():
    tex = tex_module()
    x = _clamped_grid()
    a, b = x[:, 0], x[:, 1]
    y = tex.clamped_swiglu(x, None)[:, 0]
    ref.assert_close_tol(y, ref.act_ref("clamped_swiglu", x)[:, 0], torch.float32, "clamped_swiglu")
    # a > L: clamped to L, so identical to a == L (same b) bit for bit
    for bv in B_VALS:
        at_l = y[(a == 7.0) & (b == bv)]
        for av in [7.5, 10.0, 100.0]:
            assert torch.equal(y[(a == av) & (b == bv)], at_l), (av, bv)
    # b outside [-L, L]: clamped, so identical to b == +-L
    for av in A_VALS:
        assert torch.equal(y[(a == av) & (b == 7.5)], y[(a == av) & (b == 7.0)])
        assert torch.equal(y[(a == av) & (b == 100.0)], y[(a == av) & (b == 7.0)])
        assert torch.equal(y[(a == av) & (b == -100.0)], y[(a == av) & (b == -7.0)])
    # a is clamped above only: a = -10 is not -7
    assert not torch.equal(y[(a == -10.0) & (b == 3.0)], y[(a == -7.0) & (b == 3.0)])
    # dropping the clamp would fail the comparison
    assert not ref.within_tol(y, ref.act_ref("clamped_swiglu", x, limit=1e30)[:, 0], *ref.TOL[torch.float32])

    g = torch.ones(x.shape[0], 1) * 0.5
    dx = tex.clamped_dswiglu(g, x, None)
    ref.assert_close_tol(dx, ref.dact_ref("clamped_swiglu", g, x), torch.float32, "clamped_dswiglu")
    da, db = dx[:, 0], dx[:, 1]
    bp = torch.clamp(b, -7, 7) + 1
    # d_a is exactly 0 for a > L, non-zero at a == L (where b' != 0), boundary inclusive
    assert torch.all(da[a > 7.0] == 0)
    assert torch.all(da[(a == 7.0) & (bp != 0)] != 0)
    # d_b is exactly 0 for |b| > L, non-zero at b == +-L (where act(a) != 0)
    assert torch.all(db[b.abs() > 7.0] == 0)
    assert torch.all(db[(b.abs() == 7.0) & (a != 0)] != 0)


def test_clamped_swiglu_offset_zero_vs_one():
    tex = tex_module()
    x = _clamped_grid()
    y1 = tex.clamped_swiglu(x, None)                         # default c = 1
    y0 = tex.clamped_swiglu(x, None, glu_linear_offset=0.0)  # c = 0
    ref.assert_close_tol(y0, ref.act_ref("clamped_swiglu", x, offset=0.0), torch.float32, "c=0")
    ref.assert_close_tol(y1, ref.act_ref("clamped_swiglu", x, offset=1.0), torch.float32, "c=1")
    assert not ref.within_tol(y1, ref.act_ref("clamped_swiglu", x, offset=0.0), *ref.TOL[torch.float32])
    # b = 0: c = 0 gives exactly 0, c = 1 gives act(a)
    b0 = x[:, 1] == 0
    assert torch.all(y0[b0] == 0)
    g = torch.full((x.shape[0], 1), 1.5)
    d0 = tex.clamped_dswiglu(g, x, None, glu_linear_offset=0.0)
    ref.assert_close_tol(d0, ref.dact_ref("clamped_swiglu", g, x, offset=0.0), torch.float32, "d c=0")
    d1 = tex.clamped_dswiglu(g, x, None, 7.0, 1.702, 1.0)   # positional parameters
    ref.assert_close_tol(d1, ref.dact_ref("clamped_swiglu", g, x, offset=1.0), torch.float32, "d c=1")


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_clamped_swiglu_custom_params(dtype):
    tex = tex_module()
    params = dict(limit=2.0, alpha=1.25, glu_linear_offset=0.5)
    x = uniform((33, 64), dtype)
    y = tex.clamped_swiglu(x, None, **params)
    rp = dict(limit=2.0, alpha=1.25, offset=0.5)
    ref.assert_close_tol(y, ref.act_ref("clamped_swiglu", x, **rp), dtype, "clamped_swiglu custom")
    assert not ref.within_tol(y, ref.act_ref("clamped_swiglu", x), *ref.TOL[dtype])
    g = uniform((33, 32), dtype, g=torch.Generator().manual_seed(8))
    dx = tex.clamped_dswiglu(g, x, None, **params)
    ref.assert_close_tol(dx, ref.dact_ref("clamped_swiglu", g, x, **rp), dtype, "clamped_dswiglu custom")


# ------------------------------------------------------------------------------------------------
# exact values (SPEC §3.3 list)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_exact_values_at_zero(dtype):
    tex = tex_module()
    z = torch.zeros(8, dtype=dtype)
    one = torch.ones(8, dtype=dtype)
    neg = -uniform((8,), dtype, lo=0.1, hi=3.0)
    assert torch.all(tex.gelu(z, None) == 0)
    assert torch.all(tex.dgelu(one, z, None) == 0.5)
    assert torch.all(tex.drelu(one, z, None) == 0)
    assert torch.all(tex.dsrelu(one, z, None) == 0)
    assert torch.all(tex.srelu(neg, None) == 0)
    assert torch.all(tex.dsrelu(one, neg, None) == 0)
    assert torch.all(tex.relu(neg, None) == 0)
    assert torch.all(tex.drelu(one, neg, None) == 0)
    assert torch.all(tex.dsilu(one, z, None) == 0.5)
    assert torch.all(tex.dqgelu(one, z, None) == 0.5)
    assert torch.all(tex.silu(z, None) == 0)
    assert torch.all(tex.qgelu(z, None) == 0)
    ab = torch.cat([z, one]).reshape(1, 16)          # a = 0, b = 1
    assert torch.all(tex.glu(ab, None) == 0.5)        # sigma(0) = 0.5
    d = tex.dglu(torch.ones(1, 8, dtype=dtype), ab, None)
    assert torch.all(d[:, :8] == 0.25)                # sigma'(0) = 0.25
    assert torch.all(d[:, 8:] == 0.5)
    # relu' / srelu' at positive points
    p = uniform((8,), dtype, lo=0.1, hi=3.0)
    assert torch.all(tex.drelu(one, p, None) == 1)
    assert torch.equal(tex.relu(p, None), p)


# ------------------------------------------------------------------------------------------------
# dbias variants (SPEC §3.4): (grad_bias, grad_input), bias first
# ------------------------------------------------------------------------------------------------
def dbias_tol(dtype, rows):
    """SPEC §9 dbias row: 16-bit: dtype rtol x4; FP32: rtol x sqrt(rows); atol 1e-4 (sums of up to
    a few hundred O(1) terms)."""
    if dtype == torch.float32:
        return 1.3e-6 * math.sqrt(max(rows, 1)), 1e-4
    return 4 * ref.TOL[dtype][0], 1e-4


DBIAS_SHAPES = [(37,), (2, 13), (32, 1, 32), (257, 259)]


@pytest.mark.parametrize("shape", DBIAS_SHAPES, ids=["37", "2x13", "32x1x32", "257x259"])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES))
def test_dbias_plain(name, dtype, shape):
    tex = tex_module()
    base = ref.DBIAS_NAMES[name]
    x = uniform(shape, dtype)
    g = uniform(shape, dtype, g=torch.Generator().manual_seed(11))
    out = getattr(tex, name)(g, x, None)
    assert isinstance(out, tuple) and len(out) == 2
    gb, gi = out
    K = shape[-1]
    assert tuple(gb.shape) == (K,), "grad_bias must come first, shape [K]"
    assert gb.dtype == dtype
    assert tuple(gi.shape) == tuple(shape) and gi.dtype == dtype
    rb, ri = ref.dbias_ref(base, g, x)
    ref.assert_close_tol(gi, ri, dtype, name + " grad_input")
    # grad_input identical to the matching d* op
    assert ref.bits_equal(gi, getattr(tex, "d" + base)(g, x, None))
    rows = g.numel() // K
    rtol, atol = dbias_tol(dtype, rows)
    assert ref.within_tol(gb, rb, rtol, atol), f"{name} grad_bias: {gb} vs {rb}"
    assert not ref.within_tol(gb, ref.dbias_ref(base, g, -x)[0], rtol, atol)


@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES))
def test_dbias_empty(name):
    tex = tex_module()
    x = torch.empty(0, 8)
    gb, gi = getattr(tex, name)(torch.empty(0, 8), x, None)
    assert tuple(gb.shape) == (8,) and torch.all(gb == 0)
    assert tuple(gi.shape) == (0, 8)


# ------------------------------------------------------------------------------------------------
# autograd of plain outputs (backward = the matching d* op)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_autograd_matches_dop(name, dtype):
    params = dict(limit=3.0, alpha=1.5, glu_linear_offset=0.25) if name == "clamped_swiglu" else {}
    x0 = uniform((6, 20), dtype)
    if name == "clamped_swiglu":
        x0 = x0 * 2
    x = x0.clone().requires_grad_()
    y = call_act(name, x, None, **params)
    assert y.requires_grad
    g = uniform(y.shape, dtype, g=torch.Generator().manual_seed(4))
    y.backward(g)
    expect = call_dact(name, g, x0, None, **params)
    assert x.grad is not None and x.grad.dtype == dtype
    assert ref.bits_equal(x.grad, expect)


def test_no_graph_without_grad():
    """No graph is built where no gradient is wanted: no_grad, inference_mode, or an input without
    requires_grad; the values are those of the differentiable call."""
    tex = tex_module()
    x = uniform((6, 20)).requires_grad_()
    expect = tex.gelu(x, None)
    assert expect.grad_fn is not None
    with torch.no_grad():
        y = tex.gelu(x, None)
    assert y.grad_fn is None and not y.requires_grad and ref.bits_equal(y, expect.detach())
    with torch.inference_mode():
        y = tex.gelu(x.detach(), None)
    assert y.is_inference() and ref.bits_equal(y, expect.detach())
    y = tex.gelu(x.detach(), None)
    assert y.grad_fn is None and ref.bits_equal(y, expect.detach())


def test_plain_call_runs_no_python_autograd_kernel():
    """The autograd of te::act is a C++ kernel: a call goes through no Python autograd machinery (a
    torch.library.register_autograd kernel would be, and costs about as much host time as the op itself)."""
    tex = tex_module()
    x = uniform((4, 8))
    for requires_grad in (False, True):
        files = set()
        sys.setprofile(lambda frame, event, arg: files.add(frame.f_code.co_filename) if event == "call" else None)
        try:
            tex.gelu(x.clone().requires_grad_(requires_grad), None)
        finally:
            sys.setprofile(None)
        assert not [f for f in files if "_library" in f or "autograd" in f], sorted(files)


@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_autograd_through_torch_autograd_grad(name):
    """Second path: torch.autograd.grad with a non-leaf input inside a larger graph."""
    w = torch.tensor(1.5, requires_grad=True)
    x0 = uniform((4, 8), torch.float32)
    x = x0 * w
    y = call_act(name, x, None)
    (gw,) = torch.autograd.grad(y.sum(), w)
    gx = call_dact(name, torch.ones_like(y), x.detach(), None)
    torch.testing.assert_close(gw, (gx * x0).sum(), rtol=1e-5, atol=1e-5)
