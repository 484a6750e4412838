"""Self-tests of the oracle, tests/ref/: the references must be right before they judge anything.
These run without the extension."""
import math

import pytest
import torch

from tests import ref


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_decode_table_matches_torch(fmt):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    t = ref.fp8_decode(codes, fmt).tolist()
    s = [ref.fp8_decode_scalar(c, fmt) for c in range(256)]
    for c, (a, b) in enumerate(zip(t, s)):
        assert (math.isnan(a) and math.isnan(b)) or a == b, (fmt, hex(c), a, b)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_encoder_boundary_sweep_vs_float64_scalar(fmt):
    """Exhaustive sweep of every code, every midpoint, their FP32 neighbours, saturation and
    underflow boundaries, +-Inf, NaN, both signs: tensor encoder == torch-free scalar encoder."""
    x = ref.fp8_boundary_values(fmt)
    got = ref.fp8_encode(x, fmt).tolist()
    for v, c in zip(x.tolist(), got):
        assert c == ref.fp8_encode_scalar(v, fmt), (fmt, v, hex(c), hex(ref.fp8_encode_scalar(v, fmt)))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_encoder_random_bits_vs_float64_scalar(fmt):
    g = torch.Generator().manual_seed(7)
    bits = torch.randint(-2**31, 2**31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    # also values near the FP8 range, where the interesting rounding happens
    near = (torch.rand(20000, generator=g) * 2 - 1) * torch.exp2(torch.randint(-20, 18, (20000,), generator=g).float())
    x = torch.cat([x, near])
    got = ref.fp8_encode(x, fmt).tolist()
    for v, c in zip(x.tolist(), got):
        assert c == ref.fp8_encode_scalar(v, fmt), (fmt, v, hex(c))


def test_encoder_documented_values():
    e = lambda v, f: int(ref.fp8_encode(torch.tensor([v], dtype=torch.float32), f)[0])  # noqa: E731
    assert e(448.0, "e4m3") == 0x7E
    assert e(1e9, "e4m3") == 0x7E and e(-1e9, "e4m3") == 0xFE
    assert e(math.inf, "e4m3") == 0x7E and e(-math.inf, "e4m3") == 0xFE
    assert e(464.0, "e4m3") == 0x7E          # tie between 448 and (virtual) 480 -> even -> 448
    assert e(math.nan, "e4m3") == 0x7F and e(-math.nan, "e4m3") == 0x7F
    assert e(-1e-30, "e4m3") == 0x80 and e(-0.0, "e4m3") == 0x80 and e(0.0, "e4m3") == 0x00
    assert e(2.0 ** -9, "e4m3") == 0x01       # smallest subnormal
    assert e(2.0 ** -10, "e4m3") == 0x00      # half of it: tie -> even (zero)
    assert e(3 * 2.0 ** -11, "e4m3") == 0x01
    assert e(1.0, "e4m3") == 0x38 and e(1.0625, "e4m3") == 0x38 and e(1.0625001, "e4m3") == 0x39
    assert e(57344.0, "e5m2") == 0x7B and e(math.inf, "e5m2") == 0x7B and e(-math.inf, "e5m2") == 0xFB
    assert e(1e9, "e5m2") == 0x7B and e(math.nan, "e5m2") == 0x7F and e(-math.nan, "e5m2") == 0x7F
    assert e(2.0 ** -16, "e5m2") == 0x01 and e(2.0 ** -17, "e5m2") == 0x00


def test_encoder_canonicalises_nan():
    """torch's raw cast keeps NaN's sign (0xFF for -NaN); the SPEC encoder gives 0x7F for every NaN."""
    x = torch.tensor([math.nan, -math.nan], dtype=torch.float32)
    assert ref.fp8_encode(x, "e4m3").tolist() == [0x7F, 0x7F]
    assert ref.fp8_encode(x, "e5m2").tolist() == [0x7F, 0x7F]


def test_current_scale_reference_worked_examples():
    # SPEC §4.4: [3.0] -> 0x7E, scale_inv = fl(1/fl(448/3))
    r = ref.quantize_current_ref(torch.tensor([3.0]), "e4m3")
    assert int(r.codes[0]) == 0x7E
    s = torch.tensor(448.0) / torch.tensor(3.0)
    assert torch.equal(r.scale_inv, (torch.tensor(1.0) / s).reshape(1))
    # all zeros -> scale 1
    r = ref.quantize_current_ref(torch.zeros(5), "e4m3")
    assert float(r.scale_inv) == 1.0 and int(r.codes.sum()) == 0
    # amax Inf / NaN-only
    assert float(ref.current_scale_ref(torch.tensor(math.inf), "e4m3")) == 1.0
    assert float(ref.current_scale_ref(ref.amax_ref(torch.tensor([math.nan])), "e4m3")) == 1.0
    # tiny amax -> Inf -> FLT_MAX; pow2 -> 2^127
    assert float(ref.current_scale_ref(torch.tensor(1e-45), "e4m3")) == ref.FLT_MAX
    assert float(ref.current_scale_ref(torch.tensor(1e-45), "e4m3", pow2=True)) == 2.0 ** 127
    # pow2 rounds down
    assert float(ref.current_scale_ref(torch.tensor(3.0), "e4m3", pow2=True)) == 128.0
    # epsilon
    assert float(ref.current_scale_ref(torch.tensor(0.0), "e4m3", eps=1e-6)) == float(
        torch.tensor(448.0) / torch.tensor(1e-6, dtype=torch.float32))


def test_amax_reference_ignores_nan_keeps_inf():
    assert float(ref.amax_ref(torch.tensor([1.0, math.nan, -2.0]))) == 2.0
    assert float(ref.amax_ref(torch.tensor([1.0, -math.inf]))) == math.inf
    assert float(ref.amax_ref(torch.tensor([]))) == 0.0


def test_activation_reference_exact_points():
    z = torch.zeros(1, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    assert float(ref.act_ref("gelu", z)) == 0.0
    assert float(ref.dact_ref("gelu", one, z)) == 0.5
    assert float(ref.dact_ref("relu", one, z)) == 0.0
    assert float(ref.dact_ref("srelu", one, z)) == 0.0
    assert float(ref.dact_ref("silu", one, z)) == 0.5
    assert float(ref.dact_ref("qgelu", one, z)) == 0.5
    x = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert float(ref.act_ref("glu", x)) == 0.5
    assert ref.dact_ref("glu", one, x).tolist() == [0.25, 0.5]


def test_gelu_reference_vs_torch_tanh_gelu():
    x = torch.linspace(-3, 3, 1001, dtype=torch.float64)
    torch.testing.assert_close(ref.act_ref("gelu", x), torch.nn.functional.gelu(x, approximate="tanh"),
                               rtol=1e-6, atol=1e-7)
    # derivative vs autograd of the float64 reference
    xr = x.clone().requires_grad_()
    ref.act_ref("gelu", xr).sum().backward()
    torch.testing.assert_close(ref.dact_ref("gelu", torch.ones_like(x), x), xr.grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ref.ACT_NAMES)
def test_derivative_reference_vs_autograd(name):
    """The float64 derivative references agree with autograd of the float64 forward references."""
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(4, 64, generator=g, dtype=torch.float64) * 6 - 3)
    if name == "clamped_swiglu":
        x = x * 4  # reach beyond the clamp limit
    xr = x.clone().requires_grad_()
    y = ref.act_ref(name, xr)
    gy = torch.rand(y.shape, generator=g, dtype=torch.float64) * 2 - 1
    y.backward(gy)
    torch.testing.assert_close(ref.dact_ref(name, gy, x), xr.grad, rtol=1e-6, atol=1e-7)


def test_forgiving_comparison_rules():
    r = torch.tensor([0x10, 0x20, 0x30, 0x00, 0x80] * 100, dtype=torch.uint8)
    assert ref.codes_mismatch_report(r.clone(), r, "e4m3") is None
    t = r.clone()
    t[0] = 0x11                                  # one code, 1 element of 500: forgiven
    assert ref.codes_mismatch_report(t, r, "e4m3") is None
    t[0] = 0x12                                  # two codes: never
    assert ref.codes_mismatch_report(t, r, "e4m3") is not None
    t = r.clone()
    t[1] = 0xA0                                  # sign change: never
    assert ref.codes_mismatch_report(t, r, "e4m3") is not None
    t = r.clone()
    t[3] = 0x80                                  # +0 vs -0: equal values
    assert ref.codes_mismatch_report(t, r, "e4m3") is None
    t = r.clone()
    t[:10] += 1                                  # 2 % of elements: too many
    assert ref.codes_mismatch_report(t, r, "e4m3") is not None


def test_delayed_update_reference_roll():
    h = torch.tensor([[5.0], [1.0], [2.0], [3.0]])
    nh, ns = ref.amax_and_scale_update_ref(None, [h], [torch.tensor([1.0])], "max", "e4m3", 0)
    assert nh[0][:, 0].tolist() == [0.0, 2.0, 3.0, 5.0]
    assert float(ns[0][0]) == float(torch.tensor(448.0) / torch.tensor(5.0))
    nh, ns = ref.amax_and_scale_update_ref(None, [h], [torch.tensor([1.0])], "most_recent", "e4m3", 1)
    assert float(ns[0][0]) == float(torch.tensor(224.0) / torch.tensor(5.0))


def test_as_torch_reaches_the_oracle_through_dlpack():
    """A NumPy array, as a JAX array will, reaches the references through DLPack: a view of the same memory with its
    dtype, shape and strides, judged exactly as the torch tensor holding the same values; a torch tensor passes
    through unchanged."""
    np = pytest.importorskip("numpy")
    a = np.linspace(-600.0, 600.0, 64 * 64, dtype=np.float32).reshape(64, 64)
    t = ref.as_torch(a)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and tuple(t.shape) == a.shape
    assert t.data_ptr() == a.ctypes.data, "a view, not a copy"
    cols = ref.as_torch(a[:, ::2])
    assert cols.stride() == (64, 2) and torch.equal(cols, t[:, ::2])
    x = torch.tensor(a.tolist(), dtype=torch.float32)           # the same values by another road
    assert ref.as_torch(x) is x
    assert torch.equal(ref.fp8_encode(t, "e4m3"), ref.fp8_encode(x, "e4m3"))
    mx_np, mx_torch = ref.quantize_mxfp8_ref(t, "e4m3"), ref.quantize_mxfp8_ref(x, "e4m3")
    assert torch.equal(mx_np.row, mx_torch.row) and torch.equal(mx_np.col_scale, mx_torch.col_scale)
    codes = ref.fp8_encode(x, "e5m2")
    back = ref.as_torch(codes.numpy())                          # uint8 codes through NumPy and back
    assert back.dtype == torch.uint8 and torch.equal(ref.fp8_decode(back, "e5m2"), ref.fp8_decode(codes, "e5m2"))
    assert not torch.equal(ref.fp8_encode(ref.as_torch(-a), "e4m3"), ref.fp8_encode(x, "e4m3")), \
        "a different array must give different codes"


@pytest.mark.parametrize("zero_centered", [False, True])
def test_norm_refs_match_torch_autograd(zero_centered):
    """SPEC §11's float64 forward and closed-form backward against torch's own layer_norm / rms_norm and autograd."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, 24, generator=g, dtype=torch.float64) * 3 + 1
    gamma, beta = torch.randn(24, generator=g, dtype=torch.float64), torch.randn(24, generator=g, dtype=torch.float64)
    dz = torch.randn(5, 3, 24, generator=g, dtype=torch.float64)
    eps, w = 1e-5, gamma + 1 if zero_centered else gamma
    for rms in (False, True):
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, beta))
        want = (torch.nn.functional.rms_norm(xg, (24,), wg, eps) if rms
                else torch.nn.functional.layer_norm(xg, (24,), wg, bg, eps))
        want.backward(dz)
        if rms:
            y, rsigma = ref.rmsnorm_fwd_ref(x, gamma, eps, zero_centered)
            mu = None
        else:
            y, mu, rsigma = ref.layernorm_fwd_ref(x, gamma, beta, eps, zero_centered)
        torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
        dx, dgamma, dbeta = ref.norm_bwd_ref(dz, x, mu, rsigma, gamma, zero_centered)
        torch.testing.assert_close(dx, xg.grad, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(dgamma, wg.grad, rtol=1e-10, atol=1e-10)
        if not rms:
            torch.testing.assert_close(dbeta, bg.grad, rtol=1e-10, atol=1e-10)


def test_norm_output_f32_rounds_each_step():
    """The FP32 output step differs from the float64 one only by FP32 roundings, and applies 1 + gamma first."""
    x = torch.tensor([[1.0, 2.0, 4.0]])
    mu, rsigma = torch.tensor([7 / 3]), torch.tensor([0.6])
    gamma, beta = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([0.25, 0.0, -1.0])
    got = ref.norm_output_f32(x, mu, rsigma, gamma, beta, zero_centered_gamma=True)
    f = lambda v: torch.tensor(v, dtype=torch.float32)
    for j in range(3):
        want = (((f(x[0, j].item()) - f(mu.item())) * f(0.6)) * (f(1.0) + f(gamma[j].item()))) + f(beta[j].item())
        assert got[0, j].item() == want.item()
    assert ref.norm_output_f32(x, None, rsigma, gamma, None)[0, 2].item() == (f(4.0) * f(0.6) * f(2.0)).item()
