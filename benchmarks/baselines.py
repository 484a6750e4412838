"""Torch baselines of the benchmarks (issue 24 item 4): the plain-PyTorch math each benchmark validates against
and times as "eager" and "torch.compile", and the torch peers of our GEMMs.

Activations (bench_activations.py): `make_reference(op, quant, columnwise, in_dtype)` returns the same math as our
fused op in plain torch ops (FP32 per element, SPEC 3.2 expression shapes, 5.1 rounding points), as a dict of
outputs; `ours_outputs` turns what tex returned into that dict's layout and `compare_outputs` checks one against
the other within SPEC 9's tolerances. tests/torch/test_bench_baselines.py checks these baselines against the float64
references of tests/ref/ and against tex's CPU kernels.
GEMM (bench_gemm.py): `scaled_mm_tensorwise` and `scaled_mm_blockwise` call torch._scaled_mm on the bytes and
scales of our quantized tensors. MLP (bench_mlp.py): `TorchMLP`, nn.Linear + activation.

Plain torch only: importable without the extension or a GPU.
"""

import math

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0
FLT_MAX = 3.4028234663852886e38
FP8 = torch.float8_e4m3fn

# Tolerances from SPEC section 9 (pass if |got - ref| <= atol + rtol * |ref|).
TOL_PLAIN = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
TOL_E4M3 = (0.125, 0.0675)  # on dequantized values
TOL_E2M1 = (0.25, 0.125)  # NVFP4, on dequantized values (rtol; plus one unit of the block's scale, see compare_nv)
TOL_SCALE = 1e-5  # scale_inv / amax relative tolerance (ours computes act with its own exp: a few ulp apart)


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


