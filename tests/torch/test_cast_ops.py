"""Cast helpers (SPEC §4.3, §4.10): bgrad_quantize, compute_amax,
fused_amax_and_scale_update_after_reduction, fp8_transpose, create_empty_quantized_tensor."""
import math

import pytest
import torch

from tests import ref
from tests.torch.helpers import (DTYPE_PARAMS, check_float8_tensor, cpu, current_quantizer, delayed_quantizer,
                                 fp8_dtype, tex_module, uniform, wide_random)


def _bias_tol(dtype, rows):
    if dtype == torch.float32:
        return 1.3e-6 * math.sqrt(max(rows, 1)), 1e-4
    return 4 * ref.TOL[dtype][0], 1e-4


# ------------------------------------------------------------------------------------------------
# bgrad_quantize
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(37,), (32, 1, 32), (257, 259)], ids=["37", "32x1x32", "257x259"])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("kind", ["none", "delayed", "current"])
def test_bgrad_quantize(kind, dtype, shape):
    tex = tex_module()
    x = uniform(shape, dtype)
    K = shape[-1]
    rows = x.numel() // K
    if kind == "delayed":
        q, s, amax = delayed_quantizer(-1.5, "e5m2", amax_value=0.25)
    elif kind == "current":
        q = current_quantizer("e4m3", pow2=True)
    else:
        q = None
    out = tex.bgrad_quantize(x, q)
    assert isinstance(out, tuple) and len(out) == 2
    gb, qt = out
    assert tuple(gb.shape) == (K,) and gb.dtype == dtype
    rb = x.double().reshape(-1, K).sum(0)
    rtol, atol = _bias_tol(dtype, rows)
    assert ref.within_tol(gb, rb, rtol, atol), f"grad_bias {gb} vs {rb}"
    assert not ref.within_tol(gb, -rb, rtol, atol)
    if kind == "none":
        assert isinstance(qt, torch.Tensor) and torch.equal(qt, x)
        return
    if kind == "delayed":
        r = ref.quantize_delayed_ref(x, s, torch.tensor([0.25]), "e5m2")
        w = ref.quantize_delayed_ref(-x, s, torch.tensor([0.25]), "e5m2")
        assert torch.equal(cpu(amax).reshape(1), r.amax)
        fmt = "e5m2"
    else:
        r = ref.quantize_current_ref(x, "e4m3", pow2=True)
        w = ref.quantize_current_ref(-x, "e4m3", pow2=True)
        fmt = "e4m3"
    check_float8_tensor(qt, shape, dtype, fmt)
    ref.assert_bytes_equal(cpu(qt._data), r.codes, "bgrad data", wrong=w.codes)
    ref.assert_bytes_equal(cpu(qt._transpose), r.t_codes, "bgrad transpose", wrong=w.t_codes)
    assert torch.equal(cpu(qt._scale_inv).reshape(1), r.scale_inv)


def test_bgrad_quantize_empty():
    tex = tex_module()
    q, s, amax = delayed_quantizer(2.0, "e4m3")
    gb, qt = tex.bgrad_quantize(torch.empty(0, 8, dtype=torch.bfloat16), q)
    assert tuple(gb.shape) == (8,) and torch.all(gb == 0)
    assert tuple(qt.shape) == (0, 8)
    assert float(amax) == 0.0


# ------------------------------------------------------------------------------------------------
# compute_amax
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_compute_amax_overwrites(dtype):
    tex = tex_module()
    x = wide_random((67, 45), dtype)
    amax = torch.tensor([1e30])                  # larger than anything: must still be overwritten
    tex.compute_amax(x, amax)
    assert torch.equal(amax, ref.amax_ref(x).reshape(1))
    assert not torch.equal(amax, ref.amax_ref(x * 0.5).reshape(1))
    amax.fill_(0.0)
    y = x.clone()
    y[3, 4] = math.nan                           # NaN ignored
    tex.compute_amax(y, amax)
    assert torch.equal(amax, ref.amax_ref(y).reshape(1)) and not math.isnan(float(amax))
    y[5, 6] = -math.inf                          # Inf counts
    tex.compute_amax(y, amax)
    assert float(amax) == math.inf
    # non-contiguous and 0-d
    tex.compute_amax(x.t(), amax)
    assert torch.equal(amax, ref.amax_ref(x).reshape(1))
    tex.compute_amax(torch.tensor(-2.5, dtype=dtype), amax)
    assert float(amax) == 2.5


