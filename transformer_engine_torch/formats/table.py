"""The core's format table (csrc/core/formats/table.h, through `_C.format_table()`), read once at import: the one
list of formats and their shape and decode rules. The quantizers take their block lengths, scale shapes and data
shapes from here; the rules are evaluated in Python (plain int arithmetic on the table's numbers), so dynamo traces
them where a call into `_C` would break the graph. `_C.format_scale_shapes` / `_C.format_data_shapes` /
`_C.format_decode` are the core's own evaluations, for tests."""
from __future__ import annotations

import enum

from .. import _C
from .base import _rows_cols


class Format(enum.IntEnum):
    """Format ids, the core's numbering (also the GEMM's scaling codes)."""

    PLAIN = 0
    FP8_PER_TENSOR = 1
    MXFP8 = 2
    NVFP4 = 3
    FP8_BLOCK_1x128 = 4
    FP8_BLOCK_128x128 = 5


FORMATS = tuple(_C.format_table())   # one dict per Format: name, elem_types, block, scale_type, rules, decode
assert [r["name"] for r in FORMATS] and len(FORMATS) == len(Format), "the core's format table changed its ids"


def block_len(fmt) -> int:
    """Elements along K that one scale of the rowwise copy covers (MXFP8 32, NVFP4 16, FP8 block 128)."""
    return FORMATS[fmt]["row"]["block"][1]


def _scale_dim(dim, m, k):
    src, block, pad, exact = dim
    n = m if src == 0 else k
    q = n // block if exact else -(-n // block)
    return -(-q // pad) * pad


def scale_shape(fmt, shape, columnwise: bool) -> tuple:
    """The padded scale shape (SPEC §4.8) of one copy of a tensor of `shape`: () without a scale, (1,) for a
    per-tensor scale, else the 2-D scale matrix."""
    rule = FORMATS[fmt]["col" if columnwise else "row"]
    if rule is None or rule["scale_rank"] == 0:
        return ()
    if rule["scale_rank"] == 1:
        return (1,)
    m, k = _rows_cols(shape)
    return tuple(_scale_dim(d, m, k) for d in rule["scale"])


def scale_shapes(fmt, shape) -> tuple:
    """(rowwise, columnwise) padded scale shapes of a tensor of `shape`."""
    return scale_shape(fmt, shape, False), scale_shape(fmt, shape, True)


def data_shape(fmt, shape, columnwise: bool) -> tuple:
    """The stored data shape (uint8) of one copy: shape[:-1] + (K/epb,) (epb codes a byte), a transposed copy
    (K,) + shape[:-1], or 2-D [K, M/epb] where the format stores it flattened (`flat2d`). None: no such copy."""
    row = FORMATS[fmt]
    rule = row["col" if columnwise else "row"]
    shape, epb = tuple(shape), row["elems_per_byte"]
    if rule is None:
        return None
    if not rule["transposed"]:
        return shape[:-1] + (shape[-1] // epb,) if shape else shape
    if rule["flat2d"]:
        m, k = _rows_cols(shape)
        return (k, m // epb)
    return (shape[-1],) + shape[:-1] if shape else shape   # (no packed format stores this form)


def data_shapes(fmt, shape) -> tuple:
    """(rowwise, columnwise) stored data shapes of a tensor of `shape`."""
    return data_shape(fmt, shape, False), data_shape(fmt, shape, True)
