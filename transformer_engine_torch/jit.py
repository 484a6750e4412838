"""`transformer_engine_torch.jit` (SPEC §7): torch.compile-fused elementwise helpers and the decorators around them.

`NVTE_TORCH_COMPILE` (read at import, default "1") chooses compiled helpers ("1") or plain eager torch ops
("0"); the math is the same expression either way, so results agree within the dtype's tolerance (eager rounds
every intermediate to the input dtype, compiled code keeps FP32 inside the fused kernel). The `_`-suffixed
functions are the fused kernels; the public wrappers run with CUDA autocast disabled and dispatch on whether a
bias is given. Everything works on CPU; the warm-up helpers are no-ops without CUDA.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import types
import warnings
from typing import Callable, Optional, Tuple

import torch

__all__ = [
    "jit_fuser", "dropout_fuser", "lazy_compile", "no_torch_dynamo", "set_jit_fusion_options",
    # then the bias-activation helpers, six per row of _BIAS_ACTIVATIONS (gelu, silu, relu, qgelu, srelu), below
    "l2normalization_fused_", "l2normalization_fwd_fused_", "l2normalization_backward_fused_",
    "l2normalization_fused", "l2normalization_fwd_fused", "l2normalization_backward_fused",
    "bias_dropout_add", "get_bias_dropout_add", "bias_dropout_add_fused_train_",
    "bias_dropout_add_fused_inference_", "bias_dropout_add_fused_train", "bias_dropout_add_fused_inference",
    "warmup_jit_bias_dropout_add", "warmup_jit_bias_dropout_add_all_dtypes", "warmup_jit_bias_gelu",
    "warmup_jit_bias_gelu_all_dtypes", "warmup_jit_l2normalization", "warmup_jit_l2normalization_all_dtypes",
]

TORCH_COMPILE = os.getenv("NVTE_TORCH_COMPILE", "1") == "1"
_TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def lazy_compile(fn: Callable) -> Callable:
    """`torch.compile(fn)` built on the first call and reused; inside an outer compilation `fn` is called as it is,
    so it inlines into the outer graph instead of nesting a compiled region."""
    compiled = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal compiled
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        if compiled is None:
            compiled = torch.compile(fn)
        return compiled(*args, **kwargs)

    wrapper._te_lazy_compile = True  # marks compiled helpers (tests check the env switch with it)
    return wrapper


def _identity(fn: Callable) -> Callable:
    return fn


jit_fuser = lazy_compile if (_TORCH_VERSION >= (2, 0) and TORCH_COMPILE) else _identity
dropout_fuser = lazy_compile if (_TORCH_VERSION >= (2, 2) and TORCH_COMPILE) else torch.jit.script


def no_torch_dynamo(recursive: bool = True, when: Optional[Callable[[dict], Optional[str]]] = None):
    """Decorator: run the function outside torch.compile (`torch._dynamo.disable(f, recursive=...)`), except during
    ONNX export, where the function is called as it is. With `when(call_args) -> reason or None` (the call's
    arguments keyed by parameter name, defaults applied) only the calls with a reason are excluded, and each
    distinct reason is warned about once. Functions taking `*args` cannot be used with `when`."""

    def decorator(f: Callable) -> Callable:
        disabled = torch._dynamo.disable(f, recursive=recursive)

        if when is None:
            @functools.wraps(f)
            def wrapper(*args, **kwargs):
                if torch.onnx.is_in_onnx_export():
                    return f(*args, **kwargs)
                return disabled(*args, **kwargs)

            return wrapper

        sig = inspect.signature(f)
        if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values()):
            raise TypeError(f"no_torch_dynamo(when=...): {f.__qualname__} takes *args, so its arguments cannot be "
                            f"keyed by name for `when`; give it named parameters")
        warned = set()

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            reason = when(dict(bound.arguments))
            if reason is None or torch.onnx.is_in_onnx_export():
                return f(*args, **kwargs)
            if reason not in warned:
                warned.add(reason)
                warnings.warn(f"{f.__qualname__} runs outside torch.compile: {reason}", stacklevel=2)
            return disabled(*args, **kwargs)

        return wrapper

    return decorator


def set_jit_fusion_options() -> None:
    """Nothing to set on torch >= 2.2 (torch.compile fuses); older torch gets the legacy nvfuser switches."""
    if _TORCH_VERSION >= (2, 2):
        return
    torch._C._jit_set_profiling_executor(True)  # pragma: no cover (old torch only)
    torch._C._jit_set_profiling_mode(True)
    torch._C._jit_override_can_fuse_on_cpu(False)
    torch._C._jit_override_can_fuse_on_gpu(False)
    torch._C._jit_set_texpr_fuser_enabled(False)
    torch._C._jit_set_nvfuser_enabled(True)
    torch._C._debug_set_autodiff_subgraph_inlining(False)


_CUDA_AVAILABLE = None


def _cuda_available() -> bool:
    """Asked once, on first use (importing queries no device)."""
    global _CUDA_AVAILABLE
    if _CUDA_AVAILABLE is None:
        _CUDA_AVAILABLE = torch.cuda.is_available()
    return _CUDA_AVAILABLE


def _no_cuda_autocast():
    return torch.autocast("cuda", enabled=False) if _cuda_available() else contextlib.nullcontext()


def _has_bias(bias) -> bool:
    return bias is not None and bias.numel() > 0


# ---- activations: act(x) and act'(x)·grad as in SPEC §3.2, in the input dtype -------------------------------------
def _gelu(x):  # tanh approximation
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)))


def _dgelu(grad, x):
    t = torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x))
    ff = 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)
    return ff * grad


def _silu(x):
    return x * torch.sigmoid(x)


def _dsilu(grad, x):
    s = torch.sigmoid(x)
    return (x * s * (1.0 - s) + s) * grad


def _drelu(grad, x):
    return torch.where(x > 0, grad, torch.zeros_like(grad))


def _qgelu(x):  # quick GELU: x·σ(1.702x)
    return x * torch.sigmoid(1.702 * x)


def _dqgelu(grad, x):
    s = torch.sigmoid(1.702 * x)
    return (1.702 * x * s * (1.0 - s) + s) * grad


def _srelu(x):  # squared ReLU
    r = torch.relu(x)
    return r * r


def _dsrelu(grad, x):
    return torch.relu(2.0 * x) * grad


# (name, act, act'·grad): each row gives six helpers, the fused kernels `<name>_fused_(inp)`,
# `bias_<name>_fused_(inp, bias)`, `d<name>_fused_(grad, inp)`, `bgrad_d<name>_fused_(grad, inp, bias)` and the
# public wrappers `bias_<name>_fused(inp, bias)`, `bgrad_d<name>_fused(grad, inp, bias)`.
_BIAS_ACTIVATIONS = (("gelu", _gelu, _dgelu), ("silu", _silu, _dsilu), ("relu", torch.relu, _drelu),
                     ("qgelu", _qgelu, _dqgelu), ("srelu", _srelu, _dsrelu))


def _own_code(fn: Callable, name: str) -> Callable:
    """`fn` as a function named `name` with a code object of its own. Dynamo keeps compiled graphs, and counts
    recompilations against its limit, per code object: the helpers made from one template would share one, and
    five activations times the dtypes would exhaust the limit, where written-out functions each have their own."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    out = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    out.__qualname__, out.__doc__, out.__annotations__ = name, fn.__doc__, dict(fn.__annotations__)
    return out


