"""The copy-engine transport's windows for the collective GEMM's reduce-scatter (csrc/core/comm/transport.h,
CopyEngineWindow): one symmetric-memory buffer per (group, device), every rank's mapped into every process by
torch.distributed's symmetric memory, so that each rank's partial sums are copied by the copy engine straight into
their owner's window — no NCCL send/receive kernels competing with the chunk GEMMs for SMs.

Which transport: the core decides (csrc/core/ops/collective_gemm_op.h, te::ops::collective_transport, asked through
torch.ops.te.collective_transport): NVTE_COLLECTIVE_GEMM_TRANSPORT = "copy_engine" or "nccl" (the process group's
send/receive); unset, the copy engine when every rank of the group is on this node (symmetric memory maps the peers of
one node; node_local below is what torch tells the core), NCCL otherwise. Every rank must make the same choice; it
travels in the agreement record. The window's size is the core's formula too (torch.ops.te.collective_window_bytes).
A window grows, collectively, when a call needs more than it holds; growing inside a CUDA graph capture raises — run
the op once before capturing it.
"""
from __future__ import annotations

import os

import torch

_FLAG_BYTES, _FREE_OFFSET = 4096, 2048  # CopyEngineWindow::kFlagBytes / kFreeOffset
_GRAIN = 2 << 20
_WINDOWS: dict = {}
_RS = 2  # te::ops::CollectiveKind::kReduceScatter


def transport(group=None) -> str:
    """The reduce-scatter's transport on CUDA for `group` (None: the world), "copy_engine" or "nccl": the core's
    decision (the environment's choice, else the copy engine when the group is node-local; a bad value raises the
    core's ValueError)."""
    return torch.ops.te.collective_transport(node_local(group))


def node_local(group=None) -> bool:
    """Whether every rank of `group` runs on this node: under torchrun a node's ranks are the block of
    LOCAL_WORLD_SIZE consecutive global ranks; without its variables, a group no larger than this node's GPU count."""
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    per_node = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if per_node.isdigit() and int(per_node) > 0:
        return len({r // int(per_node) for r in ranks}) == 1
    return len(ranks) <= torch.cuda.device_count()


def window_bytes(rows: int, n: int, tp: int) -> int:
    """What a reduce-scatter of x [rows, K] into y [rows/tp, n] receives, flags page included: the core's
    collective_window_bytes (the formula's one home; its plan checks the window it is given against it)."""
    return torch.ops.te.collective_window_bytes(_RS, rows, n, tp)


def window(op: str, group, nbytes: int, device: torch.device) -> list:
    """[bytes, base of rank 0's window, …] for the core, growing the group's window to `nbytes` first (collective:
    every rank of the group makes the same call, as their agreed operands make them need the same bytes)."""
    key = (group.group_name, device.index)
    held = _WINDOWS.get(key)
    if held is None or held[0] < nbytes:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{op}: the copy-engine window of group {group.group_name!r} holds "
                               f"{0 if held is None else held[0]} bytes and this call needs {nbytes}; it cannot grow "
                               f"inside a CUDA graph capture: run the op once before capturing it")
        held = _grow(group, -(-nbytes // _GRAIN) * _GRAIN, device)
        _WINDOWS[key] = held
    return held[1]


def _grow(group, nbytes: int, device: torch.device):
    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm

    torch.cuda.synchronize(device)  # no call in flight reads the old window
    buf = symm.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symm.rendezvous(buf, group)
    flags = buf[:_FLAG_BYTES].view(torch.int32)
    flags[: _FREE_OFFSET // 4].zero_()  # ready[p] = 0
    flags[_FREE_OFFSET // 4:].fill_(1)  # free[p] = 1: every peer may write
    torch.cuda.synchronize(device)
    dist.barrier(group=group, device_ids=[device.index])  # every window initialised before any peer writes into it
    offset = buf.data_ptr() - handle.buffer_ptrs[handle.rank]
    return nbytes, [nbytes] + [int(p) + offset for p in handle.buffer_ptrs], buf, handle
