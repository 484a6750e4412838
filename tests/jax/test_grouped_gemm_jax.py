"""tej.grouped_gemm (the te_grouped_gemm FFI handler over the core's grouped GEMM): against a float64 loop over the
groups with the size rules of csrc/core/gemm/grouped_gemm.h, under jit; the same bytes as tex.grouped_gemm on the same
operand bytes (CPU here, CUDA in the tests marked cuda, where the call also runs inside an XLA command buffer with
its sizes changed between replays); trace-time errors."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
import transformer_engine_torch as tex  # noqa: E402
from tests import ref  # noqa: E402
from transformer_engine_jax import _ffi  # noqa: E402

pytestmark = pytest.mark.usefixtures("jax_on_cpu")
SM = tej.ScalingMode
SIZES = [37, 0, 50, -3, 60]  # sum of the positive sizes 147 < 160: rows 147.. are zeros


def ref64(x, w, sizes, kn):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    out = np.zeros((x.shape[0], w.shape[2] if kn else w.shape[1]))
    for g, a, b in ref.grouped_rows(sizes, x.shape[0])[0]:
        out[a:b] = x[a:b] @ (w[g] if kn else w[g].T)
    return out


def operands(m, n, k, g, dtype, kn, seed):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.uniform(-2, 2, (m, k)), dtype)
    w = jnp.asarray(rng.uniform(-2, 2, (g, k, n) if kn else (g, n, k)), dtype)
    return x, w


@pytest.mark.parametrize("kn", [False, True], ids=["NK", "KN"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_vs_float64_under_jit(kn, dtype):
    x, w = operands(160, 24, 32, len(SIZES), dtype, kn, 1)
    dims = ((1,), (1,)) if kn else ((1,), (2,))
    out = jax.jit(lambda a, b, s: tej.grouped_gemm(a, b, s, dims))(x, w, jnp.asarray(SIZES, jnp.int32))
    assert out.shape == (160, 24) and out.dtype == jnp.dtype(dtype)
    want = ref64(x.astype(jnp.float32), w.astype(jnp.float32), SIZES, kn)
    # The CPU kernel accumulates in FP64 and rounds once: within half an ulp of the output dtype.
    rtol = 2.0 ** -8 if dtype == jnp.bfloat16 else 2.0 ** -23
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=rtol, atol=1e-6)
    assert not np.asarray(out[ref.grouped_rows(SIZES, 160)[1]:], np.float64).any()


def to_torch(x):
    a = np.asarray(x)
    if a.dtype == jnp.bfloat16:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    if a.dtype.itemsize == 1:
        return torch.from_numpy(a.view(np.uint8).copy()).view(
            torch.float8_e4m3fn if a.dtype == jnp.float8_e4m3fn else torch.float8_e5m2)
    return torch.from_numpy(a.copy())


def same_bytes(a, b, what):
    assert np.asarray(a).view(np.uint8).tobytes() == b.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes(), \
        f"{what}: tej and tex bytes differ"


def parity_cases(device):
    jdev = jax.devices("cpu")[0] if device == "cpu" else jax.devices("gpu")[0]
    put = lambda v: jax.device_put(v, jdev)  # noqa: E731
    sizes = [64, 0, 128, 48, 16]
    gs = jnp.asarray(sizes, jnp.int32)
    ts = torch.tensor(sizes, dtype=torch.int32, device=device)
    cases = []
    for kn in (False, True):
        x, w = operands(256, 64, 128, 5, jnp.bfloat16, kn, 2)
        got = jax.jit(lambda a, b, s: tej.grouped_gemm(a, b, s, ((1,), (1,)) if kn else ((1,), (2,))))(
            put(x), put(w), put(gs))
        want = tex.grouped_gemm(to_torch(x).to(device), to_torch(w).to(device), ts, w_layout="KN" if kn else "NK")
        cases.append((f"bf16 {'KN' if kn else 'NK'}", got, want))
    for lhs_dt, split in ((jnp.float8_e4m3fn, True), (jnp.float8_e5m2, True), (jnp.float8_e4m3fn, False)):
        x, w = operands(256, 64, 128, 5, jnp.bfloat16, False, 3)
        ql = tej.QuantizerFactory.create(scaling_mode=SM.CURRENT_TENSOR_SCALING, q_dtype=lhs_dt,
                                         q_layout=tej.QuantizeLayout.ROWWISE)
        qr = tej.QuantizerFactory.create(scaling_mode=SM.CURRENT_TENSOR_SCALING, q_dtype=jnp.float8_e4m3fn,
                                         q_layout=tej.QuantizeLayout.ROWWISE)
        got = jax.jit(lambda a, b, s: tej.grouped_gemm(a, b, s, lhs_quantizer=ql, rhs_quantizer=qr,
                                                       use_split_accumulator=split))(
            put(x), put(w), put(gs))
        xq = tej.quantize(x, ql)
        wq = [tej.quantize(w[g], qr) for g in range(5)]
        want = tex.grouped_gemm(to_torch(xq.data).to(device), to_torch(jnp.stack([t.data for t in wq])).to(device),
                                ts, x_scale_inv=to_torch(xq.scale_inv).to(device),
                                w_scale_inv=to_torch(jnp.concatenate([t.scale_inv for t in wq])).to(device),
                                use_split_accumulator=split)
        cases.append((f"FP8 {jnp.dtype(lhs_dt).name} x e4m3 per-group scales split={split}", got, want))
    # FP8 blocks, natively (lhs 1x128, rhs 128x128 per group): each frontend quantizes the same bf16 bytes.
    x, w = operands(256, 192, 208, 5, jnp.bfloat16, False, 6)
    got = jax.jit(lambda a, b, s: tej.grouped_gemm(a, b, s, lhs_quantizer=block_q(SM.BLOCK_SCALING_1x128),
                                                   rhs_quantizer=block_q(SM.BLOCK_SCALING_128x128)))(
        put(x), put(w), put(gs))
    blk = lambda dim: tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False,  # noqa: E731
                                               block_scaling_dim=dim)
    want = tex.grouped_gemm(to_torch(x).to(device), to_torch(w).to(device), ts, x_quantizer=blk(1),
                            w_quantizer=blk(2))
    cases.append(("FP8 block 1x128 x 128x128", got, want))
    return cases


def block_q(mode, dtype=jnp.float8_e4m3fn):
    return tej.QuantizerFactory.create(scaling_mode=mode, q_dtype=dtype, q_layout=tej.QuantizeLayout.ROWWISE)


def test_bytes_equal_tex_cpu():
    for what, got, want in parity_cases("cpu"):
        same_bytes(got, want, what)


@pytest.mark.cuda
def test_bytes_equal_tex_cuda():
    jax.devices("gpu")
    for what, got, want in parity_cases("cuda"):
        same_bytes(got, want, what)


def test_fp8_vs_dequantized_float64():
    x, w = operands(160, 32, 64, len(SIZES), jnp.bfloat16, False, 4)
    w = w * jnp.asarray([1.0, 8.0, 0.125, 2.0, 32.0], jnp.bfloat16)[:, None, None]
    q = lambda: tej.QuantizerFactory.create(scaling_mode=SM.CURRENT_TENSOR_SCALING,  # noqa: E731
                                            q_dtype=jnp.float8_e4m3fn, q_layout=tej.QuantizeLayout.ROWWISE)
    out = tej.grouped_gemm(x, w, jnp.asarray(SIZES, jnp.int32), lhs_quantizer=q(), rhs_quantizer=q())
    xd = tej.quantize(x, q()).dequantize(jnp.float32)
    wd = jnp.stack([tej.quantize(w[g], q()).dequantize(jnp.float32) for g in range(len(SIZES))])
    want = ref64(xd, wd, SIZES, False)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2.0 ** -8, atol=1e-5)


@pytest.mark.parametrize("rhs_form", ["quantizer", "scaled_tensor"])
def test_fp8_block_native_vs_dequantized_float64(rhs_form):
    """FP8 blocks natively: lhs 1x128, rhs 128x128 tiles per group, given as a quantizer (each group quantized on its
    own) or as one [G, N, K] ScaledTensor with N a multiple of 128 (its tiles are the per-group ones); within the
    bf16 rounding of the float64 product of the dequantized operands, under jit."""
    rng = np.random.default_rng(7)
    sizes = [37, 0, 50, -3, 60]
    x = rng.uniform(-2, 2, (160, 256)) * np.exp2(rng.integers(-6, 7, (160, 2))).repeat(128, 1)
    w = rng.uniform(-2, 2, (5, 128, 256)) * np.exp2(rng.integers(-6, 7, (5, 1, 2))).repeat(128, 2)
    x, w = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
    ql, qr = block_q(SM.BLOCK_SCALING_1x128, jnp.float8_e5m2), block_q(SM.BLOCK_SCALING_128x128)
    if rhs_form == "quantizer":
        out = jax.jit(lambda a, b: tej.grouped_gemm(a, b, jnp.asarray(sizes, jnp.int32), lhs_quantizer=ql,
                                                    rhs_quantizer=qr))(x, w)
        wd = jnp.stack([tej.quantize(w[g], qr).dequantize(jnp.float32) for g in range(5)])
    else:
        wt = tej.quantize(w, qr)
        out = jax.jit(lambda a, b: tej.grouped_gemm(a, b, jnp.asarray(sizes, jnp.int32), lhs_quantizer=ql))(x, wt)
        wd = wt.dequantize(jnp.float32)
    want = ref64(tej.quantize(x, ql).dequantize(jnp.float32), wd, sizes, False)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2.0 ** -8, atol=1e-5 * np.abs(want).max())
    assert not np.asarray(out, np.float32)[147:].any()


def test_fp8_block_scale_shape_errors():
    """The core's planner names a block scale of the wrong shape (SPEC §4.8's padded shapes) and the pairing."""
    codes = [([150, 208], 7), ([3, 200, 208], 7), ([3], 2), ([2, 152], 4), ([3, 2, 4], 4)]  # 7: E4M3, 4: fp32
    plan = _ffi.plan_grouped_gemm(codes, False, 6, False, True)
    assert plan["out"][0] == [150, 200]
    bad_lhs = [codes[0], codes[1], codes[2], ([2, 150], 4), codes[4]]
    with pytest.raises(ValueError, match=r"lhs_scale_inv \(1x128 blocks along k\) as a contiguous float32 "
                                         r"\[2, 152\], got fp32 \[2, 150\]"):
        _ffi.plan_grouped_gemm(bad_lhs, False, 6, False, True)
    bad_rhs = [codes[0], codes[1], codes[2], codes[3], ([3, 2, 2], 4)]
    with pytest.raises(ValueError, match=r"rhs_scale_inv \(128x128 tiles per group\) as a contiguous float32 "
                                         r"\[3, 2, 4\]"):
        _ffi.plan_grouped_gemm(bad_rhs, False, 6, False, True)
    with pytest.raises(ValueError, match=r"rhs_scale_inv \(128x128 tiles per group\)"):  # 1x128 x per-group scale
        _ffi.plan_grouped_gemm([codes[0], codes[1], codes[2], codes[3], ([3], 4)], False, 6, False, True)


def test_edge_shapes():
    w = jnp.ones((3, 16, 32), jnp.bfloat16)
    assert tej.grouped_gemm(jnp.zeros((0, 32), jnp.bfloat16), w, jnp.zeros(3, jnp.int32)).shape == (0, 16)
    x = jnp.ones((24, 32), jnp.bfloat16)
    assert not np.asarray(tej.grouped_gemm(x, w, jnp.zeros(3, jnp.int32)), np.float32).any()
    out = tej.grouped_gemm(x, w, jnp.asarray([0, 24, 0], jnp.int32))
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.full((24, 16), 32.0, np.float32))
    over = tej.grouped_gemm(x, w * jnp.asarray([1, 2, 3], jnp.bfloat16)[:, None, None], jnp.asarray([20, 30, 5]))
    np.testing.assert_array_equal(np.asarray(over[:20], np.float32), 32.0)
    np.testing.assert_array_equal(np.asarray(over[20:], np.float32), 64.0)  # group 1 cut at M_total = 24


def test_errors_at_trace_time():
    x = jax.ShapeDtypeStruct((8, 32), jnp.bfloat16)
    gs = jax.ShapeDtypeStruct((2,), jnp.int32)
    trace = lambda f, *a: jax.jit(f).trace(*a)  # noqa: E731
    with pytest.raises(ValueError, match=r"contracting dims differ: lhs has k = 32, rhs 30"):
        trace(tej.grouped_gemm, x, jax.ShapeDtypeStruct((2, 16, 30), jnp.bfloat16), gs)
    with pytest.raises(ValueError, match=r"group_sizes must be a contiguous int32 \[2\]"):
        trace(tej.grouped_gemm, x, jax.ShapeDtypeStruct((2, 16, 32), jnp.bfloat16),
              jax.ShapeDtypeStruct((3,), jnp.int32))
    with pytest.raises(ValueError, match=r"contracting_dims .* must contract"):
        tej.grouped_gemm(jnp.ones((8, 32)), jnp.ones((2, 16, 32)), jnp.ones(2, jnp.int32), ((0,), (2,)))
    with pytest.raises(TypeError, match="both plain of one type, or both FP8"):
        trace(tej.grouped_gemm, x, jax.ShapeDtypeStruct((2, 16, 32), jnp.float32), gs)
    e5 = tej.ScaledTensor(jnp.zeros((8, 32), jnp.float8_e5m2), jnp.ones(1), None, None, None, None,
                          SM.CURRENT_TENSOR_SCALING, tej.QuantizeLayout.ROWWISE, (8, 32), jnp.bfloat16)
    w5 = tej.ScaledTensor(jnp.zeros((2, 16, 32), jnp.float8_e5m2), jnp.ones(1), None, None, None, None,
                          SM.CURRENT_TENSOR_SCALING, tej.QuantizeLayout.ROWWISE, (2, 16, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="E5M2 x E5M2 is not a valid FP8 GEMM"):
        tej.grouped_gemm(e5, w5, jnp.ones(2, jnp.int32))
    # CUDA's alignment rule, planned for CUDA (as a trace for a GPU does), also on a machine without one.
    with pytest.raises(ValueError, match=r"on CUDA, k·2 B and n·2 B must be multiples of 16 B \(k = 36, n = 16\)"):
        _ffi.plan_grouped_gemm([([8, 36], 6), ([2, 16, 36], 6), ([2], 2), ([0], 4), ([0], 4)], False, 6, True)


_CMD_BUFFER_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np, hashlib
import transformer_engine_jax as tej
rng = np.random.default_rng(0)
x = jnp.asarray(rng.uniform(-1, 1, (1024, 256)), jnp.bfloat16)
w = jnp.asarray(rng.uniform(-1, 1, (4, 128, 256)), jnp.bfloat16)
f = jax.jit(lambda x, w, s: jnp.sin(tej.grouped_gemm(x, w, s)) + 1.0)
h = hashlib.sha256()
for sizes in ([256, 256, 256, 256], [1024, 0, 0, 0], [0, 17, 700, 300]):
    for _ in range(2):
        h.update(np.asarray(f(x, w, jnp.asarray(sizes, jnp.int32))).view(np.uint8).tobytes())
print(h.hexdigest())
"""


