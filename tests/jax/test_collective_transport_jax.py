"""tej's collective GEMM asks the core which transport its reduce-scatter runs over and how large the copy-engine
window is (issue 33: csrc/core/ops/collective_gemm_op.h, through _ffi; transformer_engine_jax/collective_ffi.py):
each value of NVTE_COLLECTIVE_GEMM_TRANSPORT, the default rule (a node-local ring: the copy engine, else NCCL), the
one bad-value message (torch's is the same: tests/jax/test_parity_torch.py), and the window-size formula against a
computation here. No devices needed (the planner's functions)."""
import pytest

pytest.importorskip("jax")

from transformer_engine_jax import _ffi, collective_ffi  # noqa: E402

KEY = "NVTE_COLLECTIVE_GEMM_TRANSPORT"
BAD = "collective GEMM: NVTE_COLLECTIVE_GEMM_TRANSPORT='{}' is not one of copy_engine, nccl"


@pytest.mark.parametrize("value, node_local, want", [
    (None, True, "copy_engine"), (None, False, "nccl"),
    ("", True, "copy_engine"), ("\t", False, "nccl"),
    ("copy_engine", True, "copy_engine"), ("copy_engine", False, "copy_engine"),
    ("nccl", True, "nccl"), ("nccl", False, "nccl"),
    (" COPY_ENGINE", False, "copy_engine"), ("Nccl ", True, "nccl"),
])
def test_the_core_decides(monkeypatch, value, node_local, want):
    if value is None:
        monkeypatch.delenv(KEY, raising=False)
    else:
        monkeypatch.setenv(KEY, value)
    assert _ffi.collective_transport(node_local) == want
    assert collective_ffi.transport(node_local) == want


@pytest.mark.parametrize("value, shown", [("bogus", "bogus"), (" NCCL2 ", "nccl2"), ("copy-engine", "copy-engine")])
def test_the_core_refuses_a_bad_value(monkeypatch, value, shown):
    monkeypatch.setenv(KEY, value)
    for node_local in (True, False):
        with pytest.raises(ValueError) as e:
            collective_ffi.transport(node_local)
        assert str(e.value) == BAD.format(shown)


def _window_bytes(rows, n, tp):
    """The flags page (transport.h's CopyEngineWindow::kFlagBytes = 4096) then tp − 1 FP32 partials [rows/tp, n]."""
    return 4096 + (tp - 1) * (rows // tp) * n * 4


@pytest.mark.parametrize("rows, n, tp", [(8, 3, 4), (4096, 8192, 2), (6, 5, 3), (128, 64, 8), (16, 16, 1)])
def test_window_bytes_are_the_cores(rows, n, tp):
    """The core's formula against the computation here; nothing for the all-gather (not the copy engine's)."""
    assert _ffi.collective_window_bytes(2, rows, n, tp) == _window_bytes(rows, n, tp)
    assert _ffi.collective_window_bytes(1, rows, n, tp) == 0


@pytest.mark.parametrize("rows, n, tp", [(8, 16, 4), (64, 32, 2), (48, 16, 3)])
def test_the_plans_window_is_the_same_formula(rows, n, tp):
    """The plan of a reduce-scatter of x [rows, k] by w [n, k] reports the same window bytes (one formula)."""
    bf16, f32, k = 6, 4, 16
    plan = _ffi.plan_collective_gemm([([rows, k], bf16), ([0], f32), ([n, k], bf16), ([0], f32)], 2, tp, bf16, True,
                                     -1, False, False, False)
    assert plan["window_bytes"] == _window_bytes(rows, n, tp)
