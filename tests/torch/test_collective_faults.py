"""Bad input to tex.all_gather_gemm / tex.gemm_reduce_scatter never hangs (transformer_engine_torch/
_collective_checks.py): 2 rank processes call the ops with operands that differ between the ranks or are bad on one
rank only, and each case must raise the same error, with the same message, on every rank — the processes must finish
within a timeout (a hang fails the test). After the faults a correct call still gives the right answer on the same
group (nothing was left in flight). Also: a group of one is the plain GEMM, a non-member's call is refused at once.
gloo on the CPU; the same cases over NCCL are marked multigpu (NVLink multicast off in every process, NCCL_DEBUG=WARN
and no WARN line allowed in any rank's output)."""
import os
import re
import tempfile
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from tests.torch.helpers import current_quantizer, tex_module

TP, M, K, N = 2, 4, 16, 8  # AG: x shard [M, K], w [N, K]; RS: x [TP·M, K], w_shard [N, K]
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
             "NCCL_DEBUG": "WARN"}

# case -> (exception class, a regex its message must match). The same message on every rank is checked separately.
EXPECTED = {
    "ag_rows_one_rank": (ValueError, r"all_gather_gemm: the 2 ranks' operands differ in x rows: every rank's x_shard "
                                     r"must be \[m, K\].*rank 0: x_shard \[4, 16\] bf16, w \[8, 16\] bf16, out bf16, "
                                     r"on c.*rank 1: x_shard \[5, 16\] bf16"),
    "ag_k_across": (ValueError, r"operands differ in K:.*x_shard \[4, 32\]"),
    "ag_dtype_one_rank": (ValueError, r"operands differ in x dtype, out_dtype:.*x_shard \[4, 16\] fp16"),
    "ag_w_one_rank": (ValueError, r"operands differ in w rows:.*w \[9, 16\] bf16"),
    "ag_bad_k_one_rank": (ValueError, r"all_gather_gemm: rank 1 of 2 failed the local checks, so no rank starts the "
                                      r"ring and every rank raises this error\. rank 1: ValueError: all_gather_gemm: "
                                      r"x_shard's last dim K=16 differs from w's K=15"),
    "ag_int_one_rank": (TypeError, r"rank 1 of 2 failed the local checks.*x_shard must be a bf16/fp16/fp32 tensor or "
                                   r"a Float8Tensor, got a torch.int32 tensor"),
    "ag_device_one_rank": (ValueError, r"rank 1 of 2 failed.*x_shard is on cpu but w on meta"),
    "ag_grad_one_rank": (ValueError, r"operands differ in requires_grad:.*requires grad: x_shard"),
    "ag_return_gathered_grad": (ValueError, r"return_gathered is for calls without autograd .*on every rank of the "
                                            r"group of 2"),
    "ag_vs_rs": (ValueError, r"all_gather_gemm/gemm_reduce_scatter: the 2 ranks' operands differ in the op, x rows: "
                             r"every rank of the group must call the same op.*rank 0: all_gather_gemm: x_shard "
                             r"\[4, 16\].*rank 1: gemm_reduce_scatter: x \[8, 16\]"),
    "ag_mxfp8": (NotImplementedError, r"all_gather_gemm: not yet supported: x_shard as MXFP8Tensor \(MXFP8\); "
                                      r"the collective GEMM takes bf16/fp16/fp32 tensors and FP8 per tensor.*on every "
                                      r"rank"),
    "ag_mxfp8_one_rank": (NotImplementedError, r"rank 1 of 2 failed the local checks.*x_shard as MXFP8Tensor "
                                               r"\(MXFP8\)"),
    "ag_nvfp4_quantizer": (NotImplementedError, r"not yet supported: quantizer NVFP4Quantizer \(NVFP4\)"),
    "rs_block_quantizer": (NotImplementedError, r"gemm_reduce_scatter: not yet supported: quantizer "
                                                r"Float8BlockQuantizer \(FP8 block\)"),
    "ag_fp8_vs_bf16": (ValueError, r"operands differ in x dtype:.*x_shard Float8Tensor\[4, 16\] E4M3"),
    "rs_rows_not_multiple": (ValueError, r"gemm_reduce_scatter: reduce-scatter splits x's 9 rows into tp = 2 equal "
                                         r"chunks: the rows must be a multiple of tp"),
    "rs_n_one_rank": (ValueError, r"gemm_reduce_scatter: the 2 ranks' operands differ in w rows:.*w_shard \[9, 16\]"),
    "rs_klocal_one_rank": (ValueError, r"operands differ in K:.*x \[8, 32\]"),
    "rs_out_dtype_one_rank": (TypeError, r"rank 1 of 2 failed.*out_dtype must be bf16, fp16 or fp32, got kFloat8E4M3"),
    "ag_sm_margin_one_rank": (ValueError, r"rank 1 of 2 failed.*sm_margin must be an int >= 0.*got -4"),
    "rs_layout_nn": (ValueError, r"layout 'NN' is not supported; the collective GEMM takes \"TN\".*on every rank of "
                                 r"the group of 2; no data was exchanged"),
}


