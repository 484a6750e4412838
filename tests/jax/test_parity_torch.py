"""tej and tex share the core: the same input bytes give the same output bytes through either frontend (CPU here;
tests marked cuda repeat it on the GPU)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
import transformer_engine_torch as tex  # noqa: E402
from transformer_engine_jax import cpp_extensions as ops  # noqa: E402

SM = tej.ScalingMode


# The CPU parity tests compare tej's CPU handler with tex's CPU kernels (tests/jax/conftest.py).
pytestmark = pytest.mark.usefixtures("jax_on_cpu")

MODES = [SM.DELAYED_TENSOR_SCALING, SM.CURRENT_TENSOR_SCALING, SM.MXFP8_1D_SCALING, SM.NVFP4_1D_SCALING,
         SM.NVFP4_2D_SCALING, SM.BLOCK_SCALING_1x128, SM.BLOCK_SCALING_128x128]


def torch_quantizer(mode, scale=None, amax=None):
    e4m3 = tex.DType.kFloat8E4M3
    if mode == SM.DELAYED_TENSOR_SCALING:
        return tex.Float8Quantizer(scale, amax, e4m3)
    if mode == SM.CURRENT_TENSOR_SCALING:
        return tex.Float8CurrentScalingQuantizer(e4m3)
    if mode == SM.MXFP8_1D_SCALING:
        return tex.MXFP8Quantizer(e4m3)
    if mode in (SM.NVFP4_1D_SCALING, SM.NVFP4_2D_SCALING):
        return tex.NVFP4Quantizer(with_2d_quantization=mode == SM.NVFP4_2D_SCALING)
    return tex.Float8BlockQuantizer(e4m3, block_scaling_dim=1 if mode == SM.BLOCK_SCALING_1x128 else 2)


def torch_pieces(t):
    """(rowwise data, rowwise scale_inv, columnwise data, columnwise scale_inv) as bytes."""
    if isinstance(t, tex.Float8Tensor):
        pieces = (t._data, t._scale_inv, t._transpose, t._scale_inv)
    else:
        pieces = (t._rowwise_data, t._rowwise_scale_inv, t._columnwise_data, t._columnwise_scale_inv)
    return [p.contiguous().view(torch.uint8).numpy().ravel() for p in pieces]


def jax_pieces(st):
    pieces = (st.data, st.scale_inv, st.colwise_data, st.colwise_scale_inv)
    return [np.asarray(p).view(np.uint8).ravel() for p in pieces]


def assert_same_bytes(jax_st, torch_t, what):
    for name, a, b in zip(("data", "scale_inv", "colwise_data", "colwise_scale_inv"), jax_pieces(jax_st),
                          torch_pieces(torch_t)):
        assert a.shape == b.shape, f"{what}: {name} has {a.size} bytes through tej, {b.size} through tex"
        bad = np.flatnonzero(a != b)
        assert bad.size == 0, f"{what}: {name} differs at {bad.size} bytes, first at {bad[0]}"


def inputs(shape, dtype, seed=0):
    x = jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32) * 3
    return x.astype(dtype)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("act", ["gelu", "swiglu", "srelu", "clamped_swiglu"])
def test_act_lu_bytes_equal_tex(act, mode):
    spelling = tej.activation_of(act)
    a = 2 if spelling.gated else 1
    x = inputs((128, a, 128), jnp.bfloat16)
    q = tej.QuantizerFactory.create(scaling_mode=mode, amax_history_len=4)
    if mode == SM.DELAYED_TENSOR_SCALING:
        q = q.__class__.tree_unflatten(q.tree_flatten()[1], (jnp.full((1,), 2.0, jnp.float32),
                                                             jnp.zeros((4,), jnp.float32)))
    got = jax.jit(lambda x, q: ops.act_lu(x, act, q))(x, q)
    xt = torch.from_dlpack(x).reshape(128, a * 128)
    scale, amax = torch.full((1,), 2.0), torch.zeros(1)
    want = getattr(tex, act)(xt, torch_quantizer(mode, scale, amax))
    assert_same_bytes(got, want, f"{act} {mode.name}")
    nvfp4 = mode in (SM.NVFP4_1D_SCALING, SM.NVFP4_2D_SCALING)
    assert got.data.dtype == (jnp.uint8 if nvfp4 else jnp.float8_e4m3fn)
    assert got.scale_inv.dtype == (jnp.uint8 if nvfp4 or mode == SM.MXFP8_1D_SCALING else jnp.float32)
    if mode == SM.DELAYED_TENSOR_SCALING:
        assert np.asarray(got.amax).tobytes() == amax.numpy().tobytes()


@pytest.mark.parametrize("mode", [None] + MODES, ids=lambda m: "plain" if m is None else m.name)
@pytest.mark.parametrize("act", ["gelu", "qgelu"])
def test_dact_dbias_bytes_equal_tex(act, mode):
    x, dz = inputs((256, 1, 128), jnp.bfloat16, 1), inputs((256, 128), jnp.bfloat16, 2)
    q = None if mode is None else tej.QuantizerFactory.create(scaling_mode=mode, amax_history_len=4)
    got, dbias = jax.jit(lambda dz, x, q: ops.quantize_dact_dbias(dz, x, act, True, q))(dz, x, q)
    xt, gt = torch.from_dlpack(x).reshape(256, 128), torch.from_dlpack(dz)
    tq = None if mode is None else torch_quantizer(mode, torch.ones(1), torch.zeros(1))
    want_bias, want = getattr(tex, "dbias_d" + act)(gt, xt, tq)
    assert np.asarray(dbias).view(np.uint16).tobytes() == want_bias.view(torch.int16).numpy().tobytes()
    if mode is None:
        assert np.asarray(got).reshape(256, 128).view(np.uint16).tobytes() == \
            want.view(torch.int16).numpy().tobytes()
    else:
        assert_same_bytes(got, want, f"dbias_d{act} {mode.name}")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_quantize_bytes_equal_tex(mode):
    x = inputs((4, 64, 256), jnp.float32, 3)
    q = tej.QuantizerFactory.create(scaling_mode=mode, amax_history_len=4)
    got = jax.jit(ops.quantize)(x, q)
    want = tex.quantize(torch.from_dlpack(x), torch_quantizer(mode, torch.ones(1), torch.zeros(1)))
    assert_same_bytes(got, want, f"quantize {mode.name}")


@pytest.mark.parametrize("act", [None, "gelu"])
@pytest.mark.parametrize("sign_mask", [True, False])
def test_nvfp4_rht_bytes_equal_tex(sign_mask, act):
    """NVFP4 with the random Hadamard transform on the columnwise copy (bf16 input, post-RHT amax), both copies,
    through tej and tex: the same bytes, also for the NVFP4 global amaxes."""
    x = inputs((64, 1, 128), jnp.bfloat16, 5)
    q = tej.QuantizerFactory.create(scaling_mode=SM.NVFP4_1D_SCALING, use_rht=True, random_sign_mask=sign_mask)
    got = jax.jit(lambda x, q: ops.act_lu(x, act, q) if act else ops.quantize(x[:, 0], q))(x, q)
    tq = tex.NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, with_random_sign_mask=sign_mask)
    xt = torch.from_dlpack(x).reshape(64, 128)
    want = tex.gelu(xt, tq) if act else tex.quantize(xt, tq)
    assert_same_bytes(got, want, f"NVFP4 RHT sign_mask={sign_mask} {act}")
    for ours, theirs in ((got.amax, want._amax_rowwise), (got.colwise_amax, want._amax_columnwise)):
        assert np.asarray(ours).tobytes() == theirs.numpy().tobytes()


@pytest.mark.parametrize("layout", ["rowwise", "colwise"])
@pytest.mark.parametrize("mode", [m for m in MODES if m not in (SM.NVFP4_1D_SCALING, SM.NVFP4_2D_SCALING)],
                         ids=lambda m: m.name)
def test_dequantize_bytes_equal_tex(mode, layout):
    x = inputs((3, 100, 256), jnp.bfloat16, 4)
    q_layout = tej.QuantizeLayout.ROWWISE if layout == "rowwise" else tej.QuantizeLayout.COLWISE
    q = tej.QuantizerFactory.create(scaling_mode=mode, q_layout=q_layout, amax_history_len=4)
    got = jax.jit(lambda x, q: ops.quantize(x, q).dequantize())(x, q)
    tq = torch_quantizer(mode, torch.ones(1), torch.zeros(1))
    tq.set_usage(rowwise=layout == "rowwise", columnwise=layout == "colwise")
    want = tex.quantize(torch.from_dlpack(x), tq).dequantize()
    assert got.dtype == jnp.bfloat16 and got.shape == x.shape
    assert np.asarray(got).view(np.uint16).tobytes() == want.view(torch.int16).numpy().tobytes()


def _gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


@pytest.mark.cuda
@pytest.mark.parametrize("mode", [None] + MODES, ids=lambda m: "plain" if m is None else m.name)
@pytest.mark.parametrize("act", ["gelu", "swiglu", "qgeglu"])
def test_cuda_bytes_equal_cpu_and_tex(act, mode):
    """On the GPU: tej through XLA's CUDA handler = tej on the CPU = tex on CUDA, byte for byte."""
    gpu = _gpu()
    assert gpu is not None, "jax sees no GPU on a machine where torch does"
    a = 2 if tej.activation_of(act).gated else 1
    x = inputs((256, a, 512), jnp.bfloat16, 7)
    q = None if mode is None else tej.QuantizerFactory.create(scaling_mode=mode, amax_history_len=4)
    f = jax.jit(lambda x, q: ops.act_lu(x, act, q))
    on_gpu = f(jax.device_put(x, gpu), jax.device_put(q, gpu))
    on_cpu = f(jax.device_put(x, jax.devices("cpu")[0]), q)
    leaves = lambda t: [np.asarray(v).view(np.uint8).tobytes() for v in jax.tree_util.tree_leaves(t)]  # noqa: E731
    assert leaves(on_gpu) == leaves(on_cpu), f"{act} {mode}: CUDA bytes differ from CPU bytes"
    xt = torch.from_dlpack(x).reshape(256, a * 512).cuda()
    want = getattr(tex, act)(xt, None if mode is None else
                             torch_quantizer(mode, torch.ones(1, device="cuda"), torch.zeros(1, device="cuda")))
    if mode is None:
        assert np.asarray(on_gpu).view(np.uint16).tobytes() == want.view(torch.int16).cpu().numpy().tobytes()
    else:
        assert_same_bytes(jax.device_get(on_gpu), _to_cpu(want), f"{act} {mode.name} on CUDA")


