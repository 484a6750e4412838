"""Activation names as TE's JAX users spell them, mapped to the core's activation codes (SPEC §1.4).

TE/JAX names an activation by a tuple of per-half functions: `("gelu",)` is GELU, `("gelu", "linear")` is GEGLU
(the activated half first, at index 0 of axis -2). The plain names of the torch frontend (`"swiglu"`, `"geglu"`,
...) are accepted too. The codes are the core's `ActKind` values, which both frontends pass to the same kernels.
"""
from __future__ import annotations

import typing


class ActivationType(typing.NamedTuple):
    name: str  # the torch frontend's name of the forward op
    code: int  # core ActKind / TE's activation enum
    spelling: tuple  # TE/JAX's tuple
    gated: bool


_ROWS = (
    ("gelu", 0, ("gelu",)),
    ("geglu", 1, ("gelu", "linear")),
    ("glu", 2, ("sigmoid", "linear")),
    ("silu", 3, ("silu",)),
    ("swiglu", 4, ("silu", "linear")),
    ("relu", 5, ("relu",)),
    ("reglu", 6, ("relu", "linear")),
    ("qgelu", 7, ("quick_gelu",)),
    ("qgeglu", 8, ("quick_gelu", "linear")),
    ("srelu", 9, ("squared_relu",)),
    ("sreglu", 10, ("squared_relu", "linear")),
    ("clamped_swiglu", 11, ("clamped_silu", "clamped_linear")),
)
ACTIVATIONS = tuple(ActivationType(n, c, s, len(s) == 2) for n, c, s in _ROWS)
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
