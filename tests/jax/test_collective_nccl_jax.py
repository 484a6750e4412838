"""The FFI collective GEMM over NCCL (transformer_engine_jax/collective_nccl.py) on several GPUs, marked `multigpu`:
one process driving every GPU, and one process per GPU bootstrapped through jax.distributed's key-value store. Each
run checks, on the gathered results, that the all-gather + GEMM equals its chunk GEMMs done alone on one device bit
for bit (sm_margin 0: the same GEMM shapes and SMs) and is within bf16 of a float64 product; that the overlapped and
non-overlapped forms give the same bytes; that the reduce-scatter equals the pure-JAX ppermute ring within FP32
accumulation and a float64 product within bf16; FP8 current scaling; and the gradients of both against the unsharded
float64 ones; and that tej.dense under jit with sharded arrays (sequence parallel) runs te_collective_gemm, its
column layer the unsharded bytes, its row layer within bf16 of them; and tej.mlp (fc1 column-, fc2 row-parallel,
sequence parallel) forward and backward within bf16 of the unsharded MLP. On a machine with fewer GPUs the tests skip; the
CPU checks the refusals."""
import os
import socket
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

SCRIPT = r"""
import os, sys
import numpy as np
import jax
tp, procs, pid = int(os.environ["TP"]), int(os.environ["PROCS"]), int(os.environ.get("PID", "0"))
if procs > 1:
    jax.distributed.initialize(os.environ["COORD"], num_processes=procs, process_id=pid, local_device_ids=[pid])
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import transformer_engine_jax as tej
from transformer_engine_jax import collective as C, collective_ffi as CF, collective_nccl as N

mesh = Mesh(np.array(jax.devices()[:tp]), ("tp",))
rng = np.random.default_rng(0)
m, K, n = 128, 256, 128            # per rank: x shard [m, K], w shard [n, K]
M, Nn = m * tp, n * tp
x = rng.uniform(-2, 2, (M, K)).astype(np.float32)
w = rng.uniform(-1, 1, (Nn, K)).astype(np.float32)
bf = lambda a: jnp.asarray(a, jnp.bfloat16)
put = lambda a, spec: jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda i: a[i])
host = lambda a: np.asarray(multihost_utils.process_allgather(a, tiled=True), np.float64)
local = jax.local_devices()[0]
one = lambda a: jax.device_put(a, local)
xb, wb = np.asarray(bf(x)), np.asarray(bf(w))  # the bf16 values, as numpy (ml_dtypes)

def same(a, b, what):
    assert np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16)), what

# ---- all-gather + GEMM: x sharded along M, w along N -> y [M, N] sharded along N ------------------------------------
xs, ws = put(xb, P("tp", None)), put(wb, P("tp", None))
for margin in (0, None):
    ag = jax.jit(lambda x, w, o: N.all_gather_gemm(x, w, mesh, "tp", comm_overlap=o, sm_margin=margin),
                 static_argnums=2)
    y, y_base = ag(xs, ws, True), ag(xs, ws, False)
    yh, bh = multihost_utils.process_allgather(y, tiled=True), multihost_utils.process_allgather(y_base, tiled=True)
    same(yh, bh, f"AG overlapped != non-overlapped (sm_margin {margin})")
    if margin == 0:  # every chunk GEMM alone on one device: [m, K] x [n, K]^T
        for r in range(tp):
            for c in range(tp):
                want = tej.gemm(one(xb[c * m:(c + 1) * m]), one(wb[r * n:(r + 1) * n]), ((1,), (1,)))
                same(np.asarray(yh)[c * m:(c + 1) * m, r * n:(r + 1) * n], want, f"AG chunk ({c}, {r})")
    ref = xb.astype(np.float64) @ wb.astype(np.float64).T
    assert np.abs(np.asarray(yh, np.float64) - ref).max() <= 2 ** -7 * np.abs(ref).max(), "AG far from float64"

# ---- GEMM + reduce-scatter: x and w sharded along K -> y sharded along M ------------------------------------------
xk, wk = put(xb[:, :K], P(None, "tp")), put(wb[:n], P(None, "tp"))
rs = jax.jit(lambda x, w, o: N.gemm_reduce_scatter(x, w, mesh, "tp", comm_overlap=o), static_argnums=2)
y, y_base = host(rs(xk, wk, True)), host(rs(xk, wk, False))
assert np.array_equal(y, y_base), "RS overlapped != non-overlapped"
ring = host(jax.jit(lambda x, w: C.gemm_reduce_scatter_sharded(x, w, mesh, "tp"))(xk, wk))
ref = xb.astype(np.float64) @ wb[:n].astype(np.float64).T
assert np.abs(y - ref).max() <= 2 ** -7 * np.abs(ref).max(), "RS far from float64"
assert np.abs(y - ring).max() <= 2 ** -7 * np.abs(ref).max(), "RS far from the ppermute ring"
print("RS == ppermute ring bit for bit:", bool(np.array_equal(y, ring)))
# one process: the reduce-scatter ran over the copy engine's windows (the default); NCCL's send/receive give its bytes
assert bool(CF.local_rings) == (jax.process_count() == 1), "copy-engine windows where every member is local"
os.environ["NVTE_COLLECTIVE_GEMM_TRANSPORT"] = "nccl"
y_nccl = host(jax.jit(lambda x, w: N.gemm_reduce_scatter(x, w, mesh, "tp"))(xk, wk))
del os.environ["NVTE_COLLECTIVE_GEMM_TRANSPORT"]
assert np.array_equal(y, y_nccl), "RS over the copy engine != over NCCL"

# ---- FP8 current scaling: the ring form's bytes (the same unsharded quantization) --------------------------------
q = lambda: tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.CURRENT_TENSOR_SCALING,
                                        q_dtype=jnp.float8_e4m3fn, q_layout=tej.QuantizeLayout.ROWWISE)
y8 = host(jax.jit(lambda x, w: N.all_gather_gemm(x, w, mesh, "tp", x_quantizer=q(), w_quantizer=q(),
                                                 sm_margin=0))(xs, ws))
ring8 = host(jax.jit(lambda x, w: C.all_gather_gemm_sharded(x, w, mesh, "tp", x_quantizer=q(),
                                                            w_quantizer=q()))(xs, ws))
assert np.array_equal(y8, ring8), "AG FP8 differs from the ppermute ring's"
ref = xb.astype(np.float64) @ wb.astype(np.float64).T
assert np.abs(y8 - ref).max() <= 0.1 * np.abs(ref).max(), "AG FP8 far from float64"

# ---- gradients: loss = sum(y * g) against float64 ----------------------------------------------------------------
g = rng.uniform(-1, 1, (M, Nn)).astype(np.float32)
gb = np.asarray(bf(g)).astype(np.float64)
loss = lambda f: (lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) * bf(g).astype(jnp.float32)))
dx, dw = jax.jit(jax.grad(loss(lambda x, w: N.all_gather_gemm(x, w, mesh, "tp")), argnums=(0, 1)))(xs, ws)
rx, rw = gb @ wb.astype(np.float64), gb.T @ xb.astype(np.float64)
for got, want, what in ((host(dx), rx, "AG dx"), (host(dw), rw, "AG dw")):
    assert np.abs(got - want).max() <= 2 ** -6 * np.abs(want).max(), what
gk = np.asarray(bf(g[:, :n])).astype(np.float64)
lossk = lambda x, w: jnp.sum(N.gemm_reduce_scatter(x, w, mesh, "tp").astype(jnp.float32) *
                             bf(g[:, :n]).astype(jnp.float32))
dx, dw = jax.jit(jax.grad(lossk, argnums=(0, 1)))(xk, wk)
rx, rw = gk @ wb[:n].astype(np.float64), gk.T @ xb.astype(np.float64)
for got, want, what in ((host(dx), rx, "RS dx"), (host(dw), rw, "RS dw")):
    assert np.abs(got - want).max() <= 2 ** -6 * np.abs(want).max(), what

# ---- tej.dense under jit with sharded arrays: the partitioning rules pick te_collective_gemm on GPUs ----------------
xd = xb.reshape(1, M, K)
k1, b1 = np.asarray(bf(w.T)), np.asarray(bf(rng.uniform(-1, 1, Nn)))  # kernel [K, N] (tej.dense's layout)
col = lambda x, k, b: tej.dense(x, k, b, sequence_parallel=True)
f = jax.jit(col, out_shardings=NamedSharding(mesh, P(None, None, "tp")))
args = (put(xd, P(None, "tp", None)), put(k1, P(None, "tp")), put(b1, P("tp")))
assert "te_collective_gemm" in f.lower(*args).compile().as_text(), "column dense: no te_collective_gemm"
same(host(f(*args)).astype(np.float32), np.asarray(jax.jit(col)(one(xd), one(k1), one(b1)), np.float64)
     .astype(np.float32), "column dense != unsharded")
hd = np.asarray(bf(rng.uniform(-1, 1, (1, M, Nn))))
k2 = np.asarray(bf(rng.uniform(-1, 1, (Nn, K)) * Nn ** -0.5))
f = jax.jit(col, out_shardings=NamedSharding(mesh, P(None, "tp", None)))
b2 = b1[:K]
args = (put(hd, P(None, None, "tp")), put(k2, P("tp", None)), put(b2, P()))
assert "te_collective_gemm" in f.lower(*args).compile().as_text(), "row dense: no te_collective_gemm"
want = np.asarray(jax.jit(col)(one(hd), one(k2), one(b2)), np.float64)
got = host(f(*args))
assert np.abs(got - want).max() <= 2 ** -7 * np.abs(want).max(), "row dense far from unsharded"

# ---- tej.mlp (gelu): fc1 column-, fc2 row-parallel, sequence parallel; forward and backward vs the unsharded MLP ---
H, F = K, Nn
r = lambda *shape, scale=1.0: np.asarray(bf(rng.uniform(-1, 1, shape) * scale))
xm, gm = r(1, M, H), r(1, M, H)
w1m, b1m, w2m, b2m = r(H, F, scale=H ** -0.5), r(F, scale=0.1), r(F, H, scale=F ** -0.5), r(H, scale=0.1)

def mlp_vjp(x, w1, b1, w2, b2, g):
    y, back = jax.vjp(lambda *p: tej.mlp(*p, sequence_parallel=True), x, w1, b1, w2, b2)
    return (y,) + back(g)

tok = P(None, "tp", None)
specs = (tok, tok, P(None, "tp"), P("tp"), P("tp", None), P())
f = jax.jit(mlp_vjp, out_shardings=tuple(NamedSharding(mesh, s) for s in specs))
args = (put(xm, tok), put(w1m, P(None, "tp")), put(b1m, P("tp")), put(w2m, P("tp", None)), put(b2m, P()),
        put(gm, tok))
assert f.lower(*args).compile().as_text().count("te_collective_gemm") >= 2, "mlp: no te_collective_gemm"
full = lambda a: np.asarray(a if a.is_fully_replicated else multihost_utils.process_allgather(a, tiled=True),
                            np.float64)
want = jax.jit(mlp_vjp)(*(one(a) for a in (xm, w1m, b1m, w2m, b2m, gm)))
for name, a, b in zip(("y", "dx", "dw1", "db1", "dw2", "db2"), f(*args), want):
    a, b = full(a), np.asarray(b, np.float64)
    assert np.abs(a - b).max() <= 2 ** -6 * max(np.abs(b).max(), 1e-6), ("tej.mlp TP vs unsharded", name)
y_tp = full(f(*args)[0])

# ---- the Flax MLP with the same parameters, sharded alike: tej.mlp's bytes -----------------------------------------
from flax import nnx
from transformer_engine_jax import flax as TF
block = TF.MLP(H, F, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, sequence_parallel=True, rngs=nnx.Rngs(0))
for name, value, spec in (("fc1_kernel", w1m, P(None, "tp")), ("fc1_bias", b1m, P("tp")),
                          ("fc2_kernel", w2m, P("tp", None)), ("fc2_bias", b2m, P())):
    getattr(block, name).set_value(put(value, spec))
graph, state = nnx.split(block)
fm = jax.jit(lambda st, x: nnx.merge(graph, st)(x), out_shardings=NamedSharding(mesh, tok))
assert "te_collective_gemm" in fm.lower(state, args[0]).compile().as_text(), "Flax MLP: no te_collective_gemm"
assert np.array_equal(full(fm(state, args[0])), y_tp), "Flax MLP TP != tej.mlp TP"
print("ok")
"""


