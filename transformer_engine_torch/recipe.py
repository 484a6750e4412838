"""Recipes and the autocast context (SPEC §8): which quantizer each GEMM operand of a layer gets.

A recipe is a value object. Inside `autocast(recipe=...)` the layers (modules.py) ask it, per operand role
("input", "weight", "grad_output"), for a *quantizer config*: a hashable tuple of plain values that the layer's
autograd function turns into a quantizer with `build_quantizer` (plain values cross into the function, so
torch.compile traces it like any other code). Delayed scaling additionally keeps per-layer state (scales and
amax histories, `DelayedScalingState`), updated once per step per layer by the fused update op.
"""
from __future__ import annotations

import contextlib
import enum
import os
import typing
import warnings
from typing import Optional

import torch

from . import _device
from . import formats as _formats
from .dtypes import DType

__all__ = ["Format", "Recipe", "DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling",
           "Float8BlockScaling", "autocast", "fp8_autocast", "is_fp8_enabled", "get_fp8_recipe",
           "get_amax_reduction_group", "is_calibrating"]

_E4M3, _E5M2 = int(DType.kFloat8E4M3), int(DType.kFloat8E5M2)


class _FormatInfo(typing.NamedTuple):
    """A Format's maxima and DTypes (a NamedTuple: dynamo builds it when a recipe is made inside a compiled
    function)."""

    max_fwd: float
    max_bwd: float
    fwd_dtype: int  # DType of forward operands (input, weight)
    bwd_dtype: int  # DType of backward operands (grad_output)


class Format(enum.Enum):
    """FP8/FP4 formats of a recipe: E4M3 (fwd and bwd, max 448), E5M2 (57344), HYBRID (fwd E4M3, bwd E5M2),
    E2M1 (FP4, max 6)."""

    E4M3 = _FormatInfo(448.0, 448.0, _E4M3, _E4M3)
    E5M2 = _FormatInfo(57344.0, 57344.0, _E5M2, _E5M2)
    HYBRID = _FormatInfo(448.0, 57344.0, _E4M3, _E5M2)
    E2M1 = _FormatInfo(6.0, 6.0, int(DType.kFloat4E2M1), int(DType.kFloat4E2M1))


def _check_format(recipe: str, fmt, allowed):
    if not isinstance(fmt, Format) or fmt not in allowed:
        names = ", ".join(f"Format.{f.name}" for f in allowed)
        raise ValueError(f"{recipe}: fp8_format must be one of {names}, got {fmt!r}")


class Recipe:
    """Base of the recipes. Subclasses give `quantizer_config(role)` for role in ("input", "weight",
    "grad_output") and `alignment`: the multiple every GEMM dim (in, out, tokens when training) must be."""

    alignment = 16

    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self) -> bool:
        return isinstance(self, Float8CurrentScaling)

    def mxfp8(self) -> bool:
        return isinstance(self, MXFP8BlockScaling)

    def nvfp4(self) -> bool:
        return isinstance(self, NVFP4BlockScaling)

    def float8_block_scaling(self) -> bool:
        return isinstance(self, Float8BlockScaling)

    def float8_per_tensor_scaling(self) -> bool:
        return isinstance(self, (DelayedScaling, Float8CurrentScaling))

    def check_available(self) -> None:
        """Raises NotImplementedError when the quantizer this recipe needs is not in this build."""

    def quantizer_config(self, role: str) -> tuple:
        raise NotImplementedError

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self):
        return hash((type(self), tuple(sorted((k, repr(v)) for k, v in vars(self).items()))))


