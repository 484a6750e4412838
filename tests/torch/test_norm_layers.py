"""tex.LayerNorm, tex.RMSNorm, tex.LayerNormLinear, tex.LayerNormMLP (issue 35; docs/torch.md "Normalization layers").

References are float64 autograd of the same math with the layer's parameters (tests/ref/normalization.py's
LayerNorm / RMSNorm, then F.linear and the SPEC §3.2 activations of test_layers.ref_act): plain precision within the
dtype's tolerance, each recipe within the SPEC §9 layer tolerance (normwise for the 4-bit and FP8-block formats,
whose block scales on these tiny tensors make elementwise bounds meaningless). Each accuracy test also shows that
the comparison discriminates (the answer for −x fails it). The fusion itself is checked by recording the norm op's
calls: under a recipe the norm receives the GEMM's input quantizer and returns the quantized tensor the GEMM reads.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from tests import ref
from tests.torch.helpers import CAPTURE_WARMUPS, capture_graph, tex_module
from tests.torch.test_layers import ref_act
from tests.torch.test_recipe_modes import assert_identical, snapshot

tex = tex_module()
norm_layers = __import__("transformer_engine_torch.norm_layers", fromlist=["_norm"])

RECIPES = {
    "current": lambda: tex.Float8CurrentScaling(),
    "delayed": lambda: tex.DelayedScaling(amax_history_len=4),
    "mxfp8": lambda: tex.MXFP8BlockScaling(),
    "fp8-block": lambda: tex.Float8BlockScaling(),
    "nvfp4": lambda: tex.NVFP4BlockScaling(),
}
# max |err| / max |ref| of the output and of the gradients: the SPEC §9 rtol of the format each pass runs in (HYBRID:
# E4M3 forward, E5M2 backward), NVFP4 twice it against float64 (as test_collective_gemm.RECIPES: three FP4 GEMMs deep).
NORMWISE = {"current": (0.125, 0.25), "delayed": (0.125, 0.25), "mxfp8": (0.125, 0.125),
            "fp8-block": (0.125, 0.125), "nvfp4": (0.5, 0.5)}
FP32_TOL = dict(rtol=1e-5, atol=1e-5)


def norm64(kind, x, w, b, eps, zcg):
    if kind == "LayerNorm":
        return ref.layernorm_fwd_ref(x, w, b, eps, zcg)[0]
    return ref.rmsnorm_fwd_ref(x, w, eps, zcg)[0]


def ref_forward(m, x):
    """float64 forward of a norm layer with m's parameters (as float64 leaves, in m.parameters() order)."""
    p = {n: t.detach().double().requires_grad_() for n, t in m.named_parameters()}
    if isinstance(m, (tex.LayerNorm, tex.RMSNorm)):
        kind = "LayerNorm" if isinstance(m, tex.LayerNorm) else "RMSNorm"
        return norm64(kind, x, p["weight"], p.get("bias"), m.eps, m.zero_centered_gamma), p
    ln = norm64(m.normalization, x, p["layer_norm_weight"], p.get("layer_norm_bias"), m.eps, m.zero_centered_gamma)
    if isinstance(m, tex.LayerNormLinear):
        y = F.linear(ln, p["weight"], p.get("bias"))
    else:
        y = F.linear(ref_act(m.activation, F.linear(ln, p["fc1_weight"], p.get("fc1_bias"))), p["fc2_weight"],
                     p.get("fc2_bias"))
    return ((y, ln) if m.return_layernorm_output else y), p


