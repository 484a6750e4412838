"""Bad input -> a clear Python exception naming the problem (SPEC §1.5, §3.1, §4.2), never a crash.
TypeError: wrong argument type; ValueError: bad values/shapes (Python checks); RuntimeError: C++
TORCH_CHECK. Patterns are loose but must name the problem (dtype / shape / scale / quantizer...)."""
import pytest
import torch

from tests import ref
from tests.torch.helpers import call_act, call_dact, current_quantizer, delayed_quantizer, tex_module, uniform

ANY = (TypeError, ValueError, RuntimeError)
SHAPEY = (ValueError, RuntimeError)


@pytest.mark.parametrize("bad", [torch.int32, torch.float64, torch.uint8], ids=["int32", "float64", "uint8"])
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_activation_wrong_dtype(name, bad):
    x = torch.ones(4, 8, dtype=bad)
    with pytest.raises(TypeError, match=r"(?i)dtype|int32|float64|uint8|Int|Double|Byte"):
        call_act(name, x, None)
    g = torch.ones(ref.out_shape(name, x.shape), dtype=bad)
    with pytest.raises(TypeError, match=r"(?i)dtype|int32|float64|uint8|Int|Double|Byte"):
        call_dact(name, g, x, None)


def test_activation_wrong_dtype_with_quantizer():
    q, _, _ = delayed_quantizer(1.0, "e4m3")
    with pytest.raises(TypeError, match=r"(?i)dtype|int32|Int"):
        tex_module().gelu(torch.ones(4, 8, dtype=torch.int32), q)


@pytest.mark.parametrize("bad", [torch.int32, torch.float64])
def test_quantize_wrong_dtype(bad):
    tex = tex_module()
    q, _, _ = delayed_quantizer(1.0, "e4m3")
    with pytest.raises(ANY, match=r"(?i)dtype|int32|float64|Int|Double"):
        tex.quantize(torch.ones(4, 8, dtype=bad), q)
    with pytest.raises(ANY, match=r"(?i)dtype|int32|float64|Int|Double"):
        tex.bgrad_quantize(torch.ones(4, 8, dtype=bad), current_quantizer("e4m3"))


@pytest.mark.parametrize("shape", [(4, 5), (7,), (3, 2, 1)], ids=["4x5", "7", "3x2x1"])
@pytest.mark.parametrize("name", sorted(ref.GATED))
def test_gated_odd_last_dim(name, shape):
    x = uniform(shape)
    with pytest.raises(SHAPEY, match=r"(?i)even|shape|last dim|dim"):
        call_act(name, x, None)
    q, _, _ = delayed_quantizer(1.0, "e4m3")
    with pytest.raises(SHAPEY, match=r"(?i)even|shape|last dim|dim"):
        call_act(name, x, q)
    g = uniform(shape[:-1] + (shape[-1] // 2 or 1,))
    with pytest.raises(SHAPEY, match=r"(?i)even|shape|last dim|dim"):
        call_dact(name, g, x, None)


@pytest.mark.parametrize("name", ["geglu", "swiglu", "clamped_swiglu"])
def test_gated_zero_dim_or_zero_last_dim(name):
    with pytest.raises(SHAPEY, match=r"(?i)even|shape|dim|0-d|scalar"):
        call_act(name, torch.tensor(1.0), None)
    with pytest.raises(SHAPEY, match=r"(?i)even|shape|dim|>= ?2|at least"):
        call_act(name, torch.empty(4, 0), None)


@pytest.mark.parametrize("name", ["gelu", "relu", "geglu", "swiglu", "glu", "clamped_swiglu"])
def test_grad_shape_mismatch(name):
    x = uniform((4, 6))
    good = ref.out_shape(name, x.shape)
    bad_shapes = [(4, good[-1] + 2), (5, good[-1]), (good[-1],)]
    if name in ref.GATED:
        bad_shapes.append((4, 6))     # grad with the INPUT's shape instead of the output's
    for bs in bad_shapes:
        with pytest.raises(SHAPEY, match=r"(?i)shape"):
            call_dact(name, uniform(bs), x, None)
        q, _, _ = delayed_quantizer(1.0, "e4m3")
        with pytest.raises(SHAPEY, match=r"(?i)shape"):
            call_dact(name, uniform(bs), x, q)


@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES))
def test_dbias_grad_shape_mismatch(name):
    tex = tex_module()
    with pytest.raises(SHAPEY, match=r"(?i)shape"):
        getattr(tex, name)(uniform((4, 7)), uniform((4, 6)), None)


