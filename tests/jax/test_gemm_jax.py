"""tej.gemm (transformer_engine_jax/gemm.py, the te_gemm FFI handler over the core's GEMM op): layouts, N-D operands,
FP8 pairs, epilogues vs float64 references; the same bytes as tex.general_gemm on the same operand bytes (CPU here,
CUDA in the tests marked cuda); trace-time errors for bad calls."""
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
import transformer_engine_torch as tex  # noqa: E402

SM = tej.ScalingMode
F64 = np.float64
# SPEC §9 tolerances (rtol, atol).
TOL = {jnp.dtype(jnp.float32): (1.3e-6, 1e-5), jnp.dtype(jnp.bfloat16): (1.6e-2, 1e-5),
       jnp.dtype(jnp.float16): (1e-3, 1e-5)}
E4M3_TOL = (0.125, 0.0675)
# tej.gemm's contracting_dims of each layout name (tex's transA + transB): TN = lhs [M, K] x rhs [N, K] (fprop),
# NN = lhs [M, K] x rhs [K, N], NT = lhs [K, M] x rhs [K, N] (wgrad), TT = lhs [K, M] x rhs [N, K].
LAYOUTS = {"TN": ((1,), (1,)), "NN": ((1,), (0,)), "NT": ((0,), (0,)), "TT": ((0,), (1,))}


# CPU tests run on jax's CPU device, also where the default device is a GPU (tests/jax/conftest.py); the tests
# marked cuda place their arrays themselves.
pytestmark = pytest.mark.usefixtures("jax_on_cpu")


def operands(layout, m, k, n, dtype, seed=0):
    """lhs, rhs for `layout` with out [m, n] and contraction k, values from N(0, 1) * 2 rounded to `dtype`."""
    r = np.random.default_rng(seed)
    lhs_shape = (m, k) if layout[1] == "N" else (k, m)
    rhs_shape = (n, k) if layout[0] == "T" else (k, n)
    lhs = jnp.asarray(r.standard_normal(lhs_shape) * 2, jnp.float32).astype(dtype)
    rhs = jnp.asarray(r.standard_normal(rhs_shape) * 2, jnp.float32).astype(dtype)
    return lhs, rhs


def ref(lhs, rhs, dims):
    return np.tensordot(np.asarray(lhs, F64), np.asarray(rhs, F64), dims)


def assert_close(got, want, tol, what=""):
    got = np.asarray(jnp.asarray(got, jnp.float32), F64)
    rtol, atol = tol
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def gelu64(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def dgelu64(x):
    t = np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x)


# ---- plain operands ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mkn", [(64, 32, 64), (33, 17, 45)], ids=["64x32x64", "33x17x45"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_vs_float64(layout, mkn, dtype):
    m, k, n = mkn
    lhs, rhs = operands(layout, m, k, n, dtype)
    dims = LAYOUTS[layout]
    out = jax.jit(lambda a, b: tej.gemm(a, b, dims))(lhs, rhs)
    assert out.shape == (m, n) and out.dtype == jnp.dtype(dtype)
    assert_close(out, ref(lhs, rhs, dims), TOL[jnp.dtype(dtype)], layout)
    # A wrong answer fails: the product with one operand negated.
    with pytest.raises(AssertionError):
        assert_close(out, -ref(lhs, rhs, dims), TOL[jnp.dtype(dtype)])


@pytest.mark.parametrize("case", [
    ((2, 3, 32), (32, 16), ((2,), (0,))),          # batch dims flattened into M
    ((4, 8, 16), (4, 8, 24), ((0, 1), (0, 1))),    # K over two leading dims of both
    ((8, 32, 4), (16, 32), ((1,), (1,))),          # a middle contracting dim: lhs transposed by XLA
    ((5, 6, 7), (7, 6, 3), ((2, 1), (0, 1))),      # two dims paired out of memory order
])
def test_nd_operands(case):
    lhs_shape, rhs_shape, dims = case
    r = np.random.default_rng(1)
    lhs = jnp.asarray(r.standard_normal(lhs_shape), jnp.float32)
    rhs = jnp.asarray(r.standard_normal(rhs_shape), jnp.float32)
    out = tej.gemm(lhs, rhs, dims)
    want = ref(lhs, rhs, dims)
    assert out.shape == want.shape
    assert_close(out, want, TOL[jnp.dtype(jnp.float32)])


