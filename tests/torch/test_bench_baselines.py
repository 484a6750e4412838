"""The benchmarks' torch baselines (benchmarks/baselines.py) agree with the float64 references of tests/ref/, and
the benchmark's own validation path accepts tex's CPU kernels and rejects a wrong answer. CPU only, small shapes.

Each activation case of bench_activations.CASE_SPECS runs three ways on a 128x256 bf16 input (swiglu: 128x512):
  - baseline (make_reference: FP32 torch math) against tests/ref/ (float64 math, SPEC 2/4 encoders) through the
    benchmark's compare_outputs, i.e. within SPEC 9's tolerances; bit for bit where no activation math is involved
    (plain casts, FP8 blocks);
  - tex's CPU op, turned into the baseline's layout by ours_outputs, against the baseline: what the GPU run checks
    before it times anything;
  - a corrupted copy of that output must fail the same check.
The GEMM peer's block-scale views and the MLP baseline are checked against tests/ref/ too.
"""
import math
import os
import re
import sys

import pytest
import torch

from tests import ref as R

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))
import baselines as B  # noqa: E402
import bench_activations as BA  # noqa: E402

BF16 = torch.bfloat16
SIZE = (128, 256)  # multiples of every block (FP8 block columnwise needs 128 rows)
CASES = [pytest.param(s, id=re.sub(r"[^A-Za-z0-9+]+", "_", f"{s.op}-{BA.quant_label(s)}").strip("_"))
         for s in BA.CASE_SPECS]


def inputs_of(spec, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, dtype=BF16, generator=g) for s in BA.input_shapes(spec, SIZE)]


def delayed_scale(spec, inputs):
    """The benchmark's delayed scale: the activation's amax at half the E4M3 range."""
    amax = B.act_f32(spec.op, inputs).abs().amax().float()
    return (0.5 * B.E4M3_MAX / amax).reshape(1).contiguous()


def baseline_of(spec, inputs, scale):
    fn = B.make_reference(spec.op, spec.quant, spec.columnwise, BF16)
    extra = [scale, torch.zeros(1)] if spec.quant == "delayed" else []
    return fn(*inputs, *extra)


def reference_of(spec, inputs, scale):
    """The oracle's (tests/ref/) answer in the baseline's dict layout (the 'got' side of compare_outputs)."""
    m, k = SIZE
    dbias = None
    if spec.op == "quantize":
        v64 = inputs[0].to(torch.float64)
    elif spec.op in ("gelu", "swiglu"):
        v64 = R.act_ref(spec.op, inputs[0])
    elif spec.op == "dgelu":
        v64 = R.dact_ref("gelu", inputs[0], inputs[1])
    else:
        dbias, v64 = R.dbias_ref("gelu", inputs[0], inputs[1])
    v32 = v64.to(torch.float32)
    out = {} if dbias is None else {"dbias": dbias.to(BF16)}
    if spec.quant is None:
        out["y"] = v64.to(BF16)
    elif spec.quant == "delayed":
        q = R.act_fp8_delayed_ref(v64, scale, torch.zeros(1), "e4m3")
        out.update(q=q.codes.view(B.FP8), scale_inv=q.scale_inv, amax=q.amax)
        if spec.columnwise:
            out["qt"] = q.t_codes.reshape(k, m)
    elif spec.quant == "current":
        q = R.act_fp8_current_ref(v64, BF16, "e4m3")
        out.update(q=q.codes.view(B.FP8), scale_inv=q.scale_inv)
        if spec.columnwise:
            out["qt"] = q.t_codes.reshape(k, m)
    elif spec.quant == "mxfp8":
        q = R.quantize_mxfp8_ref(R.rnd_in(v32, BF16), "e4m3", rowwise=True, columnwise=spec.columnwise)
        out.update(mx_row=q.row, mx_row_scale=q.row_scale)
        if spec.columnwise:
            out.update(mx_col=q.col, mx_col_scale=q.col_scale)
    elif spec.quant == "fp8block":
        # unfused: the values rounded to the input dtype, then the cast (a plain cast: the input itself)
        src = inputs[0] if spec.op == "quantize" else v64.to(BF16)
        q = R.quantize_fp8_block_ref(src, "e4m3", block_dim=1, rowwise=True, columnwise=spec.columnwise)
        out.update(fb_row=q.row, fb_row_sinv=q.row_scale)
        if spec.columnwise:
            out.update(fb_col=q.col, fb_col_sinv=q.col_scale)
    elif spec.quant == "nvfp4":
        q = R.quantize_nvfp4_ref(v32, rowwise=True, columnwise=spec.columnwise, amax=R.amax_ref(v32),
                                 data=R.rnd_in(v32, BF16))
        out.update(nv_row=q.row, nv_row_scale=q.row_scale, nv_amax=q.amax_row)
        if spec.columnwise:
            out.update(nv_col=q.col, nv_col_scale=q.col_scale)
    return out


