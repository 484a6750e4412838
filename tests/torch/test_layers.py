"""Recipes, autocast and the Linear / MLP layers (SPEC §8, tolerances §9).

References are independent of the layers: float64 PyTorch math with the same weights (recipe accuracy, SPEC §9
layer tolerances), and for Linear an emulation that quantizes each operand with the copy SPEC §6.4 prescribes for
its GEMM (rowwise X and W for fprop, columnwise W and rowwise dY for dgrad, columnwise X and dY for wgrad) and
multiplies the dequantized values in float64 — this one is tight, so a wrong layout or stored copy fails it.
"""
import functools
import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.torch.helpers import (CAPTURE_WARMUPS, DEVICE_PARAMS, HAS_CUDA, capture_graph, tex_module,
                                 without_extra_state)

tex = tex_module()

# SPEC §9, "layer outputs / grads vs torch module", bf16 column (the FP8 layers compute in bf16 here).
OUT_TOL = dict(rtol=4e-2, atol=5e-2)
GRAD_TOL = dict(rtol=4e-2, atol=0.2)

RECIPES = {
    "current": lambda: tex.Float8CurrentScaling(),
    "current-e4m3-pow2": lambda: tex.Float8CurrentScaling(fp8_format=tex.Format.E4M3, use_power_2_scales=True),
    "delayed": lambda: tex.DelayedScaling(amax_history_len=8),
    "mxfp8": lambda: tex.MXFP8BlockScaling(),
    "mxfp8-hybrid": lambda: tex.MXFP8BlockScaling(fp8_format=tex.Format.HYBRID),
}
MAIN_RECIPES = ["current", "delayed", "mxfp8"]


def ref_act(name, h):
    """float64 reference activations (SPEC §3.2; gated: first half through the nonlinearity)."""
    def sig(z):
        return torch.sigmoid(z)

    unary = {
        "gelu": lambda z: 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3))),
        "qgelu": lambda z: z * sig(1.702 * z),
        "relu": torch.relu,
        "srelu": lambda z: torch.relu(z) ** 2,
        "silu": lambda z: z * sig(z),
        "glu": sig,
    }
    gated = {"geglu": "gelu", "qgeglu": "qgelu", "reglu": "relu", "sreglu": "srelu", "swiglu": "silu", "glu": "glu"}
    if name in gated:
        a, b = h.chunk(2, dim=-1)
        return unary[gated[name]](a) * b
    if name == "clamped_swiglu":
        a, b = h.chunk(2, dim=-1)
        ac = a.clamp(max=7.0)
        return ac * sig(1.702 * ac) * (b.clamp(-7.0, 7.0) + 1.0)
    return unary[name](h)


def ref_mlp(x, m, act):
    h = F.linear(x, m.fc1_weight.double(), None if m.fc1_bias is None else m.fc1_bias.double())
    return F.linear(ref_act(act, h), m.fc2_weight.double(), None if m.fc2_bias is None else m.fc2_bias.double())


def ref_linear(x, m):
    return F.linear(x, m.weight.double(), None if m.bias is None else m.bias.double())


def run_fwd_bwd(module, x, grad, recipe=None, ref=False):
    """(out, [dx, d params...]) of module(x) with the output gradient `grad`; float64 reference when ref."""
    x = x.detach().clone().requires_grad_()
    params = list(module.parameters())
    for p in params:
        p.grad = None
    if ref:
        xd = x.double()
        y = (ref_linear(xd, module) if isinstance(module, tex.Linear) else ref_mlp(xd, module, module.activation))
        y.backward(grad.double())
    elif recipe is None:
        y = module(x)
        y.backward(grad)
    else:
        with tex.autocast(recipe=recipe):
            y = module(x)
        y.backward(grad)
    grads = [x.grad] + [p.grad for p in params]
    out = y.detach()
    for p in params:
        p.grad = None
    return out, grads


def make_inputs(shape_x, shape_y, device, dtype, scale_g=0.05):
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(shape_x, generator=g) * 2 - 1).to(dtype).to(device)
    dy = (torch.randn(shape_y, generator=g) * scale_g).to(dtype).to(device)
    return x, dy


def assert_close_all(got, want, out_tol, grad_tol):
    (y, gs), (yr, grs) = got, want
    torch.testing.assert_close(y.double(), yr, **out_tol)
    for i, (a, b) in enumerate(zip(gs, grs)):
        assert a is not None and b is not None, i
        assert a.dtype != torch.float64
        torch.testing.assert_close(a.double(), b.double(), **grad_tol, msg=lambda m: f"gradient {i}: {m}")


# ---- autocast off: plain PyTorch math --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,tol", [(torch.float32, dict(rtol=1e-5, atol=1e-5)),
                                       (torch.bfloat16, dict(rtol=1.6e-2, atol=1e-2))], ids=["fp32", "bf16"])
