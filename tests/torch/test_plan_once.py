"""One plan per call (issue 33 item 2): each activation / cast call is planned once by the core
(`_C.plan_act_calls()`, the core's debug counter, moves by exactly one), and the fake kernels' output shapes come
from that planner (`_C.plan_outputs`) and equal the eager op's, for every format and usage. CPU, small shapes."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests import ref
from tests.torch.helpers import current_quantizer, delayed_quantizer, fp8_dtype, tex_module, uniform

E4M3, E2M1 = 7, 10
GELU, SWIGLU = 0, 4


def _calls():
    return tex_module()._C.plan_act_calls()


def _quantizer(kind):
    tex = tex_module()
    if kind == "plain":
        return None
    if kind == "fp8-delayed":
        return delayed_quantizer(3.5, "e4m3", "cpu", amax_value=0.5)[0]
    if kind == "fp8-current":
        return current_quantizer("e4m3")
    if kind == "mxfp8":
        return tex.MXFP8Quantizer(fp8_dtype("e4m3"))
    if kind == "nvfp4":
        return tex.NVFP4Quantizer()
    return tex.Float8BlockQuantizer(fp8_dtype("e4m3"), block_scaling_dim=int(kind[-2]))


KINDS = ["plain", "fp8-delayed", "mxfp8", "nvfp4", "fp8-block-1d"]


@pytest.mark.parametrize("kind", KINDS)
def test_eager_activation_plans_once(kind):
    """tex.gelu(x, q) is one te op call (act / act_quantize), planned once; its result is the reference's."""
    tex = tex_module()
    x = uniform((64, 128), torch.bfloat16)
    q = _quantizer(kind)
    before = _calls()
    y = tex.gelu(x, q)
    assert _calls() - before == 1
    plain = ref.act_ref("gelu", x)
    got = y if q is None else y.dequantize(dtype=torch.float32)
    assert got.shape == (64, 128)
    if q is None:
        ref.assert_close_tol(got, plain, torch.bfloat16, "gelu bf16")


@pytest.mark.parametrize("kind", ["fp8-delayed", "mxfp8", "nvfp4", "fp8-block-2d"])
def test_quantize_into_plans_once(kind):
    """Quantizing into an existing tensor plans once (it planned twice before: once for the buffers' shapes, once
    to run) and writes what a fresh quantize writes."""
    tex = tex_module()
    x = uniform((64, 128), torch.bfloat16)
    q = _quantizer(kind)
    fresh = tex.quantize(x, q)
    dst = tex.quantize(uniform((64, 128), torch.bfloat16, lo=-1.0, hi=1.0), _quantizer(kind))
    before = _calls()
    q2 = _quantizer(kind)
    q2.update_quantized(x, dst)
    assert _calls() - before == 1
    assert torch.equal(dst.dequantize(dtype=torch.float32), fresh.dequantize(dtype=torch.float32))


# ---- fake kernels: shapes from the core's plan, equal to eager ------------------------------------------------------
def _spec(kind, rowwise, columnwise):
    """The op arguments of a quantizer spec (SPEC §1.4) of `kind`."""
    s = dict(qflags=0, eps=0.0, block_dim=1, scale=None, amax=None)
    qkind, qdtype = {"fp8-delayed": (1, E4M3), "fp8-current": (2, E4M3), "mxfp8": (3, E4M3), "nvfp4": (4, E2M1),
                     "fp8-block-1d": (5, E4M3), "fp8-block-2d": (5, E4M3), "plain": (0, E4M3)}[kind]
    if kind == "fp8-delayed":
        s.update(scale=torch.tensor([2.0]), amax=torch.zeros(1))
    if kind == "fp8-block-2d":
        s.update(qflags=2, block_dim=2)
    return (qkind, qdtype, rowwise, columnwise, s["qflags"], s["eps"], s["block_dim"], s["scale"], s["amax"], None)


