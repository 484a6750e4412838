"""The reduce-scatter's transport choice and window size (transformer_engine_torch/_collective_window.py), on the CPU:
the choice decides whether the ranks map each other's memory, so a group that spans nodes must never get the copy
engine unless asked for, and a bad name must be refused with the variable named."""
import pytest
import torch

from transformer_engine_torch import _collective_window as cw

KEY = "NVTE_COLLECTIVE_GEMM_TRANSPORT"


@pytest.fixture
def ranks_are_groups(monkeypatch):
    """A group is given as its list of global ranks."""
    monkeypatch.setattr(torch.distributed, "get_process_group_ranks", lambda group: list(group))
    monkeypatch.delenv(KEY, raising=False)


def test_torchrun_nodes_decide(ranks_are_groups, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # nodes hold global ranks 0-3, 4-7, ...
    assert cw.transport("op", [4, 5, 6, 7]) == "copy_engine"
    assert cw.transport("op", [0, 2]) == "copy_engine"
    assert cw.transport("op", [2, 3, 4, 5]) == "nccl"  # spans two nodes
    assert cw.transport("op", [0, 4]) == "nccl"


def test_without_torchrun_the_gpu_count_decides(ranks_are_groups, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cw.transport("op", [0, 1]) == "copy_engine"
    assert cw.transport("op", [0, 1, 2]) == "nccl"


def test_the_environment_wins_and_bad_names_are_refused(ranks_are_groups, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv(KEY, "nccl")
    assert cw.transport("op", [4, 5]) == "nccl"
    monkeypatch.setenv(KEY, " Copy_Engine ")
    assert cw.transport("op", [2, 3, 4, 5]) == "copy_engine"
    monkeypatch.setenv(KEY, "bogus")
    with pytest.raises(ValueError, match=r"gemm_reduce_scatter: NVTE_COLLECTIVE_GEMM_TRANSPORT='bogus' is not one of "
                                         r"copy_engine, nccl"):
        cw.transport("gemm_reduce_scatter", [0, 1])


def test_window_bytes():
    """The flags page (4096 bytes) and tp − 1 FP32 partials [rows/tp, n]."""
    assert cw.window_bytes(rows=8, n=3, tp=4) == 4096 + 3 * (2 * 3 * 4)
    assert cw.window_bytes(rows=4096, n=8192, tp=2) == 4096 + 2048 * 8192 * 4


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