def test_linear_plain_matches_nn_linear(device, dtype, tol):
    torch.manual_seed(0)
    m = tex.Linear(40, 24, params_dtype=dtype, device=device)  # plain math: any dims
    ref = torch.nn.Linear(40, 24, dtype=dtype, device=device)
    ref.load_state_dict(without_extra_state(m.state_dict()))
    x, dy = make_inputs((3, 5, 40), (3, 5, 24), device, dtype)
    y, gs = run_fwd_bwd(m, x, dy)
    xr = x.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(dy)
    assert torch.equal(y, yr.detach())
    for a, b in zip(gs, [xr.grad, ref.weight.grad, ref.bias.grad]):
        assert torch.equal(a, b)
    # And against float64 within the dtype tolerance.
    assert_close_all((y, gs), run_fwd_bwd(m, x, dy, ref=True), tol, tol)


@pytest.mark.parametrize("act", sorted(tex.modules.ACTIVATIONS))
def test_mlp_plain_matches_reference(device, act):
    torch.manual_seed(1)
    m = tex.MLP(24, 40, activation=act, device=device)
    x, dy = make_inputs((2, 7, 24), (2, 7, 24), device, torch.float32)
    tol = dict(rtol=1e-5, atol=1e-5)
    got = run_fwd_bwd(m, x, dy)
    want = run_fwd_bwd(m, x, dy, ref=True)
    assert_close_all(got, want, tol, tol)
    # The reference distinguishes: another activation's answer fails.
    other = "relu" if act != "relu" else "silu"
    if tex.modules.ACTIVATIONS[act][3]:
        other = "reglu" if act != "reglu" else "swiglu"
    m.activation = other
    wrong = run_fwd_bwd(m, x, dy, ref=True)
    assert not torch.allclose(got[0].double(), wrong[0], **tol)


def test_plain_under_autocast_disabled_and_outside(device):
    m = tex.Linear(48, 32, device=device)
    x, _ = make_inputs((16, 48), (16, 32), device, torch.float32)
    y0 = m(x)
    with tex.autocast(enabled=False, recipe=tex.Float8CurrentScaling()):
        y1 = m(x)
    with tex.autocast(recipe=tex.Float8CurrentScaling()):
        with tex.autocast(enabled=False):
            y2 = m(x)
        y3 = m(x)
    assert torch.equal(y0, y1) and torch.equal(y0, y2)
    assert not torch.equal(y0, y3)  # quantized inside
    assert not tex.recipe.is_fp8_enabled()


# ---- recipes: accuracy against float64 with the same weights ----------------------------------------------------
def check_recipe_accuracy(m, x, dy, recipe):
    """Forward and backward of m under RECIPES[recipe] within OUT_TOL / GRAD_TOL of float64 with the same weights,
    and the tolerance discriminates (the float64 answer for -x fails it). Returns the recipe's outputs."""
    got = run_fwd_bwd(m, x, dy, RECIPES[recipe]())
    want = run_fwd_bwd(m, x, dy, ref=True)
    assert_close_all(got, want, OUT_TOL, GRAD_TOL)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got[0].double(), run_fwd_bwd(m, -x, dy, ref=True)[0], **OUT_TOL)
    return got


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear_recipe_accuracy(device, recipe, bias):
    torch.manual_seed(2)
    m = tex.Linear(64, 96, bias=bias, params_dtype=torch.bfloat16, device=device)
    x, dy = make_inputs((4, 32, 64), (4, 32, 96), device, torch.bfloat16)
    got = check_recipe_accuracy(m, x, dy, recipe)
    assert got[0].dtype == torch.bfloat16
    # Quantized indeed: not the plain bf16 result.
    assert not torch.equal(got[0], run_fwd_bwd(m, x, dy)[0])


# Every activation with the main recipes; the format variants with gelu and swiglu.
MLP_CASES = [(r, a) for r in RECIPES for a in sorted(tex.modules.ACTIVATIONS)
             if r in MAIN_RECIPES or a in ("gelu", "swiglu")]


@pytest.mark.parametrize("recipe,act", MLP_CASES)
def test_mlp_recipe_accuracy(device, recipe, act):
    torch.manual_seed(3)
    m = tex.MLP(64, 128, activation=act, params_dtype=torch.bfloat16, device=device)
    x, dy = make_inputs((2, 64, 64), (2, 64, 64), device, torch.bfloat16)
    check_recipe_accuracy(m, x, dy, recipe)


def _deq(t, q, rowwise):
    """Dequantized FP32 values of the copy the GEMM uses."""
    q = q.copy()
    q.set_usage(rowwise=rowwise, columnwise=not rowwise)
    return tex.quantize(t, q).dequantize(torch.float32).double()


def _spread(t, n, g):
    """t·2^(e_row + e_col) with integer exponents drawn from [-n, n] per row and per column (bf16)."""
    e = lambda k: torch.randint(-n, n + 1, (k,), generator=g).float()  # noqa: E731
    return (t.float().cpu() * torch.exp2(e(t.shape[0])[:, None] + e(t.shape[1])[None, :])).to(t.dtype).to(t.device)


def _accumulation_unit(device, recipe):
    """Unit roundoff of the accumulator that sums a GEMM's K products (SPEC §6.6, §6.7). FP32 on the CPU and in the
    bf16 GEMM that emulates MXFP8 on a GPU (2^-23: one FP32 ulp, so truncating adders are covered too). Per-tensor
    FP8 on a GPU runs on FP8 tensor cores, whose accumulator keeps about 14 bits (Hopper with fast accumulation,
    the fprop default; with the split accumulator each k-chunk is still summed that way before the FP32 add)."""
    if device == "cuda" and recipe in ("current", "delayed"):
        return 2.0 ** -13
    return 2.0 ** -23


