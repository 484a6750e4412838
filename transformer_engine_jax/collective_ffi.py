"""The FFI form of the collective GEMM on GPUs (issues 22, 33): the NCCL communicators of a mesh axis's rings
(`initialize`), the copy-engine windows of rings one process drives, and one device's `te_collective_gemm` call
(`call`, inside shard_map or a custom_partitioning body: the core's ring schedule, csrc/core/ops/collective_gemm_op.h).
Its callers: collective_nccl.py (the explicit, differentiable all_gather_gemm / gemm_reduce_scatter) and tej.gemm's
partitioning (gemm.py's ring forms on GPUs). It imports neither, so both can import it (issue 33).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from .cpp_extensions import _register
from .dtype_codes import CODE, DTYPE

__all__ = ["AG", "RS", "available", "initialize", "call", "transport", "local_rings"]

_TARGET = "te_collective_gemm"
AG, RS = 1, 2
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
local_rings: dict = {}


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
            local_rings.setdefault(key, []).append(members)
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
def call(kind, key, tp, x, x_scale, w, w_scale, out_dtype, overlap, sm_margin, keep, w_kn=False):
    """te_collective_gemm on this device's operands (inside shard_map) -> (out, gathered or None). w: [n, k], or
    [k, n] with w_kn (plain operands)."""
    _register()
    inputs = (x, x_scale, w, w_scale)
    plan = _ffi.plan_collective_gemm([(list(a.shape), CODE[jnp.dtype(a.dtype)]) for a in inputs], kind, tp,
                                     CODE[jnp.dtype(out_dtype)], True, sm_margin, keep, bool(w_kn),
                                     True)
    # the reduce-scatter (the kind the copy engine serves: a window) asks the core; the copy engine needs every member
    # here (local_windows maps no other process's memory), else NCCL
    local = key in local_rings
    copy_engine = bool(plan["window_bytes"]) and transport(local) == "copy_engine" and local
    if copy_engine:
        _ffi.local_windows_ensure(key, local_rings[key], plan["window_bytes"])
    gathered = tuple(plan["gathered"])
    results = [jax.ShapeDtypeStruct(tuple(plan["out"][0]), DTYPE[plan["out"][1]]),
               jax.ShapeDtypeStruct(gathered, x.dtype), jax.ShapeDtypeStruct((plan["workspace_bytes"],), jnp.uint8)]
    out, g, _ = jax.ffi.ffi_call(_TARGET, results)(
        *inputs, kind=np.int64(kind), comm=np.int64(key), tp=np.int64(tp), overlap=bool(overlap),
        use_split_accumulator=True, sm_margin=np.int64(sm_margin), keep_gathered=bool(keep), w_kn=bool(w_kn),
        copy_engine=copy_engine)
    return out, (g if keep else None)


def transport(node_local: bool) -> str:
    """The reduce-scatter's transport, "copy_engine" or "nccl": the core's decision (csrc/core/ops/collective_gemm_op.h:
    NVTE_COLLECTIVE_GEMM_TRANSPORT, else the copy engine for a node-local ring, NCCL otherwise; a bad value raises the
    core's ValueError). Here a ring is node-local when this process drives every member (its windows are then mapped
    by comm/local_windows.h). Read at trace time (the call's copy_engine attribute)."""
    return _ffi.collective_transport(bool(node_local))
