"""Collective GEMM on GPUs through the FFI (issue 22): the core's ring schedule (csrc/core/ops/collective_gemm_op.h)
as one te_collective_gemm call per device, its chunk exchanges NCCL sends and receives on a stream of their own,
overlapped with the chunk GEMMs — the same schedule and bytes as the pure-JAX ring of collective.py, which XLA
cannot overlap as tightly (its collective-permutes and GEMMs are separate thunks).

  initialize(mesh, axis)          the NCCL communicators of the axis's rings, made once per (mesh axis, device) and
                                  bootstrapped through jax.distributed's key-value store when several processes hold
                                  the ring (one process per GPU), or directly when one process drives them all
  all_gather_gemm(x, w, mesh, axis)      x [M, K] sharded along M, w [N, K] along N → y [M, N] sharded along N
  gemm_reduce_scatter(x, w, mesh, axis)  x [M, K] and w [N, K] sharded along K → y [M, N] sharded along M

Both are differentiable (custom_vjp, the mirrored rings: the all-gather's dgrad is a reduce-scatter ring and its
wgrad reads the gathered x the forward kept; the reduce-scatter's dgrad is an all-gather ring of dy). FP8 current
scaling (x_quantizer / w_quantizer, per tensor): the amax is reduced over the axis first (every rank's chunk has the
unsharded tensor's scale, so the result is the unsharded FP8 GEMM's bytes), the codes travel; the backward runs in
the operands' precision. `sm_margin`: SMs the chunk GEMMs leave to NCCL's kernels (None: the core's default).
`comm_overlap=False`: the same exchanges, then the same GEMMs (the non-overlapped baseline, the same bytes).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from . import _ffi
from .cpp_extensions import _register
from .collective import _quantized, _shard_map
from .gemm import _CODE, _DTYPE, gemm
from .scaled_tensor import ScaledTensor

__all__ = ["available", "initialize", "all_gather_gemm", "gemm_reduce_scatter"]

_TARGET = "te_collective_gemm"
_AG, _RS = 1, 2
_KV_TIMEOUT_MS = 300_000


def _nccl_path() -> str:
    """libnccl.so.2 of the nvidia-nccl wheel (what torch and jax's CUDA plugin bring), else the loader's search."""
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    for root in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(root, "lib", "libnccl.so.2")
        if os.path.isfile(lib):
            return lib
    return ""


def available(mesh=None) -> bool:
    """Whether the FFI form can run: a CUDA build with the NCCL transport and (given a mesh) GPU devices."""
    if not (_ffi.with_cuda and _ffi.nccl_built()):
        return False
    devices = getattr(mesh, "devices", None) if mesh is not None else None
    if mesh is not None and devices is None:  # an abstract mesh: no devices to bind communicators to
        return False
    return mesh is None or all(d.platform == "gpu" for d in np.asarray(devices).flat)


def _rings(mesh, axis: str) -> np.ndarray:
    """[rings, tp] devices: each row one ring along `axis`, its rank order the axis index's."""
    if axis not in mesh.axis_names:
        raise ValueError(f"collective GEMM: mesh axes {mesh.axis_names} have no {axis!r}")
    devs = np.moveaxis(np.asarray(mesh.devices), mesh.axis_names.index(axis), -1)
    return devs.reshape(-1, devs.shape[-1])


def _key(rings: np.ndarray) -> int:
    ids = ",".join(str(d.id) for d in rings.flat) + f"/{rings.shape[1]}"
    return int.from_bytes(hashlib.sha256(ids.encode()).digest()[:8], "little") & ((1 << 63) - 1)


_made: set = set()
# key -> the rings of that key whose every member is a device of this process, [[(device, rank), ...], ...]: their
# reduce-scatter can move the partials with the copy engine (csrc/core/comm/local_windows.h) instead of NCCL
_local_rings: dict = {}


def initialize(mesh, axis: str) -> int:
    """Creates (once) the NCCL communicators of every ring along `axis` that holds a device of this process; returns
    their registry key. Every process holding a member must call it (tej's collective functions do, at trace time).
    Several processes: ring r's NCCL id is published by the process of its rank-0 device under a key of
    jax.distributed's key-value store and read by the others (jax.distributed.initialize must have run)."""
    if not available(mesh):
        raise NotImplementedError("collective GEMM over NCCL: needs a CUDA build with NCCL and a mesh of GPUs; on "
                                  "other devices use transformer_engine_jax.collective (the ppermute ring)")
    rings = _rings(mesh, axis)
    key = _key(rings)
    if key in _made:
        return key
    if not _ffi.nccl_loaded():
        _ffi.nccl_load(_nccl_path())
    me = jax.process_index()
    client = None
    if jax.process_count() > 1:
        from jax._src import distributed

        client = distributed.global_state.client
        if client is None:
            raise RuntimeError("collective GEMM over NCCL: several processes but no jax.distributed client; call "
                               "jax.distributed.initialize() first")
    tp = rings.shape[1]
    for i, ring in enumerate(rings):
        members = [(int(d.local_hardware_id), r) for r, d in enumerate(ring) if d.process_index == me]
        if not members:
            continue
        if len(members) == tp:
            _local_rings.setdefault(key, []).append(members)
        name = f"transformer_engine_jax/nccl/{key}/{i}"
        if ring[0].process_index == me:
            uid = _ffi.nccl_unique_id()
            if client is not None:
                client.key_value_set(name, uid.hex())
        else:
            uid = bytes.fromhex(client.blocking_key_value_get(name, _KV_TIMEOUT_MS))
        _ffi.nccl_create(key, uid, tp, members)
    _made.add(key)
    return key


# ---- one device's call ------------------------------------------------------------------------------------------
def _call(kind, key, tp, x, x_scale, w, w_scale, out_dtype, overlap, sm_margin, keep, w_kn=False):
    """te_collective_gemm on this device's operands (inside shard_map) -> (out, gathered or None). w: [n, k], or
    [k, n] with w_kn (plain operands)."""
    _register()
    inputs = (x, x_scale, w, w_scale)
    plan = _ffi.plan_collective_gemm([(list(a.shape), _CODE[jnp.dtype(a.dtype)]) for a in inputs], kind, tp,
                                     _CODE[jnp.dtype(out_dtype)], True, sm_margin, keep, bool(w_kn),
                                     True)
    copy_engine = bool(plan["window_bytes"]) and key in _local_rings and _transport() == "copy_engine"
    if copy_engine:
        _ffi.local_windows_ensure(key, _local_rings[key], plan["window_bytes"])
    gathered = tuple(plan["gathered"])
    results = [jax.ShapeDtypeStruct(tuple(plan["out"][0]), _DTYPE[plan["out"][1]]),
               jax.ShapeDtypeStruct(gathered, x.dtype), jax.ShapeDtypeStruct((plan["workspace_bytes"],), jnp.uint8)]
    out, g, _ = jax.ffi.ffi_call(_TARGET, results)(
        *inputs, kind=np.int64(kind), comm=np.int64(key), tp=np.int64(tp), overlap=bool(overlap),
        use_split_accumulator=True, sm_margin=np.int64(sm_margin), keep_gathered=bool(keep), w_kn=bool(w_kn),
        copy_engine=copy_engine)
    return out, (g if keep else None)


def _transport() -> str:
    """The reduce-scatter's transport where a ring's members are all this process's devices: NVTE_COLLECTIVE_GEMM_
    TRANSPORT = "copy_engine" (default: windows every member maps, the partials moved by the copy engine, no NCCL
    kernel beside the GEMMs) or "nccl". Read at trace time (the call's copy_engine attribute)."""
    choice = os.environ.get("NVTE_COLLECTIVE_GEMM_TRANSPORT", "copy_engine").strip().lower() or "copy_engine"
    if choice not in ("copy_engine", "nccl"):
        raise ValueError(f"collective GEMM: NVTE_COLLECTIVE_GEMM_TRANSPORT={choice!r} is not one of copy_engine, "
                         f"nccl")
    return choice


def _operand(a, quantizer, axis):
    """(values or FP8 codes, scale_inv f32[1] or empty): FP8 with the amax reduced over `axis`."""
    if quantizer is None:
        return a, jnp.zeros((0,), jnp.float32)
    q = _quantized(a, quantizer, axis)
    assert isinstance(q, ScaledTensor)
    return q.data, q.scale_inv.reshape(1).astype(jnp.float32)


def _margin(sm_margin) -> int:
    """None: -1, the core's default for NCCL (the core's planner refuses a negative margin at trace time)."""
    return -1 if sm_margin is None else int(sm_margin)


def _sharded(kind, x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype, keep=False):
    """te_collective_gemm on every device of the mesh. All-gather: x [M, K] sharded along M, w [N, K] along N -> y
    sharded along N (keep: also the gathered x, replicated). Reduce-scatter: x and w sharded along K -> y sharded
    along M."""
    key, tp = initialize(mesh, axis), mesh.shape[axis]

    def local(x, w):
        xd, xs = _operand(x, xq, axis)
        wd, ws = _operand(w, wq, axis)
        out, g = _call(kind, key, tp, xd, xs, wd, ws, out_dtype, overlap, sm_margin, keep)
        return (out, g) if keep else out

    if kind == _AG:
        ins, out = (P(axis, None), P(axis, None)), P(None, axis)
    else:
        ins, out = (P(None, axis), P(None, axis)), P(axis, None)
    return _shard_map(local, mesh, ins, (out, P(None, None)) if keep else out, check=False)(x, w)


def _check(op, x, w, mesh, axis, split_x_dim):
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"{op}: x [M, K] and w [N, K] with the same K, got x {tuple(x.shape)}, w {tuple(w.shape)}")
    tp = mesh.shape[axis]
    if tp < 2:
        raise ValueError(f"{op}: mesh axis {axis!r} has {tp} device; a collective GEMM needs a ring of 2 or more")
    for name, a, dim in (("x", x, split_x_dim), ("w", w, 0 if split_x_dim == 0 else 1)):
        if a.shape[dim] % tp:
            raise ValueError(f"{op}: {name} {tuple(a.shape)} dim {dim} must split into tp = {tp} equal shards "
                             f"(mesh axis {axis!r})")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7, 8))