def _within_gemm_bound(got, a, b, u, bias=None):
    """Elementwise: |got - a·b (- bias)| <= 8e-3·|ref| + K·u·(|a|·|b| + |bias|), float64 reference of the
    dequantized operands. The second term bounds the error of summing K products with unit roundoff u in any order
    (cancelling sums near zero included); the first is the bf16 output rounding (2^-9 relative) with a 4x margin."""
    ref, mag = a @ b, a.abs() @ b.abs()
    if bias is not None:
        ref, mag = ref + bias, mag + bias.abs()
    return bool(((got.double() - ref).abs() <= 8e-3 * ref.abs() + a.shape[1] * u * mag).all())


@pytest.mark.parametrize("recipe", ["current", "delayed", "mxfp8", "mxfp8-hybrid"])
def test_linear_uses_the_right_copies(device, recipe):
    """The three GEMMs against the quantize-dequantize emulation with the copy each layout needs, within the bound
    of their accumulation (tight: FP32 on the CPU); each other copy and each misread layout fails the same bound."""
    torch.manual_seed(4)
    r = RECIPES[recipe]()
    m = tex.Linear(64, 96, params_dtype=torch.bfloat16, device=device)
    x, dy = make_inputs((64, 64), (64, 96), device, torch.bfloat16)
    # Rows and columns of very different magnitudes (2^-16..2^16, more than E4M3 spans): a 1x32 block and a 32x1
    # block then quantize very differently, so the wrong MXFP8 copy of any operand is visible in every GEMM.
    g = torch.Generator().manual_seed(1)
    x, dy = _spread(x, 8, g), _spread(dy, 8, g)
    with torch.no_grad():
        m.weight.copy_(_spread(m.weight, 8, g))
    y, (dx, dw, db) = run_fwd_bwd(m, x, dy, r)

    def q(role):
        cfg = r.quantizer_config(role)
        if cfg[0] == "delayed":  # a fresh layer: scale 1 in every slot
            return tex.recipe.build_quantizer(cfg, True, True, torch.ones(1, device=device),
                                              torch.zeros(1, device=device))
        return tex.recipe.build_quantizer(cfg, True, True)

    qi, qw, qg = q("input"), q("weight"), q("grad_output")
    w, b = m.weight.detach(), m.bias.detach().double()
    xr, xc, wr, wc = _deq(x, qi, True), _deq(x, qi, False), _deq(w, qw, True), _deq(w, qw, False)
    gr, gc = _deq(dy, qg, True), _deq(dy, qg, False)
    u = _accumulation_unit(device, recipe)

    def misread(t):  # the same bytes read in the other copy's layout (the transposed buffer taken as untransposed)
        return t.T.contiguous().reshape(t.shape)

    #        result  A·B (+bias) with the right copies   the wrong copies          a misread layout
    gemms = {"y": (y, xr, wr.T, b, (xc, wc.T), (misread(xr), wr.T)),
             "dx": (dx, gr, wc, None, (gc, wr), (gr, misread(wc))),
             "dw": (dw, gc.T, xc, None, (gr.T, xr), (gc.T, misread(xc)))}
    for name, (got, a, bb, bias, other, mis) in gemms.items():
        assert _within_gemm_bound(got, a, bb, u, bias), name
        wrongs = [mis, other] if recipe.startswith("mxfp8") else [mis]  # per-tensor FP8: both copies hold one value
        for wa, wb in wrongs:  # what the layer would return with them, rounded to bf16 like its output
            wrong = (wa @ wb + (0 if bias is None else bias)).to(torch.bfloat16)
            assert not _within_gemm_bound(wrong, a, bb, u, bias), name
    # Bias gradient: a sum over 64 tokens, FP32-accumulated, rounded to bf16.
    assert _within_gemm_bound(db, torch.ones(1, 64, dtype=torch.float64, device=device), dy.double(), 2.0 ** -23), "db"


