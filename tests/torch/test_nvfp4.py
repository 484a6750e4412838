"""NVFP4 (SPEC §2 E2M1, §4.6, §4.8, §4.9, §5.1): bit-exact against the pure-PyTorch reference of tests/ref/
(packed bytes, compact scale bytes including the zero padding, amaxes), structured inputs (ties, bin edges,
extremes, zeros), 2-D tiles, the random Hadamard transform, stochastic rounding, every activation through the
FUSED_ACTIVATION_AMAX_NVFP4 path, the tensor API, errors, opcheck, and CPU/CUDA parity
(torch.compile: test_opcheck_compile.py, with every other quantizer kind)."""
import math

import pytest
import torch

from tests import ref
from tests.torch.helpers import (DTYPE_PARAMS, capture_graph, check_grad_bias, column_sum_rtol, cpu, dbias_inputs,
                                 opcheck_inputs, replay_on_new_inputs, run_opcheck, tex_module, uniform, wide_random)

SHAPES = [(128, 128), (256, 272), (304, 304), (1024, 2048)]
USAGES = [(True, True), (True, False), (False, True)]
SEED_KW = dict(rng_seed=0x1234_5678_9ABC, rng_offset=8)


def nvq(rowwise=True, columnwise=True, **kw):
    tex = tex_module()
    if kw.get("with_rht"):
        kw.setdefault("with_post_rht_amax", True)
    return tex.NVFP4Quantizer(rowwise=rowwise, columnwise=columnwise, **kw)


def quantize_seeded(x, q, seed=SEED_KW["rng_seed"], offset=SEED_KW["rng_offset"]):
    """The quantize op with an explicit stochastic-rounding (seed, offset) instead of the device generator's."""
    return q._wrap(torch.ops.te.quantize.default(x, *q._spec(), rng_seed=seed, rng_offset=offset), x.dtype)


def nv_close(test, r64, amax):
    """SPEC §9 NVFP4 tolerance (rtol 0.25) with the absolute part scaled to the tensor: half the smallest E2M1 step
    of the block holding the global amax (amax / 24), plus the E4M3 block-scale rounding (amax / 20 in all)."""
    return ref.within_tol(test, r64, 0.25, float(amax) / 20)