def test_float16():
    lhs, rhs = operands("NN", 48, 40, 24, jnp.float16, 2)
    assert_close(tej.gemm(lhs, rhs), ref(lhs, rhs, LAYOUTS["NN"]), TOL[jnp.dtype(jnp.float16)])


# ---- FP8 --------------------------------------------------------------------------------------------------------
FP8_PAIRS = [(jnp.float8_e4m3fn, jnp.float8_e4m3fn), (jnp.float8_e4m3fn, jnp.float8_e5m2),
             (jnp.float8_e5m2, jnp.float8_e4m3fn)]


def quantizer(mode, dtype=jnp.float8_e4m3fn, layout=tej.QuantizeLayout.ROWWISE_COLWISE, scale=None):
    q = tej.QuantizerFactory.create(scaling_mode=mode, q_dtype=dtype, q_layout=layout, amax_history_len=4)
    if scale is not None:
        q = q.__class__.tree_unflatten(q.tree_flatten()[1], (jnp.full((1,), scale, jnp.float32),
                                                             jnp.zeros((4,), jnp.float32)))
    return q


@pytest.mark.parametrize("pair", FP8_PAIRS, ids=["e4m3xe4m3", "e4m3xe5m2", "e5m2xe4m3"])
@pytest.mark.parametrize("mode", [SM.DELAYED_TENSOR_SCALING, SM.CURRENT_TENSOR_SCALING], ids=lambda m: m.name)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fp8_vs_dequantized_float64(layout, mode, pair):
    """Every layout runs as TN (each operand's copy with K last, SPEC §6.4), within the E4M3 tolerance of the
    float64 product of the dequantized operands (exactly its bf16 rounding on the CPU)."""
    lhs, rhs = operands(layout, 32, 64, 48, jnp.bfloat16, 3)
    scale = 0.75 if mode == SM.DELAYED_TENSOR_SCALING else None
    ql, qr = tej.quantize(lhs, quantizer(mode, pair[0], scale=scale)), tej.quantize(rhs, quantizer(mode, pair[1], scale=scale))
    dims = LAYOUTS[layout]
    out = jax.jit(lambda a, b: tej.gemm(a, b, dims))(ql, qr)
    assert out.shape == (32, 48) and out.dtype == jnp.bfloat16
    want = ref(ql.dequantize(jnp.float32), qr.dequantize(jnp.float32), dims)
    assert_close(out, want, E4M3_TOL, f"{layout} {mode.name}")
    assert_close(out, want, TOL[jnp.dtype(jnp.bfloat16)], "CPU: one bf16 rounding of the exact product")
    # The quantizers' path: plain operands quantized inside tej.gemm give the same bytes.
    again = tej.gemm(lhs, rhs, dims, quantizer(mode, pair[0], scale=scale), quantizer(mode, pair[1], scale=scale))
    assert np.asarray(again).tobytes() == np.asarray(out).tobytes()


def test_fp8_nd_scaled_operands():
    """A 3-D ScaledTensor: the rowwise copy for its trailing dims, the colwise copy for its leading dims."""
    r = np.random.default_rng(4)
    x = jnp.asarray(r.standard_normal((2, 16, 32)), jnp.bfloat16)
    w = jnp.asarray(r.standard_normal((32, 48)), jnp.bfloat16)
    q = quantizer(SM.CURRENT_TENSOR_SCALING)
    qx, qw = tej.quantize(x, q), tej.quantize(w, q)
    out = tej.gemm(qx, qw, ((2,), (0,)))
    assert out.shape == (2, 16, 48)
    assert_close(out, ref(qx.dequantize(jnp.float32), qw.dequantize(jnp.float32), ((2,), (0,))), E4M3_TOL)
    both = tej.gemm(qx, qx, ((0, 1), (0, 1)))  # K = 32 over the leading dims of both: the colwise copies
    assert both.shape == (32, 32)
    deq = qx.dequantize(jnp.float32)
    assert_close(both, ref(deq, deq, ((0, 1), (0, 1))), E4M3_TOL)
    flat = tej.gemm(qw, qx, ((0,), (2,)))  # w [32, 48] contracted over dim 0: its colwise copy [48, 32]
    assert flat.shape == (48, 2, 16)


