"""E2M1, NVFP4's element format (SPEC §2 and §4.6's stochastic rounding): encode, decode, and the packing of two
nibbles per byte."""
import torch

from .common import F32, F64

E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_encode(x):
    """FP32 tensor -> E2M1 nibbles (uint8), SPEC §2: thresholds with ties to even, saturate at 6, sign bit of x
    (-0.0 -> 0x8), NaN -> 0x7."""
    assert x.dtype == F32
    a = x.abs()
    c = torch.full(x.shape, 7, dtype=torch.uint8)
    for thr, code, inclusive in ((5.0, 6, True), (3.5, 5, False), (2.5, 4, True), (1.75, 3, False),
                                 (1.25, 2, True), (0.75, 1, False), (0.25, 0, True)):
        hit = (a <= thr) if inclusive else (a < thr)
        c = torch.where(hit, torch.full_like(c, code), c)
    c = torch.where(torch.signbit(x), c | 0x8, c)
    return torch.where(torch.isnan(x), torch.full_like(c, 0x7), c)


def e2m1_decode(nibbles):
    lut = torch.tensor(E2M1_GRID + [-v for v in E2M1_GRID], dtype=F32)
    return lut[nibbles.long()]


def e2m1_encode_sr(x, r):
    """Stochastic rounding of SPEC §4.6 with random bytes r (int tensor, same shape): a = |x|, u = r/256,
    t = fmaf(u, step(a), a) (exact in float64, then one rounding to FP32), q = min(floor(t/step(t))*step(t), 6)."""
    a = x.abs()
    step = lambda v: torch.where(v < 2, torch.full_like(v, 0.5), torch.where(v < 4, torch.ones_like(v),  # noqa: E731
                                                                                torch.full_like(v, 2.0)))
    u = r.to(F64) / 256.0
    t = (u * step(a).to(F64) + a.to(F64)).to(F32)  # the fused multiply-add: exact product and sum, one rounding
    st = step(t)
    q = torch.clamp(torch.floor(t / st) * st, max=6.0)
    c = e2m1_encode(q)
    c = torch.where(torch.signbit(x), c | 0x8, c)
    return torch.where(torch.isnan(x), torch.full_like(c, 0x7), c)


def nv_pack(codes):
    """[R, K] nibbles -> [R, K/2] bytes, even element in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def nv_unpack(packed):
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)
