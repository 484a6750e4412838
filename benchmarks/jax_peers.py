"""The jnp side of bench_jax.py: each case's math written in plain jnp for jax.jit (XLA fuses it as it can), the
decoders that turn both sides' outputs into values, and the tolerances they are compared with. Nothing here imports
transformer_engine_jax.

The activations follow the core's functors (csrc/core/producers/act_functors.h; gelu is the tanh form written as
x·sigmoid(2u)); the quantizers follow SPEC §4.2 (delayed), §4.4 (current), §4.5 (MXFP8) and §4.6 (NVFP4, RNE), in
float32 on the unrounded activation, rowwise, E4M3.
"""
import jax
import jax.numpy as jnp

E4M3_MAX = 448.0
_F8 = jnp.float8_e4m3fn
# (rtol, atol) of the dequantized values, peer vs ours (SPEC §9): a code apart in the format's rounding (NVFP4:
# bench_jax allows one E2M1 step of the block's scale instead of rtol).
TOLERANCE = {"bf16": (2.0 ** -7, 1e-5), "delayed": (0.125, 0.0675), "current": (0.125, 0.0675),
             "mxfp8": (0.125, 0.0675), "nvfp4": (0.0, 1e-6)}


# ---- activations (float32) ----------------------------------------------------------------------------------
def _gelu(x):
    return x * jax.nn.sigmoid(x * (2.0 * 0.03567741 * x * x + 2.0 * 0.79788456))


def _dgelu(x):
    v = 0.79788456 * x * (1.0 + 0.044715 * x * x)
    s = jax.nn.sigmoid(2.0 * v)
    return 2.0 * x * s * (1.0 - s) * (0.79788456 + 0.1070322243 * x * x) + s


def act_f32(op, *arrays):
    """The op's float32 output [M, K]: gelu(x), silu(a)·b of x [M, 2, K], or dz·gelu'(x) for dgelu_dbias."""
    if op == "dgelu_dbias":
        dz, x = arrays
        return dz.astype(jnp.float32) * _dgelu(x[:, 0].astype(jnp.float32))
    x = arrays[0].astype(jnp.float32)
    if op == "swiglu":
        return jax.nn.silu(x[:, 0]) * x[:, 1]
    return _gelu(x[:, 0])


# ---- quantizers (float32 in; (data, scale_inv, amax or None)) --------------------------------------------------
def _fp8(v):
    return jnp.clip(v, -E4M3_MAX, E4M3_MAX).astype(_F8)


def _delayed(y, scale):
    return _fp8(y * scale[0]), (1.0 / scale).astype(jnp.float32), jnp.max(jnp.abs(y)).reshape(1)


def _current(y):
    amax = jnp.max(jnp.abs(y))
    scale = jnp.where((amax > 0) & jnp.isfinite(amax), E4M3_MAX / amax, 1.0)
    return _fp8(y * scale), (1.0 / scale).reshape(1), None


def _bits(v):
    return jax.lax.bitcast_convert_type(v, jnp.uint32)


def _float(b):
    return jax.lax.bitcast_convert_type(b, jnp.float32)


def _mxfp8(y):
    m, k = y.shape
    blocks = y.reshape(m, k // 32, 32)
    a = _bits(jnp.max(jnp.abs(blocks), axis=-1) * jnp.float32(1.0 / E4M3_MAX)) & 0x7FFFFFFF
    e = jnp.where(a <= 0x400000, 0, jnp.minimum((a + 0x7FFFFF) >> 23, 0xFE))  # E8M0, rounding up
    mult = _float(jnp.where(e == 0xFE, 0x400000, (254 - e) << 23))
    return _fp8(blocks * mult[..., None]).reshape(m, k), e.astype(jnp.uint8), None


# E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7); RNE: a tie goes to the even code, so the midpoint
# between an odd code and the next counts as above it (>=), the one after an even code as below it (>).
_MIDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _e2m1(v):
    a = jnp.abs(v)
    code = sum(((a >= t) if ge else (a > t)).astype(jnp.uint8) for t, ge in _MIDS)
    return code | (jnp.signbit(v).astype(jnp.uint8) << 3)


def _nvfp4(y):
    m, k = y.shape
    amax = jnp.max(jnp.abs(y))
    s_enc = jnp.minimum(2688.0 / amax, jnp.finfo(jnp.float32).max)
    s_enc = jnp.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
    s_dec = 1.0 / s_enc
    blocks = y.reshape(m, k // 16, 16)
    sf = jnp.minimum(jnp.max(jnp.abs(blocks), axis=-1) * (s_enc * jnp.float32(1.0 / 6.0)), E4M3_MAX).astype(_F8)
    enc = jnp.minimum(1.0 / (sf.astype(jnp.float32) * s_dec), jnp.finfo(jnp.float32).max)
    codes = _e2m1(blocks * enc[..., None]).reshape(m, k // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return packed, jax.lax.bitcast_convert_type(sf, jnp.uint8), amax.reshape(1)


def peer_fn(op, fmt):
    """The case as one jnp function of (*arrays[, scale]) -> (data, scale_inv or None, dbias or None, amax or None),
    for jax.jit."""
    def f(*args):
        arrays, scale = (args[:-1], args[-1]) if fmt == "delayed" else (args, None)
        y = act_f32(op, *arrays)
        dbias = jnp.sum(y, axis=0).astype(arrays[0].dtype) if op == "dgelu_dbias" else None
        if fmt == "bf16":
            return y.astype(arrays[0].dtype), None, dbias, None
        data, scale_inv, amax = (_delayed(y, scale) if fmt == "delayed" else
                                 {"current": _current, "mxfp8": _mxfp8, "nvfp4": _nvfp4}[fmt](y))
        return data, scale_inv, dbias, amax
    return f


# ---- decoders (either side's pieces -> float32 [M, K]) -------------------------------------------------------
_E2M1_VALUES = jnp.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], jnp.float32)


def dequantize(fmt, pieces, size):
    """Values of (data, scale_inv, dbias, amax) as float32 [M, K]; scale tensors may carry SPEC §4.8's padding."""
    m, k = size
    data, scale_inv = pieces[0], pieces[1]
    if fmt == "bf16":
        return data.reshape(m, k).astype(jnp.float32)
    if fmt in ("delayed", "current"):
        return data.reshape(m, k).astype(jnp.float32) * scale_inv.reshape(())
    if fmt == "mxfp8":
        e = scale_inv.reshape(-1, scale_inv.shape[-1])[:m, :k // 32].astype(jnp.uint32)
        f = _float(jnp.where(e == 0, 0x400000, e << 23))
        return (data.reshape(m, k // 32, 32).astype(jnp.float32) * f[..., None]).reshape(m, k)
    packed = data.reshape(m, k // 2)
    codes = jnp.stack([packed & 0xF, packed >> 4], axis=-1).reshape(m, k // 16, 16)
    sf = jax.lax.bitcast_convert_type(scale_inv.reshape(-1, scale_inv.shape[-1])[:m, :k // 16].astype(jnp.uint8), _F8)
    factor = sf.astype(jnp.float32) * pieces[3].reshape(()) * jnp.float32(1.0 / 2688.0)
    return (_E2M1_VALUES[codes] * factor[..., None]).reshape(m, k)