class DelayedScaling(Recipe):
    """Per-tensor FP8 with delayed scaling: each operand slot's scale comes from the max (or the most recent) of
    an amax history of `amax_history_len` steps, `scale = fp8_max·2^-margin / amax` (SPEC §4.3). Per layer, the
    forward slots are updated right after its forward pass and the backward slots right after its backward pass
    (once per step per layer), by `tex.fused_amax_and_scale_update_after_reduction`, after a MAX all-reduce of the
    newest amaxes over the autocast's `amax_reduction_group` when `reduce_amax` and a group is given.
    `amax_compute_algo`: "max", "most_recent" or a callable `(amax_history [L, n]) -> amax [n]` (then the update
    runs unfused in Python: roll as the fused op does, scale from the returned amax)."""

    def __init__(self, margin: int = 0, fp8_format: Format = Format.HYBRID, amax_history_len: int = 1024,
                 amax_compute_algo="max", scaling_factor_compute_algo=None, reduce_amax: bool = True):
        _check_format("DelayedScaling", fp8_format, (Format.E4M3, Format.HYBRID))
        if not (isinstance(amax_history_len, int) and amax_history_len >= 1):
            raise ValueError(f"DelayedScaling: amax_history_len must be an int >= 1, got {amax_history_len!r}")
        if not (callable(amax_compute_algo) or amax_compute_algo in ("max", "most_recent")):
            raise ValueError(f"DelayedScaling: amax_compute_algo must be 'max', 'most_recent' or a callable, "
                             f"got {amax_compute_algo!r}")
        if scaling_factor_compute_algo is not None:
            raise NotImplementedError("DelayedScaling: a custom scaling_factor_compute_algo is not provided; leave "
                                      "it None (scale = fp8_max * 2^-margin / amax)")
        self.margin = int(margin)
        self.fp8_format = fp8_format
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.scaling_factor_compute_algo = None
        self.reduce_amax = bool(reduce_amax)

    def quantizer_config(self, role):
        fmt = self.fp8_format.value
        return ("delayed", fmt.bwd_dtype if role == "grad_output" else fmt.fwd_dtype)


class Float8CurrentScaling(Recipe):
    """Per-tensor FP8 with current scaling: each tensor's scale from its own amax (SPEC §4.4), amax_epsilon 0.
    `use_power_2_scales` defaults to env NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES == "1"."""

    def __init__(self, fp8_format: Format = Format.HYBRID, use_power_2_scales: Optional[bool] = None):
        _check_format("Float8CurrentScaling", fp8_format, (Format.E4M3, Format.HYBRID))
        if use_power_2_scales is None:
            use_power_2_scales = os.getenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0") == "1"
        self.fp8_format = fp8_format
        self.use_power_2_scales = bool(use_power_2_scales)

    def quantizer_config(self, role):
        fmt = self.fp8_format.value
        return ("current", fmt.bwd_dtype if role == "grad_output" else fmt.fwd_dtype, self.use_power_2_scales)


class MXFP8BlockScaling(Recipe):
    """MXFP8: E4M3 codes with an E8M0 scale per 32 elements (SPEC §4.5); HYBRID puts gradients in E5M2. GEMMs on
    Hopper and CPU run through the dequantizing emulation (SPEC §6.7). Every GEMM dim must be a multiple of 32.
    `enable_2d_quantization` (32×32 weight tiles) is not provided yet."""

    alignment = 32

    def __init__(self, margin: int = 0, fp8_format: Format = Format.E4M3, enable_2d_quantization: bool = False):
        _check_format("MXFP8BlockScaling", fp8_format, (Format.E4M3, Format.HYBRID))
        if enable_2d_quantization:
            raise NotImplementedError("MXFP8BlockScaling: enable_2d_quantization=True (32x32 weight tiles) is not "
                                      "provided; use the default 1x32 blocks")
        self.margin = int(margin)
        self.fp8_format = fp8_format
        self.enable_2d_quantization = False

    def quantizer_config(self, role):
        fmt = self.fp8_format.value
        return ("mxfp8", fmt.bwd_dtype if role == "grad_output" else fmt.fwd_dtype)


def _env_flag(name: str) -> bool:
    return os.getenv(name, "0") == "1"


