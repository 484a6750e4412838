"""torch.library.opcheck on every registered te:: op (schema, fake kernel, autograd registration,
AOT dispatch) and torch.compile(fullgraph=True) with no graph break, bit-identical to eager: one test over every
quantizer kind (per-tensor FP8 delayed and current, MXFP8, FP8 block 1-D and 2-D, NVFP4; aot_eager on each
device, inductor on CUDA); the formats' own files hold their opcheck cases."""
import pytest
import torch

from tests import ref
from tests.torch.helpers import (DEVICE_PARAMS, cpu, current_quantizer, delayed_quantizer, fp8_dtype, tex_module,
                                 uniform)

QK_NONE, QK_DELAYED, QK_CURRENT = 0, 1, 2
E4M3, E5M2 = 7, 8


def qspec(kind, qdtype=E4M3, rowwise=True, columnwise=True, flags=0, eps=0.0, block_dim=1,
          scale=None, amax=None, noop=None):
    """The flattened quantizer spec of SPEC §1.4 / API_CONTRACT, in schema order."""
    return (kind, qdtype, rowwise, columnwise, flags, eps, block_dim, scale, amax, noop)


def _te(name):
    tex_module()  # loads the extension (registers the library)
    return getattr(torch.ops.te, name)


def _cases(device):
    """(op name, args, id) triples with representative inputs on `device`."""
    f32, bf16 = torch.float32, torch.bfloat16
    x = uniform((6, 16), f32, device)
    xb = uniform((6, 16), bf16, device)
    g_un = uniform((6, 16), f32, device, g=torch.Generator().manual_seed(2))
    g_gated = uniform((6, 8), bf16, device, g=torch.Generator().manual_seed(3))

    def dl(fmt=E4M3, noop=None):
        return qspec(QK_DELAYED, fmt, scale=torch.tensor([2.5], device=device),
                     amax=torch.zeros(1, device=device), noop=noop)

    def cs(fmt=E4M3, pow2=False, eps=0.0, rowwise=True, columnwise=True):
        return qspec(QK_CURRENT, fmt, rowwise=rowwise, columnwise=columnwise, flags=1 if pow2 else 0, eps=eps)

    cases = []
    for name, code in [("gelu", 0), ("swiglu", 4), ("clamped_swiglu", 11), ("srelu", 9)]:
        xx = xb if name in ref.GATED else x
        cases.append(("act", (xx, code, 7.0, 1.702, 1.0), f"act-{name}"))
        cases.append(("act", (xx.clone().requires_grad_(), code, 7.0, 1.702, 1.0), f"act-{name}-grad"))
        gg = g_gated if name in ref.GATED else g_un
        cases.append(("dact", (gg, xx, code, 7.0, 1.702, 1.0), f"dact-{name}"))
        cases.append(("act_quantize", (xx, code, 7.0, 1.702, 1.0) + dl(), f"act_quantize-{name}-delayed"))
        cases.append(("act_quantize", (xx, code, 7.0, 1.702, 1.0) + cs(E5M2, pow2=True), f"act_quantize-{name}-current"))
        cases.append(("dact_quantize", (gg, xx, code, 7.0, 1.702, 1.0) + dl(E5M2), f"dact_quantize-{name}-delayed"))
        cases.append(("dact_quantize", (gg, xx, code, 7.0, 1.702, 1.0) + cs(), f"dact_quantize-{name}-current"))
    # Trailing arguments left at their schema defaults, as the wrappers pass them.
    cases.append(("act", (x, 0), "act-defaults"))
    cases.append(("act", (x.clone().requires_grad_(), 3), "act-defaults-grad"))
    cases.append(("dact", (g_un, x, 0), "dact-defaults"))
    cases.append(("act_quantize", (xb, 0, 7.0, 1.702, 1.0, QK_CURRENT, E4M3, True, False), "act_quantize-spec-defaults"))
    cases.append(("quantize", (x, QK_CURRENT, E5M2, True, True), "quantize-spec-defaults"))
    cases.append(("act_quantize", (x, 0, 7.0, 1.702, 1.0) + cs(rowwise=False), "act_quantize-colonly"))
    cases.append(("act_quantize", (x, 0, 7.0, 1.702, 1.0) + dl(noop=torch.zeros(1, device=device)), "act_quantize-noop"))
    cases.append(("dbias_dact", (g_un, x, 0) + dl(), "dbias_dact-gelu-delayed"))
    cases.append(("dbias_dact", (g_un.to(bf16), xb, 3) + cs(), "dbias_dact-silu-current"))
    cases.append(("quantize", (xb,) + dl(), "quantize-delayed"))
    cases.append(("quantize", (x,) + cs(E5M2, eps=1e-6), "quantize-current"))
    cases.append(("quantize", (x.t(),) + cs(), "quantize-noncontig"))
    cases.append(("bgrad_quantize", (xb,) + dl(E5M2), "bgrad_quantize-delayed"))
    cases.append(("bgrad_quantize", (x,) + cs(), "bgrad_quantize-current"))
    u8 = lambda *s: torch.zeros(s, dtype=torch.uint8, device=device)  # noqa: E731
    sinv = lambda: torch.ones(1, device=device)  # noqa: E731
    cases.append(("quantize_into", (x,) + dl() + (u8(6, 16), sinv(), u8(16, 6), sinv()), "quantize_into-delayed"))
    cases.append(("quantize_into", (xb,) + cs() + (u8(6, 16), sinv(), u8(16, 6), sinv()), "quantize_into-current"))
    data = torch.randint(0, 0x7B, (6, 16), generator=torch.Generator().manual_seed(4), dtype=torch.int32).to(torch.uint8).to(device)
    cases.append(("dequantize_fp8", (data, torch.tensor([0.5], device=device), E4M3, torch.bfloat16), "dequantize_fp8-e4m3"))
    cases.append(("dequantize_fp8", (data, torch.tensor([2.0], device=device), E5M2, torch.float32), "dequantize_fp8-e5m2"))
    cases.append(("compute_amax", (x, torch.zeros(1, device=device)), "compute_amax"))
    hists = [torch.rand(4, 3, device=device) + 0.1, torch.rand(4, 2, device=device) + 0.1]
    scales = [torch.ones(3, device=device), torch.ones(2, device=device)]
    cases.append(("fused_amax_and_scale_update", (None, hists, scales, "max", E4M3, 0.0), "amax_update-nobuf"))
    hists2 = [h.clone() for h in hists]
    scales2 = [s.clone() for s in scales]
    cases.append(("fused_amax_and_scale_update", (torch.rand(5, device=device), hists2, scales2, "most_recent", E5M2, 1.0),
                  "amax_update-buf"))
    cases.append(("fp8_transpose", (data,), "fp8_transpose"))
    cases.append(("fp8_transpose_into", (data, u8(16, 6)), "fp8_transpose_into"))
    return cases