# ---- epilogues --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["NN", "TN"])
def test_bias_and_gelu_epilogues(layout):
    m, k, n = 33, 40, 48
    lhs, rhs = operands(layout, m, k, n, jnp.bfloat16, 5)
    bias = jnp.asarray(np.random.default_rng(6).standard_normal(n), jnp.bfloat16)
    dims = LAYOUTS[layout]
    pre64 = ref(lhs, rhs, dims) + np.asarray(bias, F64)
    tol = TOL[jnp.dtype(jnp.bfloat16)]
    assert_close(jax.jit(lambda a, b, c: tej.gemm(a, b, dims, bias=c))(lhs, rhs, bias), pre64, tol, "bias")
    out, pre = jax.jit(lambda a, b, c: tej.gemm(a, b, dims, bias=c, fuse_gelu=True))(lhs, rhs, bias)
    assert pre.shape == out.shape == (m, n) and pre.dtype == jnp.bfloat16
    assert_close(pre, pre64, tol, "pre-GELU aux")
    assert_close(out, gelu64(pre64), (tol[0], 1e-2), "GELU")
    out_nb, pre_nb = tej.gemm(lhs, rhs, dims, fuse_gelu=True)
    assert_close(pre_nb, ref(lhs, rhs, dims), tol, "aux without bias")


def test_dgelu_and_bias_grad_epilogues():
    m, k, n = 32, 24, 40
    dy, w = operands("NN", m, k, n, jnp.float32, 7)
    gelu_in = jnp.asarray(np.random.default_rng(8).standard_normal((m, n)), jnp.float32)
    prod = ref(dy, w, LAYOUTS["NN"])
    want = prod * dgelu64(np.asarray(gelu_in, F64))
    out = tej.gemm(dy, w, gelu_input=gelu_in)
    assert_close(out, want, (1e-5, 1e-5), "dGELU")
    out, bgrad = tej.gemm(dy, w, gelu_input=gelu_in, bias_grad=True)
    assert bgrad.shape == (n,)
    assert_close(bgrad, want.sum(0), (1e-5, 1e-4), "dGELU bias grad")
    # Without gelu_input: the wgrad bias gradient, Σ over K of lhs (lhs = dY [T, out] contracted over T).
    x = jnp.asarray(np.random.default_rng(9).standard_normal((m, 16)), jnp.float32)
    dw, db = tej.gemm(dy, x, ((0,), (0,)), bias_grad=True)
    assert dw.shape == (k, 16) and db.shape == (k,)
    assert_close(dw, ref(dy, x, ((0,), (0,))), TOL[jnp.dtype(jnp.float32)])
    assert_close(db, np.asarray(dy, F64).sum(0), (1e-6, 1e-4), "wgrad bias grad")


# ---- the same bytes as the torch frontend -------------------------------------------------------------------------
def to_torch(x):
    a = np.asarray(x)
    if a.dtype.itemsize == 1:
        return torch.from_numpy(a.view(np.uint8).copy())
    if a.dtype == jnp.bfloat16:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def torch_fp8(st, device="cpu"):
    """A tex Float8Tensor holding the ScaledTensor's bytes (both copies)."""
    code = tex.DType.kFloat8E4M3 if st.data.dtype == jnp.float8_e4m3fn else tex.DType.kFloat8E5M2
    return tex.Float8Tensor(shape=tuple(st.shape), dtype=torch.bfloat16, data=to_torch(st.data).to(device),
                            fp8_scale_inv=to_torch(st.scale_inv).to(device), fp8_dtype=code,
                            data_transpose=to_torch(st.colwise_data).to(device))


def tex_gemm(lhs_t, rhs_t, layout, device, **kw):
    """tex's GEMM of the same call: D = op(B)·op(A) with A = rhs, B = lhs (the layout string is transA + transB)."""
    ws = torch.empty(32 * 1024 * 1024 + 1024, dtype=torch.uint8, device=device)  # tej's cuBLASLt workspace size
    return tex.generic_gemm(rhs_t, layout[0] == "T", lhs_t, layout[1] == "T", None, None, kw.get("out_dtype"),
                            kw.get("bias"), kw.get("bias_type"), kw.get("gelu", False), kw.get("gelu_in"),
                            kw.get("grad", False), ws, ws.numel(), False, kw.get("split", True))


def same_bytes(a, b, what):
    a = np.asarray(a).view(np.uint8).tobytes()
    b = b.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    assert a == b, f"{what}: tej and tex bytes differ"