class NVFP4BlockScaling(Recipe):
    """NVFP4 (E2M1 with E4M3 scales per 16 elements and an FP32 global scale, SPEC §4.6). Forward input: RHT on the
    columnwise copy, 1-D; forward weight: 2-D 16×16 tiles; backward gradient: RHT and stochastic rounding, 1-D.
    Each switch can be turned off (`disable_rht`, `disable_stochastic_rounding`, `disable_2d_quantization`, env
    NVTE_NVFP4_DISABLE_RHT / …_DISABLE_STOCHASTIC_ROUNDING / …_DISABLE_2D_QUANTIZATION).

    Needs `tex.NVFP4Quantizer`: where this build has none, using the recipe (entering `autocast` with it) raises
    NotImplementedError; the layers pick the class up as soon as it exists."""

    alignment = 32

    def __init__(self, disable_rht: Optional[bool] = None, disable_stochastic_rounding: Optional[bool] = None,
                 disable_2d_quantization: Optional[bool] = None, fp4_format: Format = Format.E2M1,
                 fp8_format: Format = Format.E4M3):
        if fp4_format is not Format.E2M1:
            raise ValueError(f"NVFP4BlockScaling: fp4_format must be Format.E2M1, got {fp4_format!r}")
        self.disable_rht = _env_flag("NVTE_NVFP4_DISABLE_RHT") if disable_rht is None else bool(disable_rht)
        self.disable_stochastic_rounding = (_env_flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING")
                                            if disable_stochastic_rounding is None
                                            else bool(disable_stochastic_rounding))
        self.disable_2d_quantization = (_env_flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION")
                                        if disable_2d_quantization is None else bool(disable_2d_quantization))
        self.fp4_format = fp4_format
        self.fp8_format = fp8_format

    def check_available(self):
        if getattr(_formats, "NVFP4Quantizer", None) is None:
            raise NotImplementedError("NVFP4BlockScaling: this build has no tex.NVFP4Quantizer yet, so layers cannot "
                                      "run in NVFP4; use Float8CurrentScaling, DelayedScaling or MXFP8BlockScaling")

    def quantizer_config(self, role):
        rht = not self.disable_rht
        if role == "input":  # (rht, stochastic rounding, 2-D)
            return ("nvfp4", rht, False, False)
        if role == "weight":
            return ("nvfp4", False, False, not self.disable_2d_quantization)
        return ("nvfp4", rht, not self.disable_stochastic_rounding, False)


class Float8BlockScaling(Recipe):
    """FP8 with 1×128 (inputs, gradients) and 128×128 (weights) blocks (SPEC §4.7); power-of-two scales unless env
    NVTE_FP8_BLOCK_SCALING_FP32_SCALES == "1"; split accumulation forced in the GEMMs.

    Needs `tex.Float8BlockQuantizer`: where this build has none, using the recipe (entering `autocast` with it)
    raises NotImplementedError; the layers pick the class up as soon as it exists."""

    alignment = 16

    def __init__(self, fp8_format: Format = Format.E4M3):
        _check_format("Float8BlockScaling", fp8_format, (Format.E4M3, Format.HYBRID))
        self.fp8_format = fp8_format
        self.force_pow_2_scales = not _env_flag("NVTE_FP8_BLOCK_SCALING_FP32_SCALES")

    def check_available(self):
        if getattr(_formats, "Float8BlockQuantizer", None) is None:
            raise NotImplementedError("Float8BlockScaling: this build has no tex.Float8BlockQuantizer yet, so layers "
                                      "cannot run with FP8 block scaling; use Float8CurrentScaling, DelayedScaling "
                                      "or MXFP8BlockScaling")

    def quantizer_config(self, role):
        fmt = self.fp8_format.value
        dtype = fmt.bwd_dtype if role == "grad_output" else fmt.fwd_dtype
        return ("block", dtype, self.force_pow_2_scales, 2 if role == "weight" else 1)


