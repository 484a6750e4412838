#!/usr/bin/env python3
"""One call of each norm kernel worth profiling (for `ncu`): RMSNorm / LayerNorm forward (plain bf16, FP8 delayed,
MXFP8) and backward at 16384 x H bf16.
Usage (repository root): PYTHONPATH=. ncu --clock-control none ... python3 tools/prof_norm.py [H]"""
import sys

import torch

import transformer_engine_torch as tex

h = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
dev = "cuda"
x = torch.randn(16384, h, device=dev, dtype=torch.bfloat16)
dz = torch.randn_like(x)
gamma = torch.randn(h, device=dev)
beta = torch.randn(h, device=dev)
e4 = tex.DType.kFloat8E4M3
delayed = tex.Float8Quantizer(torch.tensor([3.0], device=dev), torch.zeros(1, device=dev), e4, columnwise=False)
mx = tex.MXFP8Quantizer(e4, columnwise=False)
for q in (None, delayed, mx):
    tex.rmsnorm_fwd(x, gamma, 1e-5, None, q, torch.bfloat16, 0, False)
_, mu, rs = tex.layernorm_fwd(x, gamma, beta, 1e-5, None, None, torch.bfloat16, 0, False)
tex.layernorm_bwd(dz, x, mu, rs, gamma, 0, False)
_, _, rs = tex.rmsnorm_fwd(x, gamma, 1e-5, None, None, torch.bfloat16, 0, False)
tex.rmsnorm_bwd(dz, x, rs, gamma, 0, False)
torch.cuda.synchronize()
