"""Activation names as TE's JAX users spell them, mapped to the core's activation codes (SPEC §1.4).

TE/JAX names an activation by a tuple of per-half functions: `("gelu",)` is GELU, `("gelu", "linear")` is GEGLU
(the activated half first, at index 0 of axis -2). The plain names of the torch frontend (`"swiglu"`, `"geglu"`,
...) are accepted too. The rows (code, name, gated) are the core's activation table, read from the extension.
"""
from __future__ import annotations

import typing

from . import _ffi


class ActivationType(typing.NamedTuple):
    name: str  # the core's (and the torch frontend's) name of the forward op
    code: int  # core ActKind / TE's activation enum
    spelling: tuple  # TE/JAX's tuple
    gated: bool


# TE/JAX's spellings of the core's activations. The rows themselves come from the core's table (_ffi.activations());
# one the core gains without a spelling here is spelled (name,) when unary, (name, "linear") when gated.
_TE_SPELLING = {
    "gelu": ("gelu",), "geglu": ("gelu", "linear"), "glu": ("sigmoid", "linear"), "silu": ("silu",),
    "swiglu": ("silu", "linear"), "relu": ("relu",), "reglu": ("relu", "linear"), "qgelu": ("quick_gelu",),
    "qgeglu": ("quick_gelu", "linear"), "srelu": ("squared_relu",), "sreglu": ("squared_relu", "linear"),
    "clamped_swiglu": ("clamped_silu", "clamped_linear"),
}
ACTIVATIONS = tuple(
    ActivationType(name, code, _TE_SPELLING.get(name, (name, "linear") if gated else (name,)), gated)
    for code, name, gated in sorted(_ffi.activations()))
_BY_KEY = {**{a.spelling: a for a in ACTIVATIONS}, **{a.name: a for a in ACTIVATIONS}}


def _accepted() -> str:
    return ", ".join(repr(a.spelling) for a in ACTIVATIONS) + " or a name: " + ", ".join(a.name for a in ACTIVATIONS)


def activation_of(activation_type) -> ActivationType:
    """The activation named by a TE/JAX tuple (`("silu", "linear")`), a one-string sequence (`["gelu"]`) or a plain
    name (`"swiglu"`). Raises ValueError listing the accepted spellings."""
    key = activation_type
    if isinstance(key, (list, tuple)):
        key = tuple(str(k).lower() if isinstance(k, str) else k for k in key)
    elif isinstance(key, str):
        key = key.lower()
    found = _BY_KEY.get(key) if isinstance(key, (str, tuple)) else None
    if found is None:
        raise ValueError(f"activation_type {activation_type!r} is not known; accepted: {_accepted()}")
    return found