def test_compute_amax_empty_and_all_nan():
    tex = tex_module()
    amax = torch.tensor([5.0])
    tex.compute_amax(torch.empty(0, 3), amax)
    assert float(amax) == 0.0
    amax.fill_(5.0)
    tex.compute_amax(torch.full((4,), math.nan), amax)
    assert float(amax) == 0.0


# ------------------------------------------------------------------------------------------------
# fused_amax_and_scale_update_after_reduction (SPEC §4.3)
# ------------------------------------------------------------------------------------------------
def _histories(seed, shapes):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(s, generator=g) * 10 + 0.01 for s in shapes]


def _run_update(buffer, hists, scales, algo, fmt, margin):
    tex = tex_module()
    exp_h, exp_s = ref.amax_and_scale_update_ref(None if buffer is None else buffer.clone(),
                                                 [h.clone() for h in hists], [s.clone() for s in scales],
                                                 algo, fmt, margin)
    ptrs = [h.data_ptr() for h in hists] + [s.data_ptr() for s in scales]
    tex.fused_amax_and_scale_update_after_reduction(buffer, hists, scales, algo, fp8_dtype(fmt), margin)
    assert [h.data_ptr() for h in hists] + [s.data_ptr() for s in scales] == ptrs, "must update in place"
    for i, (h, e) in enumerate(zip(hists, exp_h)):
        assert torch.equal(h, e), f"history {i}: {h} != {e}"
    for i, (s, e) in enumerate(zip(scales, exp_s)):
        assert ref.bits_equal(s, e), f"scales {i}: {s} != {e}"


@pytest.mark.parametrize("margin", [0, 1, 3])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_amax_update_roll_no_buffer(algo, fmt, margin):
    hists = _histories(1, [(5, 3), (5, 2)])
    hists[0][0, 1] = 0.0                 # last == 0 -> no roll, scale kept (older entries non-zero)
    scales = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, 4.0])]
    old = [h.clone() for h in hists]
    _run_update(None, hists, scales, algo, fmt, float(margin))
    # spelled-out expectations for one column
    h0 = old[0][:, 0]
    assert hists[0][:, 0].tolist() == [0.0] + h0[2:].tolist() + [h0[0].item()]
    assert torch.equal(hists[0][:, 1], old[0][:, 1])
    assert float(scales[0][1]) == 2.0
    want = max(h0[1:].tolist() + [h0[0].item()]) if algo == "max" else h0[0].item()
    expect = (torch.tensor(ref.FP8_MAX[fmt]) * torch.tensor(2.0 ** -margin)) / torch.tensor(want)
    assert float(scales[0][0]) == float(expect)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_amax_update_with_reduction_buffer(algo):
    hists = _histories(2, [(4, 3), (4, 2)])
    scales = [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1.0, 1.0])]
    # non-zero buffer entries override history[0]; zero entries fall back to history[0]
    buffer = torch.tensor([20.0, 0.0, 0.05, 7.5, 0.0])
    hists[1][0, 1] = 0.0                 # buffer 0 and history 0: no roll, scale kept
    _run_update(buffer, hists, scales, algo, "e4m3", 0.0)
    assert float(hists[0][3, 0]) == 20.0
    assert float(scales[1][1]) == 1.0


def test_amax_update_history_len_one():
    hists = [torch.tensor([[3.0, 0.0, 5.0]])]
    scales = [torch.tensor([1.0, 9.0, 1.0])]
    _run_update(None, hists, scales, "max", "e4m3", 0.0)
    assert hists[0].tolist() == [[0.0, 0.0, 0.0]]
    assert scales[0].tolist() == [float(torch.tensor(448.0) / 3), 9.0, float(torch.tensor(448.0) / 5)]


