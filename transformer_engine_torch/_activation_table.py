"""The activations, one row each (SPEC §3): the Python side's single list. The wrappers of activations.py (and
`__all__`), the gated set of the fake kernels (_ops.py) and MLP's activations (modules.py) are derived from it.

A new activation: its functor row in C++ (csrc/core), a row here, its reference in tests/. `code` is TE's
activation enum (SPEC §1.4), the number the C++ table uses for the same row.
"""
from __future__ import annotations

import typing


class Activation(typing.NamedTuple):
    name: str  # the forward function; the backward is `d<name>`, the fused one `dbias_d<name>`
    code: int  # TE's activation enum
    gated: bool  # input [..., 2N] -> output [..., N]: act(first half) * second half
    dbias: bool  # has the fused dbias + backward (`dbias_d<name>`)
    params: bool = False  # takes (limit, alpha, offset): its wrappers are written out in activations.py

    @property
    def backward(self) -> str:
        return "clamped_dswiglu" if self.name == "clamped_swiglu" else f"d{self.name}"  # TE's name

    @property
    def dbias_backward(self):
        return f"dbias_d{self.name}" if self.dbias else None


ACTIVATIONS = (
    Activation("gelu", 0, gated=False, dbias=True),  # tanh approximation
    Activation("geglu", 1, gated=True, dbias=False),
    Activation("qgelu", 7, gated=False, dbias=True),  # x * sigmoid(1.702 x)
    Activation("qgeglu", 8, gated=True, dbias=False),
    Activation("relu", 5, gated=False, dbias=True),
    Activation("reglu", 6, gated=True, dbias=False),
    Activation("srelu", 9, gated=False, dbias=True),  # relu(x)^2
    Activation("sreglu", 10, gated=True, dbias=False),
    Activation("silu", 3, gated=False, dbias=True),
    Activation("swiglu", 4, gated=True, dbias=False),
    Activation("glu", 2, gated=True, dbias=False),  # sigmoid(a) * b
    Activation("clamped_swiglu", 11, gated=True, dbias=False, params=True),  # GPT-OSS (SPEC §3.3)
)

GATED_CODES = frozenset(a.code for a in ACTIVATIONS if a.gated)