def _gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        return 0


def _env(**kw):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XLA_PYTHON_CLIENT_PREALLOCATE="false", NCCL_DEBUG="WARN", **NO_MULTICAST)
    env.pop("JAX_PLATFORMS", None)
    env.update({k: str(v) for k, v in kw.items()})
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check(outs):
    for rc, out, err in outs:
        assert rc == 0, err[-4000:]
        assert out.strip().endswith("ok"), out[-2000:]
        warns = [line for line in err.splitlines() if "NCCL WARN" in line]
        assert not warns, warns[:5]


@pytest.mark.multigpu
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_collective_nccl_one_process(tp):
    """One process drives tp GPUs (its communicators made in one NCCL group): what TE's JAX frontend cannot do."""
    if _gpus() < tp:
        pytest.skip(f"needs {tp} GPUs, {_gpus()} visible")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=_env(TP=tp, PROCS=1), capture_output=True, text=True,
                         timeout=600)
    _check([(out.returncode, out.stdout, out.stderr)])


@pytest.mark.multigpu
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_collective_nccl_process_per_gpu(tp):
    """tp processes, one GPU each, the NCCL ids published through jax.distributed's key-value store."""
    if _gpus() < tp:
        pytest.skip(f"needs {tp} GPUs, {_gpus()} visible")
    coord = f"127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=_env(TP=tp, PROCS=tp, PID=i, COORD=coord),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(tp)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    _check(outs)


