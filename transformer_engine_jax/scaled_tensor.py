"""`ScaledTensor`: the quantized result of a tej op, as a pytree (SPEC §4.9's pieces under TE/JAX's names).

Leaves: `data` / `scale_inv` (the rowwise copy), `colwise_data` / `colwise_scale_inv` (the copy for the transposed
operand), `amax` (f32[1]: the updated amax of delayed scaling, NVFP4's rowwise global amax) and `colwise_amax`
(NVFP4's columnwise global amax). A copy the layout does not ask for is None. Static: the scaling mode, the layout,
the logical shape and the dtype `dequantize()` returns. Scale layouts are the torch frontend's (SPEC §4.8): MXFP8
scales uint8 E8M0 `[roundup(M, 128), roundup(K/32, 4)]`; the FP8 per-tensor and FP8 block columnwise copies are
transposed, MXFP8's is not; NVFP4 data packs two E2M1 codes per byte.
"""
from __future__ import annotations

import dataclasses

import jax

from .quantizers import QuantizeLayout, ScalingMode

_LEAVES = ("data", "scale_inv", "colwise_data", "colwise_scale_inv", "amax", "colwise_amax")


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class ScaledTensor:
    data: object
    scale_inv: object
    colwise_data: object
    colwise_scale_inv: object
    amax: object
    colwise_amax: object
    scaling_mode: ScalingMode
    q_layout: QuantizeLayout
    shape: tuple
    dq_dtype: object

    def tree_flatten(self):
        return tuple(getattr(self, k) for k in _LEAVES), (self.scaling_mode, self.q_layout, self.shape, self.dq_dtype)

    @classmethod
    def tree_unflatten(cls, static, leaves):
        return cls(*leaves, *static)

    def get_rowwise_tensor(self) -> "ScaledTensor":
        """The rowwise copy alone. Raises ValueError when the tensor has none."""
        if not self.q_layout.rowwise:
            raise ValueError(f"ScaledTensor ({self.scaling_mode.name}, shape {self.shape}) holds only the colwise "
                             "copy; quantize with q_layout ROWWISE or ROWWISE_COLWISE")
        return dataclasses.replace(self, colwise_data=None, colwise_scale_inv=None, colwise_amax=None,
                                   q_layout=QuantizeLayout.ROWWISE)

    def get_colwise_tensor(self) -> "ScaledTensor":
        """The colwise copy alone. Raises ValueError when the tensor has none."""
        if not self.q_layout.colwise:
            raise ValueError(f"ScaledTensor ({self.scaling_mode.name}, shape {self.shape}) holds only the rowwise "
                             "copy; quantize with q_layout COLWISE or ROWWISE_COLWISE")
        return dataclasses.replace(self, data=None, scale_inv=None, q_layout=QuantizeLayout.COLWISE)

    def dequantize(self, dtype=None):
        """The values in `dtype` (default `dq_dtype`), from the rowwise copy when there is one (SPEC §4.9)."""
        from .dequantize import dequantize

        return dequantize(self, dtype)