def corrupt(got):
    """A wrong answer: the largest value of the main output negated (its bytes for quantized outputs)."""
    bad = dict(got)
    for key in ("y", "q", "mx_row", "fb_row", "nv_row"):
        if key in bad:
            t = bad[key].clone()
            if key == "y":
                i = t.float().abs().argmax()
                t.view(-1)[i] = -t.view(-1)[i] * 2
            elif key == "nv_row":
                t.view(-1)[0] ^= 0x77  # both nibbles to the far end of the E2M1 grid
            else:
                u = t.view(torch.uint8)
                i = (u & 0x7F).argmax()
                u.view(-1)[i] ^= 0x80
            bad[key] = t
            return bad
    raise AssertionError("nothing to corrupt")


@pytest.mark.parametrize("spec", CASES)
def test_baseline_matches_reference(spec):
    inputs = inputs_of(spec)
    scale = delayed_scale(spec, inputs) if spec.quant == "delayed" else None
    base = baseline_of(spec, inputs, scale)
    ref = reference_of(spec, inputs, scale)
    B.compare_outputs(ref, base, BF16, SIZE[0])  # raises ValidationError beyond SPEC 9's tolerances
    if spec.op == "quantize" and spec.quant in ("delayed", "current"):
        # a plain cast has no activation math: the codes are the reference's, bit for bit
        R.assert_bytes_equal(base["q"].view(torch.uint8), ref["q"].view(torch.uint8), f"{spec} codes")
    with pytest.raises(B.ValidationError):
        B.compare_outputs(corrupt(ref), base, BF16, SIZE[0])


@pytest.fixture(scope="module")
def tex():
    try:
        import transformer_engine_torch as t
    except ImportError as e:  # the baselines themselves need no extension; this part does
        pytest.skip(f"transformer_engine_torch not built: {e}")
    BA.tex = t
    return t


@pytest.mark.parametrize("spec", CASES)
def test_benchmark_validation_accepts_tex_cpu(tex, spec):
    inputs = inputs_of(spec, seed=11)
    scale = delayed_scale(spec, inputs) if spec.quant == "delayed" else None
    amax = torch.zeros(1) if spec.quant == "delayed" else None
    base = baseline_of(spec, inputs, scale)
    got = B.ours_outputs(spec, BA.make_ours(spec, BA.make_quantizer(spec, scale, amax))(*inputs), amax)
    B.compare_outputs(got, base, BF16, SIZE[0])
    with pytest.raises(B.ValidationError):
        B.compare_outputs(corrupt(got), base, BF16, SIZE[0])