def _ag(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype):
    return _sharded(_AG, x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype)


def _ag_fwd(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype):
    if xq is None and wq is None:
        y, gathered = _sharded(_AG, x, w, mesh, axis, None, None, overlap, sm_margin, out_dtype, keep=True)
        return y, (gathered, w, None)
    y = _sharded(_AG, x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype)
    return y, (None, w, x)


def _ag_bwd(mesh, axis, xq, wq, overlap, sm_margin, out_dtype, res, dy):
    gathered, w, x = res
    dy = dy.astype(w.dtype)
    if gathered is None:  # a quantized forward: the backward in the operands' precision
        gathered = jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, P(None, None)))
    # dx [M, K] sharded along M = reduce-scatter over the ranks' dy [M, N/tp] · w [N/tp, K]: the RS ring with
    # "x" = dy (split along N) and "w" = wᵀ [K, N] (split along N).
    dx = _sharded(_RS, dy, w.T, mesh, axis, None, None, overlap, sm_margin, w.dtype)
    dx = dx.astype(gathered.dtype if x is None else x.dtype)
    dw = gemm(dy, gathered, ((0,), (0,)), out_dtype=w.dtype)  # dyᵀ · gathered x: [N, K], sharded along N
    return dx, dw


_ag.defvjp(_ag_fwd, _ag_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7, 8))
def _rs(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype):
    return _sharded(_RS, x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype)