def check_nv(qt, r, shape, dtype, msg, wrong=None, rowwise=True, columnwise=True):
    """Structure (SPEC §4.9 fields, shapes, dtypes) and bit-exact bytes, scales (padding included) and amaxes."""
    tex = tex_module()
    assert isinstance(qt, tex.NVFP4Tensor), type(qt)
    assert tuple(qt.shape) == tuple(shape) and qt.dtype == dtype, msg
    m = math.prod(shape[:-1]) if len(shape) > 1 else 1
    k = shape[-1]
    (rr, rc), (cr, cc) = ref.nv_scale_shapes(m, k)
    if rowwise:
        assert tuple(qt._rowwise_data.shape) == tuple(shape[:-1]) + (k // 2,), msg
        assert qt._rowwise_data.dtype == torch.uint8 and qt._rowwise_scale_inv.dtype == torch.uint8
        assert tuple(qt._rowwise_scale_inv.shape) == (rr, rc), msg
        ref.assert_bytes_equal(cpu(qt._rowwise_data).reshape(m, k // 2), r.row, msg + " rowwise data",
                               wrong=None if wrong is None else wrong.row)
        ref.assert_bytes_equal(cpu(qt._rowwise_scale_inv), r.row_scale, msg + " rowwise scales")
        assert ref.bits_equal(cpu(qt._amax_rowwise), r.amax_row), f"{msg} amax_rowwise {qt._amax_rowwise} {r.amax_row}"
    else:
        assert qt._rowwise_data is None and qt._rowwise_scale_inv is None and qt._amax_rowwise is None
    if columnwise:
        assert tuple(qt._columnwise_data.shape) == (k, m // 2), msg
        assert tuple(qt._columnwise_scale_inv.shape) == (cr, cc), msg
        ref.assert_bytes_equal(cpu(qt._columnwise_data), r.col, msg + " columnwise data",
                               wrong=None if wrong is None else wrong.col)
        ref.assert_bytes_equal(cpu(qt._columnwise_scale_inv), r.col_scale, msg + " columnwise scales")
        assert ref.bits_equal(cpu(qt._amax_columnwise), r.amax_col), msg + " amax_columnwise"
    else:
        assert qt._columnwise_data is None and qt._columnwise_scale_inv is None and qt._amax_columnwise is None


# ------------------------------------------------------------------------------------------------
# The reference itself
# ------------------------------------------------------------------------------------------------
def test_philox_reference_known_answers():
    """Random123's published Philox4x32-10 known-answer vectors."""
    assert ref.philox4x32_10([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    m = 0xFFFFFFFF
    assert ref.philox4x32_10([m, m, m, m], [m, m]) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert ref.philox4x32_10([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_e2m1_reference_encoder():
    """The threshold encoder equals nearest-grid-point with ties to the even code (float64 brute force)."""
    grid = torch.tensor(ref.E2M1_GRID, dtype=torch.float64)
    v = torch.cat([torch.linspace(-8, 8, 4097), torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])]).float()
    codes = ref.e2m1_encode(v)
    d = (v.double().abs()[:, None].clamp(max=6.0) - grid[None, :]).abs()
    best = d.min(dim=1).values
    cand = (d == best[:, None])
    idx = torch.arange(8).expand_as(cand)
    # among equally near points, the even code
    pick = torch.where(cand & (idx % 2 == 0), idx, torch.full_like(idx, 99)).min(dim=1).values
    pick = torch.where(pick == 99, torch.where(cand, idx, torch.full_like(idx, 99)).min(dim=1).values, pick)
    assert torch.equal((codes & 7).long(), pick)
    assert torch.equal(ref.e2m1_encode(torch.tensor([-0.0, float("nan"), -float("inf")])),
                       torch.tensor([0x8, 0x7, 0xF], dtype=torch.uint8))


def test_rht_reference_is_the_matrix():
    """rht_ref (FP32 in index order, then bf16) agrees with v @ R in float64 rounded to bf16 almost everywhere."""
    v = uniform((64, 256), torch.bfloat16).float()
    y = ref.rht_ref(v)
    y64 = (v.double().reshape(64, 16, 16) @ ref.rht_matrix_ref()).reshape(64, 256)
    same = (y == y64.to(torch.bfloat16).float()).float().mean()
    assert same > 0.995, same
    r = ref.rht_matrix_ref()
    assert torch.allclose(r @ r.t(), torch.eye(16, dtype=torch.float64))


# ------------------------------------------------------------------------------------------------
# Quantize: shapes, dtypes, usages (bit-exact)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_quantize(device, shape, dtype):
    tex = tex_module()
    x = wide_random(shape, dtype).to(device)
    for usage in USAGES if shape != (1024, 2048) else USAGES[:1]:
        qt = tex.quantize(x, nvq(*usage))
        r = ref.quantize_nvfp4_ref(cpu(x), *usage)
        check_nv(qt, r, shape, dtype, f"{shape} {dtype} {usage}", wrong=ref.quantize_nvfp4_ref(-cpu(x), *usage),
                 rowwise=usage[0], columnwise=usage[1])


def test_quantize_3d_and_ragged_rows_rowwise(device):
    """Leading dims flatten into M; rowwise-only accepts M % 16 != 0 (scale rows padded to 128)."""
    tex = tex_module()
    x = uniform((3, 7, 48), torch.bfloat16, device)
    qt = tex.quantize(x, nvq(True, False))
    check_nv(qt, ref.quantize_nvfp4_ref(cpu(x), True, False), (3, 7, 48), torch.bfloat16, "3-D rowwise",
             columnwise=False)
    x = uniform((32, 5, 32), torch.float32, device)
    check_nv(tex.quantize(x, nvq()), ref.quantize_nvfp4_ref(cpu(x)), (32, 5, 32), torch.float32, "3-D both")


def test_ties_to_even(device):
    """With S_enc = 1 (global amax 2688) and a block of amax 6 (sf = 1.0, enc = 1): 2.5 -> 2, 3.5 -> 4, 5 -> 4, and
    the other ties 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2."""
    tex = tex_module()
    row = torch.zeros(32)
    row[:16] = torch.tensor([6.0, 2.5, 3.5, 5.0, 0.25, 0.75, 1.25, 1.75, -2.5, -3.5, -5.0, -0.25, -0.75, -1.25,
                             -1.75, 0.0])
    row[16] = 2688.0
    x = row.repeat(16, 1).to(device)
    qt = tex.quantize(x, nvq())
    expect = torch.tensor([6.0, 2.0, 4.0, 4.0, 0.0, 1.0, 1.0, 2.0, -2.0, -4.0, -4.0, -0.0, -1.0, -1.0, -2.0, 0.0])
    codes = ref.nv_unpack(cpu(qt._rowwise_data))[0, :16]
    assert torch.equal(ref.e2m1_decode(codes), expect), ref.e2m1_decode(codes)
    assert int(cpu(qt._rowwise_scale_inv)[0, 0]) == 0x38  # E4M3 1.0
    assert float(cpu(qt._amax_rowwise)) == 2688.0
    # the columnwise copy of column 1 (all 2.5) encodes 2.0 everywhere (block amax 2.5: sf = e4m3(2.5/6))
    check_nv(qt, ref.quantize_nvfp4_ref(cpu(x)), (16, 32), torch.float32, "ties")
    # a wrong (ties-away) answer would be caught: 2.5 -> 3 is code 5, not 4
    assert int(codes[1]) == 4 and int(codes[2]) == 6 and int(codes[3]) == 6


def test_bin_edges(device):
    """v and v +- 1e-3 around every FP4 bin edge in [-12, 12] (blocks of amax 12: sf = 2, enc = 1/2 with S_enc = 1),
    against the reference bytes and against float64 nearest-grid rounding of the off-edge values."""
    tex = tex_module()
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    edges = sorted({2 * m for m in mids} | {2 * g for g in ref.E2M1_GRID[1:]})
    vals = []
    for e in edges:
        for s in (1.0, -1.0):
            vals += [s * e, s * (e - 1e-3), s * (e + 1e-3)]
    vals = [v for v in vals if abs(v) <= 12.0]
    nblk = math.ceil(len(vals) / 15)
    x = torch.zeros(16, 16 * (nblk + 1))
    for b in range(nblk):
        chunk = vals[15 * b:15 * b + 15]
        x[:, 16 * b] = 12.0
        x[:, 16 * b + 1:16 * b + 1 + len(chunk)] = torch.tensor(chunk)
    x[:, -16] = 2688.0
    qt = tex.quantize(x.to(device), nvq())
    check_nv(qt, ref.quantize_nvfp4_ref(x), tuple(x.shape), torch.float32, "bin edges",
             wrong=ref.quantize_nvfp4_ref(-x))
    deq = cpu(qt.dequantize(torch.float32))
    grid = torch.tensor(ref.E2M1_GRID, dtype=torch.float64) * 2
    for b in range(nblk):
        assert int(cpu(qt._rowwise_scale_inv)[0, b]) == 0x40  # E4M3 2.0
        for j, v in enumerate(vals[15 * b:15 * b + 15]):
            near = grid[(grid - abs(v)).abs().argmin()]
            if min((grid - abs(v)).abs()) < 0.5 * 1e-3 or abs(abs(v) - near) > 1e-6 and \
                    (grid - abs(v)).abs().sort().values[1] - (grid - abs(v)).abs().min() < 1e-6:
                continue  # exact ties are covered by the reference bytes above
            assert float(deq[0, 16 * b + 1 + j]) == math.copysign(float(near), v), (v, float(deq[0, 16 * b + 1 + j]))


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_all_max_input(device, dtype):
    """Every element at the input dtype's max finite value: bytes 0x77, block scales 448 (0x7E)."""
    tex = tex_module()
    x = torch.full((32, 64), torch.finfo(dtype).max, dtype=dtype, device=device)
    qt = tex.quantize(x, nvq())
    assert bool((cpu(qt._rowwise_data) == 0x77).all()) and bool((cpu(qt._columnwise_data) == 0x77).all())
    assert bool((cpu(qt._rowwise_scale_inv)[:32, :4] == 0x7E).all())
    assert bool((cpu(qt._columnwise_scale_inv)[:64, :2] == 0x7E).all())
    check_nv(qt, ref.quantize_nvfp4_ref(cpu(x)), (32, 64), dtype, "all max", wrong=ref.quantize_nvfp4_ref(-cpu(x)))
    neg = tex.quantize(-x, nvq())
    assert bool((cpu(neg._rowwise_data) == 0xFF).all())


def test_zeros(device):
    tex = tex_module()
    x = torch.zeros(48, 96, device=device)
    qt = tex.quantize(x, nvq())
    for t in (qt._rowwise_data, qt._columnwise_data, qt._rowwise_scale_inv, qt._columnwise_scale_inv):
        assert not bool(cpu(t).any())
    assert float(cpu(qt._amax_rowwise)) == 0.0 and float(cpu(qt._amax_columnwise)) == 0.0
    assert not bool(cpu(qt.dequantize()).any())
    check_nv(qt, ref.quantize_nvfp4_ref(cpu(x)), (48, 96), torch.float32, "zeros")


def test_specials(device):
    """NaN is ignored by the amaxes and encodes as 0x7 (+6 times the scale); Inf makes the global scale 1."""
    tex = tex_module()
    x = uniform((32, 32), torch.float32, device)
    x[0, 3] = float("nan")
    x[5, 20] = -float("inf")
    check_nv(tex.quantize(x, nvq()), ref.quantize_nvfp4_ref(cpu(x)), (32, 32), torch.float32, "NaN/Inf")


def test_empty(device):
    tex = tex_module()
    x = torch.zeros(0, 32, device=device)
    qt = tex.quantize(x, nvq())
    assert qt._rowwise_data.shape == (0, 16) and qt._columnwise_data.shape == (32, 0)
    assert float(cpu(qt._amax_rowwise)) == 0.0
    assert qt.dequantize().shape == (0, 32)


def test_noncontiguous_input(device):
    tex = tex_module()
    base = uniform((64, 48), torch.bfloat16, device)
    x = base.t()  # [48, 64] view
    check_nv(tex.quantize(x, nvq()), ref.quantize_nvfp4_ref(cpu(x).contiguous()), (48, 64), torch.bfloat16,
             "transposed view")


# ------------------------------------------------------------------------------------------------
# 2-D tiles, RHT, swizzled scales
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(128, 128), (256, 272), (48, 80)], ids=lambda s: "x".join(map(str, s)))
def test_2d_tiles(device, shape):
    tex = tex_module()
    x = wide_random(shape, torch.bfloat16).to(device)
    qt = tex.quantize(x, nvq(with_2d_quantization=True))
    r = ref.quantize_nvfp4_ref(cpu(x), two_d=True)
    check_nv(qt, r, shape, torch.bfloat16, "2-D", wrong=ref.quantize_nvfp4_ref(cpu(x)))
    rown = ref.nv_unpack(cpu(qt._rowwise_data))
    coln = ref.nv_unpack(cpu(qt._columnwise_data))
    assert torch.equal(coln, rown.t()), "2-D: columnwise codes must be the exact transpose of the rowwise codes"
    rs = cpu(qt._rowwise_scale_inv)[:shape[0], :shape[1] // 16]
    cs = cpu(qt._columnwise_scale_inv)[:shape[1], :shape[0] // 16]
    assert torch.equal(rs[::16, :], cs[::16, :].t())


def test_2d_tiles_ragged_rows_rowwise(device):
    tex = tex_module()
    x = uniform((37, 64), torch.float32, device)
    qt = tex.quantize(x, nvq(True, False, with_2d_quantization=True))
    check_nv(qt, ref.quantize_nvfp4_ref(cpu(x), True, False, two_d=True), (37, 64), torch.float32, "2-D ragged",
             columnwise=False)


@pytest.mark.parametrize("sign_mask", [True, False])
@pytest.mark.parametrize("shape", [(128, 128), (256, 272), (304, 304)], ids=lambda s: "x".join(map(str, s)))
def test_rht(device, shape, sign_mask):
    """RHT columnwise copy = the 1x16 quantization of rows of (x^T . R) (FP32 in index order, bf16), amax of the
    transformed values; the rowwise copy and its amax are those of plain NVFP4."""
    tex = tex_module()
    x = wide_random(shape, torch.bfloat16).to(device)
    qt = tex.quantize(x, nvq(with_rht=True, with_random_sign_mask=sign_mask))
    r = ref.quantize_nvfp4_ref(cpu(x), rht=True, sign_mask_on=sign_mask)
    wrong = ref.quantize_nvfp4_ref(cpu(x))            # columnwise without the transform
    wrong.row = ref.quantize_nvfp4_ref(-cpu(x)).row
    check_nv(qt, r, shape, torch.bfloat16, f"RHT {sign_mask}", wrong=wrong)
    plain = ref.quantize_nvfp4_ref(cpu(x))
    assert torch.equal(cpu(qt._rowwise_data).reshape(plain.row.shape), plain.row)
    # the transformed values really are x^T . R: dequantized columnwise copy vs float64 x^T R within NVFP4 tolerance
    xt_r = (cpu(x).double().t().reshape(shape[1], shape[0] // 16, 16) @ ref.rht_matrix_ref(sign_mask))
    deq = ref.dequantize_nvfp4_ref(cpu(qt._columnwise_data), cpu(qt._columnwise_scale_inv), cpu(qt._amax_columnwise))
    assert nv_close(deq, xt_r.reshape(shape[1], shape[0]), r.amax_col)
    # dequantize() of a columnwise-only RHT tensor applies R^T (approximate, documented)
    qc = tex.quantize(x, nvq(False, True, with_rht=True, with_random_sign_mask=sign_mask))
    back = cpu(qc.dequantize(torch.float32)).double()
    err = (back - cpu(x).double()).norm() / cpu(x).double().norm()
    assert err < 0.2, err


def test_rht_rowwise_only_is_plain(device):
    tex = tex_module()
    x = uniform((40, 64), torch.bfloat16, device)
    qt = tex.quantize(x, nvq(True, False, with_rht=True))
    check_nv(qt, ref.quantize_nvfp4_ref(cpu(x), True, False), (40, 64), torch.bfloat16, "RHT rowwise only",
             columnwise=False)


@pytest.mark.parametrize("shape", [(128, 128), (256, 272), (48, 80)], ids=lambda s: "x".join(map(str, s)))
def test_swizzled_scales(device, shape):
    tex = tex_module()
    x = uniform(shape, torch.bfloat16, device)
    q = nvq()
    q.optimize_for_gemm = True
    qt = tex.quantize(x, q)
    r = ref.quantize_nvfp4_ref(cpu(x))
    assert qt._with_gemm_swizzled_scales
    ref.assert_bytes_equal(cpu(qt._rowwise_scale_inv), ref.swizzle_ref(r.row_scale).reshape(r.row_scale.shape),
                           "swizzled rowwise")
    ref.assert_bytes_equal(cpu(qt._columnwise_scale_inv), ref.swizzle_ref(r.col_scale).reshape(r.col_scale.shape),
                           "swizzled columnwise")
    ref.assert_bytes_equal(cpu(qt._rowwise_data), r.row, "data unchanged by the layout")
    assert torch.equal(cpu(qt.dequantize(torch.float32)), cpu(tex.quantize(x, nvq()).dequantize(torch.float32)))
    # in-place swizzle of a compact tensor keeps the storage and gives the same bytes
    qc = tex.quantize(x, nvq())
    ptr = qc._rowwise_scale_inv.data_ptr()
    tex.swizzle_scales_for_gemm_(qc)
    assert qc._rowwise_scale_inv.data_ptr() == ptr and qc._with_gemm_swizzled_scales
    assert torch.equal(cpu(qc._rowwise_scale_inv), cpu(qt._rowwise_scale_inv))
    assert torch.equal(cpu(qc._columnwise_scale_inv), cpu(qt._columnwise_scale_inv))


# ------------------------------------------------------------------------------------------------
# Stochastic rounding
# ------------------------------------------------------------------------------------------------
def test_sr_explicit_seed_matches_reference(device):
    """With a fixed (seed, offset) the bytes follow the SPEC §4.6 rule on our Philox stream exactly."""
    x = wide_random((32, 48), torch.bfloat16).to(device)
    q = nvq(stochastic_rounding=True)
    qt = quantize_seeded(x, q)
    r = ref.quantize_nvfp4_ref(cpu(x), seed=SEED_KW["rng_seed"], offset=SEED_KW["rng_offset"])
    check_nv(qt, r, (32, 48), torch.bfloat16, "SR seeded", wrong=ref.quantize_nvfp4_ref(cpu(x)))
    other = ref.quantize_nvfp4_ref(cpu(x), seed=SEED_KW["rng_seed"], offset=SEED_KW["rng_offset"] + 4)
    assert not torch.equal(other.row, r.row), "another offset must give another stream"


def _brackets(codes_vals, scaled):
    """Every SR value is one of the two grid points around the (scaled) input."""
    grid = torch.tensor(ref.E2M1_GRID)
    a = scaled.abs().clamp(max=6.0)
    lo = grid[(torch.searchsorted(grid, a, right=True) - 1).clamp(0, 7)]
    hi = grid[torch.searchsorted(grid, a, right=False).clamp(0, 7)]
    v = codes_vals.abs()
    return bool(((v == lo) | (v == hi)).all())


def test_sr_statistics(device):
    """Two draws differ; every code brackets the value; the mean of 50 draws is closer (RMSE) than RTN;
    torch.manual_seed reproduces the bytes."""
    tex = tex_module()
    x = uniform((64, 128), torch.float32, device)
    q = nvq(stochastic_rounding=True)
    rtn = tex.quantize(x, nvq())
    a, b = tex.quantize(x, q), tex.quantize(x, q)
    assert not torch.equal(cpu(a._rowwise_data), cpu(b._rowwise_data))
    assert not torch.equal(cpu(a._columnwise_data), cpu(b._columnwise_data))
    assert torch.equal(cpu(a._rowwise_scale_inv), cpu(rtn._rowwise_scale_inv)), "block scales stay RNE"
    assert torch.equal(cpu(a._columnwise_scale_inv), cpu(rtn._columnwise_scale_inv))
    # bracketing, on the scaled values enc * x of each block
    r = ref.quantize_nvfp4_ref(cpu(x))
    s_enc = ref.nv_global_scale(r.amax_row)
    sf = ref.fp8_decode(r.row_scale[:64, :8].contiguous(), "e4m3")
    enc = torch.tensor(1.0) / (sf * (torch.tensor(1.0) / s_enc))
    scaled = cpu(x) * enc.repeat_interleave(16, 1)
    vals = ref.e2m1_decode(ref.nv_unpack(cpu(a._rowwise_data)))
    assert _brackets(vals, scaled)
    assert not _brackets(ref.e2m1_decode(ref.nv_unpack(r.row)).roll(1, 1), scaled), "a wrong answer would pass"
    # unbiasedness: the mean of 50 draws beats round-to-nearest
    xs = cpu(x).double()
    acc = torch.zeros_like(xs)
    for _ in range(50):
        acc += cpu(tex.quantize(x, q).dequantize(torch.float32)).double()
    rmse_sr = ((acc / 50 - xs) ** 2).mean().sqrt()
    rmse_rtn = ((cpu(rtn.dequantize(torch.float32)).double() - xs) ** 2).mean().sqrt()
    assert rmse_sr < rmse_rtn, (rmse_sr, rmse_rtn)
    # a fixed seed reproduces the bytes
    torch.manual_seed(77)
    c1 = tex.quantize(x, q)
    torch.manual_seed(77)
    c2 = tex.quantize(x, q)
    assert torch.equal(cpu(c1._rowwise_data), cpu(c2._rowwise_data))
    assert torch.equal(cpu(c1._columnwise_data), cpu(c2._columnwise_data))


def test_sr_with_rht_and_2d(device):
    x = uniform((32, 64), torch.bfloat16, device)
    for kw in (dict(with_rht=True), dict(with_2d_quantization=True)):
        q = nvq(stochastic_rounding=True, **kw)
        r = ref.quantize_nvfp4_ref(cpu(x), rht=kw.get("with_rht", False), two_d=kw.get("with_2d_quantization", False),
                                   seed=SEED_KW["rng_seed"], offset=SEED_KW["rng_offset"])
        check_nv(quantize_seeded(x, q), r, (32, 64), torch.bfloat16, f"SR {kw}")


def test_sr_ops_are_tagged_nondeterministic_seeded():
    tex_module()
    for name in ("quantize", "quantize_into", "act_quantize", "dact_quantize", "dbias_dact", "bgrad_quantize"):
        assert torch.Tag.nondeterministic_seeded in getattr(torch.ops.te, name).default.tags, name


# ------------------------------------------------------------------------------------------------
# Activations: FUSED_ACTIVATION_AMAX_NVFP4 (amax of the unrounded FP32 activation, data rnd_in(act)); RHT unfused
# ------------------------------------------------------------------------------------------------
def _act_input(name, dtype, rows=48):
    return uniform((rows, 128), dtype, g=torch.Generator().manual_seed(ref.ACT_CODE[name] + 57))


def _fused_ref(plain, unrounded, **kw):
    """SPEC §5.1 FUSED_ACTIVATION_AMAX_NVFP4: global amax of the unrounded FP32 values, data = rnd_in values."""
    return ref.quantize_nvfp4_ref(unrounded, amax=ref.amax_ref(unrounded), data=plain.float(), **kw)


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_activation_forward(device, name, dtype):
    tex = tex_module()
    x = _act_input(name, dtype).to(device)
    qt = getattr(tex, name)(x, nvq())
    plain = cpu(getattr(tex, name)(x, None))                     # rnd_in(act(x))
    unrounded = cpu(getattr(tex, name)(x.float(), None))         # the same FP32 activation, unrounded
    r = _fused_ref(plain, unrounded)
    check_nv(qt, r, plain.shape, dtype, f"{name} {dtype}", wrong=_fused_ref(-plain, -unrounded))
    v64 = ref.act_ref(name, cpu(x))
    amax = float(r.amax_row)
    assert nv_close(cpu(qt.dequantize(torch.float32)), v64, amax), f"{name} vs float64"


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_activation_backward(device, name, dtype):
    tex = tex_module()
    x = _act_input(name, dtype).to(device)
    g = uniform(ref.out_shape(name, x.shape), dtype, g=torch.Generator().manual_seed(5)).to(device)
    dname = ref.DACT_NAMES[name]
    qt = getattr(tex, dname)(g, x, nvq())
    plain = cpu(getattr(tex, dname)(g, x, None))
    unrounded = cpu(getattr(tex, dname)(g.float(), x.float(), None))
    check_nv(qt, _fused_ref(plain, unrounded), x.shape, dtype, f"{dname} {dtype}",
             wrong=_fused_ref(-plain, -unrounded))


@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_activation_rht_unfused(device, name):
    """With RHT the path is UNFUSED: rnd_in(act(x)) (bf16) then the ordinary quantize of it."""
    tex = tex_module()
    x = _act_input(name, torch.bfloat16).to(device)
    q = nvq(with_rht=True)
    qt = getattr(tex, name)(x, q)
    plain = getattr(tex, name)(x, None)
    r = ref.quantize_nvfp4_ref(cpu(plain), rht=True)
    check_nv(qt, r, tuple(plain.shape), torch.bfloat16, f"{name} RHT", wrong=ref.quantize_nvfp4_ref(-cpu(plain), rht=True))
    dq = tex.dgelu(x[:, :64].contiguous(), x[:, :64].contiguous(), q) if name == "gelu" else None
    if dq is not None:
        p2 = tex.dgelu(x[:, :64].contiguous(), x[:, :64].contiguous(), None)
        check_nv(dq, ref.quantize_nvfp4_ref(cpu(p2), rht=True), (48, 64), torch.bfloat16, "dgelu RHT")


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES))
def test_dbias(device, name, dtype):
    tex = tex_module()
    base, x, g = dbias_inputs(name, dtype, device, _act_input, 112)
    for usage in USAGES:
        gb, qt = getattr(tex, name)(g, x, nvq(*usage))
        plain = cpu(getattr(tex, "d" + base)(g, x, None))
        unrounded = cpu(getattr(tex, "d" + base)(g.float(), x.float(), None))
        check_nv(qt, _fused_ref(plain, unrounded, rowwise=usage[0], columnwise=usage[1]), x.shape, dtype,
                 f"{name} {dtype} {usage}", rowwise=usage[0], columnwise=usage[1],
                 wrong=_fused_ref(-plain, -unrounded, rowwise=usage[0], columnwise=usage[1]))
        assert gb.dtype == dtype and tuple(gb.shape) == (128,)
        want = check_grad_bias(gb, base, g, x, f"{name} grad_bias")
        assert not ref.within_tol(-cpu(gb), want, column_sum_rtol(112, dtype), 1e-4)


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_bgrad_quantize(device, dtype):
    tex = tex_module()
    x = uniform((96, 64), dtype, device)
    gb, qt = tex.bgrad_quantize(x, nvq())
    check_nv(qt, ref.quantize_nvfp4_ref(cpu(x)), (96, 64), dtype, "bgrad_quantize")
    gb64 = cpu(x).double().sum(0)
    rtol = column_sum_rtol(96, dtype)
    assert ref.within_tol(cpu(gb), gb64.to(dtype), rtol, 1e-4)


# ------------------------------------------------------------------------------------------------
# Tensor API, quantize_into, noop
# ------------------------------------------------------------------------------------------------
def test_dequantize_formula(device):
    """dequantize = fl(e2m1 * fl(fl(sf * amax) * fl(1/2688))) (TE's formula), both copies; within NVFP4 tolerance."""
    tex = tex_module()
    x = wide_random((64, 96), torch.bfloat16).to(device)
    qt = tex.quantize(x, nvq())
    r = ref.quantize_nvfp4_ref(cpu(x))
    d_row = ref.dequantize_nvfp4_ref(r.row, r.row_scale, r.amax_row)
    d_col = ref.dequantize_nvfp4_ref(r.col, r.col_scale, r.amax_col).t()
    assert ref.bits_equal(cpu(qt.dequantize(torch.float32)), d_row)
    assert cpu(qt.dequantize()).dtype == torch.bfloat16
    assert ref.bits_equal(cpu(qt.dequantize()), d_row.to(torch.bfloat16))
    qt.update_usage(rowwise_usage=False)
    assert ref.bits_equal(cpu(qt.dequantize(torch.float32)), d_col)
    assert not ref.bits_equal(cpu(qt.dequantize(torch.float32)), -d_col)
    amax = float(r.amax_row)
    assert nv_close(d_row, cpu(x).float(), amax)


def test_tensor_api(device):
    tex = tex_module()
    x = uniform((4, 8, 32), torch.float16, device)
    qt = tex.quantize(x, nvq())
    assert qt.shape == (4, 8, 32) and qt.numel() == 4 * 8 * 32 and qt.device.type == device
    assert qt._fp4_dtype == tex.DType.kFloat4E2M1
    assert qt.rowwise_scale_inv.dtype == torch.float8_e4m3fn
    v = qt.view(32, 32)
    assert v.shape == (32, 32) and v._rowwise_data.shape == (32, 16)
    assert torch.equal(cpu(v.dequantize()), cpu(qt.dequantize()).reshape(32, 32))
    with pytest.raises(ValueError, match="only leading dims"):
        qt.view(4, 256)
    c = qt.clone()
    assert c._rowwise_data.data_ptr() != qt._rowwise_data.data_ptr()
    assert torch.equal(cpu(c.dequantize()), cpu(qt.dequantize()))
    assert torch.equal(qt.to("cpu").dequantize(), cpu(qt.dequantize()))
    qt.update_usage(columnwise_usage=False)
    assert qt._columnwise_data is None and qt._amax_columnwise is None
    with pytest.raises(RuntimeError, match="cannot be derived"):
        qt.update_usage(columnwise_usage=True)
    t = tex.NVFP4Tensor(rowwise_data=c._rowwise_data.reshape(32, 16), rowwise_scale_inv=c._rowwise_scale_inv,
                        amax_rowwise=c._amax_rowwise, fp4_dtype=tex.DType.kFloat4E2M1, dtype=torch.float16)
    assert t.shape == (32, 32)
    assert torch.equal(cpu(t.dequantize()), cpu(c.dequantize()).reshape(32, 32))


def test_quantizer_value_object():
    tex = tex_module()
    a, b = nvq(stochastic_rounding=True), nvq(stochastic_rounding=True)
    assert a == b and hash(a) == hash(b) and a != nvq()
    c = a.copy()
    assert c == a and c.stochastic_rounding
    q = tex.NVFP4Quantizer(tex.DType.kFloat4E2M1, True, False)  # TE's positional order
    assert q.rowwise_usage and not q.columnwise_usage


def test_quantize_into_and_noop(device):
    tex = tex_module()
    q = nvq()
    x0 = uniform((64, 96), torch.bfloat16, device)
    out = q.make_empty((64, 96), dtype=torch.bfloat16, device=device)
    ptrs = [out._rowwise_data.data_ptr(), out._columnwise_scale_inv.data_ptr(), out._amax_rowwise.data_ptr()]
    res = tex.quantize(x0, q, output=out)
    assert res is out
    assert ptrs == [out._rowwise_data.data_ptr(), out._columnwise_scale_inv.data_ptr(), out._amax_rowwise.data_ptr()]
    check_nv(out, ref.quantize_nvfp4_ref(cpu(x0)), (64, 96), torch.bfloat16, "into")
    x1 = uniform((64, 96), torch.bfloat16, device, lo=-9, hi=9, g=torch.Generator().manual_seed(4))
    snap = [cpu(t).clone() for t in (out._rowwise_data, out._rowwise_scale_inv, out._columnwise_data,
                                      out._columnwise_scale_inv, out._amax_rowwise, out._amax_columnwise)]
    tex.quantize(x1, q, output=out, noop=torch.ones(1, device=device))
    now = [cpu(t) for t in (out._rowwise_data, out._rowwise_scale_inv, out._columnwise_data,
                            out._columnwise_scale_inv, out._amax_rowwise, out._amax_columnwise)]
    assert all(torch.equal(a, b) for a, b in zip(snap, now)), "noop = 1 must leave every buffer untouched"
    tex.quantize(x1, q, output=out, noop=torch.zeros(1, device=device))
    check_nv(out, ref.quantize_nvfp4_ref(cpu(x1)), (64, 96), torch.bfloat16, "into noop=0")
    # an output made elsewhere (separate amax tensors) gets an amax pair
    fresh = tex.quantize(x0, q)
    tex.quantize(x1, nvq(True, False), output=fresh)
    check_nv(fresh, ref.quantize_nvfp4_ref(cpu(x1), True, False), (64, 96), torch.bfloat16, "into rowwise",
             columnwise=False)


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------
def test_error_last_dim(device):
    tex = tex_module()
    x = torch.zeros(32, 24, device=device)
    with pytest.raises(ValueError, match=r"multiple of 16.*\[32, 24\].*Pad the last dim to 32"):
        tex.quantize(x, nvq())
    with pytest.raises(ValueError, match="multiple of 16"):
        tex.gelu(x, nvq())


def test_error_rows_columnwise(device):
    tex = tex_module()
    x = torch.zeros(20, 32, device=device)
    with pytest.raises(ValueError, match=r"M=20.*rowwise usage only"):
        tex.quantize(x, nvq())
    tex.quantize(x, nvq(True, False))  # rowwise-only accepts any M


def test_error_rht_dtype(device):
    tex = tex_module()
    for dtype, name in ((torch.float32, "Float"), (torch.float16, "Half")):
        with pytest.raises(TypeError, match=r"bfloat16 input only; got " + name + r" for quantized shape \[32, 32\]"):
            tex.quantize(torch.zeros(32, 32, dtype=dtype, device=device), nvq(with_rht=True))


def test_error_zero_dim(device):
    tex = tex_module()
    with pytest.raises(ValueError, match="0-d"):
        tex.quantize(torch.tensor(1.0, device=device), nvq(True, False))


def test_error_bad_config():
    tex = tex_module()
    with pytest.raises(ValueError, match="with_post_rht_amax"):
        tex.NVFP4Quantizer(with_rht=True)
    with pytest.raises(NotImplementedError, match="4over6|nvfp4_use_4over6"):
        tex.NVFP4Quantizer(nvfp4_use_4over6=True)
    with pytest.raises(NotImplementedError, match="row_scaled_nvfp4"):
        tex.NVFP4Quantizer(row_scaled_nvfp4=True)
    with pytest.raises(NotImplementedError, match="with_2d_quantization"):
        tex.NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, with_2d_quantization=True)
    with pytest.raises(ValueError, match="kFloat4E2M1"):
        tex.NVFP4Quantizer(tex.DType.kFloat8E4M3)
    with pytest.raises(ValueError, match="kFloat4E2M1"):
        torch.ops.te.quantize.default(torch.zeros(16, 16), 4, 7, True, True)


# ------------------------------------------------------------------------------------------------
# opcheck (torch.compile of every quantizer kind: test_opcheck_compile.py)
# ------------------------------------------------------------------------------------------------
def _nv_spec(rowwise=True, columnwise=True, flags=0, amax=None, noop=None):
    return (4, 10, rowwise, columnwise, flags, 0.0, 1, None, amax, noop)


def _opcheck_cases(device):
    x, xb, gu, gg, u8 = opcheck_inputs(device, 48, 64)
    return {
        "act_quantize-gelu": ("act_quantize", (x, 0, 7.0, 1.702, 1.0) + _nv_spec(), {}),
        "act_quantize-swiglu-2d-swizzled": ("act_quantize", (xb, 4, 7.0, 1.702, 1.0) + _nv_spec(flags=2 | 32), {}),
        "act_quantize-rht": ("act_quantize", (xb, 0, 7.0, 1.702, 1.0) + _nv_spec(flags=8 | 16), {}),
        "dact_quantize-dsilu-col": ("dact_quantize", (gu, x, 3, 7.0, 1.702, 1.0) + _nv_spec(False, True), {}),
        "dact_quantize-dgeglu": ("dact_quantize", (gg, xb, 1, 7.0, 1.702, 1.0) + _nv_spec(True, False), {}),
        "dbias_dact-drelu": ("dbias_dact", (gu, x, 5) + _nv_spec(), {}),
        "quantize": ("quantize", (xb,) + _nv_spec(), {}),
        "quantize-spec-defaults": ("quantize", (x, 4, 10, True, True), {}),
        "quantize-sr-seeded": ("quantize", (xb,) + _nv_spec(flags=4), dict(rng_seed=5, rng_offset=4)),
        "quantize-noop": ("quantize", (x,) + _nv_spec(noop=torch.zeros(1, device=device)), {}),
        "bgrad_quantize": ("bgrad_quantize", (xb,) + _nv_spec(), {}),
        "quantize_into": ("quantize_into", (x,) + _nv_spec(amax=torch.zeros(2, device=device)) +
                          (u8(48, 32), u8(128, 4), u8(64, 24), u8(128, 4)), {}),
    }


@pytest.mark.parametrize("case", list(_opcheck_cases("cpu")))
def test_opcheck(device, case):
    run_opcheck(_opcheck_cases(device)[case])


# ------------------------------------------------------------------------------------------------
# CUDA: CPU/CUDA byte parity (SPEC §1.1 item 1), CUDA graphs (item 6)
# ------------------------------------------------------------------------------------------------
def assert_nv_same(a, b, msg):
    for k in ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv", "_amax_rowwise",
              "_amax_columnwise"):
        ta, tb = getattr(a, k), getattr(b, k)
        assert (ta is None) == (tb is None), f"{msg} {k}"
        if ta is not None:
            assert torch.equal(cpu(ta), cpu(tb)), f"{msg} {k}"


PARITY_CONFIGS = [dict(), dict(with_2d_quantization=True), dict(with_rht=True),
                  dict(with_rht=True, with_random_sign_mask=False), dict(optimize=True)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("shape", SHAPES + [(48, 80), (4096, 1024)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_parity_quantize(shape, dtype):
    tex = tex_module()
    x = wide_random(shape, dtype)
    for cfg in PARITY_CONFIGS:
        if cfg.get("with_rht") and dtype != torch.bfloat16:
            continue
        cfg = dict(cfg)
        opt = cfg.pop("optimize", False)
        for usage in USAGES:
            q = nvq(*usage, **cfg)
            q.optimize_for_gemm = opt
            assert_nv_same(tex.quantize(x.cuda(), q), tex.quantize(x, q), f"{shape} {dtype} {cfg} {usage}")


@pytest.mark.cuda
def test_cuda_parity_ragged_and_structured():
    tex = tex_module()
    for x in (uniform((37, 64), torch.bfloat16), torch.full((32, 64), 65504.0, dtype=torch.float16),
              torch.zeros(48, 32), torch.zeros(0, 32)):
        rows_ok = x.shape[0] % 16 == 0
        for q in (nvq(True, rows_ok), nvq(True, rows_ok, with_2d_quantization=True)):
            assert_nv_same(tex.quantize(x.cuda(), q), tex.quantize(x, q), f"{tuple(x.shape)}")
    y = uniform((32, 32), torch.float32)
    y[0, 3] = float("nan")
    y[5, 20] = -float("inf")
    assert_nv_same(tex.quantize(y.cuda(), nvq()), tex.quantize(y, nvq()), "specials")


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", [dict(), dict(with_rht=True), dict(with_2d_quantization=True)],
                         ids=["1d", "rht", "2d"])
@pytest.mark.parametrize("shape", [(256, 272), (256, 512)], ids=["generic", "fast-tiles"])
def test_cuda_parity_sr_fixed_seed(cfg, shape):
    x = wide_random(shape, torch.bfloat16)
    q = nvq(stochastic_rounding=True, **cfg)
    assert_nv_same(quantize_seeded(x.cuda(), q), quantize_seeded(x, q), f"SR {cfg}")
    tex = tex_module()
    torch.manual_seed(3)
    a = tex.quantize(x.cuda(), q)
    torch.manual_seed(3)
    b = tex.quantize(x.cuda(), q)
    c = tex.quantize(x.cuda(), q)
    assert_nv_same(a, b, "manual_seed reproduces")
    assert not torch.equal(cpu(b._rowwise_data), cpu(c._rowwise_data))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_cuda_parity_activations(name, dtype):
    tex = tex_module()
    x = _act_input(name, dtype, rows=256)
    g = uniform(ref.out_shape(name, x.shape), dtype, g=torch.Generator().manual_seed(5))
    dname = ref.DACT_NAMES[name]
    for usage in USAGES:
        q = nvq(*usage)
        assert_nv_same(getattr(tex, name)(x.cuda(), q), getattr(tex, name)(x, q), f"{name} {dtype} {usage}")
        assert_nv_same(getattr(tex, dname)(g.cuda(), x.cuda(), q), getattr(tex, dname)(g, x, q), f"{dname} {dtype}")
    if dtype == torch.bfloat16:
        q = nvq(with_rht=True)
        assert_nv_same(getattr(tex, name)(x.cuda(), q), getattr(tex, name)(x, q), f"{name} RHT")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_cuda_parity_fused_tile_edges(name, dtype):
    """The fused CUDA kernels (rowwise stream; 128x64 tiles with both copies) at tile edges: rows not a multiple of
    128 or of 32 (the transposed copy then leaves byte by byte), positions not a multiple of 64, 3-D input, the
    gated backward's two outputs, swizzled scales; every usage, bytes equal to the CPU's."""
    tex = tex_module()
    gated = name == "swiglu"
    dname = ref.DACT_NAMES[name]
    for shape in [(48, 80), (144, 208), (2, 40, 96), (16, 16), (272, 64)]:
        xs = shape[:-1] + (2 * shape[-1],) if gated else shape
        x = wide_random(xs, dtype)
        g = uniform(shape, dtype, g=torch.Generator().manual_seed(13))
        for usage in USAGES:
            for opt in (False, True):
                q = nvq(*usage)
                q.optimize_for_gemm = opt
                msg = f"{name} {tuple(xs)} {dtype} {usage} swizzled={opt}"
                assert_nv_same(getattr(tex, name)(x.cuda(), q), getattr(tex, name)(x, q), msg)
                assert_nv_same(getattr(tex, dname)(g.cuda(), x.cuda(), q), getattr(tex, dname)(g, x, q), "d" + msg)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(256, 4096), (1024, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_parity_fused_many_tiles(shape):
    """Normal inputs over many column tiles (the benchmark's small shape and one with several tiles per block):
    CUDA bytes equal the CPU's for both copies and for the rowwise copy alone."""
    tex = tex_module()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(21)).to(torch.bfloat16)
    for usage in USAGES:
        q = nvq(*usage)
        assert_nv_same(tex.gelu(x.cuda(), q), tex.gelu(x, q), f"gelu {shape} {usage}")
        assert_nv_same(tex.quantize(x.cuda(), q), tex.quantize(x, q), f"quantize {shape} {usage}")


def _bf16_runs(shape, seed, run=8):
    """Every bf16 bit pattern (NaN, Inf, zeros and subnormals included) in shuffled runs of `run` consecutive codes,
    tiled to `shape`: 1x16 blocks inside the kernels' table range next to blocks that leave it."""
    g = torch.Generator().manual_seed(seed)
    runs = torch.arange(65536, dtype=torch.int32).reshape(-1, run)[torch.randperm(65536 // run, generator=g)].reshape(-1)
    n = math.prod(shape)
    return runs.repeat((n + 65535) // 65536)[:n].to(torch.int16).view(torch.bfloat16).reshape(shape)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["gelu", "qgelu", "silu"])
def test_cuda_parity_tables_forced(name, monkeypatch):
    """The bf16 table kernels of the fused path (TE_FORCE_TABLES=1 takes them at any size): every bf16 pattern (table
    blocks next to computed ones, so both encoders), normal inputs (block maxima near 6: the uncapped encoder), blocks
    of 80 positions (scale rows not a multiple of 4 blocks), and 8192 x 4096, where every resident block walks several
    double-buffered whole rounds; every usage, compact and swizzled scales, bytes equal to the CPU's."""
    monkeypatch.setenv("TE_FORCE_TABLES", "1")
    tex = tex_module()
    g = torch.Generator().manual_seed(31)
    big = torch.randn(8192, 4096, generator=g)
    big.view(-1)[::4099] = 0.0  # zeros: blocks off the table among table blocks
    every = [(u, o) for u in USAGES for o in (False, True)]
    cases = [(_bf16_runs((256, 1024), 7), every), (_bf16_runs((512, 80), 8, run=16), every),
             (torch.randn(512, 1024, generator=g), every), (big, [((True, False), False), ((True, True), False)])]
    for x, configs in cases:
        x = x.to(torch.bfloat16)
        for usage, opt in configs:
            q = nvq(*usage)
            q.optimize_for_gemm = opt
            msg = f"{name} {tuple(x.shape)} {usage} swizzled={opt}"
            assert_nv_same(getattr(tex, name)(x.cuda(), q), getattr(tex, name)(x, q), msg)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [512, 16384])  # 16384 x 128: dbias row blocks of 16 rows, summed in the fused tiles
@pytest.mark.parametrize("name", sorted(ref.DBIAS_NAMES))
def test_cuda_parity_dbias(name, rows):
    tex = tex_module()
    x = _act_input(ref.DBIAS_NAMES[name], torch.bfloat16, rows=rows)
    g = uniform(x.shape, torch.bfloat16, g=torch.Generator().manual_seed(9))
    gb_c, q_c = getattr(tex, name)(g.cuda(), x.cuda(), nvq())
    gb, qt = getattr(tex, name)(g, x, nvq())
    assert_nv_same(q_c, qt, name)
    assert ref.within_tol(cpu(gb_c).float(), gb.float(), 4 * ref.TOL[torch.bfloat16][0], 1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", [dict(), dict(with_rht=True), dict(with_2d_quantization=True)],
                         ids=["1d", "rht", "2d"])
def test_cuda_graph_quantize_nvfp4(cfg):
    """An NVFP4 quantize captured in a CUDA graph replays the eager bytes for new inputs; noop = 1 writes nothing."""
    tex = tex_module()
    q = nvq(**cfg)
    x_static = uniform((256, 384), torch.bfloat16, "cuda")
    out = tex.quantize(x_static, q)
    noop = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    graph, _ = capture_graph(lambda: tex.quantize(x_static, q, output=out, noop=noop))
    for step, x_new in replay_on_new_inputs(graph, x_static):
        assert_nv_same(out, tex.quantize(x_new.cpu(), q), f"graph step {step} vs cpu")
    snap = out.clone()
    x_static.mul_(2)
    noop.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert_nv_same(out, snap, "noop replay")


@pytest.mark.cuda
def test_cuda_graph_sr_replays_draw_fresh_bits():
    """Under capture the Philox (seed, offset) come from the graph-safe generator state: replays differ."""
    tex = tex_module()
    q = nvq(stochastic_rounding=True)
    x = uniform((128, 256), torch.bfloat16, "cuda")
    graph, out = capture_graph(lambda: tex.quantize(x, q))
    graph.replay()
    torch.cuda.synchronize()
    a = cpu(out._rowwise_data).clone()
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(a, cpu(out._rowwise_data))
