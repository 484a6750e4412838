"""The reduce-scatter's transport choice and window size on the CPU: both are the core's (issue 33,
csrc/core/ops/collective_gemm_op.h: te::ops::collective_transport, collective_window_bytes), asked through
torch.ops.te and by transformer_engine_torch/_collective_window.py. The choice decides whether the ranks map each
other's memory, so a group that spans nodes must never get the copy engine unless asked for, and a bad name must be
refused with the variable and the allowed values named — the same message tej gives (tests/jax/
test_collective_transport_jax.py)."""
import re

import pytest
import torch

import transformer_engine_torch  # noqa: F401  (registers te::)
from transformer_engine_torch import _collective_window as cw

KEY = "NVTE_COLLECTIVE_GEMM_TRANSPORT"
# The core's one message for a bad value (tej's is the same string).
BAD = "collective GEMM: NVTE_COLLECTIVE_GEMM_TRANSPORT='{}' is not one of copy_engine, nccl"


@pytest.fixture
def ranks_are_groups(monkeypatch):
    """A group is given as its list of global ranks."""
    monkeypatch.setattr(torch.distributed, "get_process_group_ranks", lambda group: list(group))
    monkeypatch.delenv(KEY, raising=False)


@pytest.mark.parametrize("value, node_local, want", [
    (None, True, "copy_engine"), (None, False, "nccl"),          # unset: the default rule
    ("", True, "copy_engine"), ("  ", False, "nccl"),             # blank is unset
    ("copy_engine", True, "copy_engine"), ("copy_engine", False, "copy_engine"),
    ("nccl", True, "nccl"), ("nccl", False, "nccl"),
    (" Copy_Engine ", False, "copy_engine"), ("NCCL\n", True, "nccl"),  # case and surrounding blanks ignored
])
def test_the_core_decides(monkeypatch, value, node_local, want):
    if value is None:
        monkeypatch.delenv(KEY, raising=False)
    else:
        monkeypatch.setenv(KEY, value)
    assert torch.ops.te.collective_transport(node_local) == want


@pytest.mark.parametrize("value, shown", [("bogus", "bogus"), (" NCCL2 ", "nccl2"), ("copy-engine", "copy-engine")])
def test_the_core_refuses_a_bad_value(monkeypatch, value, shown):
    monkeypatch.setenv(KEY, value)
    for node_local in (True, False):
        with pytest.raises(ValueError) as e:
            torch.ops.te.collective_transport(node_local)
        assert str(e.value).splitlines()[0] == BAD.format(shown)


def test_torchrun_nodes_decide(ranks_are_groups, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # nodes hold global ranks 0-3, 4-7, ...
    assert cw.transport([4, 5, 6, 7]) == "copy_engine"
    assert cw.transport([0, 2]) == "copy_engine"
    assert cw.transport([2, 3, 4, 5]) == "nccl"  # spans two nodes
    assert cw.transport([0, 4]) == "nccl"


def test_without_torchrun_the_gpu_count_decides(ranks_are_groups, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cw.transport([0, 1]) == "copy_engine"
    assert cw.transport([0, 1, 2]) == "nccl"


def test_the_environment_wins_and_bad_names_are_refused(ranks_are_groups, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv(KEY, "nccl")
    assert cw.transport([4, 5]) == "nccl"
    monkeypatch.setenv(KEY, " Copy_Engine ")
    assert cw.transport([2, 3, 4, 5]) == "copy_engine"
    monkeypatch.setenv(KEY, "bogus")
    with pytest.raises(ValueError, match="^" + re.escape(BAD.format("bogus"))):
        cw.transport([0, 1])


def _window_bytes(rows, n, tp):
    """The copy-engine window, computed here from transport.h's layout: the flags page (CopyEngineWindow::kFlagBytes
    = 4096) then one FP32 [rows/tp, n] partial from each of the tp − 1 peers."""
    return 4096 + (tp - 1) * (rows // tp) * n * 4


@pytest.mark.parametrize("rows, n, tp", [(8, 3, 4), (4096, 8192, 2), (6, 5, 3), (128, 64, 8), (16, 16, 1)])
def test_window_bytes_are_the_cores(rows, n, tp):
    """The formula lives in the core alone: the torch op, _collective_window.window_bytes and an independent
    computation agree; the all-gather (which the copy engine does not serve) needs no window."""
    want = _window_bytes(rows, n, tp)
    assert torch.ops.te.collective_window_bytes(2, rows, n, tp) == want
    assert cw.window_bytes(rows=rows, n=n, tp=tp) == want
    assert torch.ops.te.collective_window_bytes(1, rows, n, tp) == 0


def test_window_bytes_spot_values():
    assert cw.window_bytes(rows=8, n=3, tp=4) == 4096 + 3 * (2 * 3 * 4)
    assert cw.window_bytes(rows=4096, n=8192, tp=2) == 4096 + 2048 * 8192 * 4
    with pytest.raises(ValueError, match="tp must be >= 1"):
        torch.ops.te.collective_window_bytes(2, 8, 3, 0)


def test_op_refuses_a_window_off_cuda(tmp_path):
    """te::collective_gemm takes a copy-engine window only for a CUDA reduce-scatter: a window with CPU operands (or
    with the all-gather) is refused before any ring starts, naming the rule and the device."""
    import torch.distributed as dist

    import transformer_engine_torch  # noqa: F401  (registers te::)
    from transformer_engine_torch.dtypes import DType

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        bf16 = int(DType.kBFloat16)
        x, w = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16)
        name = dist.group.WORLD.group_name
        for kind, what in ((2, "reduce-scatter"), (1, "all-gather")):
            with pytest.raises(ValueError, match=f"the copy-engine window serves the CUDA reduce-scatter only; got "
                                                 f"a cpu {what}"):
                torch.ops.te.collective_gemm.default(x, None, bf16, w, None, bf16, kind, name, bf16, True, True,
                                                     False, -1, [4096 + 64, 0])
    finally:
        dist.destroy_process_group()
