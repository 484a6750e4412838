"""The oracle's shared pieces: the FP32 / FP64 names, fl() of a Python float, integer helpers, and `as_torch`, the
door through which another frontend's arrays reach these torch references."""
import torch

F32 = torch.float32
F64 = torch.float64
FLT_MAX = torch.finfo(torch.float32).max


def f32(v):
    """Python float rounded to float32 (as a Python float)."""
    return float(torch.tensor(v, dtype=F32))


def ceil_div(a, b):
    return (a + b - 1) // b


def roundup(a, b):
    return ceil_div(a, b) * b


def as_torch(x):
    """`x` as a torch tensor: a torch tensor unchanged, any other array that speaks DLPack (a JAX or NumPy array)
    viewed through `torch.from_dlpack`: same memory, same device, same dtype, no copy. The references take torch
    tensors; a JAX test passes its outputs through this and is judged by the same oracle as the torch tests. The
    view shares the source's memory (JAX arrays are immutable): never write through it."""
    if isinstance(x, torch.Tensor):
        return x
    return torch.from_dlpack(x)