def _to_cpu(t):
    for name in ("_data", "_transpose", "_scale_inv", "_rowwise_data", "_rowwise_scale_inv", "_columnwise_data",
                 "_columnwise_scale_inv"):
        v = getattr(t, name, None)
        if isinstance(v, torch.Tensor):
            setattr(t, name, v.cpu())
    return t


_CMD_BUFFER_SCRIPT = """
import hashlib, sys
import jax, jax.numpy as jnp, numpy as np
import transformer_engine_jax as tej
x = (jax.random.normal(jax.random.PRNGKey(7), (256, 1, 512), jnp.float32) * 3).astype(jnp.bfloat16)
q = tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.CURRENT_TENSOR_SCALING)
f = jax.jit(lambda x: [tej.act_lu(x, "gelu", q), tej.act_lu(x, "gelu")])
h = hashlib.sha256()
for leaf in jax.tree_util.tree_leaves([f(x) for _ in range(3)]):
    h.update(np.asarray(leaf).view(np.uint8).tobytes())
print(h.hexdigest())
"""


@pytest.mark.cuda
def test_command_buffer_gives_the_same_bytes(same_bytes_with_command_buffers):
    """XLA's command buffers (CUDA graphs) with custom calls included replay our handlers with the same bytes."""
    same_bytes_with_command_buffers(_CMD_BUFFER_SCRIPT)


