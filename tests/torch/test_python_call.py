"""`_C.call(op, args)` (csrc/torch/python_call.cpp), the wrappers' eager entry to the ops, is `op(*args)`: the same
outputs bit for bit, the same in-place updates, autograd and errors; tensor subclasses and __torch_function__ modes
take torch's own path."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.torch.helpers import DEVICE_PARAMS, tex_module, uniform
from tests.torch.test_opcheck_compile import _cases


def _call(op, *args):
    tex_module()
    from transformer_engine_torch import _C

    return _C.call(op, args)


def _clone(a):
    if isinstance(a, torch.Tensor):
        return a.detach().clone().requires_grad_(a.requires_grad)
    if isinstance(a, list):
        return [_clone(t) for t in a]
    return a


def _flat(v):
    if isinstance(v, (tuple, list)):
        return [t for x in v for t in _flat(x)]
    return [v]


def _bytes(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _assert_same(a, b, what):
    fa, fb = _flat(a), _flat(b)
    assert len(fa) == len(fb), what
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and type(x) is type(y), what
            assert (x.shape, x.dtype, x.device, x.stride()) == (y.shape, y.dtype, y.device, y.stride()), what
            assert torch.equal(_bytes(x), _bytes(y)), what
        else:
            assert x == y, what


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_call_equals_op_on_every_case(device):
    tex_module()
    for name, args, case_id in _cases(device):
        op = getattr(torch.ops.te, name).default
        a, b = [_clone(t) for t in args], [_clone(t) for t in args]
        _assert_same(op(*a), _call(op, *b), case_id)
        _assert_same(a, b, f"{case_id}: arguments after the call")


def test_call_autograd_of_act():
    tex_module()
    op = torch.ops.te.act.default
    x = uniform((4, 16)).requires_grad_()
    y = _call(op, x, 3)
    assert y.grad_fn is not None
    (gx,) = torch.autograd.grad(y.sum(), x)
    (gr,) = torch.autograd.grad(op(x, 3).sum(), x)
    assert torch.equal(gx, gr)
    with torch.no_grad():
        assert _call(op, x, 3).grad_fn is None


def _error(f):
    with pytest.raises(Exception) as e:
        f()
    return type(e.value), str(e.value)


@pytest.mark.parametrize("bad", ["int_input", "unknown_qkind", "missing_arg", "str_for_int", "too_many",
                                 "wrong_device_scale"])
def test_call_errors_equal_ops(bad):
    tex_module()
    op = torch.ops.te.act_quantize.default
    x = uniform((4, 16))
    spec = (2, 7, True, False)
    args = {
        "int_input": (x.int(), 0, 7.0, 1.702, 1.0) + spec,
        "unknown_qkind": (x, 0, 7.0, 1.702, 1.0, 9, 7, True, False),
        "missing_arg": (x, 0, 7.0),
        "str_for_int": (x, "gelu", 7.0, 1.702, 1.0) + spec,
        "too_many": (x, 0, 7.0, 1.702, 1.0) + spec + (0, 0.0, 1, None, None, None, 5),
        "wrong_device_scale": (x, 0, 7.0, 1.702, 1.0, 1, 7, True, False, 0, 0.0, 1, torch.ones(1, dtype=torch.float64),
                               torch.zeros(1)),
    }[bad]
    assert _error(lambda: _call(op, *args)) == _error(lambda: op(*args))


def test_call_accepts_what_torch_accepts():
    """IntEnum codes for ints, ints for floats, None for optional tensors, torch dtypes, and (through torch's own
    binding) a float for a bool and bools for an int and a float; equal results."""
    tex = tex_module()
    x = uniform((4, 16))
    q = torch.ops.te.quantize.default
    for args in ((x, 2, tex.DType.kFloat8E4M3, True, True, 0, 0, 1, None, None, None), (x, 2, 7, 1.0, False),
                 (x, 2, 7, True, False, False, True)):
        _assert_same(q(*args), _call(q, *args), "quantize")
    d = torch.ops.te.dequantize_fp8.default
    data = torch.arange(16, dtype=torch.uint8).reshape(2, 8)
    _assert_same(d(data, torch.ones(1), 7, torch.bfloat16), _call(d, data, torch.ones(1), 7, torch.bfloat16), "dequant")


class _Tagged(torch.Tensor):
    """A subclass whose __torch_function__ counts the calls it sees."""

    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def test_call_defers_to_torch_function():
    tex_module()
    op = torch.ops.te.act.default
    x = uniform((4, 16))
    _Tagged.seen.clear()
    y = _call(op, x.as_subclass(_Tagged), 0)
    assert op in _Tagged.seen and type(y) is _Tagged
    assert torch.equal(y.as_subclass(torch.Tensor), op(x, 0))
    with _Recorder() as mode:
        y = _call(op, x, 0)
    assert mode.seen == [op] and torch.equal(y, op(x, 0))


def test_call_keep_mask():
    """Outputs outside `keep` come back as None; the others are the op's."""
    tex_module()
    q = torch.ops.te.quantize.default
    x = uniform((4, 16))
    args = (x, 2, 7, True, False)
    full = q(*args)
    part = _call_keep(q, args, 0b10)
    assert part[0] is None and all(p is None for p in part[2:])
    assert torch.equal(part[1], full[1])
    assert _call_keep(torch.ops.te.act.default, (x, 0), 0) is None


def _call_keep(op, args, keep):
    from transformer_engine_torch import _C

    return _C.call(op, args, keep)


def _quantizers(tex):
    e4m3 = tex.DType.kFloat8E4M3
    for row, col in ((True, True), (True, False), (False, True)):
        yield tex.Float8Quantizer(torch.ones(1), torch.zeros(1), e4m3, rowwise=row, columnwise=col)
        yield tex.Float8CurrentScalingQuantizer(e4m3, rowwise=row, columnwise=col)
        yield tex.MXFP8Quantizer(e4m3, rowwise=row, columnwise=col)
        yield tex.Float8BlockQuantizer(e4m3, rowwise=row, columnwise=col, block_scaling_dim=1)
        yield tex.NVFP4Quantizer(rowwise=row, columnwise=col)


def test_pieces_cover_what_wrap_reads():
    """Each quantizer's `_pieces()` names every op output its `_wrap` reads: the wrapped tensor is the same when
    the other outputs are None (as `_C.call` returns them)."""
    tex = tex_module()
    x = uniform((32, 64), torch.bfloat16)
    for qz in _quantizers(tex):
        outs = torch.ops.te.quantize.default(x, *qz._spec())
        keep = qz._pieces()
        kept = tuple(t if (keep >> i) & 1 else None for i, t in enumerate(outs))
        a, b = qz._wrap(outs, x.dtype), qz._wrap(kept, x.dtype)
        assert torch.equal(a.dequantize(), b.dequantize()), type(qz).__name__
        assert vars(a).keys() == vars(b).keys()
        for k, v in vars(a).items():
            assert (v is None) == (vars(b)[k] is None), (type(qz).__name__, k)