# ---- delayed scaling: history and scales -------------------------------------------------------------------------
def ref_delayed_update(hist, scale, fp8_max, margin, algo):
    """SPEC §4.3 on float64 copies of one layer's [L, n] history and [n] scales (returns new ones)."""
    hist, scale = hist.clone(), scale.clone()
    L, n = hist.shape
    for j in range(n):
        last = hist[0, j].item()
        if last == 0:
            continue
        old = hist[:, j].clone()
        amax = max(old[1:].max().item() if L > 1 else 0.0, last) if algo == "max" else last
        new = torch.zeros(L, dtype=hist.dtype)
        if L > 1:
            new[1:L - 1] = old[2:L]
            new[L - 1] = last
        hist[:, j] = new
        s = torch.tensor(fp8_max * 2.0 ** -margin, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)
        scale[j] = s.item() if math.isfinite(s.item()) else torch.finfo(torch.float32).max
    return hist, scale


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 1])
def test_delayed_history_rolls_and_scales_update(device, algo, margin):
    L = 4
    recipe = tex.DelayedScaling(margin=margin, amax_history_len=L, amax_compute_algo=algo)
    m = tex.Linear(32, 16, params_dtype=torch.float32, device=device)
    fh = torch.zeros(L, 3, dtype=torch.float32)
    fs = torch.ones(3, dtype=torch.float32)
    bh = torch.zeros(L, 2, dtype=torch.float32)
    bs = torch.ones(2, dtype=torch.float32)
    w_amax = m.weight.detach().abs().max().float().cpu()
    x_amaxes = [3.0, 7.5, 1.25, 0.5, 2.0, 0.75]  # peak in step 1, then drops out of the window after L steps
    for step, xa in enumerate(x_amaxes):
        x = (torch.rand(16, 32) * 2 - 1) * 0.25  # below every planted amax
        x[3, 5] = xa
        x = x.to(device)
        dy = (torch.rand(16, 16) - 0.5).to(device)
        dy[0, 0] = 40.0 * (step + 1)
        with tex.autocast(recipe=recipe):
            y = m(x.requires_grad_())
        # forward slots: input, weight (output unused: its amax stays 0, its scale 1)
        fh[0, 0], fh[0, 1] = xa, w_amax
        fh, fs = ref_delayed_update(fh, fs, 448.0, margin, algo)
        torch.testing.assert_close(m.fp8_fwd_amax_history.cpu(), fh, rtol=0, atol=0)
        torch.testing.assert_close(m.fp8_fwd_scale.cpu(), fs, rtol=0, atol=0)
        y.backward(dy)
        bh[0, 0] = 40.0 * (step + 1)
        bh, bs = ref_delayed_update(bh, bs, 57344.0, margin, algo)  # HYBRID: gradients in E5M2
        torch.testing.assert_close(m.fp8_bwd_amax_history.cpu(), bh, rtol=0, atol=0)
        torch.testing.assert_close(m.fp8_bwd_scale.cpu(), bs, rtol=0, atol=0)
    assert fs[2] == 1 and bs[1] == 1
    if algo == "max":  # the window forgot the 7.5 of step 1 after L steps
        assert fs[0].item() == pytest.approx(448.0 * 2.0 ** -margin / 2.0, rel=1e-6)


def test_delayed_scale_is_used_next_step():
    """Step 2 quantizes with the scale of step 1's amax: the layer's output equals the emulation with that scale."""
    recipe = tex.DelayedScaling(amax_history_len=2, fp8_format=tex.Format.E4M3)
    m = tex.Linear(32, 16, bias=False)
    x1 = torch.rand(16, 32) * 0.01  # tiny values: with scale 1 they flush to FP8 subnormals
    x2 = torch.rand(16, 32) * 0.01
    with torch.no_grad(), tex.autocast(recipe=recipe):
        m(x1)
        y2 = m(x2)
    s = torch.tensor(448.0) / x1.abs().max()
    qx = tex.Float8Quantizer(s.reshape(1).clone(), torch.zeros(1), tex.DType.kFloat8E4M3)
    sw = torch.tensor(448.0) / m.weight.detach().abs().max()
    qw = tex.Float8Quantizer(sw.reshape(1).clone(), torch.zeros(1), tex.DType.kFloat8E4M3)
    ref = qx(x2).dequantize().double() @ qw(m.weight.detach()).dequantize().double().T
    torch.testing.assert_close(y2.double(), ref, rtol=1e-6, atol=1e-7)