def _cases(tex, rank, device):
    """Each case's call on this rank (rank 1 is the odd one out where only one rank is bad)."""
    g = torch.Generator().manual_seed(5)
    rnd = lambda *s, dt=torch.bfloat16: (torch.rand(*s, generator=g) * 2 - 1).to(dt).to(device)  # noqa: E731
    x, w, xr, wr = rnd(M, K), rnd(N, K), rnd(TP * M, K), rnd(N, K)
    one = rank == 1
    q = current_quantizer("e4m3", columnwise=False)
    ag, rs = tex.all_gather_gemm, tex.gemm_reduce_scatter
    return {
        "ag_rows_one_rank": lambda: ag(rnd(M + 1, K) if one else x, w),
        "ag_k_across": lambda: ag(rnd(M, 2 * K), rnd(N, 2 * K)) if one else ag(x, w),
        "ag_dtype_one_rank": lambda: ag(x.half() if one else x, w),
        "ag_w_one_rank": lambda: ag(x, rnd(N + 1, K) if one else w),
        "ag_bad_k_one_rank": lambda: ag(x, rnd(N, K - 1) if one else w),
        "ag_int_one_rank": lambda: ag(x.int() if one else x, w),
        "ag_device_one_rank": lambda: ag(x.cpu() if one else x, torch.empty(N, K, device="meta") if one else w),
        "ag_grad_one_rank": lambda: ag(x.clone().requires_grad_(one), w),
        "ag_return_gathered_grad": lambda: ag(x.clone().requires_grad_(), w, return_gathered=True),
        "ag_vs_rs": lambda: rs(xr, wr) if one else ag(x, w),
        "ag_mxfp8": lambda: ag(tex.quantize(rnd(32, 32), tex.MXFP8Quantizer(tex.DType.kFloat8E4M3)), rnd(N, 32)),
        "ag_mxfp8_one_rank": lambda: ag(tex.quantize(rnd(32, 32), tex.MXFP8Quantizer(tex.DType.kFloat8E4M3))
                                        if one else rnd(32, 32), rnd(N, 32)),
        "ag_nvfp4_quantizer": lambda: ag(x, w, quantizer=tex.NVFP4Quantizer()),
        "rs_block_quantizer": lambda: rs(xr, wr, quantizer=tex.Float8BlockQuantizer(tex.DType.kFloat8E4M3)),
        "ag_fp8_vs_bf16": lambda: ag(tex.quantize(x, q) if rank == 0 else x, w),
        "rs_rows_not_multiple": lambda: rs(rnd(2 * M + 1, K), wr),
        "rs_n_one_rank": lambda: rs(xr, rnd(N + 1, K) if one else wr),
        "rs_klocal_one_rank": lambda: rs(rnd(TP * M, 2 * K), rnd(N, 2 * K)) if one else rs(xr, wr),
        "rs_out_dtype_one_rank": lambda: rs(xr, wr, out_dtype=tex.DType.kFloat8E4M3 if one else None),
        "ag_sm_margin_one_rank": lambda: ag(x, w, sm_margin=-4 if one else None),
        "rs_layout_nn": lambda: rs(xr, wr, layout="NN"),
    }


