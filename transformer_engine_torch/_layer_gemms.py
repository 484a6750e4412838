"""What the layers share (modules.py's Linear and MLP, _tensor_parallel.py's tensor-parallel linears,
grouped_linear.py's GroupedLinear): the compute dtype, the alignment check, the recipe's quantizer configs, the GEMM
calls in the layers' layouts (SPEC §8: fprop TN, dgrad NN, wgrad NT, split accumulation on dgrad and wgrad), the
quantized-operand and delayed-scaling-slot helpers, and the per-layer delayed-scaling state (DelayedMixin). Moved
out of modules.py verbatim (issue 33), its names public within the package.
"""
from __future__ import annotations

import warnings

import torch

from .gemm import generic_gemm
from .recipe import DelayedScaling, DelayedScalingState, get_amax_reduction_group, update_delayed_scaling


def activation_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the GEMMs compute in: torch.autocast's when it is on for x's device, else x's."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def check_alignment(layer: str, recipe, dims: dict) -> None:
    a = recipe.alignment
    for name, v in dims.items():
        if v % a:
            raise ValueError(
                f"{layer}: under {type(recipe).__name__} every GEMM dim must be a multiple of {a} (SPEC §6.5), got "
                f"{name}={v}. Pad {name} to {(v + a - 1) // a * a}, or keep this layer in bf16 by running it outside "
                f"tex.autocast (or inside tex.autocast(enabled=False))")


_RHT_OFF_WARNED = set()


@torch.compiler.assume_constant_result
def _warn_rht_off(act_dtype: torch.dtype) -> bool:
    """Warns once per dtype that NVFP4 runs without RHT. Dynamo runs it as plain Python while tracing (a
    warnings.warn inside the traced code would be a graph break)."""
    if act_dtype not in _RHT_OFF_WARNED:
        _RHT_OFF_WARNED.add(act_dtype)
        warnings.warn(f"NVFP4BlockScaling: the random Hadamard transform takes bfloat16 activations only; this layer "
                      f"computes in {act_dtype}, so it runs without RHT (run it under torch.autocast(dtype="
                      f"torch.bfloat16) or with bf16 parameters to keep it)", stacklevel=3)
    return True


def layer_configs(recipe, act_dtype) -> tuple:
    """(input, weight, grad_output) quantizer configs of a layer computing in `act_dtype`. NVFP4's Hadamard transform
    takes bf16 only, so for other activation dtypes the layer turns it off on the input and gradient copies (SPEC §8),
    warning once per dtype; everything else of the recipe stays."""
    cfgs = tuple(recipe.quantizer_config(role) for role in ("input", "weight", "grad_output"))
    if act_dtype == torch.bfloat16 or not any(c[0] == "nvfp4" and c[1] for c in cfgs):
        return cfgs
    _warn_rht_off(act_dtype)
    return tuple(("nvfp4", False) + c[2:] if c[0] == "nvfp4" else c for c in cfgs)


def layer_gemm(A, transA, B, transB, out_dtype, bias=None, split=False):
    return generic_gemm(A, transA, B, transB, None, None, out_dtype, bias,
                        bias.dtype if bias is not None else None, False, None, False, None, 0, False, split)[0]


def wgrad_gemm(x_q, dy_q, dtype):
    """dW = dYᵀ·X (NT), split accumulation."""
    return layer_gemm(x_q, False, dy_q, True, dtype, split=True)


def dgrad_gemm(w_q, dy_q, dtype):
    """dX = dY·W (NN), split accumulation."""
    return layer_gemm(w_q, False, dy_q, False, dtype, split=True)


def keep_columnwise(q):
    """Drops the rowwise copy: backward reads only the columnwise one (dgrad W, wgrad X)."""
    if q is not None:
        q.update_usage(rowwise_usage=False)
    return q


def slot_views(scale, history, i):
    """(scale, amax) one-element views of slot i (amax = the slot's entry in history row 0), or (None, None)."""
    if scale is None:
        return None, None
    return scale[i:i + 1], history[0, i:i + 1]