def test_delayed_state_in_extra_state_and_moves_with_to():
    m = tex.MLP(32, 64)
    with tex.autocast(recipe=tex.DelayedScaling(amax_history_len=3)):
        m(torch.randn(32, 32))
    assert m.fp8_fwd_amax_history.shape == (3, 6) and m.fp8_bwd_amax_history.shape == (3, 4)
    sd = m.state_dict()
    assert set(sd) == {"fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "_extra_state"}
    assert sd["_extra_state"]["fwd_amax_history"] is m.fp8_fwd_amax_history  # the buffers (tests/torch/test_checkpoint.py)
    m.to(torch.device("cpu"))
    assert m.fp8_fwd_scale.device.type == "cpu"


def test_amax_reduction_group_gloo(monkeypatch):
    """The all-reduce path over a one-process gloo group: same state as without a group, and it is called."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed not built")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        calls = []
        real = dist.all_reduce

        def counting(t, op=dist.ReduceOp.SUM, group=None, async_op=False):
            calls.append(op)
            return real(t, op=op, group=group, async_op=async_op)

        monkeypatch.setattr(dist, "all_reduce", counting)
        torch.manual_seed(5)
        a = tex.Linear(32, 16)
        b = tex.Linear(32, 16)
        b.load_state_dict(a.state_dict())
        x = torch.randn(16, 32)
        recipe = tex.DelayedScaling(amax_history_len=4)
        for _ in range(3):
            with tex.autocast(recipe=recipe, amax_reduction_group=dist.group.WORLD):
                a(x.requires_grad_()).sum().backward()
            with tex.autocast(recipe=recipe):
                b(x).sum().backward()
        assert len(calls) == 6 and all(op == dist.ReduceOp.MAX for op in calls)
        for name in ("fp8_fwd_amax_history", "fp8_fwd_scale", "fp8_bwd_amax_history", "fp8_bwd_scale"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        # fp8_autocast is the same context under TE's older argument names.
        calls.clear()
        with tex.fp8_autocast(fp8_recipe=recipe, fp8_group=dist.group.WORLD):
            a(x)
        assert len(calls) == 1
    finally:
        dist.destroy_process_group()


def test_delayed_callable_amax_algo_matches_fused():
    torch.manual_seed(6)
    a, b = tex.Linear(32, 16), tex.Linear(32, 16)
    b.load_state_dict(a.state_dict())
    ra = tex.DelayedScaling(amax_history_len=4, amax_compute_algo="max")
    rb = tex.DelayedScaling(amax_history_len=4, amax_compute_algo=lambda h: h.max(dim=0).values)
    for k in range(5):
        x = torch.randn(16, 32) * (k + 1) % 3
        for m, r in ((a, ra), (b, rb)):
            with tex.autocast(recipe=r):
                m(x.requires_grad_()).sum().backward()
    for name in ("fp8_fwd_amax_history", "fp8_fwd_scale", "fp8_bwd_amax_history", "fp8_bwd_scale"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_calibrating_records_amax_without_quantizing():
    m = tex.Linear(32, 16)
    x = torch.randn(16, 32)
    with tex.autocast(recipe=tex.DelayedScaling(amax_history_len=4), calibrating=True):
        y = m(x)
    assert torch.equal(y, F.linear(x, m.weight, m.bias))
    assert m.fp8_fwd_scale[0].item() == pytest.approx(448.0 / x.abs().max().item(), rel=1e-6)
    assert m.fp8_fwd_amax_history[-1, 0].item() == x.abs().max().item()


# ---- interplay with torch: autocast, state_dict, .to(), compile --------------------------------------------------
def test_torch_autocast_bf16(device):
    torch.manual_seed(8)
    m = tex.MLP(64, 64, activation="gelu", device=device)  # fp32 parameters
    x = torch.randn(32, 64, device=device)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        y_plain = m(x)
        with tex.autocast(recipe=tex.Float8CurrentScaling()):
            xr = x.clone().requires_grad_()
            y_fp8 = m(xr)
    assert y_plain.dtype == torch.bfloat16 and y_fp8.dtype == torch.bfloat16
    y_fp8.float().sum().backward()
    assert xr.grad.dtype == torch.float32 and m.fc1_weight.grad.dtype == torch.float32
    torch.testing.assert_close(y_fp8.double(), ref_mlp(x.double(), m, "gelu"), **OUT_TOL)


def test_state_dict_and_to():
    torch.manual_seed(9)
    m = tex.Linear(32, 48)
    ref = torch.nn.Linear(32, 48)
    ref.load_state_dict(without_extra_state(m.state_dict()))  # torch.nn.Linear's keys and shapes + _extra_state
    m2 = tex.Linear(32, 48)
    m2.load_state_dict(ref.state_dict())  # strict: a state_dict without _extra_state loads
    x = torch.randn(4, 32)
    assert torch.equal(m2(x), ref(x))
    mb = m.to(torch.bfloat16)
    assert mb.weight.dtype == torch.bfloat16
    assert torch.equal(mb(x.bfloat16()), ref.to(torch.bfloat16)(x.bfloat16()))
    with torch.no_grad(), tex.autocast(recipe=tex.Float8CurrentScaling()):
        assert mb(x.bfloat16()).dtype == torch.bfloat16
    mlp = tex.MLP(32, 64, activation="swiglu", bias=False)
    assert set(mlp.state_dict()) == {"fc1_weight", "fc2_weight", "_extra_state"} and mlp.fc1_weight.shape == (128, 32)


def test_params_dtype_and_nn_linear_init():
    torch.manual_seed(10)
    m = tex.Linear(64, 32, params_dtype=torch.bfloat16)
    torch.manual_seed(10)
    ref = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    assert torch.equal(m.weight, ref.weight) and torch.equal(m.bias, ref.bias)


# ---- training ------------------------------------------------------------------------------------------------------
def fit(forward, params, teacher, steps, g):
    """AdamW (lr 3e-3) on batches of 128 x ~ N(0, 1) of width 32 drawn from `g`, target = teacher(x) + N(0, 0.1²)
    (noise floor 0.01), MSE of `forward(x)` under bf16 autocast; returns the mean loss of the first 5 steps and of the
    last 5."""
    opt = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    for _ in range(steps):
        x = torch.randn(128, 32, generator=g)
        with torch.no_grad():
            target = teacher(x) + 0.1 * torch.randn(x.shape[0], 32, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = forward(x)
        loss = F.mse_loss(y.float(), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[:5]) / 5, sum(losses[-5:]) / 5


def train(recipe, steps=60, seed=0):
    """A 3-layer model, every layer under the recipe, learning a fixed random teacher (Linear, tanh, Linear) with
    `fit`; returns (first, last) mean losses."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(tex.Linear(32, 64), tex.MLP(64, 128, activation="gelu"), tex.Linear(64, 32))
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 32))

    def forward(x):
        with tex.autocast(enabled=recipe is not None, recipe=recipe):
            return model(x)

    return fit(forward, model.parameters(), teacher, steps, torch.Generator().manual_seed(seed + 1))


