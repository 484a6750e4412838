"""tex.grouped_gemm: the grouped GEMM with the group sizes on the device (csrc/core/gemm/grouped_gemm.h). References
are float64 products per group of the (dequantized) operands; the accuracy rule is test_gemm's (SPEC §9): at most
twice PyTorch's own low-precision error plus a small atol. The size rules (empty groups, negative sizes, sizes past
M_total, uncovered rows) are checked against a reference that applies them in Python; CUDA-graph replay with new
sizes written into the captured size tensor proves that the kernels read them on the device."""
import pytest
import torch

from tests import ref
from tests.torch.helpers import capture_graph, cpu, current_quantizer, tex_module, uniform

F64 = torch.float64
DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@pytest.fixture(scope="module")
def tex():
    return tex_module()


def rnd(shape, dtype, device, seed):
    return uniform(shape, dtype, device, g=torch.Generator().manual_seed(seed))


def reference(x, w, sizes, kn, dtype=None):
    """float64 grouped product; and PyTorch's own product in `dtype` on x's device (the error baseline)."""
    m = x.shape[0]
    n = w.shape[2] if kn else w.shape[1]
    r64 = torch.zeros(m, n, dtype=F64)
    base = torch.zeros(m, n, dtype=F64)
    x64, w64 = cpu(x).to(F64), cpu(w).to(F64)
    for g, a, b in ref.grouped_rows(sizes, m)[0]:
        wg = w64[g] if kn else w64[g].t()
        r64[a:b] = x64[a:b] @ wg
        if dtype is not None and b > a:
            wl = w[g].to(dtype) if kn else w[g].to(dtype).t()
            base[a:b] = cpu(x[a:b].to(dtype) @ wl).to(F64)
    return r64, base


def assert_grouped_close(ours, r64, base, dtype, msg=""):
    o = cpu(ours).to(F64)
    assert o.shape == r64.shape, f"{msg}: shape {tuple(o.shape)} != {tuple(r64.shape)}"
    if not o.numel():
        return
    err = (o - r64).abs().max().item()
    base_err = (base - r64).abs().max().item()
    atol = ref.TOL[dtype][1] + 1e-6 * r64.abs().max().item()
    assert err <= 2 * base_err + atol, f"{msg}: max err {err} > 2 x {base_err} + {atol}"
    if r64.abs().max().item() > 0 and r64.shape[1] > 1:
        assert (o - r64.flip(-1)).abs().max().item() > 2 * base_err + atol, f"{msg}: the check would not catch it"


SIZES = {
    "mixed": [37, 0, 64, 1, 0, 90],  # sum 192 = M_total
    "one_group": [0, 0, 192, 0, 0, 0],
    "short": [10, 20, 0, 30, 0, 5],  # sum 65 < 192: rows 65.. are zeros
    "over": [100, -7, 80, 50, 40, 30],  # negative counts as 0; the sum passes 192: cut at 192
}


@pytest.mark.parametrize("layout", ["NK", "KN"])
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("case", list(SIZES))
def test_grouped_vs_float64(tex, device, layout, dt, case):
    dtype, m, n, k, sizes = DT[dt], 192, 48, 64, SIZES[case]
    x = rnd((m, k), dtype, device, 1)
    w = rnd((len(sizes), k, n) if layout == "KN" else (len(sizes), n, k), dtype, device, 2)
    x[ref.grouped_rows(sizes, m)[1]:] = 7.0  # uncovered rows hold values, so a kernel reading them would show
    out = tex.grouped_gemm(x, w, torch.tensor(sizes, dtype=torch.int32, device=device), w_layout=layout)
    assert out.dtype == dtype and out.device.type == device
    r64, base = reference(x, w, sizes, layout == "KN", dtype)
    assert_grouped_close(out, r64, base, dtype, f"{case} {dt} {layout}")
    covered = ref.grouped_rows(sizes, m)[1]
    assert torch.count_nonzero(cpu(out)[covered:]) == 0, "rows past the groups must be zeros"