def test_collective_nccl_refusals_on_cpu(run_on_cpu_mesh):
    """Without GPUs the FFI form says where to go (the ppermute ring), and bad shapes are refused at trace time."""
    run_on_cpu_mesh(r"""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh
from transformer_engine_jax import collective_nccl as N
mesh = Mesh(np.array(jax.devices()[:4]), ("tp",))
assert not N.available(mesh)
x, w = jnp.ones((64, 32), jnp.bfloat16), jnp.ones((64, 32), jnp.bfloat16)
try:
    N.all_gather_gemm(x, w, mesh, "tp")
    raise AssertionError("no error on CPU devices")
except NotImplementedError as e:
    assert "ppermute ring" in str(e), e
for f, xs, ws, words in ((N.all_gather_gemm, (66, 32), (64, 32), "(66, 32) dim 0 must split into tp = 4"),
                         (N.gemm_reduce_scatter, (64, 30), (64, 30), "(64, 30) dim 1 must split into tp = 4"),
                         (N.all_gather_gemm, (64, 32), (64, 16), "the same K")):
    try:
        f(jnp.ones(xs, jnp.bfloat16), jnp.ones(ws, jnp.bfloat16), mesh, "tp")
        raise AssertionError(f"no error for {xs}, {ws}")
    except ValueError as e:
        assert words in str(e), (words, str(e))
try:
    N.all_gather_gemm(x, w, Mesh(np.array(jax.devices()[:1]), ("tp",)), "tp")
    raise AssertionError("a ring of one passes")
except ValueError as e:
    assert "ring of 2 or more" in str(e), e
print("ok")
""")