def _make_bias_activation(name: str, act: Callable, dact: Callable) -> dict:
    """The six helpers of one activation, by name."""

    def act_(inp: torch.Tensor) -> torch.Tensor:
        return act(inp)

    def bias_act_(inp: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return act(inp + bias)

    def dact_(grad: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        return dact(grad, inp)

    def bgrad_dact_(grad: torch.Tensor, inp: torch.Tensor, bias: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        dg = dact(grad, inp + bias)
        return dg.sum(dim=0), dg

    fused = {f"{name}_fused_": act_, f"bias_{name}_fused_": bias_act_, f"d{name}_fused_": dact_,
             f"bgrad_d{name}_fused_": bgrad_dact_}
    fused = {n: jit_fuser(_own_code(f, n)) for n, f in fused.items()}
    act_, bias_act_, dact_, bgrad_dact_ = fused.values()

    def bias_act(inp: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        with _no_cuda_autocast():
            return bias_act_(inp, bias) if _has_bias(bias) else act_(inp)

    def bgrad_dact(grad: torch.Tensor, inp: torch.Tensor, bias: Optional[torch.Tensor]):
        with _no_cuda_autocast():
            if _has_bias(bias):
                return bgrad_dact_(grad, inp, bias)
            return None, dact_(grad, inp)

    bias_act.__name__ = bias_act.__qualname__ = f"bias_{name}_fused"
    bias_act.__doc__ = f"{name}(inp + bias), or {name}(inp) when bias is None or empty."
    bgrad_dact.__name__ = bgrad_dact.__qualname__ = f"bgrad_d{name}_fused"
    bgrad_dact.__doc__ = (f"(bias_grad, d{name}(inp + bias)·grad); (None, d{name}(inp)·grad) when bias is None or "
                          f"empty. bias_grad sums over dim 0.")
    return {**fused, bias_act.__name__: bias_act, bgrad_dact.__name__: bgrad_dact}


_BIAS_ACTIVATION_HELPERS = {}
for _row in _BIAS_ACTIVATIONS:
    _BIAS_ACTIVATION_HELPERS.update(_make_bias_activation(*_row))
globals().update(_BIAS_ACTIVATION_HELPERS)
__all__ += list(_BIAS_ACTIVATION_HELPERS)
del _row


# ---- L2 normalization over the last dim, in FP32 ----------------------------------------------------------------
def _l2_fwd(x: torch.Tensor, eps: float):
    xf = x.float()
    r = torch.rsqrt((xf * xf).sum(dim=-1, keepdim=True) + eps)
    return (xf * r).to(x.dtype), r


@jit_fuser
def l2normalization_fused_(x: torch.Tensor, eps: float) -> torch.Tensor:
    return _l2_fwd(x, eps)[0]


@jit_fuser
def l2normalization_fwd_fused_(x: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return _l2_fwd(x, eps)


@jit_fuser
def l2normalization_backward_fused_(grad_output: torch.Tensor, x: torch.Tensor, rsqrt_norm: torch.Tensor,
                                    eps: float) -> torch.Tensor:
    xf, dy = x.float(), grad_output.float()
    sum_sq = (xf * xf).sum(dim=-1, keepdim=True) + eps
    dot = (xf * dy).sum(dim=-1, keepdim=True)
    return (rsqrt_norm * (dy - xf * dot / sum_sq)).to(x.dtype)


def l2normalization_fused(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x·rsqrt(Σ_last x² + eps), computed in FP32, returned in x.dtype."""
    with _no_cuda_autocast():
        return l2normalization_fused_(x, eps)


def l2normalization_fwd_fused(x: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y, rsqrt_norm): y as in l2normalization_fused, rsqrt_norm FP32 [..., 1] for the backward."""
    with _no_cuda_autocast():
        return l2normalization_fwd_fused_(x, eps)


def l2normalization_backward_fused(grad_output: torch.Tensor, x: torch.Tensor, rsqrt_norm: torch.Tensor,
                                   eps: float) -> torch.Tensor:
    """dx = r·(dy − x·Σ(x·dy)/(Σx² + eps)) in FP32, returned in x.dtype."""
    with _no_cuda_autocast():
        return l2normalization_backward_fused_(grad_output, x, rsqrt_norm, eps)


# ---- bias + dropout + residual add ---------------------------------------------------------------------------
def bias_dropout_add(x: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor, prob: float,
                     training: bool) -> torch.Tensor:
    """residual + dropout(x + bias, p=prob, training): kept values scaled by 1/(1 − prob)."""
    if bias is not None:
        x = x + bias
    return residual + torch.nn.functional.dropout(x, p=prob, training=training)


def get_bias_dropout_add(training: bool):
    """The closure (x, bias, residual, prob) -> bias_dropout_add(..., training)."""

    def _bias_dropout_add(x, bias, residual, prob):
        return bias_dropout_add(x, bias, residual, prob, training)

    return _bias_dropout_add


def bias_dropout_add_fused_train_(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                                  prob: float) -> torch.Tensor:
    return residual + torch.nn.functional.dropout(x + bias, p=prob, training=True)


def bias_dropout_add_fused_inference_(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                                      prob: float) -> torch.Tensor:
    return residual + torch.nn.functional.dropout(x + bias, p=prob, training=False)


def _dropout_fuse(fn):
    """dropout_fuser, falling back to the plain function where torch.jit.script is unavailable."""
    try:
        return dropout_fuser(fn)
    except Exception:  # noqa: BLE001 (torch.jit.script is deprecated; an eager function is the same math)
        return fn


bias_dropout_add_fused_train_ = _dropout_fuse(bias_dropout_add_fused_train_)
bias_dropout_add_fused_inference_ = _dropout_fuse(bias_dropout_add_fused_inference_)


def bias_dropout_add_fused_train(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                                 prob: float) -> torch.Tensor:
    """bias_dropout_add with training=True, with grad mode on (the fused kernel is differentiable)."""
    with torch.enable_grad(), _no_cuda_autocast():
        return bias_dropout_add_fused_train_(x, bias, residual, prob)


def bias_dropout_add_fused_inference(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                                     prob: float) -> torch.Tensor:
    """bias_dropout_add with training=False (no dropout)."""
    with _no_cuda_autocast():
        return bias_dropout_add_fused_inference_(x, bias, residual, prob)


# ---- warm-up: compile the kernels ahead of training for each requires-grad combination ------------------------
_WARMUP_ITERS = 5
_WARMUP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@contextlib.contextmanager
def _cuda_rng_kept():
    state = torch.cuda.get_rng_state()
    try:
        yield
    finally:
        torch.cuda.set_rng_state(state)


def warmup_jit_bias_dropout_add(hidden_size: int, dtype: torch.dtype, seq_length: int,
                                micro_batch_size: int) -> None:
    """Runs bias_dropout_add_fused_train 5× per requires-grad combination on CUDA (no-op without CUDA)."""
    if not _cuda_available():
        return
    with _cuda_rng_kept():
        for x_grad, bias_grad, res_grad in [(False, False, False), (True, True, True), (True, False, True)]:
            x = torch.rand(seq_length, micro_batch_size, hidden_size, dtype=dtype, device="cuda",
                           requires_grad=x_grad)
            residual = torch.rand_like(x).requires_grad_(res_grad)
            bias = torch.rand(hidden_size, dtype=dtype, device="cuda", requires_grad=bias_grad)
            for _ in range(_WARMUP_ITERS):
                out = bias_dropout_add_fused_train(x, bias, residual, 0.1)
                if out.requires_grad:
                    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()


def warmup_jit_bias_gelu(ffn_hidden_size_per_partition: int, dtype: torch.dtype, seq_length: int,
                         micro_batch_size: int) -> None:
    """Runs bias_gelu_fused and bgrad_dgelu_fused 5× per requires-grad combination on CUDA (no-op without CUDA)."""
    if not _cuda_available():
        return
    with _cuda_rng_kept():
        for bias_grad, input_grad in [(True, True), (True, False), (False, True), (False, False)]:
            inp = torch.rand(seq_length * micro_batch_size, ffn_hidden_size_per_partition, dtype=dtype,
                             device="cuda", requires_grad=input_grad)
            bias = torch.rand(ffn_hidden_size_per_partition, dtype=dtype, device="cuda", requires_grad=bias_grad)
            for _ in range(_WARMUP_ITERS):
                out = bias_gelu_fused(inp, bias)
                bgrad_dgelu_fused(out.detach(), inp.detach(), bias.detach())
    torch.cuda.synchronize()


def warmup_jit_l2normalization(hidden_size: int, dtype: torch.dtype, seq_length: int,
                               micro_batch_size: int) -> None:
    """Runs the L2 normalization helpers (eps 1e-6) 5× per requires-grad combination on CUDA."""
    if not _cuda_available():
        return
    eps = 1e-6
    with _cuda_rng_kept():
        for input_grad in (False, True):
            x = torch.rand(seq_length * micro_batch_size, hidden_size, dtype=dtype, device="cuda",
                           requires_grad=input_grad)
            for _ in range(_WARMUP_ITERS):
                l2normalization_fused(x, eps)
                y, r = l2normalization_fwd_fused(x.detach(), eps)
                l2normalization_backward_fused(torch.ones_like(y), x.detach(), r, eps)
    torch.cuda.synchronize()


def warmup_jit_bias_dropout_add_all_dtypes(hidden_size: int, seq_length: int, micro_batch_size: int) -> None:
    for dtype in _WARMUP_DTYPES:
        warmup_jit_bias_dropout_add(hidden_size, dtype, seq_length, micro_batch_size)


def warmup_jit_bias_gelu_all_dtypes(ffn_hidden_size: int, seq_length: int, micro_batch_size: int) -> None:
    for dtype in _WARMUP_DTYPES:
        warmup_jit_bias_gelu(ffn_hidden_size, dtype, seq_length, micro_batch_size)


def warmup_jit_l2normalization_all_dtypes(hidden_size: int, seq_length: int, micro_batch_size: int) -> None:
    for dtype in _WARMUP_DTYPES:
        warmup_jit_l2normalization(hidden_size, dtype, seq_length, micro_batch_size)
