"""Every recipe in every execution mode (issue: hardening). A 2-layer model (Linear + MLP gelu, Linear + MLP swiglu)
takes forward+backward steps (a) eagerly, (b) under torch.compile(fullgraph=True) — so a graph break fails the
test — and (c) captured in a CUDA graph and replayed on new inputs; (b) and (c) must give outputs and gradients
bit-identical to (a) (torch.equal), and delayed scaling's scales and amax histories must advance the same way.

On the CPU the compile mode uses the aot_eager backend (dynamo + AOTAutograd, the parts that can break, without
inductor's C++ compile time) for every recipe and inductor for one; on the GPU inductor for every recipe.
Stochastic rounding (NVFP4 gradients) draws from the default generator: every step reseeds it, so each mode sees
the same bits.
"""
import pytest
import torch

from tests.torch.helpers import CAPTURE_WARMUPS, HAS_CUDA, capture_graph, tex_module

tex = tex_module()

RECIPES = {
    "delayed": lambda: tex.DelayedScaling(amax_history_len=4),
    "current": lambda: tex.Float8CurrentScaling(),
    "mxfp8": lambda: tex.MXFP8BlockScaling(),
    "nvfp4": lambda: tex.NVFP4BlockScaling(),
    "fp8-block": lambda: tex.Float8BlockScaling(),
}
ACTS = ["gelu", "swiglu"]
DELAYED_BUFFERS = ("fp8_fwd_scale", "fp8_fwd_amax_history", "fp8_bwd_scale", "fp8_bwd_amax_history")
HIDDEN, FFN, TOKENS = 64, 128, 64


def make_model(act, device, dtype):
    torch.manual_seed(21)
    return torch.nn.Sequential(tex.Linear(HIDDEN, HIDDEN, params_dtype=dtype, device=device),
                               tex.MLP(HIDDEN, FFN, activation=act, params_dtype=dtype, device=device))