GLUE = r"""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import transformer_engine_jax as tej
from transformer_engine_jax import collective_ffi as F, collective_nccl as N

AX = "tp"
def fake_call(kind, key, tp, x, xs, w, ws, out_dtype, overlap, sm_margin, keep, w_kn=False):
    f32 = lambda a, s: a.astype(jnp.float32) * (s[0] if s.shape[0] else 1.0)
    wm = f32(w, ws)
    wm = wm if w_kn else wm.T          # [k, n]
    if kind == F.AG:
        xg = jax.lax.all_gather(x, AX, tiled=True)
        out = (f32(xg, xs) @ wm).astype(out_dtype)
        return out, (xg if keep else None)
    part = f32(x, xs) @ wm
    return jax.lax.psum_scatter(part, AX, scatter_dimension=0, tiled=True).astype(out_dtype), None
# the FFI form's one home (collective_nccl's functions and tej.gemm's ring forms both call through it)
F.call = fake_call
F.available = lambda mesh=None: True
F.initialize = lambda mesh, axis: 0
mesh = Mesh(np.array(jax.devices()), (AX,))
rng = np.random.default_rng(0)
M, K, Nn = 64, 32, 48
bf = lambda *s: jnp.asarray(rng.uniform(-1, 1, s), jnp.bfloat16)
x, w, g = bf(M, K), bf(Nn, K), bf(M, Nn)
put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
f64 = lambda a: np.asarray(a, np.float64)
def close(a, b, what, tol=2**-6):
    a, b = f64(a), f64(b)
    assert np.abs(a - b).max() <= tol * np.abs(b).max(), (what, np.abs(a - b).max())
# AG forward + grads
loss = lambda f: lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) * g.astype(jnp.float32))
ag = lambda x, w: N.all_gather_gemm(x, w, mesh, AX)
y = jax.jit(ag)(put(x, P(AX, None)), put(w, P(AX, None)))
close(y, f64(x) @ f64(w).T, "AG y")
dx, dw = jax.jit(jax.grad(loss(ag), argnums=(0, 1)))(put(x, P(AX, None)), put(w, P(AX, None)))
close(dx, f64(g) @ f64(w), "AG dx"); close(dw, f64(g).T @ f64(x), "AG dw")
# RS forward + grads
w2 = bf(Nn, K)
rs = lambda x, w: N.gemm_reduce_scatter(x, w, mesh, AX)
y = jax.jit(rs)(put(x, P(None, AX)), put(w2, P(None, AX)))
close(y, f64(x) @ f64(w2).T, "RS y")
dx, dw = jax.jit(jax.grad(loss(rs), argnums=(0, 1)))(put(x, P(None, AX)), put(w2, P(None, AX)))
close(dx, f64(g) @ f64(w2), "RS dx"); close(dw, f64(g).T @ f64(x), "RS dw")
# FP8 AG forward
q = lambda: tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.CURRENT_TENSOR_SCALING, q_dtype=jnp.float8_e4m3fn,
                                        q_layout=tej.QuantizeLayout.ROWWISE)
ag8 = lambda x, w: N.all_gather_gemm(x, w, mesh, AX, x_quantizer=q(), w_quantizer=q())
y8 = jax.jit(ag8)(put(x, P(AX, None)), put(w, P(AX, None)))
close(y8, f64(x) @ f64(w).T, "AG fp8", 0.1)
# tej.dense through the partitioning rules -> _ffi_ring_body
xd = x.reshape(1, M, K); k1, b1 = w.T, bf(Nn)
col = lambda x, k, b: tej.dense(x, k, b, sequence_parallel=True)
f = jax.jit(col, out_shardings=NamedSharding(mesh, P(None, None, AX)))
args = (put(xd, P(None, AX, None)), put(k1, P(None, AX)), put(b1, P(AX)))
txt = f.lower(*args).compile().as_text()
assert "all-gather" in txt, "the emulated FFI body was not used"
close(f(*args), f64(xd) @ f64(k1) + f64(b1), "column dense")
h = bf(1, M, Nn); k2 = bf(Nn, K)
f = jax.jit(col, out_shardings=NamedSharding(mesh, P(None, AX, None)))
args = (put(h, P(None, None, AX)), put(k2, P(AX, None)), put(b1[:K], P()))
close(f(*args), f64(h) @ f64(k2) + f64(b1[:K]), "row dense")
print("ok")
"""


def test_collective_nccl_glue_on_cpu(run_on_cpu_mesh):
    """collective_nccl's Python side — shard_map specs, the custom_vjp mirrored rings, FP8 operands, and tej.gemm's
    partitioning handing the ring forms to te_collective_gemm — on the CPU mesh, with the FFI call replaced by its
    meaning in jax collectives (all_gather / psum_scatter around float32 matmuls); results against float64."""
    run_on_cpu_mesh(GLUE)
