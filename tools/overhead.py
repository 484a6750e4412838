"""Host-side cost of one small quantizing activation call, split into its parts (GPU machine)."""
import time

import torch

import transformer_engine_torch as tex

x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
q = tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, columnwise=False)
qd = tex.Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), tex.DType.kFloat8E4M3,
                         columnwise=False)


def per_call_us(f, n=3000):
    for _ in range(200):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


spec = q._spec()
op = torch.ops.te.act_quantize.default
rows = [
    ("tex.gelu(x, current)", lambda: tex.gelu(x, q)),
    ("tex.gelu(x, delayed)", lambda: tex.gelu(x, qd)),
    ("tex.gelu(x, None)", lambda: tex.gelu(x, None)),
    ("op act_quantize current", lambda: op(x, 0, 7.0, 1.702, 1.0, *spec)),
    ("torch.relu(x)", lambda: torch.relu(x)),
    ("torch.empty(1)", lambda: torch.empty(1, device="cuda")),
]
for name, f in rows:
    print(f"{name:<28} {per_call_us(f):7.2f} us/call")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(50):
        tex.gelu(x, q)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