TRAIN_RECIPES = {**RECIPES, "fp8-block": lambda: tex.Float8BlockScaling(), "nvfp4": lambda: tex.NVFP4BlockScaling()}


@pytest.mark.parametrize("recipe", MAIN_RECIPES + ["mxfp8-hybrid", "fp8-block"])
def test_training_matches_bf16(recipe):
    first_bf16, bf16 = train(None)
    first, fp8 = train(TRAIN_RECIPES[recipe]())
    print(f"\nfinal loss bf16 {bf16:.5f}, {recipe} {fp8:.5f} ({(fp8 / bf16 - 1) * 100:+.2f} %); first {first:.4f}")
    assert bf16 < 0.5 * first_bf16  # it does learn
    assert abs(fp8 - bf16) <= 0.05 * bf16


class _Residual(torch.nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return x + self.block(x)


def train_blocks(recipe, steps=120, seed=0, freeze_blocks=False):
    """The recipe where it runs at scale: an input projection Linear(32, 128) and an output head Linear(128, 32) in
    bf16, outside the recipe (as NVIDIA's NVFP4 training recipe keeps the embedding and the output head in high
    precision), between them two residual MLP(128, 256, gelu) blocks inside `tex.autocast(recipe)`. The teacher is a
    linear map plus an even quadratic feature map `((x·A)² − 1)·B` that no linear model can fit, its variance (about
    0.01) as large as the noise floor: the quantized blocks must learn it (`freeze_blocks=True`, the blocks left at
    their initialisation, ends far above). Trained with `fit`; returns (first, last) mean losses."""
    torch.manual_seed(seed)
    stem, head = tex.Linear(32, 128), tex.Linear(128, 32)
    blocks = torch.nn.Sequential(*[_Residual(tex.MLP(128, 256, activation="gelu")) for _ in range(2)])
    params = list(stem.parameters()) + list(head.parameters()) + ([] if freeze_blocks else list(blocks.parameters()))
    g = torch.Generator().manual_seed(seed + 1)
    lin = torch.randn(32, 32, generator=g) * (0.25 / 32 ** 0.5)
    a = torch.randn(32, 64, generator=g) / 32 ** 0.5
    b = torch.randn(64, 32, generator=g) * (0.07 / 64 ** 0.5)

    def forward(x):
        h = stem(x)
        with tex.autocast(enabled=recipe is not None, recipe=recipe):
            h = blocks(h)
        return head(h)

    return fit(forward, params, lambda x: x @ lin + ((x @ a) ** 2 - 1) @ b, steps, g)


@functools.lru_cache(maxsize=None)
def bf16_blocks_baseline():
    """train_blocks in bf16: ((first, last) trained, (first, last) with the blocks frozen at init), shared by the
    recipes' tests."""
    return train_blocks(None), train_blocks(None, freeze_blocks=True)


@pytest.mark.parametrize("recipe", MAIN_RECIPES + ["mxfp8-hybrid", "fp8-block", "nvfp4"])
def test_training_blocks_match_bf16(recipe):
    """Issue 5 with the first and last layers in bf16 (train_blocks): every recipe's final loss within 5 % of bf16,
    NVFP4BlockScaling (RHT and stochastic rounding on the gradients, 2-D weights) included. NVFP4 needs these ends in
    bf16: with every layer of the model of test_training_matches_bf16 in NVFP4 it ends 21 % above bf16, and not from a
    bug: an NVFP4 GEMM has the ~14 % relative error of E2M1 with 16-element blocks (~10 % per operand; the three GEMMs
    of a Linear measure 14-18 %, as their operands' errors predict), and that model trained in bf16 then run with an
    NVFP4 forward pass is already 17 % worse; the input projection and the head put that noise straight into the
    output. Broken NVFP4 wiring fails here (measured, dequantization patched): the wgrad's Hadamard transform undone on
    one operand only +73 %, the activation's global amax left out of the fprop +38 %, the weight's columnwise copy
    scrambled in the dgrad +29 %. (The FP8 recipes are also held to 5 % with every layer quantized,
    test_training_matches_bf16.)"""
    (first_bf16, bf16), (_, frozen) = bf16_blocks_baseline()
    first, got = train_blocks(TRAIN_RECIPES[recipe]())
    print(f"\nfinal loss bf16 {bf16:.5f}, {recipe} {got:.5f} ({(got / bf16 - 1) * 100:+.2f} %); bf16 with the blocks "
          f"left at init {frozen:.5f} ({(frozen / bf16 - 1) * 100:+.1f} %); first {first:.4f}")
    assert bf16 < 0.2 * first_bf16  # it learns
    assert frozen > 1.3 * bf16  # the quantized blocks carry a part of the fit far larger than the 5 % margin
    assert abs(got - bf16) <= 0.05 * bf16


# ---- errors ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe,dims,bad", [
    ("current", (24, 32), "in_features=24"),
    ("delayed", (32, 40), "out_features=40"),
    ("mxfp8", (48, 64), "in_features=48"),
])
def test_misaligned_dims_raise(recipe, dims, bad):
    m = tex.Linear(*dims)
    with tex.autocast(recipe=RECIPES[recipe]()), pytest.raises(ValueError) as e:
        m(torch.randn(32, dims[0]))
    msg = str(e.value)
    assert bad in msg and "Pad" in msg and "bf16" in msg and type(RECIPES[recipe]()).__name__ in msg
    m(torch.randn(32, dims[0]))  # fine outside autocast


