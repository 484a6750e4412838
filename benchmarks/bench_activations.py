#!/usr/bin/env python3
"""Activation / cast benchmark for transformer_engine_torch (issues 2 and 3 acceptance, shared/ANCHORS.md targets).

One run on one GPU:
  1. measures device-to-device copy bandwidth (read + write bytes) on a 268 MB bf16 buffer;
  2. for every case (op x quantizer x size) VALIDATES our op against a pure-PyTorch reference of the same
     math, then times ours, PyTorch eager and torch.compile of that reference (triton do_bench median,
     L2 flushed between calls, randn inputs far larger than L2);
  3. prints one table (us, GB/s, % of copy bandwidth, ratio to the SPEC 5.3 byte floor, speed-up over
     torch.compile) and checks the ANCHORS.md targets (MET / NOT MET).

Exit status: 0 when every measured row validated (missed targets do not fail the run), 1 when any row
failed validation or could not be validated, 2 when the run could not start (no CUDA, no extension).

Run from the repository root after building in place:
    python benchmarks/bench_activations.py [--quick] [--only SUBSTR] [--csv PATH] [--json PATH]

The reference math (gelu_f32, make_reference, ...) is plain torch and importable without the extension or a
GPU; `transformer_engine_torch` is imported inside main().
"""

import argparse
import csv
import datetime
import gc
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

tex = None  # transformer_engine_torch, bound in main() so the reference math imports without the extension

E4M3_MAX = 448.0
FLT_MAX = 3.4028234663852886e38
FP8 = torch.float8_e4m3fn
DEVICE = "cuda"  # every tensor the benchmark makes lives here

# Tolerances from SPEC section 9 (pass if |got - ref| <= atol + rtol * |ref|).
TOL_PLAIN = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
TOL_E4M3 = (0.125, 0.0675)  # on dequantized values
TOL_E2M1 = (0.25, 0.125)  # NVFP4, on dequantized values (rtol; plus one unit of the block's scale, see compare_nv)
TOL_SCALE = 1e-5  # scale_inv / amax relative tolerance (ours computes act with its own exp: a few ulp apart)

BIG = (16384, 8192)  # 268 MB of bf16: far larger than the 50-60 MB L2 of H100/H200
SMALL = (256, 4096)  # launch-bound case; its target is end-to-end wall time


# ----------------------------------------------------------------------------------------------------------
# Reference math (pure torch, FP32 per element, SPEC 3.2 expression shapes and 5.1 rounding points)
# ----------------------------------------------------------------------------------------------------------
def gelu_f32(x):
    """tanh-approximation gelu in FP32: x * (0.5 + 0.5 * tanh(x * (0.79788456 + 0.03567741 * x^2)))."""
    x = x.float()
    return x * (0.5 + 0.5 * torch.tanh(x * (0.79788456 + 0.03567741 * (x * x))))


def dgelu_f32(grad, x):
    """grad * gelu'(x) in FP32 with SPEC's derivative form."""
    x = x.float()
    t = torch.tanh(0.79788456 * x * (1.0 + 0.044715 * (x * x)))
    d = 0.5 * x * (1.0 - t * t) * (0.79788456 + 0.1070322243 * (x * x)) + 0.5 * (1.0 + t)
    return grad.float() * d


def swiglu_f32(x):
    """Gated silu: x is [..., 2H]; silu(first half) * second half, FP32, output [..., H]."""
    h = x.shape[-1] // 2
    a = x[..., :h].float()
    b = x[..., h:].float()
    return a * torch.sigmoid(a) * b


def act_f32(op, inputs):
    """Unrounded FP32 value that `op` produces (before rounding / quantization). inputs: (x,) or (grad, x)."""
    if op == "gelu":
        return gelu_f32(inputs[0])
    if op == "swiglu":
        return swiglu_f32(inputs[0])
    if op in ("dgelu", "dbias_dgelu"):
        return dgelu_f32(inputs[0], inputs[1])
    if op == "quantize":
        return inputs[0].float()
    raise ValueError(f"unknown op {op!r}")