def build_quantizer(cfg: tuple, rowwise: bool, columnwise: bool, scale=None, amax=None, amax_reduction_group=None,
                    gemm_swizzled: bool = True):
    """The quantizer of a config from `Recipe.quantizer_config`, with the given usages. Delayed scaling takes the
    slot's one-element `scale` and `amax` views (amax = the slot's entry in row 0 of the amax history). Current
    scaling with `amax_reduction_group`: the tensor's amax is MAX-reduced over that group before the scale is taken
    (tensor-parallel layers: every rank's shard then has the same scale). MXFP8 / NVFP4 tensors that only feed GEMMs
    (`gemm_swizzled`, the layers' default) are written with GEMM-swizzled scales (`optimize_for_gemm`), so no GEMM
    swizzles a temporary copy of their scales; callers that slice or gather the tensors pass False."""
    kind = cfg[0]
    if kind == "delayed":
        # The recipe's scales stay finite (SPEC §4.3 keeps the old scale for a non-finite amax, an Inf result becomes
        # FLT_MAX): no per-step read of the scale, which on CUDA would be a device sync.
        return _formats.Float8Quantizer(scale, amax, cfg[1], rowwise=rowwise, columnwise=columnwise,
                                           _check_scale=False)
    if kind == "current":
        return _formats.Float8CurrentScalingQuantizer(cfg[1], rowwise=rowwise, columnwise=columnwise,
                                                         force_pow_2_scales=cfg[2],
                                                         with_amax_reduction=amax_reduction_group is not None,
                                                         amax_reduction_group=amax_reduction_group)
    if kind == "mxfp8":
        q = _formats.MXFP8Quantizer(cfg[1], rowwise=rowwise, columnwise=columnwise)
        q.optimize_for_gemm = gemm_swizzled
        return q
    if kind == "nvfp4":
        cls = getattr(_formats, "NVFP4Quantizer", None)
        if cls is None:
            NVFP4BlockScaling().check_available()
        _, rht, sr, two_d = cfg
        q = cls(rowwise=rowwise, columnwise=columnwise, with_rht=rht, with_post_rht_amax=rht,
                with_2d_quantization=two_d, stochastic_rounding=sr)
        q.optimize_for_gemm = gemm_swizzled
        return q
    if kind == "block":
        cls = getattr(_formats, "Float8BlockQuantizer", None)
        if cls is None:
            Float8BlockScaling().check_available()
        _, dtype, pow2, dim = cfg
        return cls(dtype, rowwise=rowwise, columnwise=columnwise, force_pow_2_scales=pow2, block_scaling_dim=dim)
    raise ValueError(f"build_quantizer: unknown quantizer config {cfg!r}")


# ---- delayed-scaling state -------------------------------------------------------------------------------------
class DelayedScalingState:
    """Scales and amax histories of one layer's operand slots: forward `scale [n_fwd]`, `amax_history [L, n_fwd]`
    (slots FP8FwdTensors), backward the same with n_bwd slots (FP8BwdTensors). Row 0 of a history is the current
    step's amax: each cast of the slot max-accumulates into it (the quantizer's `amax` is a view of that entry)."""

    def __init__(self, recipe: DelayedScaling, n_fwd: int, n_bwd: int, device):
        L = recipe.amax_history_len
        self.recipe = recipe
        self.fwd_scale = torch.ones(n_fwd, dtype=torch.float32, device=device)
        self.fwd_history = torch.zeros(L, n_fwd, dtype=torch.float32, device=device)
        self.bwd_scale = torch.ones(n_bwd, dtype=torch.float32, device=device)
        self.bwd_history = torch.zeros(L, n_bwd, dtype=torch.float32, device=device)


def update_delayed_scaling(history: torch.Tensor, scale: torch.Tensor, recipe: DelayedScaling, fp8_dtype: int,
                           group=None, tp_group=None) -> None:
    """One SPEC §4.3 update of a layer's slots (forward or backward) in place, after the optional MAX all-reduce of
    row 0 over `group` (the autocast's amax_reduction_group, when `recipe.reduce_amax`). A tensor-parallel layer
    passes its `tp_group`: row 0 is then always MAX-reduced over it first (whatever `reduce_amax` says), so that
    every rank of the group derives the same scales — its shards are gathered as FP8 codes under one scale."""
    groups = [g for g, on in ((tp_group, True), (group, recipe.reduce_amax)) if g is not None and on]
    buffer = None
    if groups:
        import torch.distributed as dist

        buffer = history[0].clone()
        for g in dict.fromkeys(groups):  # MAX is idempotent: a rank in both groups gets the max over their union
            dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=g)
    if callable(recipe.amax_compute_algo):
        _update_unfused(buffer, history, scale, recipe, fp8_dtype)
        return
    torch.ops.te.fused_amax_and_scale_update.default(buffer, [history], [scale], recipe.amax_compute_algo,
                                                     int(fp8_dtype), float(recipe.margin))