def _op_calls(kind, rowwise, columnwise):
    """(op name, args) of every quantizing op of the family on CPU inputs (gated and unary activations)."""
    x = uniform((64, 128), torch.bfloat16)
    xg = uniform((64, 256), torch.bfloat16)
    g = uniform((64, 128), torch.bfloat16, g=torch.Generator().manual_seed(5))
    spec = _spec(kind, rowwise, columnwise)
    act_args = (7.0, 1.702, 1.0)
    calls = [("act_quantize", (x, GELU) + act_args + spec), ("act_quantize", (xg, SWIGLU) + act_args + spec),
             ("dact_quantize", (g, x, GELU) + act_args + spec), ("dact_quantize", (g, xg, SWIGLU) + act_args + spec),
             ("dbias_dact", (g, x, GELU) + spec)]
    if kind != "plain":  # the plain casts take a quantizer
        calls += [("quantize", (x,) + spec), ("bgrad_quantize", (x,) + spec)]
    return calls


def _described(outs):
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [(tuple(o.shape), o.dtype) for o in outs]


# Every format with both copies, each copy alone, and no quantizer (qkind 0: the plain output).
FAKE_CASES = [pytest.param(kind, row, col, id=f"{kind}-{uid}")
              for kind in ["fp8-delayed", "fp8-current", "mxfp8", "nvfp4", "fp8-block-1d", "fp8-block-2d"]
              for row, col, uid in [(True, True, "row+col"), (True, False, "row"), (False, True, "col")]]
FAKE_CASES.append(pytest.param("plain", True, True, id="plain"))


@pytest.mark.parametrize("kind,rowwise,columnwise", FAKE_CASES)
def test_fake_shapes_equal_eager(kind, rowwise, columnwise):
    """Every quantizing op's fake outputs (FakeTensorMode: the fake kernels in _ops.py, planned by the core without
    a device) have the eager outputs' shapes and dtypes, each fake call planning once."""
    for name, args in _op_calls(kind, rowwise, columnwise):
        op = getattr(torch.ops.te, name).default
        eager = _described(op(*args))
        with FakeTensorMode() as mode:
            fargs = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
            before = _calls()
            fake = _described(op(*fargs))
            assert _calls() - before == 1, name
        assert fake == eager, f"{name} {kind}: fake {fake} != eager {eager}"


def test_fake_plain_act_and_dact_equal_eager():
    """act / dact (the plain ops) as well: gated forward halves the last dim, backward keeps x's shape."""
    xg = uniform((6, 32), torch.float32)
    g = uniform((6, 16), torch.float32)
    for name, args in [("act", (xg, SWIGLU)), ("act", (g, GELU)), ("dact", (g, xg, SWIGLU))]:
        op = getattr(torch.ops.te, name).default
        eager = _described(op(*args))
        with FakeTensorMode() as mode:
            fake = _described(op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)))
        assert fake == eager, name


def test_fake_checks_are_the_core_checks():
    """The fake kernel runs the eager op's checks: an MXFP8 last dim that is not a multiple of 32 raises the core's
    ValueError at trace time, with the eager message."""
    x = uniform((4, 48), torch.float32)
    spec = _spec("mxfp8", True, True)
    op = torch.ops.te.quantize.default
    with pytest.raises(ValueError, match="multiple of 32") as eager:
        op(x, *spec)
    with FakeTensorMode() as mode:
        with pytest.raises(ValueError, match="multiple of 32") as fake:
            op(mode.from_tensor(x), *spec)
    assert str(fake.value) == str(eager.value)


def test_compile_fullgraph_plans():
    """torch.compile(fullgraph=True) of a tex activation: the fake kernel plans while tracing, then each compiled
    call plans once (the real op); the bytes are eager's."""
    tex = tex_module()
    q = tex.MXFP8Quantizer(fp8_dtype("e4m3"))
    x = uniform((64, 128), torch.bfloat16)

    def f(x):
        y = tex.gelu(x, q)
        return y._rowwise_data, y._rowwise_scale_inv, y._columnwise_data, y._columnwise_scale_inv

    eager = f(x)
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    before = _calls()
    out = cf(x)
    traced = _calls() - before
    assert traced >= 2  # the trace's fake plans (dynamo, AOT) and the run's one
    for a, b in zip(out, eager):
        assert torch.equal(a, b)
    before = _calls()
    for _ in range(3):
        cf(x)
    assert _calls() - before == 3
