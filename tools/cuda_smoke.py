"""Quick CUDA smoke check used during development: CPU vs CUDA bit parity for every activation, direction and
per-tensor format, and rough timings against the device-to-device copy. Prints a summary; exits 1 on mismatch."""
import sys
import time

import torch

import transformer_engine_torch as tex

GATED = {"geglu", "glu", "swiglu", "reglu", "qgeglu", "sreglu", "clamped_swiglu"}
FWD = ["gelu", "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu", "silu", "swiglu", "glu", "clamped_swiglu"]
BWD = {"gelu": "dgelu", "geglu": "dgeglu", "qgelu": "dqgelu", "qgeglu": "dqgeglu", "relu": "drelu", "reglu": "dreglu",
       "srelu": "dsrelu", "sreglu": "dsreglu", "silu": "dsilu", "swiglu": "dswiglu", "glu": "dglu",
       "clamped_swiglu": "clamped_dswiglu"}


def quantizers(dev, fp8):
    yield "plain", None
    yield "delayed", tex.Float8Quantizer(torch.tensor([3.5], device=dev), torch.zeros(1, device=dev), fp8)
    yield "current", tex.Float8CurrentScalingQuantizer(fp8)


def flat(res):
    if isinstance(res, tuple):
        return [t for r in res for t in flat(r)]
    if isinstance(res, tex.Float8Tensor):
        return [t for t in (res._data, res._transpose, res._scale_inv) if t is not None]
    return [res]


def same(a, b):
    a, b = a.cpu(), b.cpu()
    if a.dtype.is_floating_point:
        return torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a.nan_to_num(1234.5),
                           b.nan_to_num(1234.5)) and torch.equal(a.isnan(), b.isnan())
    return torch.equal(a, b)


def parity():
    bad = []
    n = 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape in ((257, 260), (128, 136), (3, 7, 32), (1000, 24)):
            x = (torch.rand(shape) * 6 - 3).to(dtype)
            x.view(-1)[:5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0]).to(dtype)
            g = (torch.rand(shape) * 4 - 2).to(dtype)
            for name in FWD:
                gshape = list(shape)
                if name in GATED:
                    gshape[-1] //= 2
                for fp8 in (tex.DType.kFloat8E4M3, tex.DType.kFloat8E5M2):
                    for qn, _ in quantizers("cpu", fp8):
                        if qn == "plain" and fp8 == tex.DType.kFloat8E5M2:
                            continue
                        res = {}
                        for dev in ("cpu", "cuda"):
                            q = dict(quantizers(dev, fp8))[qn]
                            xd = x.to(dev)
                            gd = g[..., : gshape[-1]].contiguous().to(dev)
                            res[dev] = (flat(getattr(tex, name)(xd, q)) + flat(getattr(tex, BWD[name])(gd, xd, q)) +
                                        ([q.amax] if qn == "delayed" else []))
                        n += 1
                        if not all(same(a, b) for a, b in zip(res["cpu"], res["cuda"])):
                            bad.append((name, qn, str(fp8), str(dtype), shape))
    for fp8 in (tex.DType.kFloat8E4M3, tex.DType.kFloat8E5M2):
        bits = torch.randint(-2**31, 2**31 - 1, (1 << 20,), dtype=torch.int32).view(torch.float32)
        outs = [flat(tex.quantize(bits.to(d), tex.Float8Quantizer(torch.ones(1, device=d), torch.zeros(1, device=d), fp8)))
                for d in ("cpu", "cuda")]
        n += 1
        if not all(same(a, b) for a, b in zip(*outs)):
            bad.append(("quantize-bits", str(fp8)))
    print(f"parity: {n - len(bad)}/{n} cases identical")
    for b in bad[:40]:
        print("  MISMATCH", b)
    return not bad


def bench(fn, iters=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        st.record()
        fn()
        en.record()
        torch.cuda.synchronize()
        ts.append(st.elapsed_time(en) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def timings():
    M, K = 16384, 8192
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy = bench(lambda: y.copy_(x))
    bw = 2 * x.numel() * 2 / copy / 1e6
    print(f"copy {copy:.1f} us = {bw:.2f} TB/s")
    d = tex.Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), tex.DType.kFloat8E4M3,
                            rowwise=True, columnwise=False)
    dt = tex.Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), tex.DType.kFloat8E4M3)
    c = tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)
    g = torch.randn_like(x)
    xs = torch.randn(M, 2 * K, device="cuda", dtype=torch.bfloat16)
    cases = [
        ("gelu bf16", lambda: tex.gelu(x, None), 4),
        ("gelu fp8 delayed", lambda: tex.gelu(x, d), 3),
        ("gelu fp8 delayed +T", lambda: tex.gelu(x, dt), 4),
        ("gelu fp8 current", lambda: tex.gelu(x, c), 5),
        ("swiglu fp8 current", lambda: tex.swiglu(xs, c), 9),
        ("dgelu bf16", lambda: tex.dgelu(g, x, None), 6),
        ("dbias_dgelu fp8 delayed", lambda: tex.dbias_dgelu(g, x, d), 5),
        ("cast fp8 delayed +T", lambda: tex.quantize(x, dt), 4),
        ("relu bf16", lambda: tex.relu(x, None), 4),
    ]
    for name, fn, bpe in cases:
        t = bench(fn)
        floor = x.numel() * bpe / (bw * 1e6)
        print(f"{name:28s} {t:8.1f} us  floor {floor:7.1f}  {floor / t * 100:5.1f}% of floor")
    xsm = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(100):
        tex.gelu(xsm, c)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(1000):
        tex.gelu(xsm, c)
    torch.cuda.synchronize()
    print(f"small gelu fp8 current end-to-end {(time.perf_counter() - t0) * 1e3:.1f} us/call")


if __name__ == "__main__":
    ok = parity()
    timings()
    sys.exit(0 if ok else 1)
