"""The collective GEMM's checks before its ring (collective.py): one rank raising alone would leave the others waiting
in the ring for it forever, so every rank first runs its local checks, then all ranks exchange one fixed-size int64
record each (one all_gather over the group) and decide from the same tp records: every rank raises the same error,
or none does. No operand byte moves before that.

The invariant: every field of the record but the message is equal on every rank, or every rank raises. Equal fields
make the ring's chunk sizes and wire dtype match (AG: x shards [m, K]; RS: [M/tp, N] FP32 partial sums), make the
chunk GEMM's plan decide alike on every rank (its rules read only shapes, dtypes and formats, so a plan error is
raised by every rank before the first exchange) and make the backward run the same rings everywhere (the dgrad ring
runs where x requires grad).

Cost: one all_gather of tp × 704 bytes (on a gloo or "cpu:gloo,cuda:nccl" group through gloo on the host; on a
NCCL-only group on the GPU, reading it back waiting for the current stream). By default ("once") the ranks exchange
each operand signature once per group: a call whose record the whole group already agreed on skips the exchange,
so a training loop pays it in its first step only (measured on 4 × H200 per call: +6.5 % of a bf16 and +17 % of an
FP8 tensor-parallel MLP step, benchmarks/bench_tp_mlp.py). What "once" does not catch: one rank alone changing its
operands after the group agreed on them (the others skip the exchange, so the ring fails in the transport; NCCL's
watchdog ends it). `validate=True` (or NVTE_COLLECTIVE_GEMM_VALIDATE=always) exchanges on every call; `validate=False`
(or =0, the same on every rank) keeps only the local checks. The backward's rings reuse the forward's checked
shapes and do not repeat it. The exchange is skipped (local checks only) while a CUDA graph is captured (a capture
reuses the shapes its eager warm-up checked; reading a device value is not allowed there) and while torch.compile
traces. A group of one is refused (ValueError: not a collective; tex.Linear / tex.MLP with a tp_group of one run
unsharded)."""
from __future__ import annotations

import os
import struct

import torch

from ._collective_window import transport
from .dtypes import DType, as_dtype
from .formats.base import QuantizedTensor, Quantizer
from .formats.fp8 import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor

AG, RS = 1, 2
OP_NAMES = {AG: "all_gather_gemm", RS: "gemm_reduce_scatter"}
_OPERAND_NAMES = {AG: ("x_shard", "w"), RS: ("x", "w_shard")}

# The record: _HEAD int64 fields (unknown: -1), then the rank's local error message, UTF-8, _MSG bytes.
_FIELDS = ("magic", "kind", "status", "x_rows", "x_k", "x_dtype", "x_wire", "x_format", "w_rows", "w_k", "w_dtype",
           "w_format", "out_dtype", "x_grad", "w_grad", "device", "transport", "msg_len")
_HEAD, _MSG = 20, 512
_LEN = _HEAD + _MSG // 8
_MAGIC = 0x7E22C0DE02  # record layout version 2
# status: 0 = the local checks passed, else the class of the local error (every rank re-raises the first one's).
_STATUS = {TypeError: 1, ValueError: 2, NotImplementedError: 3}
_ERRORS = {1: TypeError, 2: ValueError, 3: NotImplementedError, 4: RuntimeError}
_PLAIN = {torch.float32: int(DType.kFloat32), torch.float16: int(DType.kFloat16), torch.bfloat16: int(DType.kBFloat16)}
_SHORT = {int(DType.kFloat32): "fp32", int(DType.kFloat16): "fp16", int(DType.kBFloat16): "bf16",
          int(DType.kFloat8E4M3): "E4M3", int(DType.kFloat8E5M2): "E5M2"}
_DEVICES = {"cpu": 0, "cuda": 1}
_PLAIN_FMT, _FP8_FMT, _QUANTIZER_FMT = 0, 1, 2
SUPPORTED = ("the collective GEMM takes bf16/fp16/fp32 tensors and FP8 per tensor (a Float8Tensor, or a plain x with "
             "a Float8Quantizer or Float8CurrentScalingQuantizer)")


def _short(code):
    return _SHORT.get(code, "?")


def resolve_group(op, group):
    """The process group (None: the world), with the errors no peer can be waiting on (nothing to exchange with)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{op}: torch.distributed is not initialized: call torch.distributed.init_process_group(...) "
                         f"on every rank first")
    group = dist.group.WORLD if group is None else group
    if not isinstance(group, dist.ProcessGroup) or dist.get_rank(group) < 0:
        raise ValueError(f"{op}: this process (global rank {dist.get_rank()}) is not a member of the group it passed; "
                         f"call the op only on the group's ranks")
    return group


def _group_devices(group):
    """The device types the group's backends run on ({'cpu', 'cuda'} for gloo, {'cuda'} for NCCL)."""
    types = {d.type for d in getattr(group, "_device_types", ())}
    if not types:  # older torch: from the backend's name
        import torch.distributed as dist

        backend = str(dist.get_backend(group))
        types = {"cuda"} if backend == "nccl" else {"cpu"} if backend == "gloo" else {"cpu", "cuda"}
    return types