def test_misaligned_tokens_only_when_training():
    m = tex.MLP(32, 64)
    x = torch.randn(10, 32)
    with tex.autocast(recipe=tex.Float8CurrentScaling()):
        with pytest.raises(ValueError, match="tokens"):
            m(x)
        with torch.no_grad():
            y = m(x)  # inference: the token count is no GEMM's contraction dim
    assert y.shape == (10, 32)
    with tex.autocast(recipe=tex.Float8CurrentScaling()), pytest.raises(ValueError, match="ffn_hidden_size=40"):
        tex.MLP(32, 40)(torch.randn(16, 32))


def test_bad_arguments():
    with pytest.raises(ValueError, match="activation"):
        tex.MLP(32, 64, activation="tanh")
    with pytest.raises(ValueError, match="in_features"):
        tex.Linear(32, 16)(torch.randn(4, 31))
    with pytest.raises(TypeError, match="recipe"):
        with tex.autocast(recipe="fp8"):
            pass
    with pytest.raises(ValueError, match="fp8_format"):
        tex.Float8CurrentScaling(fp8_format=tex.Format.E5M2)
    with pytest.raises(ValueError, match="amax_history_len"):
        tex.DelayedScaling(amax_history_len=0)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        tex.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(NotImplementedError):
        tex.MXFP8BlockScaling(enable_2d_quantization=True)


def test_nvfp4_recipe_turns_rht_off_for_non_bf16_activations(monkeypatch):
    """SPEC §8: NVFP4's Hadamard transform takes bf16 only, so a layer computing in fp32 runs the recipe without it,
    warning once, and gives exactly what disable_rht=True gives; under bf16 autocast the transform stays."""
    import transformer_engine_torch._layer_gemms as layer_gemms

    monkeypatch.setattr(layer_gemms, "_RHT_OFF_WARNED", set())
    torch.manual_seed(3)
    layer = tex.MLP(64, 64)
    x, dy = make_inputs((64, 64), (64, 64), "cpu", torch.float32)

    def run(recipe, bf16=False):
        torch.manual_seed(5)  # the stochastic-rounding bits come from the default generator
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return run_fwd_bwd(layer, x, dy, recipe)

    with pytest.warns(UserWarning, match="Hadamard transform takes bfloat16 activations only"):
        got = run(tex.NVFP4BlockScaling())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = run(tex.NVFP4BlockScaling())  # warned once
        with_rht = run(tex.NVFP4BlockScaling(), bf16=True)
    want = run(tex.NVFP4BlockScaling(disable_rht=True))
    for a, b in zip([got[0]] + got[1] + [again[0]] + again[1], [want[0]] + want[1] + [want[0]] + want[1]):
        assert torch.equal(a, b)
    without = run(tex.NVFP4BlockScaling(disable_rht=True), bf16=True)
    assert not torch.equal(with_rht[1][1], without[1][1])  # fc1's wgrad reads the transformed X and dH


def test_recipe_defaults_and_switches(monkeypatch):
    d = tex.DelayedScaling()
    assert (d.margin, d.fp8_format, d.amax_history_len, d.amax_compute_algo, d.reduce_amax) == (
        0, tex.Format.HYBRID, 1024, "max", True)
    assert d.quantizer_config("input") == ("delayed", 7) and d.quantizer_config("grad_output") == ("delayed", 8)
    assert tex.Float8CurrentScaling().quantizer_config("weight") == ("current", 7, False)
    monkeypatch.setenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "1")
    assert tex.Float8CurrentScaling().use_power_2_scales
    assert tex.MXFP8BlockScaling().quantizer_config("grad_output") == ("mxfp8", 7)
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "1")
    n = tex.NVFP4BlockScaling()
    assert n.disable_rht and not n.disable_stochastic_rounding and not n.disable_2d_quantization
    assert n.quantizer_config("weight") == ("nvfp4", False, False, True)
    assert n.quantizer_config("grad_output") == ("nvfp4", False, True, False)
    assert tex.NVFP4BlockScaling(disable_rht=False).quantizer_config("input") == ("nvfp4", True, False, False)
    b = tex.Float8BlockScaling()
    assert b.force_pow_2_scales and b.quantizer_config("weight") == ("block", 7, True, 2)
    assert b.quantizer_config("input") == ("block", 7, True, 1)
    monkeypatch.setenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "1")
    assert not tex.Float8BlockScaling().force_pow_2_scales
    assert tex.recipe.get_fp8_recipe() == tex.DelayedScaling()  # default recipe


@pytest.mark.parametrize("name,cls", [("NVFP4BlockScaling", "NVFP4Quantizer"),
                                      ("Float8BlockScaling", "Float8BlockQuantizer")])