def _update_unfused(buffer, history, scale, recipe, fp8_dtype):
    """The update with a user amax function: the same roll as the fused op, amax = fn(history with row 0 = the
    newest amax), scale = fp8_max·2^-margin / amax where finite and > 0."""
    last = history[0] if buffer is None else torch.where(buffer != 0, buffer, history[0])
    fp8_max = 448.0 if int(fp8_dtype) == _E4M3 else 57344.0
    with torch.no_grad():
        h = history.clone()
        h[0] = last
        amax = recipe.amax_compute_algo(h).to(torch.float32).reshape(-1)
        rolled = torch.roll(h, -1, 0)
        rolled[0] = 0
        keep = last == 0
        history.copy_(torch.where(keep.unsqueeze(0), history, rolled))
        new_scale = torch.full_like(amax, fp8_max * 2.0 ** (-recipe.margin)) / amax   # a fill, not a host copy
        new_scale = torch.where(torch.isinf(new_scale), torch.full_like(new_scale, torch.finfo(torch.float32).max),
                                new_scale)
        ok = torch.isfinite(amax) & (amax > 0) & ~keep
        scale.copy_(torch.where(ok, new_scale, scale))


# ---- does the device have the recipe's GEMM? (SPEC §6.6) ------------------------------------------------------------
# The quantized-tensor class each recipe's GEMMs take (its `gemm_format` names it in messages, its `native_gemm` says
# where cuBLASLt runs it natively).
_GEMM_OPERAND = ((DelayedScaling, _formats.Float8Tensor), (Float8CurrentScaling, _formats.Float8Tensor),
                 (MXFP8BlockScaling, _formats.MXFP8Tensor), (NVFP4BlockScaling, _formats.NVFP4Tensor),
                 (Float8BlockScaling, _formats.Float8BlockwiseQTensor))
_EMULATION_GPU = ("GEMMs emulated: each operand decoded once to bf16, then a bf16 GEMM (SPEC §6.7): portable, near bf16 "
                  "speed, with two bf16 temporaries per GEMM")
_EMULATION_CPU = ("GEMMs emulated: dequantize exactly to FP32, then an FP32 GEMM with FP64 accumulation (SPEC §6.7): a "
                  "reference, not a fast path")
_SUPPORT_CHECKED: set = set()  # (recipe class, arch) pairs already checked (and warned about)


def _autocast_device() -> torch.device:
    """The device the layers' GEMMs will run on, as far as autocast can tell: the current CUDA device when there is
    one and this build has CUDA kernels, else the CPU."""
    if torch.cuda.is_available() and _device.built_with_cuda():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gemm_support(recipe_cls: type, device: torch.device) -> Optional[tuple]:
    """("native" | "emulated" | "none", why) for the GEMMs of recipe class `recipe_cls` on `device` (SPEC §6.6); None
    for a recipe class this table does not know."""
    cls = next((cls for r, cls in _GEMM_OPERAND if issubclass(recipe_cls, r)), None)
    if cls is None:
        return None
    fmt = cls.gemm_format
    if device.type != "cuda":
        return "emulated", f"no native {fmt} GEMM on the CPU"
    index = _device.cuda_index(device)
    cap = tuple(_device.capability(index))
    if cls.native_gemm is None:  # per-tensor FP8: native from sm_89 on, never emulated
        if cap >= (8, 9):
            return "native", ""
        return "none", ("FP8 per-tensor GEMMs need FP8 tensor cores (sm_89 or newer) and are not emulated on GPUs; keep "
                        "these layers in bf16 (tex.autocast(enabled=False)), or use MXFP8BlockScaling, whose GEMMs are "
                        "emulated in bf16")
    if _device.gemm_is_native(cls.__name__, index):
        return "native", ""
    if cap < (8, 0):
        return "none", (f"no native {fmt} GEMM, and the emulation's bf16 GEMM needs sm_80 or newer; keep these layers "
                        f"in bf16 (tex.autocast(enabled=False))")
    version = _device.cublaslt_version()
    return "emulated", (f"a native {fmt} GEMM needs {cls.native_gemm.where()} (this is cuBLASLt {version // 10000}."
                        f"{version // 100 % 100})")