def fp8_delayed_ref(a, scale, amax, columnwise):
    """Delayed scaling, FULLY_FUSED: q = e4m3(fl(a * scale)) from the unrounded FP32 value `a`.

    `.to(float8_e4m3fn)` neither saturates nor canonicalises NaN, so clamp to +-448 first (SPEC 2).
    amax accumulates by max (returned as a new [1] tensor instead of updated in place).
    """
    q = (a * scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    out = {"q": q, "scale_inv": torch.reciprocal(scale), "amax": torch.maximum(amax, a.abs().amax())}
    if columnwise:
        # columnwise copy = bitwise transpose of the rowwise bytes, [K, M]
        out["qt"] = q.view(torch.uint8).reshape(-1, q.shape[-1]).t().contiguous()
    return out


def fp8_current_ref(a, in_dtype):
    """Current scaling (FUSED_ACTIVATION_AMAX_FP8): amax pass over the unrounded FP32 value, then
    q = e4m3(fl(rnd_in(a) * scale)) with scale = fl(448 / amax) (amax 0/Inf/NaN -> 1, Inf scale -> FLT_MAX)."""
    amax = a.abs().amax()
    ok = torch.isfinite(amax) & (amax > 0)
    scale = torch.where(ok, E4M3_MAX / amax, torch.ones_like(amax)).clamp(max=FLT_MAX)
    q = (a.to(in_dtype).float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return {"q": q, "scale_inv": torch.reciprocal(scale).reshape(1)}


def e8m0_round_up(v):
    """E8M0 code of non-negative finite FP32 values, rounding up (SPEC 2): E + (mantissa != 0); zero or
    subnormal -> 0 if v <= 2^-127 else 1; saturates at 254."""
    bits = v.float().contiguous().view(torch.int32)
    e, f = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    code = torch.where(e == 0, (f > 0x400000).to(torch.int32), e + (f != 0).to(torch.int32))
    return code.clamp(max=254)


def mx_multiplier(code):
    """2^(127 - code) as exact FP32 built from its bits (code 254 -> the subnormal 2^-127)."""
    bits = torch.where(code == 254, torch.full_like(code, 0x400000), (254 - code) << 23)
    return bits.view(torch.float32)


def mxfp8_blocks_ref(v):
    """1x32 blocks along the last dim of FP32 [R, K]: (E4M3 codes as float8, E8M0 scale codes uint8 [R, K/32])."""
    r, k = v.shape
    b = v.reshape(r, k // 32, 32)
    code = e8m0_round_up(b.abs().amax(-1) * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32))
    q = (b * mx_multiplier(code)[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q.reshape(r, k), code.to(torch.uint8)


def mxfp8_ref(a, in_dtype, columnwise):
    """MXFP8, FULLY_FUSED: the activation rounded to the input dtype, then per-block E8M0 round-up scales and
    E4M3 codes; the columnwise copy (same shape) from 32x1 blocks of the same values (M % 32 == 0 here)."""
    v = a.to(in_dtype).float().reshape(-1, a.shape[-1])
    out = {}
    out["mx_row"], out["mx_row_scale"] = mxfp8_blocks_ref(v)
    if columnwise:
        qt, st = mxfp8_blocks_ref(v.t().contiguous())
        out["mx_col"], out["mx_col_scale"] = qt.t(), st.t()
    return out


def fp8_block_1x128_ref(v):
    """1x128 blocks along the rows of FP32 [R, K] (K % 128 == 0), power-of-two scales (SPEC 4.7 defaults; no
    amax here is 0, Inf or tiny): (E4M3 codes as float8 [R, K], scale_inv [R, K/128])."""
    r, k = v.shape
    b = v.reshape(r, k // 128, 128)
    amax = b.abs().amax(-1)
    s = torch.where(amax > 0, torch.tensor(E4M3_MAX, dtype=torch.float32) / amax, torch.ones_like(amax))
    s = (s.view(torch.int32) & -8388608).view(torch.float32)  # clear the mantissa: round down to 2^n
    q = (b * s[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q.reshape(r, k), 1.0 / s


def fp8_block_ref(a, in_dtype, columnwise):
    """FP8 block 1x128 (UNFUSED: the value rounded to the input dtype, then quantized): rowwise blocks along K;
    the columnwise copy is x^T [K, M] with 1x128 blocks along its rows."""
    v = a.to(in_dtype).float().reshape(-1, a.shape[-1])
    out = {}
    out["fb_row"], out["fb_row_sinv"] = fp8_block_1x128_ref(v)
    if columnwise:
        out["fb_col"], out["fb_col_sinv"] = fp8_block_1x128_ref(v.t().contiguous())
    return out


E2M1_THRESHOLDS = ((5.0, 6, True), (3.5, 5, False), (2.5, 4, True), (1.75, 3, False), (1.25, 2, True),
                   (0.75, 1, False), (0.25, 0, True))  # |v| <= (or <) threshold -> code; ties go to the even code
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_codes(x):
    """FP32 -> E2M1 nibbles (uint8): round to nearest, ties to even, saturate at 6, sign in bit 3."""
    a = x.abs()
    c = torch.full_like(x, 7, dtype=torch.uint8)
    for thr, code, inclusive in E2M1_THRESHOLDS:
        c = torch.where(a <= thr if inclusive else a < thr, torch.full_like(c, code), c)
    return c | (torch.signbit(x).to(torch.uint8) << 3)


def nvfp4_global_scale(amax):
    """S_enc = min(fl(2688 / amax), FLT_MAX); 1 when amax is 0 (SPEC 4.6)."""
    s = (torch.tensor(6.0 * E4M3_MAX, dtype=torch.float32, device=amax.device) / amax).clamp(max=FLT_MAX)
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


def nvfp4_blocks_ref(v, amax):
    """1x16 blocks along the rows of FP32 [R, C] with global amax: (packed bytes [R, C/2] with the even element in
    the low nibble, E4M3 block scales as uint8 [R, C/16]). sf = e4m3(bamax * fl(S_enc * fl(1/6))), values encoded
    as v * fl(1 / fl(float(sf) * fl(1 / S_enc)))."""
    r, c = v.shape
    s_enc = nvfp4_global_scale(amax)
    inv6 = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(6.0, dtype=torch.float32)
    b = v.reshape(r, c // 16, 16)
    sf = (b.abs().amax(-1) * (s_enc * inv6.to(v.device))).to(FP8)
    enc = (1.0 / (sf.float() * (1.0 / s_enc))).clamp(max=FLT_MAX)
    codes = e2m1_codes(b * enc[..., None]).reshape(r, c)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), sf.view(torch.uint8)


def nvfp4_ref(a, in_dtype, columnwise):
    """NVFP4, FUSED_ACTIVATION_AMAX_NVFP4 without RHT: the global amax of the unrounded FP32 activation (both
    copies), the encoded values rounded to the input dtype; the columnwise copy is the transpose [K, M]."""
    amax = a.abs().amax()
    v = a.to(in_dtype).float().reshape(-1, a.shape[-1])
    out = {"nv_amax": amax.reshape(1)}
    out["nv_row"], out["nv_row_scale"] = nvfp4_blocks_ref(v, amax)
    if columnwise:
        out["nv_col"], out["nv_col_scale"] = nvfp4_blocks_ref(v.t().contiguous(), amax)
    return out


def make_reference(op, quant, columnwise, in_dtype):
    """The same math as our op, in plain torch. Arguments: the op's tensor inputs, then (scale, amax) for
    delayed scaling. Returns a dict with keys among dbias, y, q, qt, scale_inv, amax."""

    def reference(*tensors):
        if quant == "delayed":
            inputs, scale, amax = tensors[:-2], tensors[-2], tensors[-1]
        else:
            inputs = tensors
        a = act_f32(op, inputs)
        out = {}
        if op == "dbias_dgelu":
            # FP32 sum over all rows of the unrounded grad * gelu'(x), rounded once to the input dtype
            out["dbias"] = a.reshape(-1, a.shape[-1]).sum(0).to(in_dtype)
        if quant is None:
            out["y"] = a.to(in_dtype)
        elif quant == "delayed":
            out.update(fp8_delayed_ref(a, scale, amax, columnwise))
        elif quant == "current":
            out.update(fp8_current_ref(a, in_dtype))
        elif quant == "mxfp8":
            out.update(mxfp8_ref(a, in_dtype, columnwise))
        elif quant == "fp8block":
            out.update(fp8_block_ref(a, in_dtype, columnwise))
        elif quant == "nvfp4":
            out.update(nvfp4_ref(a, in_dtype, columnwise))
        else:
            raise ValueError(f"unknown quantizer kind {quant!r}")
        return out

    reference.__name__ = f"ref_{op}_{quant or 'plain'}{'_t' if columnwise else ''}"
    return reference


# ----------------------------------------------------------------------------------------------------------
# Cases. bytes_per_elt = SPEC 5.3 minimum bytes per OUTPUT element, bf16 input (gated ops read 2 per output).
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CaseSpec:
    op: str  # gelu | swiglu | dgelu | dbias_dgelu | quantize
    quant: object  # None | "delayed" | "current" | "mxfp8" | "fp8block" | "nvfp4"
    columnwise: bool  # also write the columnwise FP8 copy (transposed for FP8 per-tensor, same shape for MXFP8)
    bytes_per_elt: float


CASE_SPECS = [
    CaseSpec("gelu", None, False, 4),  # 2 read x + 2 write y
    CaseSpec("gelu", "delayed", False, 3),  # 2 read x + 1 write q
    CaseSpec("gelu", "delayed", True, 4),  # 2 read x + 1 write q + 1 write q^T
    CaseSpec("gelu", "current", False, 5),  # 2 read x (amax pass) + 2 read x (recompute) + 1 write q
    CaseSpec("swiglu", None, False, 6),  # 4 read [a|b] + 2 write y
    CaseSpec("swiglu", "delayed", False, 5),  # 4 read [a|b] + 1 write q
    CaseSpec("swiglu", "current", False, 9),  # 4 read (amax pass) + 4 read (recompute) + 1 write q
    CaseSpec("dgelu", None, False, 6),  # 2 read grad + 2 read x + 2 write dx
    CaseSpec("dgelu", "delayed", False, 5),  # 2 + 2 read + 1 write q
    CaseSpec("dgelu", "current", False, 9),  # (2 + 2) amax pass + (2 + 2) recompute + 1 write q
    CaseSpec("dbias_dgelu", None, False, 6),  # 2 + 2 read + 2 write dx (+ dbias partials, negligible)
    CaseSpec("dbias_dgelu", "delayed", False, 5),  # 2 + 2 read + 1 write q (+ dbias partials)
    CaseSpec("dbias_dgelu", "current", False, 9),  # (2 + 2) amax pass + (2 + 2) + 1 write q (+ dbias)
    # tex.quantize with no quantizer does not exist: no plain row
    CaseSpec("quantize", "delayed", False, 3),  # 2 read x + 1 write q
    CaseSpec("quantize", "delayed", True, 4),  # 2 read x + 1 write q + 1 write q^T
    CaseSpec("quantize", "current", False, 5),  # 2 read x (amax) + 2 read x (cast) + 1 write q
    # MXFP8 (FULLY_FUSED): one pass; E8M0 scales are 1 byte per 32 elements per copy
    CaseSpec("gelu", "mxfp8", False, 2 + 1 + 1 / 32),  # 2 read x + 1 write q + 1/32 scale
    CaseSpec("gelu", "mxfp8", True, 2 + 2 + 2 / 32),  # 2 read x + 1 + 1 write (both copies) + 2/32 scales
    CaseSpec("swiglu", "mxfp8", False, 4 + 1 + 1 / 32),  # 4 read [a|b] + 1 write q + 1/32 scale
    # FP8 block 1x128 with the columnwise (transposed) copy: one pass; float32 scales, 4 bytes per 128 per copy
    CaseSpec("quantize", "fp8block", True, 2 + 2 + 8 / 128),  # 2 read x + 1 + 1 write (both copies) + scales
    # NVFP4 (FUSED_ACTIVATION_AMAX_NVFP4): amax pass, then recompute + cast; 1/2 byte per element per copy, one
    # E4M3 scale per 16 elements per copy
    CaseSpec("gelu", "nvfp4", False, 2 + 2 + 1 / 2 + 1 / 16),  # two reads of x + packed codes + scales
    CaseSpec("gelu", "nvfp4", True, 2 + 2 + 1 + 2 / 16),  # both copies (columnwise transposed)
]


def quant_label(spec):
    if spec.quant is None:
        return "bf16"
    if spec.quant == "mxfp8":
        return "mxfp8" + ("+col" if spec.columnwise else "")
    if spec.quant == "fp8block":
        return "fp8-block 1x128" + (" (+T)" if spec.columnwise else "")
    if spec.quant == "nvfp4":
        return "nvfp4" + ("+T" if spec.columnwise else "")
    return f"fp8-{spec.quant}" + ("+T" if spec.columnwise else "")


def case_name(spec, size):
    m, k = size
    in_k = 2 * k if spec.op == "swiglu" else k  # swiglu: x is [M, 2H], output [M, H] = size
    return f"{spec.op} {quant_label(spec)} {m}x{in_k}"


def input_shapes(spec, size):
    m, k = size
    if spec.op == "swiglu":
        return [(m, 2 * k)]
    if spec.op in ("dgelu", "dbias_dgelu"):
        return [(m, k), (m, k)]  # grad, x
    return [(m, k)]


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------
class Timer:
    """Median GPU time per call in microseconds: triton.testing.do_bench, or CUDA events as a fallback.
    Both flush L2 between calls (outside the timed region)."""

    def __init__(self, quick):
        self.warmup_ms, self.rep_ms = (5, 20) if quick else (25, 100)
        self.e2e_iters = 200 if quick else 2000
        self._do_bench = None
        self._flush = None
        try:
            from triton.testing import do_bench

            self._do_bench = do_bench
            self.method = f"triton.testing.do_bench(warmup={self.warmup_ms}, rep={self.rep_ms}, median)"
        except Exception:  # triton missing or broken
            self.method = f"CUDA events (warmup {self.warmup_ms} ms, rep {self.rep_ms} ms, median, L2 flush)"

    def gpu_us(self, fn):
        if self._do_bench is not None:
            return 1000.0 * float(self._do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))
        return self._events_us(fn)

    def _events_us(self, fn):
        if self._flush is None:
            self._flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=DEVICE)
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            self._flush.zero_()
            fn()
        e.record()
        torch.cuda.synchronize()
        est_ms = max(s.elapsed_time(e) / 5, 1e-3)
        for _ in range(max(1, int(self.warmup_ms / est_ms))):
            fn()
        n = max(1, int(self.rep_ms / est_ms))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            self._flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return 1000.0 * statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))

    def e2e_us(self, fn):
        """End-to-end wall time per call: host loop of N calls, then synchronize, / N (median of 3 loops)."""
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        per_call = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(self.e2e_iters):
                fn()
            torch.cuda.synchronize()
            per_call.append((time.perf_counter() - t0) / self.e2e_iters)
        return 1e6 * statistics.median(per_call)


def measure_copy_bandwidth(timer):
    """Device-to-device copy of a 16384x8192 bf16 buffer (268 MB); bytes = read + write."""
    src = torch.randn(BIG, device=DEVICE, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = timer.gpu_us(lambda: dst.copy_(src))
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    return {"bytes": nbytes, "us": us, "gbs": nbytes / us / 1e3}


# ----------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------
class ValidationError(Exception):
    pass


def check_close(what, got, ref, rtol, atol):
    """Raise ValidationError naming the first bad element unless |got - ref| <= atol + rtol * |ref| everywhere
    (NaN in `got` fails)."""
    if tuple(got.shape) != tuple(ref.shape):
        raise ValidationError(f"{what}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
    g, r = got.float(), ref.float()
    ok = (g - r).abs() <= atol + rtol * r.abs()
    n_bad = int((~ok).sum().item())
    if n_bad:
        flat = (~ok).reshape(-1).nonzero()[0, 0].item()
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(g.shape)))
        gv, rv = g.reshape(-1)[flat].item(), r.reshape(-1)[flat].item()
        raise ValidationError(
            f"{what}: {n_bad} of {g.numel()} elements outside rtol={rtol} atol={atol}; "
            f"first at {idx}: got {gv!r}, reference {rv!r}"
        )


def dequant(q, scale_inv):
    return q.float() * scale_inv.float().reshape(())


def mx_dequant(q, code, along_rows):
    """E4M3 codes [M, K] times 2^(code - 127) of their 1x32 (rowwise) or 32x1 (columnwise) block."""
    f = torch.exp2(code.float() - 127.0)
    f = f.repeat_interleave(32, dim=0 if along_rows else 1)
    return q.view(FP8).float() * f


def compare_mx(got, ref, info):
    """MXFP8 pieces: dequantized values within the E4M3 tolerance (ours evaluates the activation with its own
    FP32 math, so a rounded bf16 value, and rarely a block scale, can differ from torch's)."""
    for side, along_rows, label in (("row", False, "rowwise"), ("col", True, "columnwise")):
        if f"mx_{side}" not in ref:
            continue
        q, code = got[f"mx_{side}"], got[f"mx_{side}_scale"]
        if q is None:
            raise ValidationError(f"no {label} MXFP8 copy although it was requested")
        m, k = ref[f"mx_{side}"].shape
        code = code[: m // 32, :k] if along_rows else code[:m, : k // 32]
        check_close(f"dequantized {label} MXFP8", mx_dequant(q.reshape(m, k), code, along_rows),
                    mx_dequant(ref[f"mx_{side}"].view(torch.uint8), ref[f"mx_{side}_scale"], along_rows), *TOL_E4M3)
        same = (q.reshape(m, k).view(torch.uint8) == ref[f"mx_{side}"].view(torch.uint8)).float().mean().item()
        info.append(f"{label} MXFP8 bytes equal to reference: {100 * same:.3f} %")


def compare_fb(got, ref, info):
    """FP8 block pieces: a plain cast has no activation math, so codes and scales must equal the reference's."""
    for side, label in (("row", "rowwise"), ("col", "columnwise (transposed)")):
        if f"fb_{side}" not in ref:
            continue
        q, sinv = got.get(f"fb_{side}"), got.get(f"fb_{side}_sinv")
        if q is None:
            raise ValidationError(f"no {label} FP8 block copy although it was requested")
        rq, rs = ref[f"fb_{side}"].view(torch.uint8), ref[f"fb_{side}_sinv"]
        r, nb = rs.shape
        if tuple(q.shape) != tuple(rq.shape):
            raise ValidationError(f"{label} FP8 block data shape {tuple(q.shape)}, expected {tuple(rq.shape)}")
        # the op stores [K/128, roundup(M, 4)] (M contiguous); a compiled reference has the reference's own layout
        ours_sinv = sinv if tuple(sinv.shape) == tuple(rs.shape) else sinv[:nb, :r].t()
        if not torch.equal(ours_sinv, rs):
            raise ValidationError(f"{label} FP8 block scale_inv differs from the reference")
        n_bad = int((q.view(torch.uint8) != rq).sum().item())
        if n_bad:
            raise ValidationError(f"{label} FP8 block data: {n_bad} of {q.numel()} bytes differ from the reference")
        info.append(f"{label} FP8 block bytes and scales equal to reference")


def nv_dequant(packed, sf, amax):
    """(E2M1 value * u, u) per element of one copy [R, C/2], u = float(sf) / S_enc the block's unit (scales cut
    to [R, C/16])."""
    r, half = packed.shape
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=packed.device)
    vals = lut[torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(r, 2 * half).long()]
    unit = (sf[:r, : 2 * half // 16].view(FP8).float() / nvfp4_global_scale(amax.reshape(()))).repeat_interleave(16, 1)
    return vals * unit, unit


def compare_nv(got, ref, info):
    """NVFP4 pieces: the global amax within TOL_SCALE, dequantized values within the SPEC 9 E2M1 tolerance (ours
    evaluates the activation with its own FP32 math, so a rounded bf16 value can differ from torch's)."""
    if "nv_amax" not in ref:
        return
    check_close("NVFP4 global amax", got["nv_amax"].reshape(1), ref["nv_amax"].reshape(1), TOL_SCALE, 0.0)
    for side, label in (("row", "rowwise"), ("col", "columnwise (transposed)")):
        if f"nv_{side}" not in ref:
            continue
        q, sf = got.get(f"nv_{side}"), got.get(f"nv_{side}_scale")
        if q is None:
            raise ValidationError(f"no {label} NVFP4 copy although it was requested")
        rq = ref[f"nv_{side}"]
        if tuple(q.shape) != tuple(rq.shape):
            raise ValidationError(f"{label} NVFP4 data shape {tuple(q.shape)}, expected {tuple(rq.shape)}")
        got_v, _ = nv_dequant(q, sf, got["nv_amax"])
        ref_v, unit = nv_dequant(rq, ref[f"nv_{side}_scale"], ref["nv_amax"])
        # ours evaluates the op with its own FP32 math: a value one bf16 ulp away may round to the neighbouring
        # E2M1 point (at most 2 units of the block apart, 1 below |v| = 4 units)
        bad = (got_v - ref_v).abs() > TOL_E2M1[0] * ref_v.abs() + unit
        if int(bad.sum().item()):
            i = bad.reshape(-1).nonzero()[0, 0].item()
            raise ValidationError(f"dequantized {label} NVFP4: {int(bad.sum().item())} elements beyond one E2M1 step "
                                  f"+ rtol {TOL_E2M1[0]}; first flat index {i}: got {got_v.reshape(-1)[i].item()}, "
                                  f"reference {ref_v.reshape(-1)[i].item()}")
        same = (q == rq).float().mean().item()
        info.append(f"{label} NVFP4 bytes equal to reference: {100 * same:.3f} %")


def compare_outputs(got, ref, in_dtype, rows):
    """Compare output dicts (keys among dbias, y, q, qt, scale_inv, amax). Returns an info string;
    raises ValidationError on the first mismatch."""
    info = []
    if "dbias" in ref:
        rtol, atol = TOL_PLAIN[in_dtype]
        # SPEC 9: dbias at dtype tolerance with rtol x4 for 16-bit; atol grows with the rows summed (order is free)
        check_close("grad_bias", got["dbias"], ref["dbias"], 4 * rtol, 1e-4 * math.sqrt(rows))
    if "y" in ref:
        if got["y"].dtype != ref["y"].dtype:
            raise ValidationError(f"output dtype {got['y'].dtype}, expected {ref['y'].dtype}")
        check_close("output", got["y"], ref["y"], *TOL_PLAIN[in_dtype])
    if "q" in ref:
        check_close("scale_inv", got["scale_inv"].reshape(1), ref["scale_inv"].reshape(1), TOL_SCALE, 0.0)
        check_close(
            "dequantized rowwise FP8", dequant(got["q"], got["scale_inv"]), dequant(ref["q"], ref["scale_inv"]), *TOL_E4M3
        )
        same = (got["q"].view(torch.uint8) == ref["q"].view(torch.uint8)).float().mean().item()
        info.append(f"FP8 bytes equal to reference: {100 * same:.3f} %")
    compare_mx(got, ref, info)
    compare_fb(got, ref, info)
    compare_nv(got, ref, info)
    if "qt" in ref:
        q2d = got["q"].view(torch.uint8).reshape(-1, got["q"].shape[-1])
        if tuple(got["qt"].shape) != tuple(q2d.t().shape):
            raise ValidationError(f"transposed copy shape {tuple(got['qt'].shape)}, expected {tuple(q2d.t().shape)}")
        if not torch.equal(got["qt"].view(torch.uint8), q2d.t()):
            n_bad = int((got["qt"].view(torch.uint8) != q2d.t()).sum().item())
            raise ValidationError(f"transposed copy: {n_bad} bytes differ from the transpose of the rowwise bytes")
    if "amax" in ref:
        check_close("amax (from 0 after one call)", got["amax"].reshape(1), ref["amax"].reshape(1), TOL_SCALE, 0.0)
    return "; ".join(info)


def ours_outputs(spec, result, amax_buf):
    """Turn what tex returned into the reference's dict layout."""
    out = {}
    if spec.op == "dbias_dgelu":
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise ValidationError(f"dbias_dgelu returned {type(result).__name__}, expected (grad_bias, grad_input)")
        out["dbias"], result = result
    if spec.quant is None:
        if not isinstance(result, torch.Tensor):
            raise ValidationError(f"expected a plain tensor with quantizer=None, got {type(result).__name__}")
        out["y"] = result
        return out
    if spec.quant == "mxfp8":
        out["mx_row"], out["mx_row_scale"] = result._rowwise_data, result._rowwise_scale_inv
        if spec.columnwise:
            out["mx_col"], out["mx_col_scale"] = result._columnwise_data, result._columnwise_scale_inv
        return out
    if spec.quant == "nvfp4":
        out["nv_row"], out["nv_row_scale"] = result._rowwise_data, result._rowwise_scale_inv
        out["nv_amax"] = result._amax_rowwise
        if spec.columnwise:
            out["nv_col"], out["nv_col_scale"] = result._columnwise_data, result._columnwise_scale_inv
        return out
    if spec.quant == "fp8block":
        out["fb_row"], out["fb_row_sinv"] = result._rowwise_data, result._rowwise_scale_inv
        if spec.columnwise:
            out["fb_col"], out["fb_col_sinv"] = result._columnwise_data, result._columnwise_scale_inv
        return out
    data = getattr(result, "_data", None)
    if data is None:
        raise ValidationError(f"{type(result).__name__} has no rowwise _data although rowwise=True")
    out["q"] = data.view(FP8) if data.dtype == torch.uint8 else data
    out["scale_inv"] = result._scale_inv
    if spec.columnwise:
        qt = getattr(result, "_transpose", None)
        if qt is None:
            raise ValidationError("no _transpose although columnwise=True")
        out["qt"] = qt
    if spec.quant == "delayed":
        out["amax"] = amax_buf
    return out


def poison_allocator(nbytes_list):
    """Fill soon-to-be-reused allocator blocks with 0xFF (NaN in bf16 and E4M3) so unwritten outputs show."""
    blocks = [torch.full((max(n, 1),), 0xFF, dtype=torch.uint8, device=DEVICE) for n in nbytes_list]
    torch.cuda.synchronize()
    del blocks


# ----------------------------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------------------------
def make_quantizer(spec, scale, amax):
    if spec.quant is None:
        return None
    if spec.quant == "delayed":
        return tex.Float8Quantizer(scale, amax, tex.DType.kFloat8E4M3, rowwise=True, columnwise=spec.columnwise)
    if spec.quant == "mxfp8":
        return tex.MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=spec.columnwise)
    if spec.quant == "nvfp4":
        return tex.NVFP4Quantizer(rowwise=True, columnwise=spec.columnwise)
    if spec.quant == "fp8block":
        return tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=spec.columnwise,
                                        block_scaling_dim=1)
    return tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=spec.columnwise)


def make_ours(spec, quantizer):
    fn = {"gelu": tex.gelu, "swiglu": tex.swiglu, "dgelu": tex.dgelu, "dbias_dgelu": tex.dbias_dgelu}.get(spec.op)
    if spec.op == "quantize":
        return lambda *t: tex.quantize(t[0], quantizer)
    return lambda *t: fn(*t, quantizer)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def blank_row(spec, size, copy_gbs):
    m, k = size
    nbytes = spec.bytes_per_elt * m * k  # per output element; output is [M, K_out]
    return {
        "case": case_name(spec, size), "op": spec.op, "quantizer": spec.quant or "none",
        "columnwise": spec.columnwise, "M": m, "K_out": k, "bytes_per_elt": spec.bytes_per_elt, "bytes": nbytes,
        "ours_us": None, "eager_us": None, "compile_us": None, "floor_us": nbytes / (copy_gbs * 1e3),
        "ours_gbs": None, "pct_copy_bw": None, "ours_over_floor": None, "speedup_vs_compile": None,
        "ours_e2e_us": None, "eager_e2e_us": None, "compile_e2e_us": None, "relu_e2e_us": None, "valid": False,
        "note": "",
    }


def run_case(spec, size, timer, copy_gbs, args, seed):
    name = case_name(spec, size)
    m, k = size
    n_out = m * k
    row = blank_row(spec, size, copy_gbs)
    dtype = torch.bfloat16
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    inputs = [torch.randn(s, device=DEVICE, dtype=dtype, generator=gen) for s in input_shapes(spec, size)]

    extra, amax_buf, scale = [], None, None
    if spec.quant == "delayed":
        # a realistic delayed scale: the activation's amax lands at half the E4M3 range
        act_amax = act_f32(spec.op, inputs).abs().amax().float()
        scale = (0.5 * E4M3_MAX / act_amax).reshape(1).contiguous()
        amax_buf = torch.zeros(1, device=DEVICE, dtype=torch.float32)
        extra = [scale, torch.zeros(1, device=DEVICE, dtype=torch.float32)]  # reference's own amax history
    ref_fn = make_reference(spec.op, spec.quant, spec.columnwise, dtype)
    ref_args = inputs + extra

    # ---- validate first -------------------------------------------------------------------------------
    try:
        ref = ref_fn(*ref_args)
    except Exception as e:  # a reference that cannot run means the row cannot be validated
        row["note"] = f"reference failed: {type(e).__name__}: {e}"
        log(f"FAIL  {name}: {row['note']}")
        return row
    try:
        quantizer = make_quantizer(spec, scale, amax_buf)
        ours = make_ours(spec, quantizer)
        out_bytes = [n_out * (2 if spec.quant is None else 1)] + ([n_out] if spec.columnwise else [])
        poison_allocator(out_bytes + ([2 * k] if spec.op == "dbias_dgelu" else []))
        got = ours_outputs(spec, ours(*inputs), amax_buf)
        torch.cuda.synchronize()
        info = compare_outputs(got, ref, dtype, m)
    except ValidationError as e:
        row["note"] = f"validation: {e}"
        log(f"FAIL  {name}: {row['note']}")
        return row
    except Exception as e:
        row["note"] = f"ours raised {type(e).__name__}: {e}"
        log(f"FAIL  {name}: {row['note']}")
        return row
    row["valid"] = True
    del got
    log(f"ok    {name}" + (f"  ({info})" if info else ""))

    # ---- time -------------------------------------------------------------------------------------------
    small = size == SMALL
    row["ours_us"] = timer.gpu_us(lambda: ours(*inputs))
    row["eager_us"] = timer.gpu_us(lambda: ref_fn(*ref_args))
    if small:
        row["ours_e2e_us"] = timer.e2e_us(lambda: ours(*inputs))
        row["eager_e2e_us"] = timer.e2e_us(lambda: ref_fn(*ref_args))
        # The host's pace at this point of the run: one torch op, one launch, the same loop. On the GPU machines it
        # ranged 7-11 us between runs (torch.compile's worker processes, started by an earlier case, slow it too).
        row["relu_e2e_us"] = timer.e2e_us(lambda: torch.relu(inputs[0]))
    if not args.no_compile:
        try:
            torch._dynamo.reset()  # fresh cache per case: no recompile-limit fallbacks, no dynamic shapes
            compiled = torch.compile(ref_fn, fullgraph=True, dynamic=False, mode=args.compile_mode)
            t0 = time.perf_counter()
            cref = compiled(*ref_args)  # compile + warm-up, outside any timing
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            try:
                compare_outputs(cref, ref, dtype, m)
            except ValidationError as e:
                row["note"] = f"torch.compile reference differs from eager ({e}); timed anyway"
                log(f"warn  {name}: {row['note']}")
            del cref
            row["compile_us"] = timer.gpu_us(lambda: compiled(*ref_args))
            if small:
                row["compile_e2e_us"] = timer.e2e_us(lambda: compiled(*ref_args))
            log(f"      compiled reference in {compile_s:.1f} s")
        except Exception as e:
            row["note"] = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log(f"warn  {name}: {row['note']}")

    t = row["ours_us"]
    row["ours_gbs"] = row["bytes"] / (t * 1e3)
    row["pct_copy_bw"] = 100.0 * row["ours_gbs"] / copy_gbs
    row["ours_over_floor"] = t / row["floor_us"]
    if row["compile_us"]:
        row["speedup_vs_compile"] = row["compile_us"] / t
    return row


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------
COLUMNS = [  # (header, key, format)
    ("case", "case", "{}"),
    ("B/elt", "bytes_per_elt", "{:g}"),
    ("ours us", "ours_us", "{:.1f}"),
    ("eager us", "eager_us", "{:.1f}"),
    ("compile us", "compile_us", "{:.1f}"),
    ("floor us", "floor_us", "{:.1f}"),
    ("ours GB/s", "ours_gbs", "{:.0f}"),
    ("% of copy BW", "pct_copy_bw", "{:.1f}"),
    ("ours/floor", "ours_over_floor", "{:.2f}"),
    ("speedup vs compile", "speedup_vs_compile", "{:.2f}"),
    ("ours e2e us", "ours_e2e_us", "{:.1f}"),
]


def fmt(v, f):
    return "-" if v is None else f.format(v)


def print_table(rows):
    cells = [[h for h, _, _ in COLUMNS]]
    for r in rows:
        if r["valid"]:
            cells.append([fmt(r[k], f) for _, k, f in COLUMNS])
        else:
            cells.append([r["case"], fmt(r["bytes_per_elt"], "{:g}"), "INVALID"] + [""] * (len(COLUMNS) - 3))
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]

    def line(c):  # a Markdown table, so the block can be quoted as is
        return "| " + " | ".join(s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(c, widths))) + " |"

    print(line(cells[0]))
    print("|" + "|".join(":" + "-" * (w + 1) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|")
    for c in cells[1:]:
        print(line(c))


def find(rows, op, quant, columnwise, size):
    name = case_name(CaseSpec(op, quant, columnwise, 0), size)
    for r in rows:
        if r["case"] == name and r["valid"]:
            return r
    return None


def evaluate_targets(rows):
    """ANCHORS.md targets. Each: name, status (MET / NOT MET / NOT MEASURED), measured, required."""
    out = []

    def pct_target(label, row, need):
        if row is None:
            return out.append({"target": label, "status": "NOT MEASURED", "measured": None, "required": f">= {need} % of copy BW"})
        v = row["pct_copy_bw"]
        out.append({"target": label, "status": "MET" if v >= need else "NOT MET", "measured": f"{v:.1f} %",
                    "required": f">= {need} % of copy BW"})

    def floor_target(label, row, need):
        if row is None:
            return out.append({"target": label, "status": "NOT MEASURED", "measured": None, "required": f"<= {need}x floor"})
        v = row["ours_over_floor"]
        out.append({"target": label, "status": "MET" if v <= need else "NOT MET", "measured": f"{v:.2f}x floor",
                    "required": f"<= {need}x floor"})

    pct_target("gelu -> FP8 delayed (16384x8192)", find(rows, "gelu", "delayed", False, BIG), 92)
    floor_target("gelu -> FP8 current (16384x8192)", find(rows, "gelu", "current", False, BIG), 1.15)
    floor_target("swiglu -> FP8 current (x 16384x16384)", find(rows, "swiglu", "current", False, BIG), 1.15)
    floor_target("dbias_dgelu -> FP8 delayed (16384x8192)", find(rows, "dbias_dgelu", "delayed", False, BIG), 1.15)
    pct_target("FP8 cast rowwise + transposed (16384x8192)", find(rows, "quantize", "delayed", True, BIG), 80)
    pct_target("gelu -> MXFP8 rowwise (16384x8192)", find(rows, "gelu", "mxfp8", False, BIG), 85)
    pct_target("gelu -> MXFP8 rowwise + columnwise (16384x8192)", find(rows, "gelu", "mxfp8", True, BIG), 75)
    pct_target("swiglu -> MXFP8 rowwise (x 16384x16384)", find(rows, "swiglu", "mxfp8", False, BIG), 85)
    floor_target("gelu -> NVFP4 rowwise (16384x8192)", find(rows, "gelu", "nvfp4", False, BIG), 1.2)
    floor_target("gelu -> NVFP4 rowwise + columnwise (16384x8192)", find(rows, "gelu", "nvfp4", True, BIG), 1.2)
    pct_target("gelu bf16 -> bf16 (16384x8192)", find(rows, "gelu", None, False, BIG), 90)
    pct_target("dgelu bf16 (16384x8192)", find(rows, "dgelu", None, False, BIG), 90)

    small = find(rows, "gelu", "current", False, SMALL)
    label = "gelu -> FP8 current 256x4096 end to end"
    if small is None:
        out.append({"target": label, "status": "NOT MEASURED", "measured": None, "required": "<= 12 us"})
    else:
        v = small["ours_e2e_us"]
        extra = f" (GPU median {small['ours_us']:.1f} us, torch.relu e2e {small['relu_e2e_us']:.1f} us at that point"
        extra += f", torch.compile e2e {small['compile_e2e_us']:.1f} us)" if small["compile_e2e_us"] else ")"
        out.append({"target": label, "status": "MET" if v <= 12 else "NOT MET", "measured": f"{v:.1f} us" + extra,
                    "required": "<= 12 us"})

    timed = [r for r in rows if r["valid"] and r["compile_us"] is not None]
    block = [r for r in timed if r["quantizer"] in ("mxfp8", "nvfp4", "fp8block") and r["M"] == BIG[0]]
    label = "block formats >= 1.5x faster than torch.compile (16384 rows)"
    if not block:
        out.append({"target": label, "status": "NOT MEASURED", "measured": None, "required": ">= 1.5x"})
    else:
        short = [r for r in block if r["speedup_vs_compile"] < 1.5]
        measured = f"{len(block) - len(short)}/{len(block)} cases"
        if short:
            measured += "; short: " + ", ".join(f"{r['case']} ({r['speedup_vs_compile']:.2f}x)" for r in short)
        out.append({"target": label, "status": "NOT MET" if short else "MET", "measured": measured,
                    "required": ">= 1.5x on every block-format case"})
    slower = [r for r in timed if r["ours_us"] > r["compile_us"]]
    label = "no case slower than torch.compile"
    if not timed:
        out.append({"target": label, "status": "NOT MEASURED", "measured": None, "required": "ours <= compile"})
    else:
        measured = f"{len(timed) - len(slower)}/{len(timed)} cases at least as fast"
        if slower:
            measured += "; slower: " + ", ".join(f"{r['case']} ({r['speedup_vs_compile']:.2f}x)" for r in slower)
        out.append({"target": label, "status": "NOT MET" if slower else "MET", "measured": measured,
                    "required": "ours <= compile on every case"})
    return out


def print_targets(targets):
    print("\nTargets (shared/ANCHORS.md):")
    w = max(len(t["target"]) for t in targets)
    for t in targets:
        print(f"  {t['status']:<12} {t['target']:<{w}}  measured {t['measured'] or '-'}  (required {t['required']})")


def save_csv(path, rows):
    keys = list(rows[0].keys()) if rows else [k for _, k, _ in COLUMNS]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def save_json(path, meta, rows, targets):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows, "targets": targets}, f, indent=2)