def parity_cases(device):
    """(what, tej result(s), tex result(s)) for plain, FP8 and epilogue calls on `device` ('cpu' or 'cuda')."""
    jdev = jax.devices("cpu")[0] if device == "cpu" else jax.devices("gpu")[0]
    put = lambda x: jax.device_put(x, jdev)  # noqa: E731
    cases = []
    for layout in LAYOUTS:
        for dtype in (jnp.bfloat16, jnp.float32):
            lhs, rhs = operands(layout, 48, 64, 32, dtype, 10)
            got = jax.jit(lambda a, b: tej.gemm(a, b, LAYOUTS[layout]))(put(lhs), put(rhs))
            want = tex_gemm(to_torch(lhs).to(device), to_torch(rhs).to(device), layout, device)[0]
            cases.append((f"{layout} {jnp.dtype(dtype).name}", got, want))
    lhs, rhs = operands("NN", 48, 64, 32, jnp.bfloat16, 11)
    bias = jnp.asarray(np.random.default_rng(12).standard_normal(32), jnp.bfloat16)
    lt, rt, bt = (to_torch(v).to(device) for v in (lhs, rhs, bias))
    got = tej.gemm(put(lhs), put(rhs), bias=put(bias))
    cases.append(("bias", got, tex_gemm(lt, rt, "NN", device, bias=bt, bias_type=torch.bfloat16)[0]))
    got, pre = tej.gemm(put(lhs), put(rhs), bias=put(bias), fuse_gelu=True)
    d, _, want_pre, _ = tex_gemm(lt, rt, "NN", device, bias=bt, bias_type=torch.bfloat16, gelu=True)
    cases += [("gelu", got, d), ("gelu aux", pre, want_pre)]
    gelu_in = jnp.asarray(np.random.default_rng(13).standard_normal((48, 32)), jnp.bfloat16)
    got, bgrad = tej.gemm(put(lhs), put(rhs), gelu_input=put(gelu_in), bias_grad=True)
    d, want_bgrad, _, _ = tex_gemm(lt, rt, "NN", device, bias=torch.empty(32, dtype=torch.bfloat16, device=device),
                                   bias_type=torch.bfloat16, gelu=True, gelu_in=to_torch(gelu_in).to(device),
                                   grad=True)
    cases += [("dgelu", got, d), ("dgelu bias grad", bgrad, want_bgrad)]
    for pair in FP8_PAIRS:
        for split in (True, False):
            lhs, rhs = operands("NN", 48, 64, 32, jnp.bfloat16, 14)
            ql = tej.quantize(lhs, quantizer(SM.CURRENT_TENSOR_SCALING, pair[0]))
            qr = tej.quantize(rhs, quantizer(SM.CURRENT_TENSOR_SCALING, pair[1]))
            got = jax.jit(lambda a, b: tej.gemm(a, b, use_split_accumulator=split))(put(ql), put(qr))
            want = tex_gemm(torch_fp8(ql, device), torch_fp8(qr, device), "NN", device, split=split)[0]
            cases.append((f"FP8 {jnp.dtype(pair[0]).name} x {jnp.dtype(pair[1]).name} split={split}", got, want))
    return cases


def test_bytes_equal_tex_cpu():
    for what, got, want in parity_cases("cpu"):
        same_bytes(got, want, what)


def _gpu():
    """jax's first GPU (the tests marked cuda run where there is one)."""
    return jax.devices("gpu")[0]


@pytest.mark.cuda
def test_bytes_equal_tex_cuda():
    """On the GPU: tej's CUDA handler and tex on CUDA run the same cuBLASLt call (same workspace size) on the same
    bytes: bit-identical, fused epilogues included."""
    _gpu()  # jax must see the GPU torch sees
    for what, got, want in parity_cases("cuda"):
        same_bytes(got, want, what)