_FP8_BUFFERS = ("fp8_fwd_scale", "fp8_fwd_amax_history", "fp8_bwd_scale", "fp8_bwd_amax_history")
_EXTRA_STATE_VERSION = 1
# get_extra_state's keys -> the buffers they hold
_EXTRA_STATE_KEYS = (("fwd_scale", "fp8_fwd_scale"), ("fwd_amax_history", "fp8_fwd_amax_history"),
                     ("bwd_scale", "fp8_bwd_scale"), ("bwd_amax_history", "fp8_bwd_amax_history"))


class DelayedMixin:
    """Per-layer delayed-scaling state as non-persistent float32 buffers, saved in `state_dict` under
    `<module>._extra_state` (get_extra_state / set_extra_state, TE's key) so that a checkpoint resumes bit for bit.

    They are allocated when the layer is built, for the default `DelayedScaling()` (history of 1024 steps), and
    again by `init_fp8_state(recipe)` or, eagerly, at the first forward under a recipe of another history length.
    They must exist before torch.compile traces the layer: the backward updates the backward slots in place, and
    AOTAutograd can apply a backward mutation to a graph input but not to a tensor the traced forward created (its
    partitioner fails with "Node ... was invalid, but is output"). `.to(dtype)` / `.half()` leave them float32."""

    _N_FWD = 3
    _N_BWD = 2

    def _init_fp8_buffers(self, device=None):
        st = DelayedScalingState(DelayedScaling(), self._N_FWD, self._N_BWD, device)
        for name, t in zip(_FP8_BUFFERS, (st.fwd_scale, st.fwd_history, st.bwd_scale, st.bwd_history)):
            self.register_buffer(name, t, persistent=False)

    def init_fp8_state(self, recipe: DelayedScaling, device=None) -> None:
        """(Re)allocates the delayed-scaling state for `recipe` (fresh: scales 1, histories 0) on `device` (default:
        where the parameters are). Call it before torch.compile traces the layer under a DelayedScaling whose
        amax_history_len is not the default 1024."""
        if not isinstance(recipe, DelayedScaling):
            raise TypeError(f"{type(self).__name__}.init_fp8_state: recipe must be a DelayedScaling, got "
                            f"{type(recipe).__name__}")
        device = device if device is not None else next(self.parameters()).device
        st = DelayedScalingState(recipe, self._N_FWD, self._N_BWD, device)
        self.fp8_fwd_scale, self.fp8_fwd_amax_history = st.fwd_scale, st.fwd_history
        self.fp8_bwd_scale, self.fp8_bwd_amax_history = st.bwd_scale, st.bwd_history

    def _apply(self, fn, recurse=True):
        """Module.to / .cuda / .half move the delayed-scaling buffers but keep them float32 (a bf16 amax history or
        scale would round every update)."""
        saved = {name: self._buffers.pop(name) for name in _FP8_BUFFERS if self._buffers.get(name) is not None}
        out = super()._apply(fn, recurse)
        for name, t in saved.items():
            moved = fn(t)
            self._buffers[name] = moved if moved.dtype == torch.float32 else t.to(device=moved.device)
        return out

    # ---- checkpoints: the state travels in state_dict as `<module>._extra_state` (TE's key) ----------------------
    def get_extra_state(self) -> dict:
        """The delayed-scaling state for `state_dict`: {"version": 1, "fwd_scale" [n_fwd], "fwd_amax_history"
        [L, n_fwd], "bwd_scale" [n_bwd], "bwd_amax_history" [L, n_bwd]}, the float32 buffers themselves (as
        state_dict gives parameters: not copies). Plain tensors and ints, so `torch.load(weights_only=True)` reads it.
        A layer that never ran under DelayedScaling saves its fresh state (scales 1, histories 0, L = 1024)."""
        return {"version": _EXTRA_STATE_VERSION, **{key: getattr(self, name) for key, name in _EXTRA_STATE_KEYS}}

    def set_extra_state(self, state) -> None:
        """Restores `get_extra_state()`'s dict (None: nothing saved, the state is left as it is). The tensors go to
        where this layer's state lives, as float32; a history of another length than the current one replaces the
        buffers (the next forward under a DelayedScaling of that length then uses them, not fresh ones)."""
        if state is None:
            return
        name = type(self).__name__
        if not isinstance(state, dict) or state.get("version") != _EXTRA_STATE_VERSION:
            got = f"a dict of version {state.get('version')!r}" if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{name}.set_extra_state: expected the dict get_extra_state() writes (version "
                             f"{_EXTRA_STATE_VERSION}, keys {', '.join(k for k, _ in _EXTRA_STATE_KEYS)}), got {got} "
                             f"(a TransformerEngine checkpoint's state dict loads through tex.load_te_state_dict)")
        slots = {"fwd": self._N_FWD, "bwd": self._N_BWD}
        for key, buf in _EXTRA_STATE_KEYS:
            t, n = state.get(key), slots[key[:3]]
            want = f"[{n}]" if key.endswith("scale") else f"[L, {n}]"
            ok = isinstance(t, torch.Tensor) and t.dim() == (1 if key.endswith("scale") else 2) and t.shape[-1] == n
            if not ok:
                got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}.set_extra_state: {key} must be a tensor of shape {want} ({n} delayed-scaling "
                                 f"slots of this layer), got {got}")
        if state["fwd_amax_history"].shape[0] != state["bwd_amax_history"].shape[0]:
            raise ValueError(f"{name}.set_extra_state: fwd_amax_history and bwd_amax_history must have the same "
                             f"length L, got {state['fwd_amax_history'].shape[0]} and "
                             f"{state['bwd_amax_history'].shape[0]}")
        device = self.fp8_fwd_scale.device
        for key, buf in _EXTRA_STATE_KEYS:
            t, mine = state[key], getattr(self, buf)
            if t.shape == mine.shape:
                with torch.no_grad():
                    mine.copy_(t)  # in place: a compiled graph holding the buffer sees the restored values
            else:
                setattr(self, buf, t.detach().to(device=device, dtype=torch.float32, copy=True))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """A state_dict without `<prefix>_extra_state` (torch.nn.Linear's, or one written before the key existed)
        loads strictly too: the delayed-scaling state is then left as it is."""
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        key = prefix + "_extra_state"
        if key in missing_keys:
            missing_keys.remove(key)

    def _delayed_state(self, recipe, device):
        """(fwd_scale, fwd_history, bwd_scale, bwd_history) for a delayed recipe, else four Nones."""
        if not isinstance(recipe, DelayedScaling):
            return None, None, None, None
        h = self.fp8_fwd_amax_history
        if h.shape[0] != recipe.amax_history_len or h.device != device:
            if torch.compiler.is_compiling():
                raise RuntimeError(
                    f"{type(self).__name__}: under torch.compile the delayed-scaling state must exist before tracing, "
                    f"but it holds a history of {h.shape[0]} steps on {h.device} and the recipe asks for "
                    f"{recipe.amax_history_len} steps on {device}. Call layer.init_fp8_state(recipe) (or "
                    f"tex.init_fp8_state(model, recipe)) before compiling, or run one eager step first")
            self.init_fp8_state(recipe, device)
        return self.fp8_fwd_scale, self.fp8_fwd_amax_history, self.fp8_bwd_scale, self.fp8_bwd_amax_history

    def _calibrate(self, recipe, tensors_by_slot, tp_group=None):
        """calibrating=True: record each forward operand's amax into its history entry (max), then update (a
        tensor-parallel layer's amaxes are those of its shards, MAX-reduced over `tp_group`)."""
        fs, fh, _, _ = self._delayed_state(recipe, tensors_by_slot[0][1].device)
        with torch.no_grad():
            for slot, t in tensors_by_slot:
                amax = torch.zeros(1, dtype=torch.float32, device=t.device)
                torch.ops.te.compute_amax.default(t.detach(), amax)
                fh[0, slot:slot + 1].copy_(torch.maximum(fh[0, slot:slot + 1], amax))
        update_delayed_scaling(fh, fs, recipe, recipe.fp8_format.value.fwd_dtype, get_amax_reduction_group(),
                               tp_group=tp_group)
