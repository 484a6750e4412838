#!/usr/bin/env python3
"""The NVFP4 quantizer's time per option on one 8192x16384 bf16 tensor (both copies), next to the MXFP8 cast, with
the achieved bytes per second (bf16 read, two packed copies written): where an NVFP4 step's quantize time goes.

    PYTHONPATH=. python tools/nvfp4_cast_time.py
"""
import torch

import transformer_engine_torch as tex

x = torch.randn(8192, 16384, device="cuda", dtype=torch.bfloat16)
floor_bytes = x.numel() * 2 + x.numel()  # read bf16, write two packed copies
def t(f, n=20):
    for _ in range(3): f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n * 1e3
for name, kw in [("plain", {}), ("2d", dict(with_2d_quantization=True)), ("sr", dict(stochastic_rounding=True)),
                 ("rht", dict(with_rht=True, with_post_rht_amax=True)),
                 ("rht+sr", dict(with_rht=True, with_post_rht_amax=True, stochastic_rounding=True))]:
    q = tex.NVFP4Quantizer(**kw)
    us = t(lambda: tex.quantize(x, q))
    print(f"nvfp4 cast {name:7s} 8192x16384: {us:8.1f} us  ({floor_bytes / us / 1e3:.0f} GB/s)")
q = tex.MXFP8Quantizer(tex.DType.kFloat8E4M3)
us = t(lambda: tex.quantize(x, q)); print(f"mxfp8 cast both copies: {us:8.1f} us ({x.numel() * 4 / us / 1e3:.0f} GB/s)")