def _operand(rec, op, name, prefix, t):
    """Fills rec's fields of one operand as far as they are known, then raises the local error, if any."""
    if isinstance(t, (torch.Tensor, QuantizedTensor)) and t.dim() >= 1:
        shape = tuple(t.shape)
        rows = 1
        for s in shape[:-1]:
            rows *= s
        rec[f"{prefix}_rows"], rec[f"{prefix}_k"] = rows, shape[-1]
    if isinstance(t, Float8Tensor):
        rec[f"{prefix}_format"], rec[f"{prefix}_dtype"] = _FP8_FMT, int(t._fp8_dtype)
        if t._data is None:
            raise ValueError(f"{op}: {name} needs its rowwise copy (K along its last dim); quantize it with "
                             f"rowwise=True")
    elif isinstance(t, QuantizedTensor):
        fmt = type(t).gemm_format or type(t).__name__
        raise NotImplementedError(f"{op}: not yet supported: {name} as {type(t).__name__} ({fmt}); {SUPPORTED}. "
                                  f"Dequantize it, or quantize per tensor")
    elif isinstance(t, torch.Tensor):
        if t.dtype not in _PLAIN:
            raise TypeError(f"{op}: {name} must be a bf16/fp16/fp32 tensor or a Float8Tensor, got a {t.dtype} tensor")
        rec[f"{prefix}_format"], rec[f"{prefix}_dtype"] = _PLAIN_FMT, _PLAIN[t.dtype]
    else:
        raise TypeError(f"{op}: {name} must be a torch.Tensor (bf16/fp16/fp32) or a Float8Tensor, got "
                        f"{type(t).__name__}")
    if t.dim() < 1:
        raise ValueError(f"{op}: {name} must have at least one dim (K is its last), got a 0-d tensor")


def _local_checks(rec, kind, x, w, quantizer, out_dtype, return_gathered, differentiable, types):
    """Every check one rank can make alone; fills rec along the way (what it reached is in the others' messages)."""
    op = OP_NAMES[kind]
    xn, wn = _OPERAND_NAMES[kind]
    _operand(rec, op, xn, "x", x)
    rec["x_wire"] = rec["x_dtype"]
    if quantizer is not None:
        if not isinstance(quantizer, Quantizer):
            raise TypeError(f"{op}: quantizer must be a tex Quantizer or None, got {type(quantizer).__name__}")
        if not isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)):
            fmt = getattr(quantizer.tensor_class, "gemm_format", None) or type(quantizer).__name__
            raise NotImplementedError(f"{op}: not yet supported: quantizer {type(quantizer).__name__} ({fmt}); "
                                      f"{SUPPORTED}")
        if isinstance(x, QuantizedTensor):
            raise ValueError(f"{op}: quantizer quantizes a plain {xn}; {xn} is already {type(x).__name__}")
        if not quantizer.rowwise_usage:
            raise ValueError(f"{op}: the quantizer must make the rowwise copy (rowwise=True): the ring moves and "
                             f"multiplies {xn}'s rows")
        rec["x_format"], rec["x_wire"] = _QUANTIZER_FMT, int(quantizer.dtype)
    _operand(rec, op, wn, "w", w)
    if x.device != w.device:
        raise ValueError(f"{op}: {xn} is on {x.device} but {wn} on {w.device}; move them to one device")
    rec["device"] = _DEVICES.get(x.device.type, 2)
    if x.device.type not in types:
        raise ValueError(f"{op}: {xn} is on {x.device} but the group runs on {'/'.join(sorted(types))} (gloo: CPU "
                         f"tensors, NCCL: each rank's GPU); move the operands there")
    if rec["x_k"] != rec["w_k"]:
        raise ValueError(f"{op}: {xn}'s last dim K={rec['x_k']} differs from {wn}'s K={rec['w_k']} ({xn} "
                         f"[rows, K], {wn} [n, K]: y = {xn}·{wn}ᵀ)")
    if out_dtype is None:
        rec["out_dtype"] = rec["x_dtype"] if rec["x_format"] != _FP8_FMT else int(DType.kBFloat16)
    else:
        d = int(as_dtype(out_dtype, f"{op} out_dtype"))
        if d not in _PLAIN.values():
            raise TypeError(f"{op}: out_dtype must be bf16, fp16 or fp32, got {DType(d).name}")
        rec["out_dtype"] = d
    if return_gathered and differentiable:
        raise ValueError(f"{op}: return_gathered is for calls without autograd (the autograd form keeps the "
                         f"gathered x itself)")
    rec["x_grad"] = int(differentiable and bool(x.requires_grad))
    rec["w_grad"] = int(differentiable and bool(w.requires_grad))