def _case_ids():
    # build ids without importing the extension at collection time
    names = []
    for name in ["gelu", "swiglu", "clamped_swiglu", "srelu"]:
        names += [f"act-{name}", f"act-{name}-grad", f"dact-{name}", f"act_quantize-{name}-delayed",
                  f"act_quantize-{name}-current", f"dact_quantize-{name}-delayed", f"dact_quantize-{name}-current"]
    names += ["act-defaults", "act-defaults-grad", "dact-defaults", "act_quantize-spec-defaults",
              "quantize-spec-defaults", "act_quantize-colonly", "act_quantize-noop", "dbias_dact-gelu-delayed", "dbias_dact-silu-current",
              "quantize-delayed", "quantize-current", "quantize-noncontig", "bgrad_quantize-delayed",
              "bgrad_quantize-current", "quantize_into-delayed", "quantize_into-current", "dequantize_fp8-e4m3",
              "dequantize_fp8-e5m2", "compute_amax", "amax_update-nobuf", "amax_update-buf", "fp8_transpose",
              "fp8_transpose_into"]
    return names


ALL_OPS = ["act", "dact", "act_quantize", "dact_quantize", "dbias_dact", "quantize", "bgrad_quantize",
           "quantize_into", "dequantize_fp8", "compute_amax", "fused_amax_and_scale_update", "fp8_transpose",
           "fp8_transpose_into"]


def test_every_contract_op_is_registered_and_covered():
    tex_module()
    for name in ALL_OPS:
        assert hasattr(torch.ops.te, name), f"torch.ops.te.{name} is not registered"
    covered = {c[0] for c in _cases("cpu")}
    assert covered == set(ALL_OPS)
    assert [c[2] for c in _cases("cpu")] == _case_ids()


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("case_id", _case_ids())
def test_opcheck(case_id, device):
    cases = {c[2]: c for c in _cases(device)}
    name, args, _ = cases[case_id]
    torch.library.opcheck(_te(name).default, args)


def test_quantizing_op_returns_six_tensors():
    """[row_data, row_scale_inv, col_data, col_scale_inv, amax_row, amax_col], 0-element when absent."""
    x = uniform((6, 16))
    outs = _te("quantize")(x, *qspec(QK_CURRENT, E4M3, rowwise=True, columnwise=False))
    assert isinstance(outs, (list, tuple)) and len(outs) == 6
    row, row_si, col, col_si, _, _ = outs
    assert row.dtype == torch.uint8 and tuple(row.shape) == (6, 16)
    assert col.numel() == 0
    r = ref.quantize_current_ref(x, "e4m3")
    assert torch.equal(row, r.codes) and torch.equal(row_si.reshape(1), r.scale_inv)
    outs = _te("act_quantize")(x, 0, 7.0, 1.702, 1.0, *qspec(QK_CURRENT, E4M3, rowwise=False, columnwise=True))
    assert len(outs) == 6 and outs[0].numel() == 0 and tuple(outs[2].shape) == (16, 6)


# ------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True): no graph break, bit-identical to eager
# ------------------------------------------------------------------------------------------------
def _compile(fn, backend):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)