@pytest.mark.cuda
@pytest.mark.parametrize("dims", [(1, 1), (1, 2), (2, 1)], ids=["1dx1d", "1dx2d", "2dx1d"])
def test_fp8_block_cuda(dims):
    """FP8 block 1x128 / 128x128 natively on sm_90 (CUDA only): within the E4M3 tolerance of the dequantized
    product, and the same bytes as tex on the same input (tej and tex quantize identically)."""
    gpu = _gpu()
    mode = {1: SM.BLOCK_SCALING_1x128, 2: SM.BLOCK_SCALING_128x128}
    x, w = operands("TN", 256, 256, 128, jnp.bfloat16, 15)  # x [256, 256] (M, K), w [128, 256] (N, K)
    qx = tej.quantize(jax.device_put(x, gpu), quantizer(mode[dims[0]]))
    qw = tej.quantize(jax.device_put(w, gpu), quantizer(mode[dims[1]]))
    out = jax.jit(lambda a, b: tej.gemm(a, b, ((1,), (1,))))(qx, qw)
    want = ref(qx.dequantize(jnp.float32), qw.dequantize(jnp.float32), ((1,), (1,)))
    assert_close(out, want, E4M3_TOL)
    # bias with block operands: cuBLASLt's BIAS epilogue; GELU: the unfused fallback (no fused kernel)
    bias = jax.device_put(jnp.linspace(-1, 1, 128).astype(jnp.bfloat16), gpu)
    o, pre = jax.jit(lambda a, b, c: tej.gemm(a, b, ((1,), (1,)), bias=c, fuse_gelu=True))(qx, qw, bias)
    assert_close(pre, want + np.asarray(bias, F64), E4M3_TOL)
    assert_close(o, gelu64(np.asarray(pre, F64)), E4M3_TOL)
    tq = lambda d: tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, block_scaling_dim=d)  # noqa: E731
    tx = tex.quantize(to_torch(x).cuda(), tq(dims[0]))
    tw = tex.quantize(to_torch(w).cuda(), tq(dims[1]))
    want_tex = tex_gemm(tx, tw, "TN", "cuda")[0]
    from transformer_engine_torch import _device

    if _device.gemm_is_native("Float8BlockwiseQTensor", torch.cuda.current_device()):
        same_bytes(out, want_tex, f"FP8 block {dims}")  # both the native cuBLASLt call
    else:  # tex emulates it (dequantize + bf16 GEMM, SPEC §6.7) where it sees no native kernel
        assert_close(out, want_tex.double().cpu().numpy(), E4M3_TOL)


# ---- trace-time errors --------------------------------------------------------------------------------------------
def trace(f, *args):
    """Traces f without running it: errors raised here are trace-time errors."""
    return jax.eval_shape(f, *args)


def test_errors_at_trace_time():
    bf = jnp.bfloat16
    a, b = jnp.zeros((32, 24), bf), jnp.zeros((16, 32), bf)
    with pytest.raises(ValueError, match=r"K mismatch: lhs dim 1 has 24 elements but rhs dim 0 has 16.*"
                                         r"lhs bfloat16\(32, 24\), rhs bfloat16\(16, 32\)"):
        trace(lambda x, y: tej.gemm(x, y), a, b)
    with pytest.raises(ValueError, match=r"lhs contracts over 2 dims and rhs over 1"):
        trace(lambda x, y: tej.gemm(x, y, ((0, 1), (0,))), a, b)
    with pytest.raises(ValueError, match=r"out of range"):
        trace(lambda x, y: tej.gemm(x, y, ((2,), (0,))), a, b)
    with pytest.raises(ValueError, match=r"at least 2-D"):
        trace(lambda x, y: tej.gemm(x, y, ((0,), (0,))), jnp.zeros((16,), bf), b)
    with pytest.raises(TypeError, match=r"lhs must be float32, float16, bfloat16 or a ScaledTensor, got int32"):
        trace(lambda x, y: tej.gemm(x, y, ((1,), (1,))), jnp.zeros((16, 24), jnp.int32), jnp.zeros((8, 24), bf))
    with pytest.raises(TypeError, match=r"mixed operands.*A \[8, 24\] bf16, B \[16, 24\] fp32"):
        trace(lambda x, y: tej.gemm(x, y, ((1,), (1,))), jnp.zeros((16, 24), jnp.float32), jnp.zeros((8, 24), bf))
    with pytest.raises(TypeError, match=r"bias must be BFloat16 \(the output dtype\), got Float"):
        trace(lambda x, y: tej.gemm(x, y, ((1,), (1,)), bias=jnp.zeros(8)), jnp.zeros((16, 24), bf),
              jnp.zeros((8, 24), bf))
    with pytest.raises(ValueError, match=r"bias must be a contiguous 1-D tensor of length 8"):
        trace(lambda x, y: tej.gemm(x, y, ((1,), (1,)), bias=jnp.zeros(7, bf)), jnp.zeros((16, 24), bf),
              jnp.zeros((8, 24), bf))


