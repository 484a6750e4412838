"""One plan per call in tej (issue 33 item 2): a jit trace of an activation plans once in the core (the trace-time
plan is cached per signature, so a second trace of the same signature plans zero times); each execution of the
compiled program plans once more, in the FFI handler, for its device; the results' shapes and dtypes (what XLA
allocates, jax.eval_shape's answer) are those of the trace's plan. Counted by the core's debug counter
(`_ffi.plan_act_calls()`)."""
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
from transformer_engine_jax import _ffi, cpp_extensions  # noqa: E402
from transformer_engine_jax.activation_types import activation_of  # noqa: E402
from transformer_engine_jax.quantizers import QuantizerFactory, ScalingMode  # noqa: E402

pytestmark = pytest.mark.usefixtures("jax_on_cpu")

MODES = {"plain": None, "fp8-delayed": ScalingMode.DELAYED_TENSOR_SCALING, "mxfp8": ScalingMode.MXFP8_1D_SCALING,
         "nvfp4": ScalingMode.NVFP4_1D_SCALING}


def _quantizer(kind):
    mode = MODES[kind]
    return None if mode is None else QuantizerFactory.create(scaling_mode=mode)


def _x():
    return jax.random.uniform(jax.random.PRNGKey(3), (64, 1, 128), jnp.float32, -3.0, 3.0).astype(jnp.bfloat16)


def _fn():
    """A fresh jitted activation (a new function object: jax traces it anew)."""
    return jax.jit(lambda x, q: tej.act_lu(x, "gelu", q))


@pytest.mark.parametrize("kind", list(MODES))
def test_trace_plans_once_and_retrace_plans_zero(kind):
    cpp_extensions._cached_plan.cache_clear()
    x, q = _x(), _quantizer(kind)
    before = _ffi.plan_act_calls()
    _fn().lower(x, q)
    assert _ffi.plan_act_calls() - before == 1  # was 4: two checked plans, each for the CPU and for CUDA
    before = _ffi.plan_act_calls()
    _fn().lower(x, q)
    assert _ffi.plan_act_calls() - before == 0  # the same signature: the cached plan


@pytest.mark.parametrize("kind", list(MODES))
def test_each_execution_plans_once(kind):
    """The handler plans its call on every execution (it runs the plan for its device, with the buffers XLA gives
    it): one plan per executed call, none from the trace once compiled."""
    x, q = _x(), _quantizer(kind)
    f = _fn().lower(x, q).compile()
    jax.block_until_ready(f(x, q))
    before = _ffi.plan_act_calls()
    for _ in range(3):
        jax.block_until_ready(f(x, q))
    assert _ffi.plan_act_calls() - before == 3


@pytest.mark.parametrize("kind", list(MODES))
def test_result_shapes_are_the_plans(kind):
    """jax.eval_shape's shapes and dtypes (the ffi_call results' ShapeDtypeStructs) come from the cached plan of the
    call (no planning once it is cached) and the executed call returns arrays of exactly those shapes."""
    cpp_extensions._cached_plan.cache_clear()
    x, q = _x(), _quantizer(kind)
    pieces, _ = cpp_extensions._plan("act_lu", activation_of("gelu").code, False, False, (64, 128),
                                     jnp.dtype(jnp.bfloat16), (), cpp_extensions._attrs(q))
    before = _ffi.plan_act_calls()
    abstract = jax.eval_shape(lambda x: tej.act_lu(x, "gelu", q), x)
    assert _ffi.plan_act_calls() - before == 0
    concrete = tej.act_lu(x, "gelu", q)
    row, row_si, col, col_si = pieces[:4]
    if q is None:
        assert abstract.shape == concrete.shape == row[2] == (64, 128)
        assert abstract.dtype == concrete.dtype == jnp.bfloat16
        return
    assert abstract.data.shape == concrete.data.shape == row[2]
    assert abstract.scale_inv.shape == concrete.scale_inv.shape == row_si[2]
    assert abstract.colwise_data.shape == concrete.colwise_data.shape == col[2]
    if col_si[0]:  # per-tensor FP8 has one scale_inv for both copies
        assert abstract.colwise_scale_inv.shape == concrete.colwise_scale_inv.shape == col_si[2]
    assert np.dtype(abstract.data.dtype) == np.dtype(concrete.data.dtype)