def fp8_current_ref(a, in_dtype, columnwise=False):
    """Current scaling (FUSED_ACTIVATION_AMAX_FP8): amax pass over the unrounded FP32 value, then
    q = e4m3(fl(rnd_in(a) * scale)) with scale = fl(448 / amax) (amax 0/Inf/NaN -> 1, Inf scale -> FLT_MAX);
    the columnwise copy is the bitwise transpose of q, as delayed scaling's."""
    amax = a.abs().amax()
    ok = torch.isfinite(amax) & (amax > 0)
    scale = torch.where(ok, E4M3_MAX / amax, torch.ones_like(amax)).clamp(max=FLT_MAX)
    q = (a.to(in_dtype).float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    out = {"q": q, "scale_inv": torch.reciprocal(scale).reshape(1)}
    if columnwise:
        out["qt"] = q.view(torch.uint8).reshape(-1, q.shape[-1]).t().contiguous()
    return out


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
            out.update(fp8_current_ref(a, in_dtype, columnwise))
        elif quant == "mxfp8":
            out.update(mxfp8_ref(a, in_dtype, columnwise))
        elif quant == "fp8block":
            out.update(fp8_block_ref(a, in_dtype, columnwise))
            out["fb_exact"] = op == "quantize"  # no activation math: bytes must be equal
        elif quant == "nvfp4":
            out.update(nvfp4_ref(a, in_dtype, columnwise))
        else:
            raise ValueError(f"unknown quantizer kind {quant!r}")
        return out

    reference.__name__ = f"ref_{op}_{quant or 'plain'}{'_t' if columnwise else ''}"
    return reference



# ----------------------------------------------------------------------------------------------------------
# Validation: our outputs in the baseline's layout, compared within SPEC 9's tolerances
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


# The block formats' keys in the output dicts: {quant: (prefix, scale suffix)}, e.g. mx_row, mx_row_scale.
_BLOCK_KEYS = {"mxfp8": ("mx", "_scale"), "nvfp4": ("nv", "_scale"), "fp8block": ("fb", "_sinv")}


def _requested_copies(got, ref, prefix, scale_suffix, fmt):
    """(side, label, our data, our scale, reference data) of each copy (rowwise; columnwise, transposed) the
    reference has; raises ValidationError when ours lacks it or has another shape."""
    for side, label in (("row", "rowwise"), ("col", "columnwise (transposed)")):
        if f"{prefix}_{side}" not in ref:
            continue
        q, scale = got.get(f"{prefix}_{side}"), got.get(f"{prefix}_{side}{scale_suffix}")
        if q is None:
            raise ValidationError(f"no {label} {fmt} copy although it was requested")
        rq = ref[f"{prefix}_{side}"]
        if tuple(q.shape) != tuple(rq.shape):
            raise ValidationError(f"{label} {fmt} data shape {tuple(q.shape)}, expected {tuple(rq.shape)}")
        yield side, label, q, scale, rq


def compare_fb(got, ref, info):
    """FP8 block pieces. A plain cast has no activation math, so codes and scales must equal the reference's. After
    an activation (ours evaluates it with its own FP32 math, the reference with torch's) SPEC 5.2's rule: one-code
    differences on at most 0.5 % of the codes and scales, never two codes, never a sign change."""
    exact = ref.get("fb_exact", True)
    for side, label, q, sinv, rq in _requested_copies(got, ref, "fb", "_sinv", "FP8 block"):
        rq, rs = rq.view(torch.uint8), ref[f"fb_{side}_sinv"]
        r, nb = rs.shape
        # the op stores [K/128, roundup(M, 4)] (M contiguous); a compiled reference has the reference's own layout
        ours_sinv = sinv if tuple(sinv.shape) == tuple(rs.shape) else sinv[:nb, :r].t()
        s_bad = int((ours_sinv != rs).sum().item())
        if s_bad and (exact or s_bad > 0.005 * rs.numel()):
            raise ValidationError(f"{label} FP8 block scale_inv: {s_bad} of {rs.numel()} differ from the reference")
        q8 = q.view(torch.uint8)
        n_bad = int((q8 != rq).sum().item())
        if n_bad and not exact:
            # E4M3 codes: the sign is bit 7 and the magnitude bits are monotone, so one step is a difference of 1
            step = ((q8 & 0x7F).int() - (rq & 0x7F).int()).abs()
            sign = ((q8 ^ rq) & 0x80).bool() & ((q8 & 0x7F) != 0) & ((rq & 0x7F) != 0)
            if int((step > 1).sum().item()) or int(sign.sum().item()) or n_bad > 0.005 * q8.numel():
                raise ValidationError(f"{label} FP8 block data: {n_bad} of {q.numel()} bytes differ from the "
                                      f"reference (beyond SPEC 5.2's one-code rule)")
            info.append(f"{label} FP8 block: {n_bad} one-code differences (SPEC 5.2)")
        elif n_bad:
            raise ValidationError(f"{label} FP8 block data: {n_bad} of {q.numel()} bytes differ from the reference")
        else:
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
    for side, label, q, sf, rq in _requested_copies(got, ref, "nv", "_scale", "NVFP4"):
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
    """Turn what tex returned into the reference's dict layout. spec: anything with .op, .quant, .columnwise (a
    bench_activations CaseSpec)."""
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
    if spec.quant in _BLOCK_KEYS:
        prefix, scale = _BLOCK_KEYS[spec.quant]
        out[f"{prefix}_row"], out[f"{prefix}_row{scale}"] = result._rowwise_data, result._rowwise_scale_inv
        if spec.quant == "nvfp4":
            out["nv_amax"] = result._amax_rowwise
        if spec.columnwise:
            out[f"{prefix}_col"], out[f"{prefix}_col{scale}"] = result._columnwise_data, result._columnwise_scale_inv
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




# ----------------------------------------------------------------------------------------------------------
# GEMM peers: torch._scaled_mm on the bytes and scales of our quantized tensors (D [M, N] = X [M, K] . W [N, K]^T)
# ----------------------------------------------------------------------------------------------------------
def scaled_mm_tensorwise(X, W, fast_accum, out_dtype=torch.bfloat16):
    """torch._scaled_mm on two per-tensor Float8Tensors (the TN fprop): mat1 = X's rowwise codes [M, K], mat2 = W's
    rowwise codes [N, K] transposed as a view (torch wants it column-major), scales = their scale_inv [1]."""
    return torch._scaled_mm(X.rowwise_data, W.rowwise_data.t(), scale_a=X._scale_inv, scale_b=W._scale_inv,
                            out_dtype=out_dtype, use_fast_accum=fast_accum)


def blockwise_peer_operands(Xb, Wb):
    """(mat1, mat2, scale_a, scale_b) for torch's block-scaled _scaled_mm from our FP8 block tensors X [M, K]
    (1x128 blocks; stored scale_inv [K/128, roundup(M, 4)], M contiguous) and W [N, K] (128x128 blocks; stored
    [N/128, roundup(K/128, 4)]). torch wants scale_a (M, K/128) outer-dim-major, strides (1, M), and scale_b
    (K/128, N/128) whose transpose is row-major, strides (1, K/128): views of compact copies of our scales (made
    once, outside any timing). The codes are our bytes, mat2 transposed as a view as for the per-tensor GEMM."""
    M, K = Xb.rowwise_data.reshape(-1, Xb.shape[-1]).shape
    N = Wb.rowwise_data.shape[0]
    kb, nb = -(-K // 128), -(-N // 128)
    scale_a = Xb._rowwise_scale_inv[:kb, :M].contiguous().t()
    scale_b = Wb._rowwise_scale_inv[:nb, :kb].contiguous().t()
    return Xb.rowwise_data.reshape(M, K), Wb.rowwise_data.t(), scale_a, scale_b


def scaled_mm_blockwise(operands, out_dtype=torch.bfloat16):
    """1x128 x 128x128 block-scaled GEMM through torch._scaled_mm (torch infers the scaling from the scale shapes and
    strides; split accumulation, the only mode cuBLASLt has for block scales)."""
    a, b, sa, sb = operands
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=False)


def scaled_mm_blockwise_v2(operands, out_dtype=torch.bfloat16):
    """The same through torch.nn.functional.scaled_mm with explicit ScalingType recipes (torch >= 2.10)."""
    a, b, sa, sb = operands
    st = F.ScalingType
    return F.scaled_mm(a, b, sa, st.BlockWise1x128, sb, st.BlockWise128x128, output_dtype=out_dtype)


# ----------------------------------------------------------------------------------------------------------
# MLP baseline: bf16 nn.Linear + activation, eager (and the module torch.compile compiles)
# ----------------------------------------------------------------------------------------------------------
class TorchMLP(torch.nn.Module):
    """fc2(act(fc1(x))); act is tanh-gelu, or swiglu = silu(first half) * second half of fc1's [.., 2 * ffn]."""

    def __init__(self, hidden, ffn, act, dtype, device):
        super().__init__()
        gated = act == "swiglu"
        self.act = act
        self.fc1 = torch.nn.Linear(hidden, ffn * (2 if gated else 1), dtype=dtype, device=device)
        self.fc2 = torch.nn.Linear(ffn, hidden, dtype=dtype, device=device)

    def forward(self, x):
        h = self.fc1(x)
        if self.act == "swiglu":
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


# ----------------------------------------------------------------------------------------------------------
# Decoder baseline (bench_model.py): a Llama-style decoder from torch.nn.Linear, torch.nn.RMSNorm and
# F.scaled_dot_product_attention, laid out as tex.TransformerLayer so that weights copy over unchanged
# ----------------------------------------------------------------------------------------------------------
def rope_freqs(seq, head_dim, base=10000.0, device=None):
    """TE's rotary frequencies [seq, 1, 1, head_dim] (float32): position t times base^(-2i/head_dim) for the
    head_dim/2 pairs, the two halves equal (non-interleaved: channel i pairs with i + head_dim/2)."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    f = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    return torch.cat((f, f), dim=-1)[:, None, None, :]


def apply_rope_bshd(t, freqs):
    """t [b, s, heads, d] rotated by freqs [>= s, 1, 1, d]: t·cos + rotate_half(t)·sin, cos and sin rounded to t's
    dtype (tex.apply_rotary_pos_emb's rule, written here in plain torch)."""
    f = freqs[: t.shape[1]].transpose(0, 1)
    cos, sin = f.cos().to(t.dtype), f.sin().to(t.dtype)
    t1, t2 = t.chunk(2, dim=-1)
    return t * cos + torch.cat((-t2, t1), dim=-1) * sin


class TorchDecoderLayer(torch.nn.Module):
    """Pre-norm block, no biases: h = x + proj(SDPA_causal(rope(q), rope(k), v)), (q, k, v) = qkv(RMSNorm(x)) with
    qkv's rows per head [q; k; v] (tex.TransformerLayer's fused layout); y = h + fc2(swiglu(fc1(RMSNorm(h)))), swiglu
    = silu(first half) * second half of fc1's [.., 2 * ffn]. x [batch, seq, hidden]."""

    def __init__(self, hidden, ffn, heads, eps, dtype, device):
        super().__init__()
        kw = dict(bias=False, dtype=dtype, device=device)
        self.heads, self.head_dim = heads, hidden // heads
        self.attn_norm = torch.nn.RMSNorm(hidden, eps=eps, dtype=dtype, device=device)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, **kw)
        self.proj = torch.nn.Linear(hidden, hidden, **kw)
        self.mlp_norm = torch.nn.RMSNorm(hidden, eps=eps, dtype=dtype, device=device)
        self.fc1 = torch.nn.Linear(hidden, 2 * ffn, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, **kw)

    def forward(self, x, rotary_pos_emb):
        b, s, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, self.heads, 3, self.head_dim).unbind(3)
        q, k = apply_rope_bshd(q, rotary_pos_emb), apply_rope_bshd(k, rotary_pos_emb)
        a = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        g, u = self.fc1(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(g) * u)