@torch.compiler.assume_constant_result
def _check_gemm_support(recipe_cls: type) -> bool:
    """At autocast entry: NotImplementedError when the device has no GEMM for the recipe's format at all, a
    UserWarning (once per recipe class and arch) when its GEMMs are emulated. Takes the class (a constant), so that
    dynamo runs it as plain Python while tracing a compiled region that enters autocast (warnings.warn inside the
    traced code would be a graph break)."""
    device = _autocast_device()
    arch = _device.arch_name(device)
    key = (recipe_cls, arch)
    if key in _SUPPORT_CHECKED:
        return True
    support = _gemm_support(recipe_cls, device)
    if support is None:
        return True
    status, why = support
    fmt = next(cls for r, cls in _GEMM_OPERAND if issubclass(recipe_cls, r)).gemm_format
    if status == "none":
        raise NotImplementedError(f"autocast: {recipe_cls.__name__} has no {fmt} GEMM on {arch}: {why}")
    _SUPPORT_CHECKED.add(key)
    if status == "emulated":
        how = _EMULATION_CPU if device.type == "cpu" else _EMULATION_GPU
        warnings.warn(f"autocast: {recipe_cls.__name__} on {arch}: {why}; {how}", UserWarning, stacklevel=4)
    return True


# ---- autocast ----------------------------------------------------------------------------------------------------
class _AutocastState:
    enabled = False
    calibrating = False
    recipe: Optional[Recipe] = None
    group = None


_STATE = _AutocastState()


def is_fp8_enabled() -> bool:
    """True inside `autocast(enabled=True)`."""
    return _STATE.enabled


def is_calibrating() -> bool:
    return _STATE.calibrating


def get_fp8_recipe() -> Recipe:
    """The recipe of the innermost autocast (the default DelayedScaling() when none was given)."""
    return _STATE.recipe if _STATE.recipe is not None else DelayedScaling()


def get_amax_reduction_group():
    return _STATE.group


@contextlib.contextmanager
def autocast(enabled: bool = True, calibrating: bool = False, recipe: Optional[Recipe] = None,
             amax_reduction_group=None):
    """Inside, tex layers (Linear, MLP) run their GEMMs with the quantizers `recipe` assigns to each operand (default
    `DelayedScaling()`). `enabled=False` runs them in plain precision (nestable: the previous state is restored on
    exit). `calibrating=True` (delayed scaling) records amaxes and updates the scales without quantizing.
    `amax_reduction_group`: process group over which delayed-scaling amaxes are MAX-reduced before each update."""
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(f"autocast: recipe must be a tex recipe (DelayedScaling, Float8CurrentScaling, "
                        f"MXFP8BlockScaling, NVFP4BlockScaling, Float8BlockScaling), got {type(recipe).__name__}")
    if enabled:
        if recipe is not None:
            recipe.check_available()
        _check_gemm_support(type(recipe) if recipe is not None else DelayedScaling)
    saved = (_STATE.enabled, _STATE.calibrating, _STATE.recipe, _STATE.group)
    _STATE.enabled, _STATE.calibrating = bool(enabled), bool(calibrating)
    _STATE.recipe = recipe if recipe is not None else DelayedScaling()
    _STATE.group = amax_reduction_group
    try:
        yield
    finally:
        _STATE.enabled, _STATE.calibrating, _STATE.recipe, _STATE.group = saved


def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Optional[Recipe] = None,
                 fp8_group=None):
    """TE's older name of `autocast` (arguments `fp8_recipe`, `fp8_group`)."""
    return autocast(enabled=enabled, calibrating=calibrating, recipe=fp8_recipe, amax_reduction_group=fp8_group)