def _pack(rec, message):
    raw = message.encode("utf-8")
    if len(raw) > _MSG:
        raw = raw[:_MSG - 3].decode("utf-8", "ignore").encode("utf-8") + "…".encode("utf-8")
    rec["msg_len"] = len(raw)
    head = [int(rec.get(f, -1)) for f in _FIELDS] + [0] * (_HEAD - len(_FIELDS))
    return head + list(struct.unpack(f"<{_MSG // 8}q", raw.ljust(_MSG, b"\0")))


def _unpack(values):
    rec = dict(zip(_FIELDS, values[:len(_FIELDS)]))
    n = max(0, min(rec["msg_len"], _MSG))
    rec["message"] = struct.pack(f"<{_MSG // 8}q", *values[_HEAD:])[:n].decode("utf-8", "ignore")
    return rec


def _describe(rec, with_op=False):
    """'x_shard [24, 64] bf16, w [48, 64] bf16, out bf16, on cpu' — the record as a message names it."""
    kind = rec["kind"]
    xn, wn = _OPERAND_NAMES.get(kind, ("x", "w"))

    def operand(name, p, wire=None):
        shape = f"[{rec[p + '_rows']}, {rec[p + '_k']}]" if rec[p + "_k"] >= 0 else "[?]"
        if rec[p + "_format"] == _FP8_FMT:
            return f"{name} Float8Tensor{shape} {_short(rec[p + '_dtype'])}"
        text = f"{name} {shape} {_short(rec[p + '_dtype'])}"
        return text + (f" quantized to {_short(wire)}" if rec[p + "_format"] == _QUANTIZER_FMT else "")

    text = f"{operand(xn, 'x', rec['x_wire'])}, {operand(wn, 'w')}, out {_short(rec['out_dtype'])}"
    text = f"{OP_NAMES.get(kind, '?')}: {text}" if with_op else text
    grads = [n for n, f in ((xn, "x_grad"), (wn, "w_grad")) if rec[f] > 0]
    device = {0: "cpu", 1: "cuda"}.get(rec["device"], "?")
    return text + f", on {device}" + (f", requires grad: {' and '.join(grads)}" if grads else "")


_WHAT = {"kind": "the op", "x_rows": "x rows", "x_k": "K", "x_dtype": "x dtype", "x_wire": "x dtype",
         "x_format": "x dtype", "w_rows": "w rows", "w_k": "K", "w_dtype": "w dtype", "w_format": "w dtype",
         "out_dtype": "out_dtype", "x_grad": "requires_grad", "w_grad": "requires_grad", "device": "device",
         "transport": "transport (NVTE_COLLECTIVE_GEMM_TRANSPORT)"}
_RULE = {AG: "every rank's x_shard must be [m, K] with the same m, K and dtype (the ring moves equal chunks), and w "
             "[N_local, K] the same shape and dtype on every rank",
         RS: "every rank's x must be [M, K_local] and w_shard [N, K_local] with the same M, K_local, N and dtypes "
             "(the ring adds equal [M/tp, N] FP32 partial sums)"}


def _decide(recs, tp):
    """The one error every rank raises from the same tp records (None: they agree); built from the records alone,
    so that its message is the same on every rank."""
    op = "/".join(dict.fromkeys(OP_NAMES.get(rec["kind"], "?") for rec in recs))
    strangers = [r for r, rec in enumerate(recs) if rec["magic"] != _MAGIC]
    if strangers:
        return RuntimeError, (f"{op}: ranks {strangers} of {tp} sent no collective GEMM record (they are in another "
                              f"collective call): every rank of the group must call the same ops in the same order")
    failed = [r for r, rec in enumerate(recs) if rec["status"]]
    if failed:
        err = _ERRORS.get(recs[failed[0]]["status"], RuntimeError)
        messages = {recs[r]["message"] for r in failed}
        if len(failed) == tp and len(messages) == 1:
            return err, f"{messages.pop()} (on every rank of the group of {tp}; no data was exchanged)"
        who = f"rank {failed[0]}" if len(failed) == 1 else "ranks " + ", ".join(map(str, failed))
        detail = "; ".join(f"rank {r}: {_ERRORS.get(recs[r]['status'], RuntimeError).__name__}: {recs[r]['message']}"
                           for r in failed)
        return err, (f"{op}: {who} of {tp} failed the local checks, so no rank starts the ring and every rank raises "
                     f"this error. {detail}")
    differ = [f for f in _WHAT if len({rec[f] for rec in recs}) > 1]
    if differ:
        names = ", ".join(dict.fromkeys(_WHAT[f] for f in differ))
        ranks = "; ".join(f"rank {r}: {_describe(rec, 'kind' in differ)}" for r, rec in enumerate(recs))
        rule = _RULE[recs[0]["kind"]] if "kind" not in differ else "every rank of the group must call the same op"
        return ValueError, (f"{op}: the {tp} ranks' operands differ in {names}: {rule}, the same out_dtype, and x and "
                            f"w requiring grad alike on every rank (the backward runs rings too). No data was "
                            f"exchanged; every rank raises this error. {ranks}")
    return None