def twins(act, device, dtype, n, recipe=None):
    """n models with the same parameters (and, under a DelayedScaling, fresh delayed state for it: it must exist
    before torch.compile traces a layer)."""
    models = [make_model(act, device, dtype) for _ in range(n)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    if isinstance(recipe, tex.DelayedScaling):
        for m in models:
            tex.init_fp8_state(m, recipe)
    return models


def step_fn(model, recipe):
    """One forward+backward of `model` (a module, or its torch.compile) under `recipe`; returns the output
    (gradients land in .grad). A compiled module's backward is the graph AOTAutograd traced with its forward."""
    def step(x, dy):
        with tex.autocast(recipe=recipe):
            y = model(x)
        y.backward(dy)
        return y
    return step


def inputs(k, device, dtype):
    g = torch.Generator().manual_seed(100 + k)
    x = (torch.rand(TOKENS, HIDDEN, generator=g) * 4 - 2).to(dtype).to(device)
    dy = (torch.randn(TOKENS, HIDDEN, generator=g) * 0.1).to(dtype).to(device)
    return x, dy


def snapshot(model, x, y, clear=True):
    """Output, input gradient, parameter gradients and delayed-scaling buffers after a step, as clones; `clear`
    drops the gradients afterwards (not for a captured graph, whose replays write into the captured ones)."""
    out = {"y": y.detach().clone(), "dx": x.grad.clone()}
    for name, p in model.named_parameters():
        out["grad " + name] = p.grad.clone()
        if clear:
            p.grad = None
    for name, b in model.named_buffers():
        if name.split(".")[-1] in DELAYED_BUFFERS and b is not None:
            out[name] = b.clone()
    return out


def assert_identical(got, want, what):
    assert got.keys() == want.keys(), what
    for key in want:
        assert torch.equal(got[key], want[key]), f"{what}: {key} differs"


def run_eager_and_compiled(recipe_name, act, device, dtype, backend, steps=3):
    """(eager snapshots, compiled snapshots) over `steps` steps on fresh inputs; the compiled step is
    torch.compile(fullgraph=True) of the model, whose backward AOTAutograd compiles."""
    recipe = RECIPES[recipe_name]()
    eager_model, comp_model = twins(act, device, dtype, 2, recipe)
    eager = step_fn(eager_model, recipe)
    compiled = step_fn(torch.compile(comp_model, fullgraph=True, backend=backend), recipe)
    got, want = [], []
    for k in range(steps):
        x, dy = inputs(k, device, dtype)
        for fn, model, out in ((eager, eager_model, want), (compiled, comp_model, got)):
            xi = x.clone().requires_grad_()
            torch.manual_seed(1000 + k)
            y = fn(xi, dy)
            out.append(snapshot(model, xi, y))
    return want, got


CPU_CASES = [pytest.param(r, a, "aot_eager", id=f"{r}-{a}-aot_eager") for r in RECIPES for a in ACTS]
CPU_CASES.append(pytest.param("delayed", "swiglu", "inductor", id="delayed-swiglu-inductor", marks=pytest.mark.slow))


@pytest.mark.parametrize("recipe_name,act,backend", CPU_CASES)
def test_compile_fullgraph_cpu(recipe_name, act, backend):
    torch._dynamo.reset()
    want, got = run_eager_and_compiled(recipe_name, act, "cpu", torch.bfloat16, backend)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_identical(g, w, f"{recipe_name}/{act} compiled step {k}")
    if recipe_name == "delayed":  # the buffers did move (a scale update that never happened would also be equal)
        assert not torch.equal(want[-1]["0.fp8_fwd_scale"], torch.ones_like(want[-1]["0.fp8_fwd_scale"]))


def test_compile_default_delayed_needs_no_init():
    """The state allocated with the layer fits the default DelayedScaling(): compile works without init_fp8_state."""
    torch._dynamo.reset()
    recipe = tex.DelayedScaling()
    model = make_model("gelu", "cpu", torch.float32)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, dy = inputs(0, "cpu", torch.float32)
    step_fn(compiled, recipe)(x.clone().requires_grad_(), dy)
    assert model[0].fp8_bwd_amax_history.shape == (1024, 2)
    assert model[0].fp8_bwd_amax_history[-1].abs().sum() > 0  # the backward's update reached the buffer


def test_compile_with_unprepared_history_length_says_what_to_do():
    torch._dynamo.reset()
    model = make_model("gelu", "cpu", torch.float32)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, dy = inputs(0, "cpu", torch.float32)
    with pytest.raises(Exception, match=r"init_fp8_state") as info:
        step_fn(compiled, tex.DelayedScaling(amax_history_len=16))(x.clone().requires_grad_(), dy)
    assert "16 steps" in str(info.value) and "1024 steps" in str(info.value)


def test_half_keeps_delayed_state_float32():
    model = make_model("swiglu", "cpu", torch.float32).to(torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for m in model:
        for name in DELAYED_BUFFERS:
            assert getattr(m, name).dtype == torch.float32, name


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_compile_fullgraph_cuda(recipe_name, act):
    torch._dynamo.reset()
    want, got = run_eager_and_compiled(recipe_name, act, "cuda", torch.bfloat16, "inductor")
    for k, (g, w) in enumerate(zip(got, want)):
        assert_identical(g, w, f"{recipe_name}/{act} compiled step {k}")


@pytest.mark.cuda
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_cuda_graph_replay(recipe_name, act):
    """A captured step replayed on new inputs equals the eager twin's step, output, gradients and delayed state."""
    dev, dtype = "cuda", torch.bfloat16
    recipe = RECIPES[recipe_name]()
    model, twin = twins(act, dev, dtype, 2, recipe)
    static_x = torch.zeros(TOKENS, HIDDEN, device=dev, dtype=dtype, requires_grad=True)
    static_dy = torch.zeros(TOKENS, HIDDEN, device=dev, dtype=dtype)
    x0, dy0 = inputs(0, dev, dtype)
    static_x.data.copy_(x0)
    static_dy.copy_(dy0)

    def captured():
        for p in model.parameters():
            p.grad = None
        static_x.grad = None
        return step_fn(model, recipe)(static_x, static_dy)

    torch.manual_seed(999)
    graph, static_y = capture_graph(captured)
    # The twin takes the same warm-up steps (capture_graph runs the step CAPTURE_WARMUPS times before capturing).
    for _ in range(CAPTURE_WARMUPS):
        xt = x0.clone().requires_grad_()
        step_fn(twin, recipe)(xt, dy0)
        for p in twin.parameters():
            p.grad = None
    for k in range(1, 4):
        x, dy = inputs(k, dev, dtype)
        static_x.data.copy_(x)
        static_dy.copy_(dy)
        torch.manual_seed(1000 + k)
        graph.replay()
        got = snapshot(model, static_x, static_y, clear=False)
        xt = x.clone().requires_grad_()
        torch.manual_seed(1000 + k)
        want = snapshot(twin, xt, step_fn(twin, recipe)(xt, dy))
        assert_identical(got, want, f"{recipe_name}/{act} replay {k}")


def test_compile_traces_recipe_construction_and_first_warning(monkeypatch):
    """Code dynamo traces asks no question that breaks the graph: recipes built inside the compiled function
    (their env defaults, Format values), and NVFP4's first 'RHT off' warning for a non-bf16 layer."""
    import transformer_engine_torch._layer_gemms as layer_gemms

    monkeypatch.setattr(layer_gemms, "_RHT_OFF_WARNED", set())
    torch._dynamo.reset()
    model = make_model("gelu", "cpu", torch.float32)

    def f(x):
        ys = []
        for recipe in (tex.Float8CurrentScaling(), tex.MXFP8BlockScaling(), tex.NVFP4BlockScaling(),
                       tex.Float8BlockScaling(), tex.DelayedScaling()):
            with tex.autocast(recipe=recipe):
                ys.append(model(x))
        return torch.stack(ys)

    x, _ = inputs(0, "cpu", torch.float32)
    with pytest.warns(UserWarning, match="Hadamard"):
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    eager_model = make_model("gelu", "cpu", torch.float32)
    model.load_state_dict(eager_model.state_dict())
    tex.init_fp8_state(model, tex.DelayedScaling())
    assert torch.equal(got, f(x))  # fresh delayed state both times: the same first step
    assert tex.get_cublasLt_version() == torch.compile(tex.get_cublasLt_version, fullgraph=True)()


def test_compile_asks_native_gemm_of_a_cuda_device_without_guards(monkeypatch):
    """The block GEMMs pick native or emulated by device facts while dynamo traces (gemm.py). Pretend to be an
    sm_90 device with cuBLASLt 13.1 (the facts are cached, so seeding the cache is all the device there is): the
    answer must be a constant dynamo bakes in. A set from an assume_constant_result function broke this on the GPU
    (dynamo cannot install the membership guard), which no CPU run took."""
    from transformer_engine_torch import _device

    monkeypatch.setitem(_device._CAPABILITY, 0, (9, 0))
    monkeypatch.setitem(_device._FACTS, "cublaslt", 130100)
    torch._dynamo.reset()

    def f(x):
        a = _device.gemm_is_native("Float8BlockwiseQTensor", 0)
        b = _device.gemm_is_native("MXFP8Tensor", 0)
        return x + 1 if a and not b else x - 1

    x = torch.zeros(3)
    assert torch.equal(torch.compile(f, fullgraph=True, backend="eager")(x), x + 1)
    torch._dynamo.reset()


class _DeviceLog(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the device of every tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.devices = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.devices.add(t.device.type)
        return out


def test_dequantize_helpers_make_no_host_tensor():
    """A host tensor copied to the device is an error inside a CUDA graph capture. The NVFP4 decode table and the
    Hadamard matrix are built on the target device (meta here: any CPU tensor among the ops' outputs is a host
    copy waiting to happen), and equal the values SPEC §4.6 spells out."""
    from transformer_engine_torch.formats.nvfp4 import _e2m1_values, e2m1_unpack, rht_matrix

    log = _DeviceLog()
    with log:
        e2m1_unpack(torch.empty(4, 8, dtype=torch.uint8, device="meta"), 16)
        rht_matrix(device="meta")
    assert log.devices == {"meta"}
    want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    got = _e2m1_values("cpu")
    assert got.tolist() == want + [-v for v in want]
    assert torch.signbit(got[8]).item()  # code 8 is -0.0
    h = torch.tensor([[(-1.0) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], dtype=torch.float64)
    mask = 0b1010_0110_0011_0101
    s = torch.tensor([-1.0 if (mask >> t) & 1 else 1.0 for t in range(16)], dtype=torch.float64)
    assert torch.equal(rht_matrix(mask, dtype=torch.float64), s[:, None] * h / 4)
