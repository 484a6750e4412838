"""Facts about this process's build, library and devices, asked once and kept as plain Python values.

They are constants of the process, and some are asked from code that dynamo and AOTAutograd trace (gemm.py picks a
native or an emulated block GEMM by them). A question put to the device or the library inside a trace is either a
graph break or, for a te op without tensor arguments, a NotImplementedError under fake tensors. So each answer
comes from a plain function (no te op, no dispatcher), is cached on first use, and is marked
`assume_constant_result`: dynamo calls it once while tracing and bakes the answer into the graph; AOTAutograd's
tracing of a backward runs it as ordinary Python. Nothing here runs at import (importing needs no GPU).
"""
from __future__ import annotations

import torch

from . import _C
from .formats.base import TENSOR_CLASSES

_CAPABILITY: dict = {}
_FACTS: dict = {}


@torch.compiler.assume_constant_result
def built_with_cuda() -> bool:
    """Whether this build has the CUDA kernels (False for a CPU-only build)."""
    if "cuda" not in _FACTS:
        _FACTS["cuda"] = bool(_C.built_with_cuda())
    return _FACTS["cuda"]


@torch.compiler.assume_constant_result
def cublaslt_version() -> int:
    """cublasLtGetVersion() of the loaded library, e.g. 130200 (0 in a CPU-only build)."""
    if "cublaslt" not in _FACTS:
        _FACTS["cublaslt"] = int(_C.cublaslt_version())
    return _FACTS["cublaslt"]


@torch.compiler.assume_constant_result
def capability(index: int) -> tuple:
    """(major, minor) compute capability of CUDA device `index`."""
    cap = _CAPABILITY.get(index)
    if cap is None:
        cap = _CAPABILITY[index] = tuple(torch.cuda.get_device_capability(index))
    return cap


def arch_name(device: torch.device) -> str:
    """`sm_90`-style name of a device for messages, `cpu` for the CPU."""
    if device.type != "cuda":
        return device.type
    major, minor = capability(cuda_index(device))
    return f"sm_{major}{minor}"


def cuda_index(device: torch.device) -> int:
    """The index of a CUDA device (the current one for a bare 'cuda'; a tensor's device always has its index)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def native_gemm_formats(index: int) -> frozenset:
    """Names of the quantized-tensor classes with a native cuBLASLt GEMM on CUDA device `index` (SPEC §6.6): those
    whose `native_gemm` holds for the device's capability and the loaded cuBLASLt (FP8 blocks on sm_90 with cuBLASLt
    >= 12.9; MXFP8 and NVFP4 on sm_100/sm_110 with cuBLASLt >= 12.8). The others are emulated (§6.7). For eager
    code; traced code asks `gemm_is_native` (dynamo cannot guard a set that came from a constant)."""
    return frozenset(name for name in TENSOR_CLASSES if gemm_is_native(name, index))


@torch.compiler.assume_constant_result
def gemm_is_native(cls_name: str, index: int) -> bool:
    """Whether quantized-tensor class `cls_name` (its name, a plain constant) has a native cuBLASLt GEMM on CUDA
    device `index`: a plain bool, so a trace bakes it in with no guard."""
    cls = TENSOR_CLASSES.get(cls_name)
    return cls is not None and cls.native_gemm is not None and cls.native_gemm.holds(capability(index),
                                                                                     cublaslt_version())