def test_grouped_equals_loop_of_single_gemms(tex, device):
    """Each group's rows equal a single GEMM of that group (tex.general_gemm) — bit for bit on the CPU, where both are
    the exact kernel; within the GEMM rule on CUDA (a CUTLASS kernel against cuBLASLt: different K orders)."""
    sizes = [33, 0, 71, 24]
    dtype, k, n = torch.bfloat16, 64, 40
    m = sum(sizes)
    x, w = rnd((m, k), dtype, device, 3), rnd((4, n, k), dtype, device, 4)
    out = tex.grouped_gemm(x, w, offsets=torch.tensor(sizes, device=device).cumsum(0))
    for g, a, b in ref.grouped_rows(sizes, m)[0]:
        if b == a:
            continue
        single = tex.general_gemm(w[g], x[a:b], out_dtype=dtype)[0]
        if device == "cpu":
            assert torch.equal(out[a:b], single), f"group {g}"
        else:
            r64, base = reference(x[a:b], w[g:g + 1], [b - a], False, dtype)
            assert_grouped_close(out[a:b], r64, base, dtype, f"group {g}")


@pytest.mark.parametrize("split", [True, False], ids=["split", "fast"])
@pytest.mark.parametrize("pair", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")])
def test_grouped_fp8_per_group_scales(tex, device, pair, split):
    """FP8 per tensor: x one scale, each expert's weight its own (w_quantizer quantizes every group apart); within the
    E4M3 tolerance of the float64 product of the dequantized operands."""
    sizes = [40, 0, 56, 32]
    m, n, k = sum(sizes), 32, 64
    x = rnd((m, k), torch.bfloat16, device, 5)
    w = rnd((4, n, k), torch.bfloat16, device, 6) * torch.tensor([1.0, 4.0, 0.25, 16.0], device=device).view(4, 1, 1)
    xq = current_quantizer(pair[0], columnwise=False)
    wq = current_quantizer(pair[1], columnwise=False)
    out = tex.grouped_gemm(x, w, torch.tensor(sizes, dtype=torch.int32, device=device), x_quantizer=xq,
                           w_quantizer=wq, use_split_accumulator=split)
    assert out.dtype == torch.bfloat16
    xd = tex.quantize(x, xq).dequantize(torch.float32)
    wd = torch.stack([tex.quantize(w[g], wq).dequantize(torch.float32) for g in range(4)])
    r64, base = reference(xd, wd, sizes, False, torch.bfloat16)
    assert_grouped_close(out, r64, base, torch.bfloat16, f"FP8 {pair}")
    # The same bytes given as codes + scale_inv.
    wt = [tex.quantize(w[g], wq) for g in range(4)]
    codes = torch.stack([t._data for t in wt]).view(FP8[pair[1]])
    again = tex.grouped_gemm(tex.quantize(x, xq), codes, torch.tensor(sizes, dtype=torch.int32, device=device),
                             w_scale_inv=torch.cat([t._scale_inv for t in wt]), use_split_accumulator=split)
    assert torch.equal(again, out)


def test_grouped_empty_shapes(tex, device):
    x = torch.zeros(0, 32, dtype=torch.bfloat16, device=device)
    w = rnd((3, 16, 32), torch.bfloat16, device, 7)
    out = tex.grouped_gemm(x, w, torch.zeros(3, dtype=torch.int32, device=device))
    assert out.shape == (0, 16)
    x = rnd((24, 32), torch.bfloat16, device, 8)
    out = tex.grouped_gemm(x, w, torch.zeros(3, dtype=torch.int32, device=device))
    assert out.shape == (24, 16) and torch.count_nonzero(out) == 0


def test_grouped_errors(tex):
    x = torch.zeros(8, 32, dtype=torch.bfloat16)
    w = torch.zeros(2, 16, 32, dtype=torch.bfloat16)
    sizes = torch.tensor([4, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"contracting dims differ: lhs has k = 32, rhs 30.*rhs \[2, 16, 30\]"):
        tex.grouped_gemm(x, w[:, :, :30], sizes)
    with pytest.raises(ValueError, match=r"group_sizes must be a contiguous int32 \[2\]"):
        tex.grouped_gemm(x, w, torch.tensor([4, 2, 2], dtype=torch.int32))
    with pytest.raises(TypeError, match="both plain of one type, or both FP8"):
        tex.grouped_gemm(x, w.half(), sizes)
    e5 = torch.zeros(8, 32, dtype=torch.float8_e5m2)
    s1 = torch.ones(1)
    with pytest.raises(ValueError, match=r"E5M2 x E5M2 is not a valid FP8 GEMM"):
        tex.grouped_gemm(e5, torch.zeros(2, 16, 32, dtype=torch.float8_e5m2), sizes, x_scale_inv=s1,
                         w_scale_inv=torch.ones(2))
    e4w = torch.zeros(2, 32, 16, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"FP8 grouped GEMM takes rhs as \[groups, n, k\] only"):
        tex.grouped_gemm(e5, e4w, sizes, x_scale_inv=s1, w_scale_inv=torch.ones(2), w_layout="KN")
    with pytest.raises(ValueError, match=r"rhs_scale_inv as a contiguous float32 \[2\] \(one per group\)"):
        tex.grouped_gemm(e5, e4w.transpose(1, 2), sizes, x_scale_inv=s1, w_scale_inv=torch.ones(1))
    with pytest.raises(ValueError, match="exactly one of group_sizes and offsets"):
        tex.grouped_gemm(x, w)
    with pytest.raises(TypeError, match="int32 or int64"):
        tex.grouped_gemm(x, w, torch.tensor([4.0, 4.0]))


@pytest.mark.cuda
def test_grouped_cuda_misaligned_k(tex):
    x = torch.zeros(8, 36, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(2, 16, 36, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"multiples of 16 B \(k = 36, n = 16\)"):
        tex.grouped_gemm(x, w, torch.tensor([4, 4], dtype=torch.int32, device="cuda"))


def replays_match_eager(call, sizes, size_lists, check=None):
    """Captures call() once in a CUDA graph; then, for each list of group sizes, copies it into `sizes` (the int32
    tensor the call reads on the device), replays, and asserts the replayed output equals an eager call() bit for
    bit; check(list, output), when given, then runs on it. Returns the captured output (the last replay's)."""
    graph, out = capture_graph(call)
    for new in size_lists:
        sizes.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        eager = call()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), new
        if check is not None:
            check(new, out)
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_grouped_cuda_graph_reads_sizes_on_device(tex, fp8):
    """Captured once; new sizes copied into the captured size tensor change the replayed result (nothing was read on
    the host at capture), and each replay equals an eager call with those sizes, bit for bit."""
    m, n, k = 512, 128, 256
    x = rnd((m, k), torch.bfloat16, "cuda", 9)
    w = rnd((4, n, k), torch.bfloat16, "cuda", 10)
    kw = {}
    if fp8:
        xq, wq = current_quantizer("e4m3", columnwise=False), current_quantizer("e4m3", columnwise=False)
        xt = tex.quantize(x, xq)
        wt = [tex.quantize(w[g], wq) for g in range(4)]
        x = xt._data.view(torch.float8_e4m3fn)
        w = torch.stack([t._data for t in wt]).view(torch.float8_e4m3fn)
        kw = dict(x_scale_inv=xt._scale_inv, w_scale_inv=torch.cat([t._scale_inv for t in wt]))
    sizes = torch.tensor([128, 128, 128, 128], dtype=torch.int32, device="cuda")
    out = replays_match_eager(lambda: tex.grouped_gemm(x, w, sizes, **kw), sizes,
                              ([512, 0, 0, 0], [0, 300, 0, 100], [17, 0, 255, 240]))
    assert torch.count_nonzero(out[17 + 255 + 240:]) == 0


@pytest.mark.cuda
def test_grouped_cuda_large_uses_tensor_cores_and_is_right(tex):
    """A MoE-sized call (16 experts, skewed sizes with empty ones) on the CUTLASS kernel, against float64."""
    g, n, k = 16, 256, 512
    sizes = [300, 0, 17, 1024, 0, 64, 128, 1, 511, 0, 256, 77, 600, 3, 200, 116]
    m = sum(sizes)
    x, w = rnd((m, k), torch.bfloat16, "cuda", 11), rnd((g, n, k), torch.bfloat16, "cuda", 12)
    out = tex.grouped_gemm(x, w, torch.tensor(sizes, dtype=torch.int32, device="cuda"))
    r64, base = reference(x, w, sizes, False, torch.bfloat16)
    assert_grouped_close(out, r64, base, torch.bfloat16, "MoE bf16")


def test_grouped_opcheck():
    tex_module()
    x = rnd((24, 32), torch.bfloat16, "cpu", 13)
    w = rnd((3, 16, 32), torch.bfloat16, "cpu", 14)
    sizes = torch.tensor([8, 0, 16], dtype=torch.int32)
    torch.library.opcheck(torch.ops.te.grouped_gemm.default, (x, w, sizes, None, None, 6, 6, False, 6))


def wgrad_reference(dy, x, sizes, dtype):
    """float64 dw[g] = dy rowsᵀ · x rows, and PyTorch's own product in `dtype` (the error baseline)."""
    g_count, m = len(sizes), dy.shape[0]
    r64 = torch.zeros(g_count, dy.shape[1], x.shape[1], dtype=F64)
    base = torch.zeros_like(r64)
    for g, a, b in ref.grouped_rows(sizes, m)[0]:
        r64[g] = cpu(dy[a:b]).to(F64).t() @ cpu(x[a:b]).to(F64)
        if b > a:
            base[g] = cpu(dy[a:b].t() @ x[a:b]).to(F64)
    return r64, base


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("case", ["mixed", "short", "over"])
def test_grouped_wgrad_vs_float64(tex, device, dt, case):
    """dw[g] = dy[rows of g]ᵀ · x[rows of g] with the same size rules; a group without rows gives zeros."""
    dtype, m, n, k, sizes = DT[dt], 192, 48, 64, SIZES[case]
    dy, x = rnd((m, n), dtype, device, 15), rnd((m, k), dtype, device, 16)
    out = tex.grouped_gemm_wgrad(dy, x, torch.tensor(sizes, dtype=torch.int32, device=device))
    assert out.shape == (len(sizes), n, k) and out.dtype == dtype
    r64, base = wgrad_reference(dy, x, sizes, dtype)
    for g in range(len(sizes)):
        if ref.grouped_rows(sizes, m)[0][g][2] == ref.grouped_rows(sizes, m)[0][g][1]:
            assert torch.count_nonzero(out[g]) == 0, f"group {g} has no rows: zeros"
        else:
            assert_grouped_close(out[g], r64[g], base[g], dtype, f"wgrad {case} group {g}")


def test_grouped_wgrad_errors(tex):
    dy = torch.zeros(8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"contracting \(grouped row\) dims differ: lhs has 8 rows, rhs 6"):
        tex.grouped_gemm_wgrad(dy, torch.zeros(6, 32, dtype=torch.bfloat16), torch.tensor([4, 4], dtype=torch.int32))
    with pytest.raises(TypeError, match="must be a bf16, fp16 or fp32 tensor"):
        tex.grouped_gemm_wgrad(dy.to(torch.float8_e4m3fn), torch.zeros(8, 32), torch.tensor([8], dtype=torch.int32))


@pytest.mark.cuda
def test_grouped_wgrad_cuda_graph(tex):
    m, n, k = 512, 128, 256
    dy, x = rnd((m, n), torch.bfloat16, "cuda", 17), rnd((m, k), torch.bfloat16, "cuda", 18)
    sizes = torch.tensor([128, 128, 128, 128], dtype=torch.int32, device="cuda")
    def against_reference(new, out):
        r64, base = wgrad_reference(dy, x, new, torch.bfloat16)
        for g in range(4):
            assert_grouped_close(out[g], r64[g], base[g], torch.bfloat16, f"wgrad replay {new} group {g}")

    replays_match_eager(lambda: tex.grouped_gemm_wgrad(dy, x, sizes), sizes,
                        ([512, 0, 0, 0], [0, 300, 0, 100], [17, 0, 255, 240]), against_reference)


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8_block"])
def test_grouped_emulated_formats(tex, device, fmt):
    """MXFP8 / FP8 block operands: both dequantized to bf16, then the bf16 grouped GEMM (the same bytes as calling it
    on the dequantized values)."""
    sizes = [64, 0, 50]
    x, w = rnd((128, 128), torch.bfloat16, device, 19), rnd((3, 64, 128), torch.bfloat16, device, 20)
    q = (lambda: tex.MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)) if fmt == "mxfp8" else \
        (lambda: tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False, block_scaling_dim=1))
    ts = torch.tensor(sizes, dtype=torch.int32, device=device)
    got = tex.grouped_gemm(x, w, ts, x_quantizer=q(), w_quantizer=q())
    xd = tex.quantize(x, q()).dequantize(torch.bfloat16)
    wd = torch.stack([tex.quantize(w[g], q()).dequantize(torch.bfloat16) for g in range(3)])
    assert torch.equal(got, tex.grouped_gemm(xd, wd, ts))
    assert not torch.equal(got, tex.grouped_gemm(x, w, ts))