def test_grad_dtype_mismatch():
    tex = tex_module()
    x = uniform((4, 6), torch.float32)
    with pytest.raises(ANY, match=r"(?i)dtype|bfloat16|BFloat16|float32"):
        tex.dgelu(uniform((4, 6), torch.bfloat16), x, None)
    with pytest.raises(ANY, match=r"(?i)dtype|float16|Half|float32"):
        tex.dswiglu(uniform((4, 3), torch.float16), x, None)


# ------------------------------------------------------------------------------------------------
# quantizer problems
# ------------------------------------------------------------------------------------------------
def _use(q, x=None):
    tex = tex_module()
    x = uniform((4, 8)) if x is None else x
    tex.quantize(x, q)
    tex.gelu(x, q)


@pytest.mark.parametrize("bad", [torch.ones(2), torch.ones(1, 2), torch.ones(()).reshape(1, 1, 1)[:, :, :0]],
                         ids=["2", "1x2", "empty"])
def test_scale_wrong_shape(bad):
    tex = tex_module()
    with pytest.raises(ANY, match=r"(?i)shape|numel|element|size"):
        q = tex.Float8Quantizer(bad, torch.zeros(1), tex.DType.kFloat8E4M3)
        _use(q)


@pytest.mark.parametrize("bad", [torch.float64, torch.float16, torch.bfloat16, torch.int32])
def test_scale_wrong_dtype(bad):
    tex = tex_module()
    with pytest.raises(ANY, match=r"(?i)dtype|float32|Float"):
        q = tex.Float8Quantizer(torch.ones(1, dtype=bad), torch.zeros(1), tex.DType.kFloat8E4M3)
        _use(q)


def test_amax_wrong_shape_or_dtype():
    tex = tex_module()
    with pytest.raises(ANY, match=r"(?i)amax|shape|numel|size"):
        q = tex.Float8Quantizer(torch.ones(1), torch.zeros(3), tex.DType.kFloat8E4M3)
        _use(q)
    with pytest.raises(ANY, match=r"(?i)amax|dtype|float32"):
        q = tex.Float8Quantizer(torch.ones(1), torch.zeros(1, dtype=torch.float16), tex.DType.kFloat8E4M3)
        _use(q)


def test_scale_not_a_tensor():
    tex = tex_module()
    with pytest.raises(ANY, match=r"(?i)scale|tensor"):
        q = tex.Float8Quantizer(1.0, torch.zeros(1), tex.DType.kFloat8E4M3)
        _use(q)


@pytest.mark.parametrize("bad_q", [object(), "fp8", 3, torch.ones(1)], ids=["object", "str", "int", "tensor"])
def test_unknown_quantizer_type(bad_q):
    tex = tex_module()
    x = uniform((4, 8))
    with pytest.raises(TypeError, match=r"(?i)quantizer"):
        tex.gelu(x, bad_q)
    with pytest.raises(TypeError, match=r"(?i)quantizer"):
        tex.dgelu(x, x, bad_q)
    with pytest.raises(TypeError, match=r"(?i)quantizer"):
        tex.swiglu(x, bad_q)
    with pytest.raises(TypeError, match=r"(?i)quantizer"):
        tex.quantize(x, bad_q)
    with pytest.raises(TypeError, match=r"(?i)quantizer"):
        tex.bgrad_quantize(x, bad_q)
    with pytest.raises(TypeError, match=r"(?i)quantizer"):
        tex.dbias_dgelu(x, x, bad_q)


def test_unknown_quantizer_lookalike_class():
    """An object that merely looks like a Float8Quantizer is still rejected."""
    tex = tex_module()

    class Fake:
        def __init__(self):
            self.scale = torch.ones(1)
            self.amax = torch.zeros(1)
            self.dtype = tex.DType.kFloat8E4M3
            self.rowwise_usage = True
            self.columnwise_usage = True

    with pytest.raises(TypeError, match=r"(?i)quantizer"):
        tex.gelu(uniform((4, 8)), Fake())


@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_quantizer_without_usage(kind):
    """Neither rowwise nor columnwise usage: ValueError from every path, and an `output` passed in keeps its
    buffers."""
    tex = tex_module()
    x = uniform((4, 8))
    if kind == "delayed":
        q = delayed_quantizer(1.0, "e4m3", rowwise=False, columnwise=False)[0]
    else:
        q = current_quantizer("e4m3", rowwise=False, columnwise=False)
    for call in (lambda: tex.quantize(x, q), lambda: tex.gelu(x, q), lambda: tex.dgelu(x, x, q),
                 lambda: tex.bgrad_quantize(x, q), lambda: tex.dbias_dgelu(x, x, q)):
        with pytest.raises(ValueError, match=r"(?i)neither rowwise nor columnwise"):
            call()
    out = tex.quantize(x, current_quantizer("e4m3"))
    data, transpose = out._data, out._transpose
    with pytest.raises(ValueError, match=r"(?i)neither rowwise nor columnwise"):
        tex.quantize(x, q, output=out)
    assert out._data is data and out._transpose is transpose