# ---- the collective GEMM: tex over gloo (2 processes) and tej's ring (2 CPU devices) give the same bytes ----------
def _tex_collective_rank(rank, tp, d, init):
    """One gloo rank: tex.all_gather_gemm and tex.gemm_reduce_scatter on its shards of the saved operands; saves its
    outputs (bf16 bits)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=tp)
    try:
        x, w = (torch.from_numpy(np.load(f"{d}/{n}.npy")).view(torch.bfloat16) for n in ("x", "w"))
        m, k = x.shape[0] // tp, x.shape[1] // tp
        n = w.shape[0] // tp
        ag = tex.all_gather_gemm(x[rank * m:(rank + 1) * m].contiguous(), w[rank * n:(rank + 1) * n].contiguous())
        rs = tex.gemm_reduce_scatter(x[:, rank * k:(rank + 1) * k].contiguous(), w[:, rank * k:(rank + 1) * k]
                                     .contiguous())
        for name, y in (("ag", ag), ("rs", rs)):
            np.save(f"{d}/{name}{rank}.npy", y.view(torch.int16).numpy())
    finally:
        dist.destroy_process_group()


_TEJ_COLLECTIVE = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh
from transformer_engine_jax import collective as C
d, tp = {d!r}, 2
mesh = Mesh(np.array(jax.devices()[:tp]), ("tp",))
x, w = (jnp.asarray(np.load(f"{{d}}/{{n}}.npy").view(jnp.bfloat16)) for n in ("x", "w"))
ag = np.asarray(C.all_gather_gemm_sharded(x, w, mesh, "tp")).view(np.int16)
rs = np.asarray(C.gemm_reduce_scatter_sharded(x, w, mesh, "tp")).view(np.int16)
want_ag = np.concatenate([np.load(f"{{d}}/ag{{r}}.npy") for r in range(tp)], axis=1)  # each rank: its N columns
want_rs = np.concatenate([np.load(f"{{d}}/rs{{r}}.npy") for r in range(tp)], axis=0)  # each rank: its M rows
assert np.array_equal(ag, want_ag), "all-gather + GEMM: tej's bytes differ from tex's"
assert np.array_equal(rs, want_rs), "GEMM + reduce-scatter: tej's bytes differ from tex's"
print("ok")
"""