# One test over every quantizer kind: an activation into that format under torch.compile(fullgraph=True), every
# buffer of the result and its dequantized value bit-identical to eager, on two inputs through one compiled graph.
# Modes: aot_eager on each device, inductor on CUDA. Each kind keeps the activation and the shapes of the format's
# own compile tests this one replaced (aot_eager shape, inductor shape): FP8 block's 200x260 has partial blocks.
_TWO_COPIES = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")
COMPILE_KINDS = {
    "fp8-delayed": ("gelu", (32, 48), (128, 256), ("_data", "_transpose", "_scale_inv")),
    "fp8-current": ("gelu", (32, 48), (128, 256), ("_data", "_transpose", "_scale_inv")),
    "mxfp8": ("swiglu", (96, 256), (128, 512), _TWO_COPIES),
    "fp8-block-1d": ("gelu", (200, 260), (256, 512), _TWO_COPIES),
    "fp8-block-2d": ("gelu", (200, 260), (256, 512), _TWO_COPIES),
    "nvfp4": ("gelu", (64, 256), (128, 512), _TWO_COPIES + ("_amax_rowwise", "_amax_columnwise")),
}
COMPILE_MODES = [pytest.param("cpu", "aot_eager", id="cpu-aot_eager"),
                 pytest.param("cuda", "aot_eager", id="cuda-aot_eager", marks=pytest.mark.cuda),
                 pytest.param("cuda", "inductor", id="cuda-inductor", marks=pytest.mark.cuda)]


def _compile_quantizer(kind, device):
    """A fresh E4M3 (NVFP4: E2M1) quantizer of `kind` and the amax it updates in place (delayed scaling; else None)."""
    tex = tex_module()
    if kind == "fp8-delayed":
        q, _, amax = delayed_quantizer(3.5, "e4m3", device, amax_value=0.5)
        return q, amax
    if kind == "fp8-current":
        return current_quantizer("e4m3"), None
    if kind == "mxfp8":
        return tex.MXFP8Quantizer(fp8_dtype("e4m3")), None
    if kind.startswith("fp8-block"):
        return tex.Float8BlockQuantizer(fp8_dtype("e4m3"), block_scaling_dim=int(kind[-2])), None
    return tex.NVFP4Quantizer(), None


def _compile_reference(kind, plain):
    """{buffer: reference bytes} of the plain (unquantized) activation output, for the kinds whose compile tests
    checked against the reference as well (MXFP8, FP8 block)."""
    if kind == "mxfp8":
        r = ref.quantize_mxfp8_ref(plain, "e4m3")
    elif kind.startswith("fp8-block"):
        r = ref.quantize_fp8_block_ref(plain, "e4m3", int(kind[-2]))
    else:
        return {}
    return {"_rowwise_data": r.row, "_columnwise_scale_inv": r.col_scale}


@pytest.mark.slow
@pytest.mark.parametrize("device,backend", COMPILE_MODES)
@pytest.mark.parametrize("kind", list(COMPILE_KINDS))
def test_compile_activation_quantize(kind, device, backend):
    act, aot_shape, inductor_shape, buffers = COMPILE_KINDS[kind]
    op = getattr(tex_module(), act)
    shape = aot_shape if backend == "aot_eager" else inductor_shape
    x = uniform(shape, torch.bfloat16, device)
    x2 = uniform(shape, torch.bfloat16, device, lo=-6.0, hi=6.0, g=torch.Generator().manual_seed(9))

    def f(x, q):
        y = op(x, q)
        return tuple(getattr(y, name) for name in buffers) + (y.dequantize(),)

    q_e, amax_e = _compile_quantizer(kind, device)
    eager = [f(x, q_e), f(x2, q_e)]
    q_c, amax_c = _compile_quantizer(kind, device)
    cf = _compile(f, backend)
    out = [cf(x, q_c), cf(x2, q_c)]
    for got, want in zip(out, eager):
        for name, a, b in zip(buffers + ("dequantize()",), got, want):
            assert (a is None) == (b is None), f"{kind} {name}: present in one run only"
            assert a is None or ref.bits_equal(cpu(a), cpu(b)), f"{kind} {name} differs from eager"
    for name, r in _compile_reference(kind, cpu(op(x, None))).items():
        assert torch.equal(cpu(out[0][buffers.index(name)]), r), f"{kind} {name} differs from the reference"
    if amax_e is not None:
        assert torch.equal(amax_c, amax_e), "delayed amax must be updated in place under compile too"
        assert float(amax_c) > 0.5


@pytest.mark.slow
def test_compile_quantize_dequantize():
    tex = tex_module()
    q = current_quantizer("e5m2", pow2=True)

    def f(x):
        return tex.quantize(x, q).dequantize(dtype=torch.float32)

    x = uniform((40, 24), torch.float16)
    eager = f(x)
    out = _compile(f, "aot_eager")(x)
    assert ref.bits_equal(out, eager)


@pytest.mark.slow
def test_compile_plain_activation_forward_backward():
    tex = tex_module()

    def f(x):
        return tex.swiglu(x, None).float().sum()

    x0 = uniform((16, 32), torch.bfloat16)
    xe = x0.clone().requires_grad_()
    f(xe).backward()
    xc = x0.clone().requires_grad_()
    _compile(f, "aot_eager")(xc).backward()
    assert ref.bits_equal(xc.grad, xe.grad)