def test_ops_raise_type_error_for_dtypes():
    """The ops themselves, not only the Python wrappers, raise TypeError for a wrong dtype (SPEC §1.5)."""
    tex_module()
    with pytest.raises(TypeError, match=r"float32, float16 or bfloat16"):
        torch.ops.te.act.default(torch.ones(4, 8, dtype=torch.int32), 0, 7.0, 1.702, 1.0)
    with pytest.raises(TypeError, match=r"grad dtype"):
        torch.ops.te.dact.default(uniform((4, 8), torch.bfloat16), uniform((4, 8)), 0, 7.0, 1.702, 1.0)


def test_quantize_with_none_quantizer():
    tex = tex_module()
    with pytest.raises(ANY, match=r"(?i)quantizer|None"):
        tex.quantize(uniform((4, 8)), None)


@pytest.mark.parametrize("bad", ["float32", "int", "fp4"])
def test_invalid_fp8_dtype(bad):
    tex = tex_module()
    val = {"float32": tex.DType.kFloat32, "int": 99, "fp4": tex.DType.kFloat4E2M1}[bad]
    with pytest.raises((TypeError, ValueError, RuntimeError, NotImplementedError),
                       match=r"(?i)fp8|float8|e4m3|e5m2|dtype"):
        q = tex.Float8Quantizer(torch.ones(1), torch.zeros(1), val)
        _use(q)
    with pytest.raises((TypeError, ValueError, RuntimeError, NotImplementedError),
                       match=r"(?i)fp8|float8|e4m3|e5m2|dtype"):
        q = tex.Float8CurrentScalingQuantizer(val)
        _use(q)


# ------------------------------------------------------------------------------------------------
# cast helpers
# ------------------------------------------------------------------------------------------------
def test_compute_amax_bad_amax():
    tex = tex_module()
    with pytest.raises(ANY, match=r"(?i)amax|shape|numel|size"):
        tex.compute_amax(uniform((4, 4)), torch.zeros(2))
    with pytest.raises(ANY, match=r"(?i)amax|dtype|float32"):
        tex.compute_amax(uniform((4, 4)), torch.zeros(1, dtype=torch.float16))
    with pytest.raises(ANY, match=r"(?i)dtype|int32|Int"):
        tex.compute_amax(torch.ones(4, dtype=torch.int32), torch.zeros(1))


def test_amax_update_bad_algo_and_lists():
    tex = tex_module()
    h, s = [torch.ones(4, 2)], [torch.ones(2)]
    with pytest.raises(ANY, match=r"(?i)algo|max|most_recent"):
        tex.fused_amax_and_scale_update_after_reduction(None, h, s, "mean", tex.DType.kFloat8E4M3, 0.0)
    with pytest.raises(ANY, match=r"(?i)scale|histor|len|size|shape|number"):
        tex.fused_amax_and_scale_update_after_reduction(None, [torch.ones(4, 2), torch.ones(4, 2)], s, "max",
                                                        tex.DType.kFloat8E4M3, 0.0)
    with pytest.raises(ANY, match=r"(?i)scale|shape|size|numel"):
        tex.fused_amax_and_scale_update_after_reduction(None, h, [torch.ones(3)], "max", tex.DType.kFloat8E4M3, 0.0)
    with pytest.raises(ANY, match=r"(?i)buffer|shape|size|numel|reduction"):
        # too small to hold the row-0 amax of every history
        tex.fused_amax_and_scale_update_after_reduction(torch.ones(1), h, s, "max", tex.DType.kFloat8E4M3, 0.0)


def test_dequantize_bad_otype():
    tex = tex_module()
    qt = tex.quantize(uniform((4, 8)), current_quantizer("e4m3"))
    with pytest.raises(ANY, match=r"(?i)dtype|otype|int32|Int|Float8|fp8"):
        tex.dequantize(qt, torch.int32)


def test_fp8_transpose_bad_out():
    tex = tex_module()
    x = torch.zeros(4, 6, dtype=torch.uint8)
    with pytest.raises(ANY, match=r"(?i)shape|size|out"):
        tex.fp8_transpose(x, tex.DType.kFloat8E4M3, out=torch.empty(4, 6, dtype=torch.uint8))