def _exchange(group, tp, values, types):
    import torch.distributed as dist

    device = torch.device("cpu") if "cpu" in types else torch.device("cuda", torch.cuda.current_device())
    mine = torch.tensor(values, dtype=torch.int64)
    if device.type != "cpu":
        mine = mine.to(device)
    out = torch.empty(tp * _LEN, dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(out, mine, group=group)
    flat = out.tolist()
    return [flat[r * _LEN:(r + 1) * _LEN] for r in range(tp)]


def _exchange_possible(x):
    if torch.compiler.is_compiling():
        return False
    dev = getattr(x, "device", None)
    return not (isinstance(dev, torch.device) and dev.type == "cuda" and torch.cuda.is_current_stream_capturing())


def check(kind, x, w, group, *, quantizer=None, out_dtype=None, return_gathered=False, differentiable=False,
          validate=None, sm_margin=None, layout="TN"):
    """The checks before the ring of `kind` (AG or RS) on this rank's operands; returns the group (resolved) after
    every rank agreed, or raises the error every rank raises (module docstring)."""
    op = OP_NAMES[kind]
    group = resolve_group(op, group)
    tp = group.size()
    types = _group_devices(group)
    rec = {"magic": _MAGIC, "kind": kind, "status": 0}
    local = None
    try:
        _local_checks(rec, kind, x, w, quantizer, out_dtype, return_gathered, differentiable, types)
        # this process's reduce-scatter transport on CUDA (_collective_window.py): 0 the process group's send/receive,
        # 1 the copy engine's windows; recorded for every op, so that ranks that chose differently are told at their
        # first collective GEMM
        rec["transport"] = int(x.device.type == "cuda" and transport(group) == "copy_engine")
        if layout != "TN":
            raise ValueError(f"{op}: layout {layout!r} is not supported; the collective GEMM takes \"TN\" (w [N, K], "
                             f"D = X·Wᵀ): pass the weight's [N, K] copy")
        if sm_margin is not None and (not isinstance(sm_margin, int) or sm_margin < 0):
            raise ValueError(f"{op}: sm_margin must be an int >= 0 (the SMs the chunk GEMMs leave to the exchanges; "
                             f"None: the core's default), got {sm_margin!r}")
    except Exception as e:  # noqa: BLE001  (every local error travels to the peers, then is raised by all)
        local = e
    mode = _mode(validate)
    if tp == 1:  # no peer waits on this rank: raised at once
        if local is not None:
            raise local
        raise ValueError(f"{op}: the group has one rank; a collective GEMM needs a group of 2 or more (tp = 1 is the "
                         f"plain GEMM: tex.general_gemm, or tex.Linear / tex.MLP, whose tp_group of one runs the "
                         f"unsharded layer)")
    if mode == "off" or not _exchange_possible(x):
        if local is not None:
            raise local
        return group
    if local is not None:
        rec["status"] = next((c for t, c in _STATUS.items() if isinstance(local, t)), 4)
    packed = _pack(rec, str(local) if local is not None else "")
    signature = (id(group), tuple(packed))
    if mode == "once" and local is None and signature in _AGREED:
        return group
    recs = [_unpack(v) for v in _exchange(group, tp, packed, types)]
    verdict = _decide(recs, tp)
    if verdict is None and kind == RS and recs[0]["x_rows"] % tp:
        verdict = ValueError, (f"{op}: reduce-scatter splits x's {recs[0]['x_rows']} rows into tp = {tp} equal "
                               f"chunks: the rows must be a multiple of tp (every rank: {_describe(recs[0])}). No "
                               f"data was exchanged; every rank raises this error")
    if verdict is not None:
        err, message = verdict
        raise err(message) from local
    if len(_AGREED) < _AGREED_MAX:
        _AGREED.add(signature)
    return group


# Signatures (group, record) every rank of the group agreed on: "once" skips their exchange from then on.
_AGREED: set = set()
_AGREED_MAX = 4096


def _mode(validate) -> str:
    """validate: True "always", False "off", None the environment's NVTE_COLLECTIVE_GEMM_VALIDATE ("once" by default;
    "1"/"always", "0"/"off")."""
    if validate is not None:
        return "always" if validate else "off"
    env = os.environ.get("NVTE_COLLECTIVE_GEMM_VALIDATE", "once").lower()
    return {"1": "always", "always": "always", "0": "off", "off": "off"}.get(env, "once")
