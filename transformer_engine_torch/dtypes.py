"""`tex.DType` (TE's integers, SPEC §1.3) and conversions between DType, torch dtypes and ints."""
from __future__ import annotations

import enum

import torch


class DType(enum.IntEnum):
    """TE's data type codes. Compares equal to the plain ints; pickles as an int."""

    kByte = 0
    kInt16 = 1
    kInt32 = 2
    kInt64 = 3
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat8E8M0 = 9
    kFloat4E2M1 = 10


_FROM_TORCH = {
    torch.uint8: DType.kByte,
    torch.bool: DType.kByte,
    torch.int16: DType.kInt16,
    torch.int32: DType.kInt32,
    torch.int64: DType.kInt64,
    torch.float32: DType.kFloat32,
    torch.float16: DType.kFloat16,
    torch.bfloat16: DType.kBFloat16,
    torch.float8_e4m3fn: DType.kFloat8E4M3,
    torch.float8_e5m2: DType.kFloat8E5M2,
}
_TO_TORCH = {
    DType.kByte: torch.uint8,
    DType.kInt16: torch.int16,
    DType.kInt32: torch.int32,
    DType.kInt64: torch.int64,
    DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16,
    DType.kBFloat16: torch.bfloat16,
    DType.kFloat8E4M3: torch.float8_e4m3fn,
    DType.kFloat8E5M2: torch.float8_e5m2,
}
FP8_DTYPES = (DType.kFloat8E4M3, DType.kFloat8E5M2)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def as_dtype(value, what: str = "dtype") -> DType:
    """DType from a DType, an int or a torch dtype (ours: all three are accepted wherever a DType is)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, torch.dtype):
        if value not in _FROM_TORCH:
            raise TypeError(f"{what}: torch dtype {value} has no tex.DType")
        return _FROM_TORCH[value]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return DType(value)
        except ValueError:
            raise ValueError(f"{what}: {value} is not a tex.DType code; accepted: {[int(d) for d in DType]}") from None
    raise TypeError(f"{what} must be a tex.DType, a torch dtype or an int, got {type(value).__name__}")


def as_fp8_dtype(value, what: str = "fp8_dtype") -> DType:
    d = as_dtype(value, what)
    if d not in FP8_DTYPES:
        raise ValueError(f"{what} must be kFloat8E4M3 or kFloat8E5M2, got {d.name}")
    return d


def to_torch_dtype(value, what: str = "dtype") -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    d = as_dtype(value, what)
    if d not in _TO_TORCH:
        raise ValueError(f"{what}: {d.name} has no torch dtype")
    return _TO_TORCH[d]


def fp8_max(d: DType) -> float:
    return 448.0 if d == DType.kFloat8E4M3 else 57344.0
