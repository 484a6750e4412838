"""FP32 arithmetic on the bits (uint32), subnormals kept: IEEE round to nearest even, as the hardware ops without
flush-to-zero.

XLA's CPU backend flushes subnormal inputs and results of float ops to zero (FTZ/DAZ), and LLVM may turn a bit test
of a float that the same kernel also uses as a float back into a float compare, which then flushes too. The torch
frontend and the core keep subnormals. So where tej computes FP32 values that the torch frontend computes (NVFP4
decode factors and values, the delayed-scaling update), it works on uint32 bits from the input's bitcast to the
output's, with these helpers; only values that cannot be subnormal meet a float op.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

U32 = jnp.uint32
ABS, EXP, MANT, HIDDEN, SIGN = 0x7FFFFFFF, 0x7F800000, 0x7FFFFF, 0x800000, np.uint32(0x80000000)
QUIET, DEFAULT_NAN = 0x400000, np.uint32(0xFFC00000)   # x86's NaN of inf * 0


def bits(x):
    return jax.lax.bitcast_convert_type(x, U32)


def from_bits(u):
    return jax.lax.bitcast_convert_type(u, jnp.float32)


def const(v):
    """The bits of the FP32 value v (a Python or numpy number)."""
    return U32(np.float32(v).view(np.uint32))


def is_zero(u):
    return (u & ABS) == 0


def is_nan(u):
    return (u & ABS) > EXP


def is_finite(u):
    return (u & EXP) != EXP


def order_key(u):
    """int32 keys ordered as the FP32 values of bits u (NaN excluded; -0.0 and +0.0 share key 0)."""
    mag = (u & ABS).astype(jnp.int32)
    return jnp.where((u & SIGN) != 0, -mag, mag)


def _split(u):
    """|x| = M * 2^e of FP32 bits u, M with its top bit at 2^23 (subnormals normalised; M = 0 for zero)."""
    biased = (u >> 23) & 0xFF
    m = jnp.where(biased == 0, u & MANT, (u & MANT) | HIDDEN)
    shift = jnp.where(m == 0, U32(0), jax.lax.clz(m) - U32(8))
    e = jnp.maximum(biased, U32(1)).astype(jnp.int32) - 150 - shift.astype(jnp.int32)
    return m << shift, e


def mul(ua, ub):
    """Bits of fl(a * b). A NaN operand's NaN (quieted) or x86's default NaN for Inf * 0."""
    (ma, ea), (mb, eb) = _split(ua), _split(ub)
    a1, a0, b1, b0 = ma >> 12, ma & 0xFFF, mb >> 12, mb & 0xFFF
    mid = a1 * b0 + a0 * b1                             # < 2^25; the 48-bit product is hi * 2^24 + lo
    low = a0 * b0 + ((mid & 0xFFF) << 12)
    hi, lo = a1 * b1 + (mid >> 12) + (low >> 24), low & 0xFFFFFF
    top = hi >= HIDDEN
    sig = jnp.where(top, hi, (hi << 1) | (lo >> 23))    # 24 bits, |a * b| = (sig + rest / 2^24) * 2^e
    rest = jnp.where(top, lo, (lo << 1) & 0xFFFFFF)
    e = ea + eb + jnp.where(top, 24, 23)
    up = (rest > 0x800000) | ((rest == 0x800000) & ((sig & 1) == 1))
    sig_n = sig + up.astype(U32)
    carry = sig_n >> 24
    e_n = e + carry.astype(jnp.int32)
    normal = jnp.where(e_n + 150 >= 255, U32(EXP),
                       ((e_n + 150).astype(U32) << 23) | (jnp.where(carry == 1, U32(HIDDEN), sig_n) & MANT))
    s = jnp.clip(-149 - e, 1, 25).astype(U32)           # subnormal result: drop s bits, round half to even
    kept = sig >> s
    sticky = ((sig & ((U32(1) << (s - 1)) - 1)) != 0) | (rest != 0)
    sub = kept + (((sig >> (s - 1)) & 1) & (sticky | ((kept & 1) == 1))).astype(U32)
    finite = jnp.where((ma == 0) | (mb == 0), U32(0), jnp.where(e >= -149, normal, sub))
    inf_times = jnp.where(is_zero(ua) | is_zero(ub), DEFAULT_NAN, U32(EXP))
    mag = jnp.where(is_nan(ua), ua | QUIET, jnp.where(is_nan(ub), ub | QUIET,
                    jnp.where(is_finite(ua) & is_finite(ub), finite, inf_times)))
    return jnp.where(is_nan(ua) | is_nan(ub) | (mag == DEFAULT_NAN), mag, mag | ((ua ^ ub) & SIGN))


def div(un, ud):
    """Bits of fl(n / d) for finite nonzero n, d (either may be subnormal) whose quotient is normal or overflows to
    Inf: the quotient of the normalised significands (both in [2^23, 2^24), so it is normal) with the exponents
    added."""
    (mn, en), (md, ed) = _split(un), _split(ud)
    r = bits(mn.astype(jnp.float32) / md.astype(jnp.float32))
    e = ((r >> 23) & 0xFF).astype(jnp.int32) + en - ed
    mag = jnp.where(e >= 255, U32(EXP), (jnp.clip(e, 1, 254).astype(U32) << 23) | (r & MANT))
    return mag | ((un ^ ud) & SIGN)


def recip(u):
    """Bits of fl(1 / x) for a normal x > 0, subnormal results (x > 2^126) included: round(2^149 / x) units of
    2^-149, by restoring division of 2^p by x's 24-bit significand."""
    sig = (u & MANT) | HIDDEN
    p = 299 - ((u >> 23) & 0xFF).astype(jnp.int32)     # 2^149 / x = 2^p / sig

    def step(i, c):  # bit p - i of the numerator (1 for i = 0, else 0); steps past bit 0 (i > p) change nothing
        rem, q = c
        rem2 = (rem << 1) | (i == 0).astype(U32)
        ge = rem2 >= sig
        live = i <= p
        return (jnp.where(live, jnp.where(ge, rem2 - sig, rem2), rem),
                jnp.where(live, (q << 1) | ge.astype(U32), q))

    rem, q = jax.lax.fori_loop(0, 47, step, (jnp.zeros_like(u), jnp.zeros_like(u)))
    up = ((rem << 1) > sig) | (((rem << 1) == sig) & ((q & 1) == 1))
    return jnp.where(u >= const(2.0 ** 126), q + up.astype(U32), div(const(1), u))