def run(m, x, dy, recipe=None, reference=False, dln=None):
    """(outputs, [dx, parameter grads in m.parameters() order]) of one forward+backward."""
    x = x.detach().clone().requires_grad_()
    if reference:
        xd = x.detach().double().requires_grad_()
        out, p = ref_forward(m, xd)
        outs = out if isinstance(out, tuple) else (out,)
        sum((o * g.double()).sum() for o, g in zip(outs, (dy, dln)) if g is not None).backward()
        return [o.detach() for o in outs], [xd.grad] + [p[n].grad for n, _ in m.named_parameters()]
    for q in m.parameters():
        q.grad = None
    with tex.autocast(enabled=recipe is not None, recipe=recipe):
        out = m(x)
    outs = out if isinstance(out, tuple) else (out,)
    sum((o.float() * g.float()).sum() for o, g in zip(outs, (dy, dln)) if g is not None).backward()
    grads = [x.grad] + [q.grad for q in m.parameters()]
    for q in m.parameters():
        q.grad = None
    return [o.detach() for o in outs], grads


def inputs(shape_x, shape_y, dtype=torch.float32, seed=7):
    g = torch.Generator().manual_seed(seed)
    x = ((torch.rand(shape_x, generator=g) * 4 - 2) + torch.randn(shape_x[-1], generator=g)).to(dtype)
    dy = (torch.randn(shape_y, generator=g) * 0.05).to(dtype)
    return x, dy