def test_amax_update_inf_scale_and_nonfinite_amax():
    hists = [torch.tensor([[1e-45, math.inf, 2.0], [0.0, 0.0, 0.0]])]
    scales = [torch.tensor([1.0, 3.0, 1.0])]
    _run_update(None, hists, scales, "most_recent", "e4m3", 0.0)
    assert float(scales[0][0]) == ref.FLT_MAX     # 448 / 1e-45 overflows -> FLT_MAX
    assert float(scales[0][1]) == 3.0             # amax Inf -> old scale kept
    assert float(scales[0][2]) == 224.0


def test_amax_update_repeated_steps():
    """Several steps of a delayed recipe: cast -> update -> cast uses the new scale."""
    tex = tex_module()
    L = 4
    hist = torch.zeros(L, 1)
    scale = torch.ones(1)
    amax_view = hist[0]                                    # row 0 view, as the recipe does
    q = tex.Float8Quantizer(scale, amax_view, tex.DType.kFloat8E4M3)
    rh, rs = [hist.clone()], [scale.clone()]
    for step in range(6):
        x = uniform((16, 16), torch.float32, lo=-(step + 1.0), hi=step + 1.0, g=torch.Generator().manual_seed(step))
        qt = tex.quantize(x, q)
        r = ref.quantize_delayed_ref(x, rs[0], rh[0][0].clone(), "e4m3")
        ref.assert_bytes_equal(cpu(qt._data), r.codes, f"step {step}")
        rh[0][0] = r.amax
        assert torch.equal(hist, rh[0])
        rh, rs = ref.amax_and_scale_update_ref(None, rh, rs, "max", "e4m3", 0.0)
        tex.fused_amax_and_scale_update_after_reduction(None, [hist], [scale], "max", tex.DType.kFloat8E4M3, 0.0)
        assert torch.equal(hist, rh[0]) and torch.equal(scale, rs[0]), step


# ------------------------------------------------------------------------------------------------
# fp8_transpose
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 37), (37, 1), (611, 782), (4, 5, 6)])
def test_fp8_transpose(shape):
    tex = tex_module()
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)
    K = shape[-1]
    expect = x.reshape(-1, K).t().contiguous()
    out = tex.fp8_transpose(x, tex.DType.kFloat8E4M3)
    assert out.dtype == torch.uint8 and out.is_contiguous()
    M = x.numel() // K
    ref.assert_bytes_equal(out, expect, "fp8_transpose", wrong=x.reshape(K, M) if K > 1 and M > 1 else None)
    buf = torch.empty(K, x.numel() // K, dtype=torch.uint8)
    p = buf.data_ptr()
    tex.fp8_transpose(x, tex.DType.kFloat8E5M2, out=buf)
    assert buf.data_ptr() == p
    ref.assert_bytes_equal(buf, expect, "fp8_transpose out=")


def test_fp8_transpose_of_quantized_data_matches_transpose_copy():
    tex = tex_module()
    x = wide_random((45, 70), torch.bfloat16)
    qt = tex.quantize(x, current_quantizer("e4m3"))
    assert torch.equal(tex.fp8_transpose(qt._data, tex.DType.kFloat8E4M3), qt._transpose)


# ------------------------------------------------------------------------------------------------
# create_empty_quantized_tensor
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7, 5, 3), (16,), (0, 4)])
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_create_empty_quantized_tensor(dtype, shape):
    tex = tex_module()
    q, s, amax = delayed_quantizer(3.5, "e4m3")
    qt = tex.create_empty_quantized_tensor(q, list(shape), dtype, "cpu")
    check_float8_tensor(qt, shape, dtype, "e4m3")
    assert torch.equal(cpu(qt._scale_inv).reshape(1), ref.reciprocal_f32(torch.tensor(3.5)).reshape(1))
    qt = tex.create_empty_quantized_tensor(q, torch.Size(shape), dtype, torch.device("cpu"))
    check_float8_tensor(qt, shape, dtype, "e4m3")
    qc = current_quantizer("e5m2", rowwise=True, columnwise=False)
    qt = tex.create_empty_quantized_tensor(qc, shape, dtype, "cpu")
    check_float8_tensor(qt, shape, dtype, "e5m2", rowwise=True, columnwise=False)
    qc = current_quantizer("e5m2", rowwise=False, columnwise=True)
    qt = tex.create_empty_quantized_tensor(qc, shape, dtype, "cpu")
    check_float8_tensor(qt, shape, dtype, "e5m2", rowwise=False, columnwise=True)