@pytest.mark.cuda
def test_command_buffer_with_changing_sizes(same_bytes_with_command_buffers):
    """One compiled program, recorded into a command buffer (CUDA graph) with our call inside, run with three sets
    of sizes: the same bytes as without command buffers (the kernels read the sizes on the device each replay)."""
    same_bytes_with_command_buffers(_CMD_BUFFER_SCRIPT)


@pytest.mark.parametrize("mode", [SM.MXFP8_1D_SCALING, SM.BLOCK_SCALING_1x128], ids=["mxfp8", "fp8_block"])
def test_emulated_formats_equal_the_dequantized_bf16_call(mode):
    """MXFP8 / FP8 block: both operands' dequantized bf16 values through the bf16 grouped GEMM, the same bytes as
    calling it on them; and tex's emulation gives the same bytes."""
    x, w = operands(128, 64, 128, 3, jnp.bfloat16, False, 5)
    sizes = jnp.asarray([64, 0, 50], jnp.int32)
    q = lambda: tej.QuantizerFactory.create(scaling_mode=mode, q_dtype=jnp.float8_e4m3fn,  # noqa: E731
                                            q_layout=tej.QuantizeLayout.ROWWISE)
    got = tej.grouped_gemm(x, w, sizes, lhs_quantizer=q(), rhs_quantizer=q())
    xd = tej.quantize(x, q()).dequantize(jnp.bfloat16)
    wd = jnp.stack([tej.quantize(w[g], q()).dequantize(jnp.bfloat16) for g in range(3)])
    want = tej.grouped_gemm(xd, wd, sizes)
    assert np.asarray(got).view(np.uint16).tobytes() == np.asarray(want).view(np.uint16).tobytes()
    assert not np.array_equal(np.asarray(got, np.float32), np.asarray(tej.grouped_gemm(x, w, sizes), np.float32))