def perturb(m, seed=3):
    """Non-trivial norm parameters (the init is ones / zeros), so that gamma and beta matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n in ("weight", "bias", "layer_norm_weight", "layer_norm_bias") and p.dim() == 1 and \
                    not (isinstance(m, tex.LayerNormLinear) and n in ("weight", "bias")):
                p.add_((torch.rand(p.shape, generator=g) - 0.5).to(p.dtype))
    return m


def close_all(got, want, out_tol, grad_tol):
    """Elementwise (tolerance dicts) or normwise (floats: max |err| <= tol * max |ref|)."""
    (outs, grads), (routs, rgrads) = got, want
    pairs = [("out", a, b, out_tol) for a, b in zip(outs, routs)]
    pairs += [(f"grad {i}", a, b, grad_tol) for i, (a, b) in enumerate(zip(grads, rgrads))]
    for what, a, b, tol in pairs:
        assert a is not None and b is not None, what
        if isinstance(tol, float):
            err = (a.double() - b).abs().max().item()
            assert err <= tol * b.abs().max().item(), f"{what}: max error {err} vs max |ref| {b.abs().max()}"
        else:
            torch.testing.assert_close(a.double(), b.double(), **tol, msg=lambda s: f"{what}: {s}")


# ---- the norms alone ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
def test_norm_matches_float64(kind, zcg):
    m = perturb(getattr(tex, kind)(48, eps=1e-3, zero_centered_gamma=zcg))
    x, dy = inputs((3, 5, 48), (3, 5, 48))
    got = run(m, x, dy)
    close_all(got, run(m, x, dy, reference=True), FP32_TOL, FP32_TOL)
    assert got[0][0].dtype == torch.float32 and got[0][0].shape == x.shape
    with pytest.raises(AssertionError):
        close_all(got, run(m, -x, dy, reference=True), FP32_TOL, FP32_TOL)


def test_norms_match_torch_modules():
    """Against torch.nn.LayerNorm / RMSNorm with the same parameters (their own math, not ours)."""
    x, dy = inputs((6, 40), (6, 40))
    for ours, theirs in ((tex.LayerNorm(40, eps=1e-4), torch.nn.LayerNorm(40, eps=1e-4)),
                         (tex.RMSNorm(40, eps=1e-4), torch.nn.RMSNorm(40, eps=1e-4))):
        perturb(ours)
        theirs.load_state_dict(ours.state_dict())
        xt = x.clone().requires_grad_()
        yt = theirs(xt)
        yt.backward(dy)
        (y,), grads = run(ours, x, dy)
        torch.testing.assert_close(y, yt.detach(), **FP32_TOL)
        for a, b in zip(grads, [xt.grad] + [p.grad for p in theirs.parameters()]):
            torch.testing.assert_close(a, b, **FP32_TOL)


def test_norm_bf16_and_torch_autocast():
    m = perturb(tex.LayerNorm(64))
    x, dy = inputs((16, 64), (16, 64))
    want = run(m, x, dy, reference=True)
    bf16 = dict(rtol=1.6e-2, atol=2e-2)
    got = run(m, x.bfloat16(), dy.bfloat16())
    assert got[0][0].dtype == torch.bfloat16 and got[1][0].dtype == torch.bfloat16
    close_all(got, want, bf16, dict(rtol=4e-2, atol=5e-2))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the compute dtype is autocast's; dx in x's dtype
        (y,), grads = run(m, x, dy)
    assert y.dtype == torch.bfloat16 and grads[0].dtype == torch.float32
    close_all(([y], grads), want, bf16, dict(rtol=4e-2, atol=5e-2))


# ---- parameters ----------------------------------------------------------------------------------------------------
def test_parameter_names_order_and_init():
    torch.manual_seed(0)
    assert [n for n, _ in tex.LayerNorm(8).named_parameters()] == ["weight", "bias"]
    assert [n for n, _ in tex.RMSNorm(8).named_parameters()] == ["weight"]
    lnl = tex.LayerNormLinear(64, 128)
    assert list(lnl.state_dict()) == ["layer_norm_weight", "layer_norm_bias", "weight", "bias", "_extra_state"]
    assert list(tex.LayerNormLinear(64, 32, normalization="RMSNorm", bias=False).state_dict()) == [
        "layer_norm_weight", "weight", "_extra_state"]
    mlp = tex.LayerNormMLP(64, 128, activation="swiglu")
    assert list(mlp.state_dict()) == ["layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias",
                                      "fc2_weight", "fc2_bias", "_extra_state"]
    assert mlp.fc1_weight.shape == (256, 64) and mlp.fc2_weight.shape == (64, 128)
    # TE's init: norm weight ones (zeros zero-centred), biases zeros, GEMM weights normal(0, 0.023)
    assert torch.equal(lnl.layer_norm_weight, torch.ones(64)) and not lnl.layer_norm_bias.any()
    assert not lnl.bias.any() and not mlp.fc1_bias.any() and not mlp.fc2_bias.any()
    for w in (lnl.weight, mlp.fc1_weight, mlp.fc2_weight):
        assert abs(w.std().item() - 0.023) < 0.0015 and abs(w.mean().item()) < 0.002
    z = tex.LayerNormMLP(64, 128, zero_centered_gamma=True, init_method=torch.nn.init.zeros_,
                         output_layer_init_method=torch.nn.init.ones_)
    assert not z.layer_norm_weight.any() and not z.fc1_weight.any() and bool((z.fc2_weight == 1).all())
    assert not tex.RMSNorm(8, zero_centered_gamma=True).weight.any()
    # state_dict round trip: the same outputs
    other = tex.LayerNormLinear(64, 128)
    other.load_state_dict(lnl.state_dict())
    x = torch.randn(4, 64)
    assert torch.equal(other(x), lnl(x))


# ---- LayerNormLinear / LayerNormMLP ---------------------------------------------------------------------------------
def _make(cls, norm, zcg, ret, dtype=torch.float32, act="gelu", seed=4):
    torch.manual_seed(seed)
    kw = dict(normalization=norm, zero_centered_gamma=zcg, return_layernorm_output=ret, params_dtype=dtype)
    m = tex.LayerNormLinear(64, 96, **kw) if cls == "linear" else tex.LayerNormMLP(64, 128, activation=act, **kw)
    # weights of O(1/sqrt(fan-in)) so that the outputs are O(1) and the tolerances mean something
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1 / math.sqrt(p.shape[1]))
            elif "layer_norm" not in n:
                p.uniform_(-0.2, 0.2)
    return perturb(m)


@pytest.mark.parametrize("cls", ["linear", "mlp"])
@pytest.mark.parametrize("norm,zcg,ret", [("LayerNorm", False, False), ("RMSNorm", True, True),
                                          ("LayerNorm", True, True), ("RMSNorm", False, False)])
def test_plain_matches_float64(cls, norm, zcg, ret):
    m = _make(cls, norm, zcg, ret)
    n_out = 96 if cls == "linear" else 64
    x, dy = inputs((2, 8, 64), (2, 8, n_out))
    dln = torch.randn(2, 8, 64) * 0.05 if ret else None
    got = run(m, x, dy, dln=dln)
    close_all(got, run(m, x, dy, reference=True, dln=dln), FP32_TOL, FP32_TOL)
    with pytest.raises(AssertionError):
        close_all(got, run(m, -x, dy, reference=True, dln=dln), FP32_TOL, FP32_TOL)


CASES = [(c, r, n) for c in ("linear", "mlp") for r in RECIPES for n in ("LayerNorm", "RMSNorm")
         if n == "LayerNorm" or r in ("current", "mxfp8")]


@pytest.mark.parametrize("cls,recipe,norm", CASES)
def test_recipe_matches_float64(cls, recipe, norm):
    m = _make(cls, norm, norm == "RMSNorm", False, torch.bfloat16, act="swiglu" if recipe == "mxfp8" else "gelu")
    n_out = 96 if cls == "linear" else 64
    x, dy = inputs((2, 32, 64), (2, 32, n_out), torch.bfloat16)
    torch.manual_seed(5)  # NVFP4's stochastic rounding
    got = run(m, x, dy, RECIPES[recipe]())
    want = run(m, x, dy, reference=True)
    close_all(got, want, *NORMWISE[recipe])
    assert got[0][0].dtype == torch.bfloat16
    assert not torch.equal(got[0][0], run(m, x, dy)[0][0])  # quantized indeed
    with pytest.raises(AssertionError):
        close_all(got, run(m, -x, dy, reference=True), *NORMWISE[recipe])


@pytest.mark.parametrize("cls", ["linear", "mlp"])
def test_norm_output_feeds_the_gemm_quantized(cls, monkeypatch):
    """The fusion: under a recipe the norm op gets the GEMM's input quantizer and the layer's GEMM reads what it
    returns; with return_layernorm_output the norm writes the high-precision output (returned, equal to tex.LayerNorm's
    on the same input) and the layer quantizes that."""
    calls = []
    real = norm_layers._norm.layernorm_fwd

    def recording(*args):
        out = real(*args)
        calls.append((args[5], out[0]))
        return out

    monkeypatch.setattr(norm_layers._norm, "layernorm_fwd", recording)
    gemm_inputs = []
    real_gemm = norm_layers.layer_gemm if cls == "linear" else tex.modules.layer_gemm

    def gemm(A, transA, B, *rest, **kw):
        gemm_inputs.append(B)
        return real_gemm(A, transA, B, *rest, **kw)

    monkeypatch.setattr(norm_layers if cls == "linear" else tex.modules, "layer_gemm", gemm)
    m = _make(cls, "LayerNorm", False, False, torch.bfloat16)
    x, _ = inputs((32, 64), (32, 64), torch.bfloat16)
    with tex.autocast(recipe=tex.MXFP8BlockScaling()):
        m(x.requires_grad_())
    (q, out), = calls
    assert isinstance(q, tex.MXFP8Quantizer) and isinstance(out, tex.MXFP8Tensor)
    assert gemm_inputs[0] is out
    calls.clear()
    m.return_layernorm_output = True
    with tex.autocast(recipe=tex.MXFP8BlockScaling()):
        _, ln = m(x)
    (q, out), = calls
    assert q is None and out.dtype == torch.bfloat16
    ref_ln = tex.LayerNorm(64, params_dtype=torch.bfloat16)
    ref_ln.load_state_dict({"weight": m.layer_norm_weight, "bias": m.layer_norm_bias})
    assert torch.equal(ln, ref_ln(x))


def test_delayed_scaling_and_calibration():
    """The fused layer's delayed state: the input slot's amax is the norm output's (the GEMM's input), calibration
    records it without quantizing, and a step moves the scales."""
    m = _make("linear", "LayerNorm", False, False, torch.bfloat16)
    x, dy = inputs((32, 64), (32, 96), torch.bfloat16)
    recipe = tex.DelayedScaling(amax_history_len=4)
    plain = run(m, x, dy)[0][0]
    with tex.autocast(recipe=recipe, calibrating=True):
        y = m(x)
    assert torch.equal(y, plain)
    ln = tex.LayerNorm(64, params_dtype=torch.bfloat16)
    ln.load_state_dict({"weight": m.layer_norm_weight, "bias": m.layer_norm_bias})
    want_amax = ln(x).abs().max().float()
    hist = m.fp8_fwd_amax_history
    assert torch.equal(hist[-1, 0], want_amax), (hist[:, 0], want_amax)  # rolled into the window
    assert m.fp8_fwd_scale[0] == torch.tensor(448.0) / want_amax
    run(m, x, dy, recipe)
    assert (m.fp8_bwd_scale != 1).any()


# ---- compile -------------------------------------------------------------------------------------------------------
def _model(dtype=torch.bfloat16):
    torch.manual_seed(21)
    return torch.nn.Sequential(tex.LayerNormLinear(64, 64, params_dtype=dtype),
                               tex.LayerNormMLP(64, 128, normalization="RMSNorm", activation="swiglu",
                                                params_dtype=dtype))


# CPU: DelayedScaling (its in-place state updates are what AOTAutograd must carry) with aot_eager, two steps; the
# CUDA-marked runs take every recipe through inductor. (test_recipe_modes.py holds Linear and MLP to the same.)
COMPILE_CASES = [pytest.param("delayed", "cpu", "aot_eager", id="delayed-cpu")] + [
    pytest.param(r, "cuda", "inductor", id=f"{r}-cuda", marks=pytest.mark.cuda) for r in ["none", *RECIPES]]


@pytest.mark.parametrize("recipe_name,device,backend", COMPILE_CASES)
def test_compile_fullgraph_equals_eager(recipe_name, device, backend):
    torch._dynamo.reset()
    recipe = None if recipe_name == "none" else RECIPES[recipe_name]()
    eager_model, comp_model = _model().to(device), _model().to(device)
    comp_model.load_state_dict(eager_model.state_dict())
    if isinstance(recipe, tex.DelayedScaling):
        for mm in (eager_model, comp_model):
            tex.init_fp8_state(mm, recipe)
    compiled = torch.compile(comp_model, fullgraph=True, backend=backend)
    for k in range(2):
        x, dy = (t.to(device) for t in inputs((64, 64), (64, 64), torch.bfloat16, seed=100 + k))
        outs = []
        for fn, model in ((eager_model, eager_model), (compiled, comp_model)):
            xi = x.clone().requires_grad_()
            torch.manual_seed(1000 + k)
            with tex.autocast(enabled=recipe is not None, recipe=recipe):
                y = fn(xi)
            y.backward(dy)
            outs.append(snapshot(model, xi, y))
        assert_identical(outs[1], outs[0], f"{recipe_name} compiled step {k}")
    if recipe_name == "delayed":  # the state did move (an update that never happened would also be equal)
        assert not torch.equal(outs[0]["0.fp8_fwd_scale"], torch.ones_like(outs[0]["0.fp8_fwd_scale"]))


# ---- bad input ------------------------------------------------------------------------------------------------------
def test_bad_arguments_name_the_argument():
    for eps in (0.0, -1e-5, float("nan"), float("inf"), "1e-5"):
        with pytest.raises(ValueError, match="eps must be a finite number > 0"):
            tex.LayerNorm(16, eps=eps)
        with pytest.raises(ValueError, match="eps"):
            tex.LayerNormMLP(16, 32, eps=eps)
    with pytest.raises(ValueError, match="normalization must be one of LayerNorm, RMSNorm, got 'BatchNorm'"):
        tex.LayerNormLinear(16, 16, normalization="BatchNorm")
    with pytest.raises(ValueError, match="parallel_mode must be None or 'column'"):
        tex.LayerNormLinear(16, 16, parallel_mode="row", tp_group=object())
    m = tex.LayerNormLinear(32, 16)
    with pytest.raises(ValueError, match=r"input last dim must equal in_features=32, got input shape \(4, 31\)"):
        m(torch.randn(4, 31))
    with pytest.raises(TypeError, match="input dtype must be float32, float16 or bfloat16, got torch.int32"):
        tex.RMSNorm(8)(torch.ones(2, 8, dtype=torch.int32))
    m.layer_norm_weight = torch.nn.Parameter(torch.ones(31))
    with pytest.raises(ValueError, match=r"layer_norm_weight must have shape \[32\] \(hidden_size\), got \[31\]"):
        m(torch.randn(4, 32))
    n = tex.LayerNorm(8)
    n.bias = torch.nn.Parameter(torch.ones(8, dtype=torch.float64))
    with pytest.raises(TypeError, match="bias dtype must be float32, float16 or bfloat16, got torch.float64"):
        n(torch.randn(2, 8))


@pytest.mark.parametrize("recipe,layer,bad", [
    ("mxfp8", lambda: tex.LayerNormLinear(48, 64), "in_features=48"),
    ("fp8-block", lambda: tex.LayerNormMLP(64, 40), "ffn_hidden_size=40"),
    ("current", lambda: tex.LayerNormLinear(24, 32), "in_features=24"),
])
def test_misaligned_hidden_under_a_recipe(recipe, layer, bad):
    m = layer()
    x = torch.randn(32, m.layer_norm_weight.shape[0])
    with tex.autocast(recipe=RECIPES[recipe]()), pytest.raises(ValueError) as e:
        m(x)
    assert bad in str(e.value) and "Pad" in str(e.value) and type(RECIPES[recipe]()).__name__ in str(e.value)
    m(x)  # fine outside autocast


# ---- GPU ------------------------------------------------------------------------------------------------------------
def check_graph_replay(model, twin, step, make_inputs, what):
    """Captures `step(model, static_x, static_dy)` (a forward+backward) in a CUDA graph, then replays it on new
    inputs from `make_inputs(k)` (k = 0: the warm-up's) against the eager twin taking the same steps (its warm-up
    included: capture_graph runs the step CAPTURE_WARMUPS times): outputs, gradients and delayed state identical."""
    x0, dy0 = make_inputs(0)
    static_x = x0.clone().requires_grad_()
    static_dy = dy0.clone()

    def captured():
        for p in model.parameters():
            p.grad = None
        static_x.grad = None
        return step(model, static_x, static_dy)

    graph, static_y = capture_graph(captured)
    for _ in range(CAPTURE_WARMUPS):
        step(twin, x0.clone().requires_grad_(), dy0)
        for p in twin.parameters():
            p.grad = None
    for k in range(1, 4):
        x, dy = make_inputs(k)
        static_x.data.copy_(x)
        static_dy.copy_(dy)
        graph.replay()
        got = snapshot(model, static_x, static_y, clear=False)
        xt = x.clone().requires_grad_()
        assert_identical(got, snapshot(twin, xt, step(twin, xt, dy)), f"{what} replay {k}")


@pytest.mark.cuda
@pytest.mark.parametrize("recipe_name", ["current", "delayed", "mxfp8"])
def test_cuda_graph_training_step_replays_bit_identically(recipe_name):
    """A captured forward+backward step of LayerNormLinear + LayerNormMLP replays like its eager twin, step after
    step (outputs, gradients, delayed state)."""
    recipe = RECIPES[recipe_name]()
    model, twin = _model().cuda(), _model().cuda()
    twin.load_state_dict(model.state_dict())

    def step(m, x, dy):
        with tex.autocast(recipe=recipe):
            y = m(x)
        y.backward(dy)
        return y

    check_graph_replay(model, twin, step, lambda k: tuple(
        t.cuda() for t in inputs((64, 64), (64, 64), torch.bfloat16, seed=100 + k)), recipe_name)