def block_quantizer(fmt, dim):
    return tex_module().Float8BlockQuantizer(tex_module().DType.kFloat8E4M3 if fmt == "e4m3" else
                                             tex_module().DType.kFloat8E5M2, rowwise=True, columnwise=False,
                                             block_scaling_dim=dim)


def block_spread(shape, device, seed):
    """Values whose magnitude changes by powers of two from one 128-block (x: per row and k block; w: per 128x128
    tile) to the next, so that a block read with the wrong scale is far off."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-6, 7, shape, generator=g).to(torch.float32)
    return torch.exp2(e).to(device)


@pytest.mark.parametrize("shape", [(160, 256, 384), (150, 200, 208)], ids=["whole_blocks", "partial_blocks"])
@pytest.mark.parametrize("pair", [("e4m3", "e4m3"), ("e5m2", "e4m3")])
def test_grouped_fp8_block_native(tex, device, pair, shape):
    """FP8 blocks natively: x with 1x128 blocks, each expert's weight with 128x128 tiles (quantized per group). Every
    block's two scales are applied (CUTLASS's blockwise kernel on CUDA, the exact decode on the CPU): within the bf16
    rule of the float64 product of the dequantized operands, groups starting inside 128-row and 4-row scale blocks,
    partial k blocks and n tiles, padded scale tensors and an empty group included."""
    m, n, k = shape
    sizes = [41, 0, 57, m - 41 - 57 - 9]  # 9 rows past the sum: zeros
    x = rnd((m, k), torch.bfloat16, device, 21)
    x = (x.float() * block_spread((m, (k + 127) // 128), device, 22).repeat_interleave(128, 1)[:, :k]).bfloat16()
    w = rnd((4, n, k), torch.bfloat16, device, 23)
    tiles = block_spread((4, (n + 127) // 128, (k + 127) // 128), device, 24)
    w = (w.float() * tiles.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :k]).bfloat16()
    xq, wq = block_quantizer(pair[0], 1), block_quantizer(pair[1], 2)
    ts = torch.tensor(sizes, dtype=torch.int32, device=device)
    out = tex.grouped_gemm(x, w, ts, x_quantizer=xq, w_quantizer=wq)
    assert out.dtype == torch.bfloat16
    xd = tex.quantize(x, xq).dequantize(torch.float32)
    wd = torch.stack([tex.quantize(w[g], wq).dequantize(torch.float32) for g in range(4)])
    r64, base = reference(xd, wd, sizes, False, torch.bfloat16)
    assert_grouped_close(out, r64, base, torch.bfloat16, f"FP8 block {pair} {shape}")
    assert torch.count_nonzero(out[m - 9:]) == 0
    # Quantized tensors given directly: the same call, the same bytes.
    again = tex.grouped_gemm(tex.quantize(x, xq), [tex.quantize(w[g], wq) for g in range(4)], ts)
    assert torch.equal(again, out)
    if n % 128 == 0:  # one quantized [G, N, K] tensor: its 128x128 tiles are the per-group ones, used as stored
        assert torch.equal(tex.grouped_gemm(tex.quantize(x, xq), tex.quantize(w, wq), ts), out)


@pytest.mark.cuda
def test_grouped_fp8_block_cuda_graph(tex):
    """The block kernel (scale layout prep, problem table, grouped kernel) captured once and replayed with new sizes:
    each replay equals an eager call bit for bit."""
    m, n, k = 384, 256, 512
    x, w = rnd((m, k), torch.bfloat16, "cuda", 25), rnd((4, n, k), torch.bfloat16, "cuda", 26)
    xt = tex.quantize(x, block_quantizer("e4m3", 1))
    wt = [tex.quantize(w[g], block_quantizer("e4m3", 2)) for g in range(4)]
    sizes = torch.tensor([96, 96, 96, 96], dtype=torch.int32, device="cuda")
    replays_match_eager(lambda: tex.grouped_gemm(xt, wt, sizes), sizes,
                        ([384, 0, 0, 0], [0, 200, 0, 100], [17, 0, 255, 100]))