class TorchDecoder(torch.nn.Module):
    """Embedding [vocab, hidden] -> layers -> RMSNorm -> LM head Linear(hidden, vocab, no bias) -> mean cross entropy
    of the float32 logits. `layers` is a list of modules called as layer(x, rotary_pos_emb=freqs) (TorchDecoderLayer,
    tex.TransformerLayer in "bshd"); everything around them is plain torch in bf16 for every variant."""

    def __init__(self, vocab, hidden, heads, seq, layers, eps, dtype, device):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden, dtype=dtype, device=device)
        self.layers = torch.nn.ModuleList(layers)
        self.norm = torch.nn.RMSNorm(hidden, eps=eps, dtype=dtype, device=device)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False, dtype=dtype, device=device)
        self.register_buffer("freqs", rope_freqs(seq, hidden // heads, device=device), persistent=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, rotary_pos_emb=self.freqs)
        return self.tail(x, targets)

    def tail(self, x, targets):
        """Final norm, LM head and the loss (a method of its own so that it can be compiled as one graph)."""
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def compile_blocks(self, **kw):
        """torch.compile each layer and the tail, one graph each (torchtitan's per-block compile: the layers share
        one compiled graph, so compiling costs one layer's time, not the whole model's). In place; returns self."""
        for i, layer in enumerate(self.layers):
            self.layers[i] = torch.compile(layer, **kw)
        self.tail = torch.compile(self.tail, **kw)
        return self


def torch_decoder(cfg, dtype, device, seed=0):
    """The plain decoder of `cfg` (vocab, hidden, heads, ffn, layers, seq, eps), weights drawn N(0, 0.02) (the
    output projections proj and fc2 N(0, 0.02 / sqrt(2 * layers)), GPT-2's residual scaling), norms ones."""
    torch.manual_seed(seed)
    layers = [TorchDecoderLayer(cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["eps"], dtype, device)
              for _ in range(cfg["layers"])]
    model = TorchDecoder(cfg["vocab"], cfg["hidden"], cfg["heads"], cfg["seq"], layers, cfg["eps"], dtype, device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg["layers"]) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                p.normal_(0.0, std)
    return model