def _rs_fwd(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype):
    return _rs(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype), (x, w)


def _rs_bwd(mesh, axis, xq, wq, overlap, sm_margin, out_dtype, res, dy):
    x, w = res
    dy = dy.astype(w.dtype)
    # dx [M, K] sharded along K = all-gather of dy [M/tp, N] times w [N, K/tp]: the AG ring with "w" = wᵀ [K, N]
    # sharded along K, keeping the gathered dy for dw.
    dx, gathered = _sharded(_AG, dy, w.T, mesh, axis, None, None, overlap, sm_margin, w.dtype, keep=True)
    dw = gemm(gathered, x, ((0,), (0,)), out_dtype=w.dtype)  # dyᵀ · x: [N, K], sharded along K
    return dx.astype(x.dtype), dw


_rs.defvjp(_rs_fwd, _rs_bwd)


def all_gather_gemm(x, w, mesh, axis: str, *, x_quantizer=None, w_quantizer=None, comm_overlap=True, sm_margin=None,
                    out_dtype=None):
    """y [M, N] = x [M, K] · w [N, K]ᵀ with x sharded along M and w along N over `axis` (a column-parallel layer's
    sequence-parallel input): each device's te_collective_gemm gathers x around the NCCL ring while it multiplies the
    chunks it has; y comes back sharded along N. Bit for bit the unsharded tej.gemm (FP8: of the unsharded
    quantization)."""
    _check("all_gather_gemm", x, w, mesh, axis, 0)
    out_dtype = jnp.dtype(out_dtype or (x.dtype if x_quantizer is None else jnp.bfloat16))
    return _ag(x, w, mesh, axis, x_quantizer, w_quantizer, bool(comm_overlap), _margin(sm_margin), out_dtype)


def gemm_reduce_scatter(x, w, mesh, axis: str, *, x_quantizer=None, w_quantizer=None, comm_overlap=True,
                        sm_margin=None, out_dtype=None):
    """y [M, N] = x [M, K] · w [N, K]ᵀ with x and w sharded along K over `axis` (a row-parallel layer with a
    sequence-parallel output): each device computes its FP32 partial products chunk by chunk and sends each to the
    chunk's owner while the next is computed — by the copy engine where one process drives every device of the ring
    (_transport), else by NCCL (chunk c summed over ranks c + 1, …, c, rounded once); y comes back sharded along M."""
    _check("gemm_reduce_scatter", x, w, mesh, axis, 1)
    if x.shape[0] % mesh.shape[axis]:
        raise ValueError(f"gemm_reduce_scatter: x's {x.shape[0]} rows must split into tp = {mesh.shape[axis]} "
                         f"output shards (mesh axis {axis!r})")
    out_dtype = jnp.dtype(out_dtype or (x.dtype if x_quantizer is None else jnp.bfloat16))
    return _rs(x, w, mesh, axis, x_quantizer, w_quantizer, bool(comm_overlap), _margin(sm_margin), out_dtype)