def test_block_peer_scale_views(tex):
    """torch._scaled_mm's block-scale views of our FP8 block tensors hold the oracle's scales in the shapes and
    strides torch checks: scale_a (M, K/128) strides (1, M); scale_b (K/128, N/128) strides (1, K/128)."""
    M, N, K = 256, 384, 512
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, K, dtype=BF16, generator=g)
    w = torch.randn(N, K, dtype=BF16, generator=g)
    Xb = tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, columnwise=False, block_scaling_dim=1)(x)
    Wb = tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, columnwise=False, block_scaling_dim=2)(w)
    a, b, sa, sb = B.blockwise_peer_operands(Xb, Wb)
    assert (a.shape, b.shape, b.stride()) == ((M, K), (K, N), (1, K))
    assert (sa.shape, sa.stride(), sb.shape, sb.stride()) == ((M, K // 128), (1, M), (K // 128, N // 128),
                                                              (1, K // 128))
    rx = R.quantize_fp8_block_ref(x, "e4m3", block_dim=1, columnwise=False)
    rw = R.quantize_fp8_block_ref(w, "e4m3", block_dim=2, columnwise=False)
    assert torch.equal(sa, rx.row_scale[:, :M].t())
    assert torch.equal(sb, rw.row_scale[:, :K // 128].t())
    # what torch computes from these views is the dequantized product of the reference
    deq_a = a.float() * sa.repeat_interleave(128, 1)
    deq_b = b.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(deq_a, R.dequantize_fp8_block_ref(rx, "e4m3", 1, (M, K), torch.float32))
    assert torch.equal(deq_b.t(), R.dequantize_fp8_block_ref(rw, "e4m3", 2, (N, K), torch.float32))
    assert not torch.equal(sb.t().contiguous().t(), rw.row_scale[:, :K // 128])  # a transposed view would fail


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_torch_mlp_matches_reference(act):
    torch.manual_seed(0)
    mlp = B.TorchMLP(64, 128, act, BF16, "cpu")
    x = torch.randn(32, 64, dtype=BF16)
    y = mlp(x).float()

    def ref(swap=False):
        h = x.double() @ mlp.fc1.weight.double().t() + mlp.fc1.bias.double()
        if swap:  # a wrong answer: gate and value halves exchanged
            h = torch.cat(h.chunk(2, dim=-1)[::-1], dim=-1)
        a = R.act_ref(act, h)
        return a @ mlp.fc2.weight.double().t() + mlp.fc2.bias.double()

    scale = ref().abs().max().item()
    # bf16 rounds fc1's output and the activation: a few bf16 ulps of the output's size
    assert (y.double() - ref()).abs().max().item() <= 2e-2 * scale
    if act == "swiglu":
        assert (y.double() - ref(swap=True)).abs().max().item() > 2e-2 * scale
    assert math.isfinite(scale)


def test_cublaslt_log_comparison():
    """bench_gemm's reading of cuBLASLt's log: the same kernel is reported as such; a different algo, a differing
    heuristic field and a setting only one side made are each named."""
    import bench_gemm as BG

    mm = ("A=0x* Adesc=[type=R_8F_E4M3 rows=256 cols=128 ld=256] computeDesc=[computeType=COMPUTE_32F "
          "scaleType=R_32F transa=OP_T fastAccumulationMode=1] algo=[algoId=66 tile=MATMUL_TILE_128x128 stages=4] "
          "workSpaceSizeInBytes=33554432 beta=0")
    heur = "Adesc=[type=R_8F_E4M3] preference=[maxWorkspaceBytes=33554432] requestedAlgoCount=1"
    pref = "pref=0x* attr=MATMUL_PREF_MIN_ALIGNMENT_A_BYTES buf=0x* sizeInBytes=4 bufData=0x100"
    ours = [("cublasLtMatmulPreferenceSetAttribute", pref), ("cublasLtMatmulAlgoGetHeuristic", heur),
            ("cublasLtMatmul", mm)]
    same = BG.compare_calls(ours, [("cublasLtMatmulAlgoGetHeuristic", heur), ("cublasLtMatmul", mm)])
    assert same["same_kernel"] and same["algo_ours"] == "[algoId=66 tile=MATMUL_TILE_128x128 stages=4]"
    assert same["differences"] == [] and same["messages_only_peer"] == []
    assert same["messages_only_ours"] == [f"cublasLtMatmulPreferenceSetAttribute: {pref}"]
    other = BG.compare_calls(ours, [("cublasLtMatmulAlgoGetHeuristic", heur.replace("33554432", "4194304")),
                                    ("cublasLtMatmul", mm.replace("128x128", "128x256"))])
    assert not other["same_kernel"]
    assert any(d.startswith("cublasLtMatmul algo:") for d in other["differences"])
    assert any(d.startswith("cublasLtMatmulAlgoGetHeuristic preference:") for d in other["differences"])


def test_gemm_validation_rejects_a_wrong_product(tex):
    """bench_gemm's check of ours against the float64 product of the dequantized operands passes tex's CPU GEMM and
    fails the same output with its rows shuffled."""
    import bench_gemm as BG

    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 256, dtype=BF16, generator=g)
    w = torch.randn(128, 256, dtype=BF16, generator=g) / 16
    cs = tex.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, columnwise=False)
    X, W = cs(x), cs(w)
    out = tex.general_gemm(W, X, out_dtype=BF16)[0]
    assert BG.ref_close(out, X, W, *B.TOL_E4M3)
    assert not BG.ref_close(out.flip(0), X, W, *B.TOL_E4M3)


def test_fp8_block_one_code_rule():
    """After an activation, compare_fb accepts one-code differences (SPEC 5.2) but not two codes or a sign flip;
    a plain cast accepts none."""
    spec = next(s for s in BA.CASE_SPECS if s.op == "dbias_dgelu" and s.quant == "fp8block")
    inputs = inputs_of(spec)
    base = baseline_of(spec, inputs, None)
    assert base["fb_exact"] is False

    def with_code(delta=0, sign=False):
        got = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in base.items()}
        q = got["fb_row"].view(torch.uint8).reshape(-1)
        i = int(((q & 0x7F) > 4).nonzero()[0, 0])  # a code with room on both sides
        q[i] = (q[i] ^ 0x80) if sign else (q[i] + delta)
        return got

    info = []
    B.compare_fb(with_code(1), dict(base), info)
    assert any("one-code" in s for s in info)
    for bad in (with_code(2), with_code(sign=True)):
        with pytest.raises(B.ValidationError):
            B.compare_fb(bad, dict(base), [])
    with pytest.raises(B.ValidationError):
        B.compare_fb(with_code(1), dict(base, fb_exact=True), [])