def test_fp8_errors_at_trace_time():
    r = np.random.default_rng(16)
    x = jnp.asarray(r.standard_normal((32, 32)), jnp.bfloat16)
    e5 = quantizer(SM.CURRENT_TENSOR_SCALING, jnp.float8_e5m2)
    with pytest.raises(ValueError, match=r"E5M2 x E5M2 has no FP8 GEMM kernel.*E5M2.*E5M2.*as E4M3"):
        trace(lambda a: tej.gemm(a, a, ((1,), (1,)), e5, e5), x)
    e4 = quantizer(SM.CURRENT_TENSOR_SCALING)
    with pytest.raises(ValueError, match=r"FP8 per-tensor GEMM needs the contraction dim K to be a multiple of 16, "
                                         r"got K=24.*Pad K to 32"):
        trace(lambda a, b: tej.gemm(a, b, ((1,), (1,)), e4, e4), jnp.zeros((32, 24), jnp.bfloat16),
              jnp.zeros((32, 24), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"last dim N to be a multiple of 16, got N=24"):
        trace(lambda a, b: tej.gemm(a, b, ((1,), (1,)), e4, e4), jnp.zeros((32, 32), jnp.bfloat16),
              jnp.zeros((24, 32), jnp.bfloat16))
    rowonly = tej.quantize(x, quantizer(SM.CURRENT_TENSOR_SCALING, layout=tej.QuantizeLayout.ROWWISE))
    with pytest.raises(ValueError, match=r"rhs ScaledTensor\(32, 32\).*needs its colwise copy.*never a transpose"):
        trace(lambda a, b: tej.gemm(a, b), rowonly, rowonly)
    q3 = tej.quantize(jnp.zeros((4, 8, 32), jnp.bfloat16), e4)
    with pytest.raises(ValueError, match=r"contracts over dims \(1,\), which neither of its copies holds"):
        trace(lambda a, b: tej.gemm(a, b, ((1,), (0,))), q3, jnp.zeros((8, 16), jnp.bfloat16))
    with pytest.raises(TypeError, match=r"mixed operands"):
        trace(lambda a, b: tej.gemm(a, b), tej.quantize(x, e4), x)


@pytest.mark.parametrize("dims", [(1, 1), (1, 2), (2, 1)], ids=["1dx1d", "1dx2d", "2dx1d"])
def test_fp8_block_on_the_cpu(dims):
    """FP8 block operands on the CPU: the core's CPU kernel decodes every element with its block's scale exactly
    (fl(code · scale_inv), as dequantize does) and accumulates in FP64 — within half a bf16 ulp of the float64
    product of the dequantized operands, partial blocks included; and the same bytes as tex on the CPU."""
    mode = {1: SM.BLOCK_SCALING_1x128, 2: SM.BLOCK_SCALING_128x128}
    x, w = operands("TN", 200, 208, 144, jnp.bfloat16, 16)  # x [200, 208] (M, K), w [144, 208] (N, K)
    spread = np.exp2(np.random.default_rng(17).integers(-6, 7, (2, 2)))  # the blocks' magnitudes differ
    x = (np.asarray(x, F64) * spread[np.arange(200)[:, None] // 128, np.arange(208)[None] // 128]).astype(x.dtype)
    qx, qw = tej.quantize(jnp.asarray(x), quantizer(mode[dims[0]])), tej.quantize(w, quantizer(mode[dims[1]]))
    out = jax.jit(lambda a, b: tej.gemm(a, b, ((1,), (1,))))(qx, qw)
    want = ref(qx.dequantize(jnp.float32), qw.dequantize(jnp.float32), ((1,), (1,)))
    np.testing.assert_allclose(np.asarray(out, F64), want, rtol=2.0 ** -8, atol=1e-6 * np.abs(want).max())
    tq = lambda d: tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3, block_scaling_dim=d)  # noqa: E731
    want_tex = tex_gemm(tex.quantize(to_torch(jnp.asarray(x)), tq(dims[0])), tex.quantize(to_torch(w), tq(dims[1])),
                        "TN", "cpu")[0]
    same_bytes(out, want_tex, f"FP8 block {dims} on the CPU")


_BLOCK_MODES = {"mxfp8": SM.MXFP8_1D_SCALING, "nvfp4": SM.NVFP4_1D_SCALING}


def block_case(fmt, layout, device):
    """(tej's MXFP8 / NVFP4 GEMM, tex's of the same quantized values, the float64 product of the decoded copies each
    GEMM reads) in `layout` on `device`: lhs and rhs quantized by both frontends (the same bytes, test_parity_torch)."""
    dims = LAYOUTS[layout]
    lhs, rhs = operands(layout, 96, 64, 160, jnp.bfloat16, 30)
    put = (lambda a: jax.device_put(a, _gpu())) if device == "cuda" else (lambda a: a)
    q = quantizer(_BLOCK_MODES[fmt])
    ql, qr = tej.quantize(put(lhs), q), tej.quantize(put(rhs), q)
    out = jax.jit(lambda a, b: tej.gemm(a, b, dims))(ql, qr)
    # the copy each operand's contraction reads: rowwise over its last dim, colwise over its first
    dl = (ql if dims[0] == (1,) else ql.get_colwise_tensor()).dequantize(jnp.float32)
    dr = (qr if dims[1] == (1,) else qr.get_colwise_tensor()).dequantize(jnp.float32)
    tq = tex.MXFP8Quantizer(tex.DType.kFloat8E4M3) if fmt == "mxfp8" else tex.NVFP4Quantizer()
    tl, tr = tex.quantize(to_torch(lhs).to(device), tq), tex.quantize(to_torch(rhs).to(device), tq)
    want_tex = tex_gemm(tl, tr, layout, device, out_dtype=torch.bfloat16)[0]
    return out, want_tex, ref(dl, dr, dims)


def test_nvfp4_needs_its_amax_at_trace_time():
    """An NVFP4 copy without its global amax cannot be decoded (the core folds it into alpha): a trace-time error
    naming the operand and the missing field."""
    import dataclasses
    qn = tej.quantize(jnp.zeros((128, 128), jnp.bfloat16), quantizer(SM.NVFP4_1D_SCALING))
    with pytest.raises(ValueError, match=r"rhs ScaledTensor\(128, 128\) NVFP4_1D_SCALING.*has no amax"):
        trace(lambda a, b: tej.gemm(a, b, ((1,), (1,))), qn, dataclasses.replace(qn, amax=None))


@pytest.mark.parametrize("fmt,layout", [("mxfp8", "TN"), ("mxfp8", "NN"), ("mxfp8", "NT"), ("nvfp4", "TN"),
                                        ("nvfp4", "NT")])
def test_block_formats_on_the_cpu(fmt, layout):
    """MXFP8 / NVFP4 through tej.gemm on the CPU: the core's CPU kernel decodes each element exactly (MXFP8
    fl(code · 2^(e-127)); NVFP4 fl(e2m1 · sf) with both global decode scales folded into alpha', SPEC §6.7; GEMM-swizzled
    scales) and accumulates in FP64 — within half a bf16 ulp (and alpha's FP32 rounding) of the float64 product of the
    dequantized copies; the same bytes as tex on the CPU."""
    out, want_tex, want = block_case(fmt, layout, "cpu")
    assert out.shape == want.shape == (96, 160)
    np.testing.assert_allclose(np.asarray(jnp.asarray(out, jnp.float32), F64), want, rtol=2.0 ** -8, atol=1e-30)
    assert not np.allclose(np.asarray(jnp.asarray(out, jnp.float32), F64), -want, rtol=1e-2), "a wrong answer passes"
    same_bytes(out, want_tex, f"{fmt} {layout} on the CPU")


@pytest.mark.cuda
@pytest.mark.parametrize("fmt,layout", [("mxfp8", "TN"), ("mxfp8", "NN"), ("mxfp8", "NT"), ("nvfp4", "TN"),
                                        ("nvfp4", "NN"), ("nvfp4", "NT")])
def test_block_formats_cuda(fmt, layout):
    """MXFP8 / NVFP4 through tej.gemm on the GPU (sm_90: the core decodes each operand once to bf16, then the bf16
    GEMM, NVFP4's global scales in the device alpha'; sm_100: native): within the FP32-accumulation rule of the
    float64 product, and the same bytes as tex."""
    out, want_tex, want = block_case(fmt, layout, "cuda")
    mag = np.abs(want).max()
    np.testing.assert_allclose(np.asarray(jnp.asarray(out, jnp.float32), F64), want, rtol=2.0 ** -7,
                               atol=2.0 ** -16 * mag)
    same_bytes(out, want_tex, f"{fmt} {layout} on CUDA")