def _good_calls(tex, rank, device):
    """After the faults: the same group still gives the right answers (exact: bf16 operands, fp32 output of small
    integer-valued products), with and without the check, and a group of one is the plain GEMM."""
    import torch.distributed as dist

    g = torch.Generator().manual_seed(9)
    ints = lambda *s: torch.randint(-3, 4, s, generator=g).bfloat16().to(device)  # noqa: E731
    x_full, w = ints(TP * M, K), ints(N, K)
    want = (x_full.double() @ w.double().t()).float()
    for validate in (True, False):
        y = tex.all_gather_gemm(x_full[rank * M:(rank + 1) * M].contiguous(), w, out_dtype=torch.float32,
                                validate=validate)
        assert torch.equal(y, want), f"rank {rank}: AG after the faults (validate={validate}) is wrong"
        ks = slice(rank * K // TP, (rank + 1) * K // TP)
        y = tex.gemm_reduce_scatter(x_full[:, ks].contiguous(), w[:, ks].contiguous(), out_dtype=torch.float32,
                                    validate=validate)
        assert torch.equal(y, want[rank * M:(rank + 1) * M]), f"rank {rank}: RS after the faults is wrong"
    # validate "once" (the default): a signature the group agreed on is not exchanged again; True exchanges each call
    from transformer_engine_torch import _collective_checks as checks

    exchanges, original = [], checks._exchange
    checks._exchange = lambda *a: (exchanges.append(1), original(*a))[1]
    try:
        xs = x_full[rank * M:(rank + 1) * M].contiguous()
        for _ in range(3):
            tex.all_gather_gemm(xs, w, out_dtype=torch.float32)
        once = len(exchanges)
        tex.all_gather_gemm(xs, w, out_dtype=torch.float32, validate=True)
    finally:
        checks._exchange = original
    assert once <= 1 and len(exchanges) == once + 1, f"rank {rank}: exchanges {once}, then {len(exchanges)}"
    # a group of one (every rank makes both groups; each uses its own): refused at once (no peer waits on it); a
    # tensor-parallel layer with a tp_group of one runs the unsharded layer
    groups = [dist.new_group([r]) for r in range(TP)]
    mine, other = groups[rank], groups[1 - rank]
    xs = x_full[:M].clone().requires_grad_()
    for call in (lambda: tex.all_gather_gemm(xs, w, mine), lambda: tex.gemm_reduce_scatter(x_full, w, mine)):
        with pytest.raises(ValueError, match=r"the group has one rank; a collective GEMM needs a group of 2 or more"):
            call()
    lin = tex.Linear(K, N, bias=False, tp_group=mine, parallel_mode="column", sequence_parallel=True, device=device,
                     params_dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
    y = lin(xs)
    assert torch.equal(y, torch.nn.functional.linear(xs, w)), "a tp_group of one: Linear is not the unsharded layer"
    # a process outside the group it passes: refused at once (its peers are not waiting on it)
    with pytest.raises(ValueError, match=r"all_gather_gemm: this process \(global rank \d\) is not a member of the "
                                         r"group it passed"):
        tex.all_gather_gemm(xs.detach(), w, other)
    dist.barrier()


def worker(rank, init_file, log_dir, results, backend):
    import datetime

    import torch.distributed as dist

    log = os.open(os.path.join(log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)  # NCCL writes its WARN lines to stdout, torch and gloo to stderr: both land in the rank's log
    os.dup2(log, 2)
    try:
        torch.set_num_threads(1)
        device = "cpu"
        if backend == "nccl":
            os.environ.update(_NCCL_ENV)
            torch.cuda.set_device(rank)
            device = f"cuda:{rank}"
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=TP,
                                timeout=datetime.timedelta(seconds=60),
                                **({"device_id": torch.device(device)} if backend == "nccl" else {}))
        tex = tex_module()
        got = {}
        for name, call in _cases(tex, rank, device).items():
            try:
                call()
                got[name] = ("no error", "")
            except Exception as e:  # noqa: BLE001  (the parent compares the ranks' errors)
                got[name] = (type(e).__name__, str(e))
        _good_calls(tex, rank, device)
        results[rank] = got
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (reported to the parent, which fails the test with it)
        results[rank] = traceback.format_exc()
    finally:
        os.close(log)


def run_faults(backend, timeout=150):
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d, ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=worker, args=(r, os.path.join(d, "init"), d, results, backend))
                 for r in range(TP)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=timeout)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
        logs = {}
        for r in range(TP):
            with open(os.path.join(d, f"rank{r}.log"), errors="replace") as f:
                logs[r] = f.read()
        tails = "\n".join(f"--- rank {r} output (tail) ---\n{logs[r][-3000:]}" for r in range(TP))
        assert not hung, f"ranks {hung} did not finish within {timeout} s (a hang)\n{tails}"
        for r in range(TP):
            assert isinstance(results.get(r), dict), f"rank {r}:\n{results.get(r)}\n{tails}"
        got = [dict(results[r]) for r in range(TP)]
    for name, (err, pattern) in EXPECTED.items():
        kind, message = got[0][name]
        assert kind == err.__name__, f"{name}: rank 0 raised {kind}: {message!r}, want {err.__name__}"
        assert re.search(pattern, message, re.S), f"{name}: rank 0's message {message!r} does not match {pattern!r}"
        for r in range(1, TP):
            assert got[r][name] == got[0][name], f"{name}: rank {r} raised {got[r][name]}, rank 0 {got[0][name]}"
    return logs


def test_collective_faults_gloo():
    """Each bad input raises the same error on both ranks, and nothing hangs (gloo, CPU)."""
    run_faults("gloo")


@pytest.mark.multigpu
def test_collective_faults_nccl():
    """The same faults over NCCL (one process per GPU), with no NCCL WARN line in any rank's output."""
    if torch.cuda.device_count() < TP:
        pytest.skip(f"needs {TP} GPUs, {torch.cuda.device_count()} visible")
    logs = run_faults("nccl")
    for r, text in logs.items():
        warns = [line for line in text.splitlines() if "NCCL WARN" in line]
        assert not warns, f"rank {r} logged NCCL warnings:\n" + "\n".join(warns[:20])


def test_expected_cases_match_calls():
    """Every case the ranks run has an expected error, and vice versa (no case silently unchecked)."""
    assert set(_cases(tex_module(), 0, "cpu")) == set(EXPECTED)