# ----------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repetitions (do_bench warmup 5 ms, rep 20 ms; 200 e2e calls)")
    p.add_argument("--only", action="append", default=[], metavar="SUBSTR",
                   help="run only cases whose name contains SUBSTR (case-insensitive; repeatable, OR). "
                        "Names look like 'gelu fp8-delayed+T 16384x8192'; see --list")
    p.add_argument("--csv", metavar="PATH", help="write the table (all columns, raw numbers) as CSV")
    p.add_argument("--json", metavar="PATH", help="write meta, table rows and target checks as JSON")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile timings (faster)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument("--list", action="store_true", help="list case names and exit")
    return p.parse_args(argv)


def selected_cases(only):
    cases = [(s, size) for size in (BIG, SMALL) for s in CASE_SPECS]
    if only:
        subs = [o.lower() for o in only]
        cases = [(s, z) for s, z in cases if any(o in case_name(s, z).lower() for o in subs)]
    return cases


def main(argv=None):
    global tex
    args = parse_args(argv)
    t_start = time.perf_counter()
    cases = selected_cases(args.only)
    if args.list:
        for s, z in cases:
            print(f"{case_name(s, z):<36} {s.bytes_per_elt:g} B/elt")
        return 0
    if not cases:
        print(f"no case matches --only {args.only}; use --list", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("CUDA is not available: this benchmark needs a GPU", file=sys.stderr)
        return 2
    try:
        import transformer_engine_torch as _tex
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root (in-place build)
        try:
            import transformer_engine_torch as _tex
        except ImportError as e:
            print(f"cannot import transformer_engine_torch ({e}); build it first "
                  "(python setup.py build_ext --inplace) and run from the repository root", file=sys.stderr)
            return 2
    tex = _tex

    torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(args.quick)
    props = torch.cuda.get_device_properties(0)
    l2_mb = getattr(props, "L2_cache_size", 0) / 2**20
    log(f"device {props.name} (L2 {l2_mb:.0f} MB), torch {torch.__version__}, timing: {timer.method}")

    copy = measure_copy_bandwidth(timer)
    log(f"D2D copy {copy['bytes'] / 1e6:.0f} MB (read + write): {copy['us']:.1f} us = {copy['gbs']:.0f} GB/s")

    rows = []
    for i, (spec, size) in enumerate(cases):
        try:
            rows.append(run_case(spec, size, timer, copy["gbs"], args, seed=1000 + i))
        except torch.cuda.OutOfMemoryError as e:
            log(f"FAIL  {case_name(spec, size)}: out of memory ({e})")
            row = blank_row(spec, size, copy["gbs"])
            row["note"] = f"out of memory: {e}"
            rows.append(row)
        gc.collect()
        torch.cuda.empty_cache()

    print()
    print(f"{props.name}; copy bandwidth {copy['gbs']:.0f} GB/s measured in this run; "
          f"floor = SPEC 5.3 minimum bytes / copy bandwidth; speedup vs compile = compile us / ours us; "
          f"e2e = host loop of {timer.e2e_iters} calls then synchronize, per call (256x4096 rows only)")
    print_table(rows)
    targets = evaluate_targets(rows)
    print_targets(targets)

    failed = [r for r in rows if not r["valid"]]
    if failed:
        print(f"\nVALIDATION FAILED for {len(failed)} of {len(rows)} cases:")
        for r in failed:
            print(f"  {r['case']}: {r['note']}")
    notes = [r for r in rows if r["valid"] and r.get("note")]
    for r in notes:
        print(f"note: {r['case']}: {r['note']}")
    n_met = sum(t["status"] == "MET" for t in targets)
    print(f"\nSummary: {len(rows) - len(failed)}/{len(rows)} cases validated; targets met {n_met}/{len(targets)}; "
          f"run took {time.perf_counter() - t_start:.0f} s")

    meta = {
        "device": props.name, "torch": torch.__version__, "timing": timer.method,
        "copy_bytes": copy["bytes"], "copy_us": copy["us"], "copy_gbs": copy["gbs"],
        "quick": args.quick, "only": args.only, "compile_mode": args.compile_mode,
        "e2e_iters": timer.e2e_iters, "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    if args.csv:
        save_csv(args.csv, rows)
        log(f"wrote {args.csv}")
    if args.json:
        save_json(args.json, meta, rows, targets)
        log(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