def test_collective_gemm_bytes_equal_tex(tmp_path, run_on_cpu_mesh):
    """The collective GEMM through both frontends on the CPU: tex over torch.distributed (gloo, 2 processes, the
    core's ring) and tej's ring (ppermutes around tej.gemm on 2 CPU devices) give the same output bytes for the same
    input bytes — all-gather + GEMM, and GEMM + reduce-scatter with its FP32 partials summed in the ring's order."""
    import torch.multiprocessing as mp

    rng = np.random.default_rng(11)
    tp, m, k, n = 2, 16, 32, 24
    for name, shape in (("x", (tp * m, tp * k)), ("w", (tp * n, tp * k))):
        bits = torch.from_numpy(rng.uniform(-2, 2, shape).astype(np.float32)).bfloat16().view(torch.int16)
        np.save(tmp_path / f"{name}.npy", bits.numpy())
    mp.start_processes(_tex_collective_rank, args=(tp, str(tmp_path), str(tmp_path / "init")), nprocs=tp,
                       start_method="spawn")
    run_on_cpu_mesh(_TEJ_COLLECTIVE.format(d=str(tmp_path)))


@pytest.mark.parametrize("value", [None, "", "nccl", " Copy_Engine ", "bogus", "NCCL2"])
def test_collective_transport_is_one_decision(monkeypatch, value):
    """Issue 33: both frontends ask the core which transport the collective GEMM's reduce-scatter takes, so for every
    value of NVTE_COLLECTIVE_GEMM_TRANSPORT and either group kind they answer alike, and a bad value raises the same
    ValueError message in both."""
    from transformer_engine_jax import collective_ffi

    if value is None:
        monkeypatch.delenv("NVTE_COLLECTIVE_GEMM_TRANSPORT", raising=False)
    else:
        monkeypatch.setenv("NVTE_COLLECTIVE_GEMM_TRANSPORT", value)
    for node_local in (True, False):
        outcomes = []
        for ask in (collective_ffi.transport, torch.ops.te.collective_transport):
            try:
                outcomes.append(ask(node_local))
            except ValueError as e:
                outcomes.append(("ValueError", str(e).splitlines()[0]))
        assert outcomes[0] == outcomes[1], outcomes
        if value in ("bogus", "NCCL2"):
            assert outcomes[0] == ("ValueError", f"collective GEMM: NVTE_COLLECTIVE_GEMM_TRANSPORT="
                                                 f"'{value.lower()}' is not one of copy_engine, nccl")