def test_unavailable_recipes_raise_until_their_quantizer_lands(name, cls):
    recipe = getattr(tex, name)()
    if hasattr(tex, cls):
        # Wired: the layer runs forward and backward in bf16 (the NVFP4 recipe's Hadamard transform takes bf16
        # only); accuracy of those formats is tested where their quantizers are.
        layer = tex.Linear(64, 64, params_dtype=torch.bfloat16)
        x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
        with tex.autocast(recipe=recipe):
            y = layer(x)
        y.float().sum().backward()
        assert y.shape == (64, 64) and x.grad.shape == (64, 64) and torch.isfinite(x.grad.float()).all()
        return
    with pytest.raises(NotImplementedError, match=cls):
        with tex.autocast(recipe=recipe):
            pass
    with tex.autocast(enabled=False, recipe=recipe):  # disabled: nothing to quantize, no error
        pass


# ---- GPU --------------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("recipe", MAIN_RECIPES)
def test_cuda_graph_training_step_replays_bit_identically(recipe):
    """A captured forward+backward step replays with the same outputs and gradients as the eager twin, step after
    step (delayed scaling: its scales and histories evolve identically)."""
    torch.manual_seed(12)
    dev = "cuda"
    model = torch.nn.Sequential(tex.MLP(256, 512, activation="swiglu", params_dtype=torch.bfloat16, device=dev),
                                tex.Linear(256, 128, params_dtype=torch.bfloat16, device=dev))
    twin = torch.nn.Sequential(tex.MLP(256, 512, activation="swiglu", params_dtype=torch.bfloat16, device=dev),
                               tex.Linear(256, 128, params_dtype=torch.bfloat16, device=dev))
    twin.load_state_dict(model.state_dict())
    r = RECIPES[recipe]()
    static_x = torch.randn(256, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def step(m, x):
        for p in m.parameters():
            p.grad = None
        x.grad = None
        with tex.autocast(recipe=r):
            y = m(x)
        y.float().square().mean().backward()
        return y

    def assert_same_delayed_state(k):
        for ma, mb in zip(model, twin):
            for name in ("fp8_fwd_scale", "fp8_fwd_amax_history", "fp8_bwd_scale", "fp8_bwd_amax_history"):
                assert torch.equal(getattr(ma, name), getattr(mb, name)), (k, name)

    # The same warm-up steps on the twin, so both start from the same delayed state: capture_graph executes fn
    # CAPTURE_WARMUPS times; its captured call is recorded, not run (a third eager step here would put the twin's
    # backward histories and scales one update ahead: same outputs, different gradients).
    graph, static_y = capture_graph(lambda: step(model, static_x))
    for _ in range(CAPTURE_WARMUPS):
        step(twin, static_x.detach().clone().requires_grad_())
    torch.cuda.synchronize()
    if recipe == "delayed":
        assert_same_delayed_state("after warm-up")
    for k in range(3):
        new_x = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
        static_x.data.copy_(new_x)
        graph.replay()
        xt = new_x.clone().requires_grad_()
        yt = step(twin, xt)
        torch.cuda.synchronize()
        assert torch.equal(static_y, yt), k
        assert torch.equal(static_x.grad, xt.grad), k
        for pa, pb in zip(model.parameters(), twin.parameters()):
            assert torch.equal(pa.grad, pb.grad), k
        if recipe == "delayed":
            assert_same_delayed_state(k)


@pytest.mark.cuda
@pytest.mark.parametrize("recipe", MAIN_RECIPES)
def test_cuda_matches_cpu(recipe):
    """The same layer on CPU and GPU agree within the layer tolerance (GEMM accumulation order differs)."""
    torch.manual_seed(13)
    m = tex.MLP(128, 256, activation="gelu", params_dtype=torch.bfloat16)
    x, dy = make_inputs((128, 128), (128, 128), "cpu", torch.bfloat16)
    y_cpu, g_cpu = run_fwd_bwd(m, x, dy, RECIPES[recipe]())
    m.to("cuda")
    y_gpu, g_gpu = run_fwd_bwd(m, x.cuda(), dy.cuda(), RECIPES[recipe]())
    torch.testing.assert_close(y_gpu.cpu().double(), y_cpu.double(), **OUT_TOL)
    for a, b in zip(g_gpu, g_cpu):
        torch.testing.assert_close(a.cpu().double(), b.double(), **GRAD_TOL)


@pytest.mark.parametrize("recipe_name", ["MXFP8BlockScaling", "NVFP4BlockScaling"])
def test_layer_quantizers_write_gemm_swizzled_scales(recipe_name):
    """The layers' MXFP8 / NVFP4 quantizers write GEMM-swizzled scales (no GEMM swizzles a temporary), unless the
    caller slices the tensors (gemm_swizzled=False); either way the tensor holds the same values."""
    from transformer_engine_torch.recipe import build_quantizer
    tex = tex_module()
    cfg = getattr(tex, recipe_name)().quantizer_config("input")
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    swz, compact = build_quantizer(cfg, True, True), build_quantizer(cfg, True, True, gemm_swizzled=False)
    assert swz.optimize_for_gemm and not compact.optimize_for_gemm
    a, b = swz(x), compact(x)
    assert a._with_gemm_swizzled_scales and not b._with_gemm_swizzled_scales
    assert torch.equal(a.dequantize(), b.dequantize())
