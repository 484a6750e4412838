"""The core's format table (csrc/core/formats/table.h) against a spelled-out reference of SPEC §4.3-§4.9: its rows,
its scale- and data-shape rules (the core's own evaluation through `_C` / `_ffi` and the frontends' evaluations),
its host decode against tests/ref's decoders, and the two frontends reading the same table. CPU only, fast."""
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.ref.fp8 import fp8_decode
from tests.ref.fp8_block import dequantize_fp8_block_ref, fb_scale_shapes
from tests.ref.mxfp8 import dequantize_mxfp8_ref, mx_scale_shapes
from tests.ref.nvfp4 import dequantize_nvfp4_ref, nv_scale_shapes
from transformer_engine_torch import _C
from transformer_engine_torch.formats import table as tex_table

E4M3, E5M2, E8M0, E2M1, F32 = 7, 8, 9, 10, 4

# The reference, spelled out from the SPEC: per format, (element types, scale type, decode rule, quantizer kinds,
# block_dim, codes per byte, rowwise (block, transposed), columnwise (block, transposed) or None).
REFERENCE = {
    "plain": ((F32, 5, 6), F32, 0, (0,), 0, 1, ((0, 0), False), None),
    "fp8_per_tensor": ((E4M3, E5M2), F32, 1, (1, 2), 0, 1, ((0, 0), False), ((0, 0), True)),
    "mxfp8": ((E4M3, E5M2), E8M0, 2, (3,), 0, 1, ((1, 32), False), ((32, 1), False)),
    "nvfp4": ((E2M1,), E4M3, 3, (4,), 0, 2, ((1, 16), False), ((16, 1), True)),
    "fp8_block_1x128": ((E4M3, E5M2), F32, 4, (5,), 1, 1, ((1, 128), False), ((128, 1), True)),
    "fp8_block_128x128": ((E4M3, E5M2), F32, 4, (5,), 2, 1, ((128, 128), False), ((128, 128), True)),
}
NAMES = list(REFERENCE)
# [M, K] shapes: multiples of every block, and not (the ragged edges of each padding rule).
SHAPES = [(1, 32), (128, 128), (96, 64), (130, 160), (257, 384), (33, 48), (512, 256), (7, 16)]


def ref_scale_shapes(name, m, k):
    """(rowwise, columnwise) scale shapes from tests/ref (per-tensor: the float32 [1]; plain: none)."""
    if name == "plain":
        return (), None
    if name == "fp8_per_tensor":
        return (1,), (1,)
    if name == "mxfp8":
        return mx_scale_shapes(m, k)
    if name == "nvfp4":
        return nv_scale_shapes(m, k)
    return fb_scale_shapes(m, k, 2 if name.endswith("128x128") else 1)


def ref_data_shapes(name, shape):
    """(rowwise, columnwise) stored data shapes, SPEC §4.9."""
    m, k = tex_table._rows_cols(shape)
    if name == "plain":
        return tuple(shape), None
    if name == "mxfp8":
        return tuple(shape), tuple(shape)
    if name == "nvfp4":
        return tuple(shape[:-1]) + (k // 2,), (k, m // 2)
    return tuple(shape), (shape[-1],) + tuple(shape[:-1])


def test_rows_match_the_spelled_out_reference():
    rows = tex_table.FORMATS
    assert [r["name"] for r in rows] == NAMES
    assert [r["id"] for r in rows] == list(range(len(NAMES))) == [int(f) for f in tex_table.Format]
    for r in rows:
        elems, scale_type, decode, kinds, block_dim, epb, row, col = REFERENCE[r["name"]]
        got = (r["elem_types"], r["scale_type"], r["decode"], r["kinds"], r["block_dim"], r["elems_per_byte"],
               (r["row"]["block"], r["row"]["transposed"]),
               None if r["col"] is None else (r["col"]["block"], r["col"]["transposed"]))
        assert got == (elems, scale_type, decode, kinds, block_dim, epb, row, col), r["name"]
    assert [tex_table.block_len(f) for f in tex_table.Format][2:] == [32, 16, 128, 128]


def _valid(name, shape):
    """Shapes the format's quantizer takes: NVFP4 needs K % 16 == 0 (and M % 16 == 0 for its transposed copy),
    MXFP8 K % 32 == 0."""
    m, k = tex_table._rows_cols(shape)
    return {"nvfp4": k % 16 == 0 and m % 16 == 0, "mxfp8": k % 32 == 0}.get(name, True)


@pytest.mark.parametrize("name,shape", [(n, s) for n in NAMES for s in SHAPES + [(2, 3, 64), (4, 8, 32, 48)]
                                        if _valid(n, s)])
def test_scale_and_data_shapes(name, shape):
    fmt = NAMES.index(name)
    m, k = tex_table._rows_cols(shape)
    want_scale = ref_scale_shapes(name, m, k)
    want_data = ref_data_shapes(name, shape)
    assert tex_table.scale_shapes(fmt, shape) == (tuple(want_scale[0]), () if want_scale[1] is None
                                                  else tuple(want_scale[1]))
    assert tex_table.data_shapes(fmt, shape) == want_data
    # The core's own evaluation (2-D: a per-tensor scale reads [1, 1], data as the stored [rows, bytes] matrices).
    core_scale = _C.format_scale_shapes(fmt, m, k)
    for got, want in zip(core_scale, want_scale):
        want = () if want is None else tuple(want)
        assert got == {(): (0, 0), (1,): (1, 1)}.get(want, want)
    epb = REFERENCE[name][5]
    core_data = _C.format_data_shapes(fmt, m, k)
    assert core_data[0] == (m, k // epb)
    if want_data[1] is not None:
        assert core_data[1] == ((k, m // epb) if REFERENCE[name][7][1] else (m, k // epb))


def _random_copy(name, m, k, columnwise, code_type, gen, edges=(0, 254, 255)):
    """Random codes and compact scales of one stored copy: (codes uint8 [R, C/epb], scales tensor, amax); the first
    MXFP8 scales are the E8M0 `edges`."""
    fmt = NAMES.index(name)
    (rd, cd) = _C.format_data_shapes(fmt, m, k)[1 if columnwise else 0]
    sr, sc = _C.format_scale_shapes(fmt, m, k)[1 if columnwise else 0]
    codes = torch.randint(0, 256, (rd, cd), generator=gen, dtype=torch.int32).to(torch.uint8)
    if name == "mxfp8":
        scales = torch.randint(100, 156, (sr, sc), generator=gen, dtype=torch.int32).to(torch.uint8)
        scales.view(-1)[:len(edges)] = torch.tensor(edges, dtype=torch.uint8)   # 0: 2^-127, 254: 2^127, 255: NaN
    elif name == "nvfp4":
        scales = torch.randint(0, 0x7F, (sr, sc), generator=gen, dtype=torch.int32).to(torch.uint8)
    else:
        e = torch.randint(-20, 20, (sr, sc), generator=gen).to(torch.float32)
        scales = torch.rand((sr, sc), generator=gen) * torch.exp2(e) + 2.0 ** -30
    return codes, scales, None


def _core_decode(name, columnwise, code_type, codes, scales, amax, m, k):
    raw = _C.format_decode(NAMES.index(name), columnwise, code_type, codes.numpy().tobytes(),
                           scales.contiguous().numpy().tobytes(), amax, m, k)
    return torch.frombuffer(bytearray(raw), dtype=torch.float32)


def _assert_same(got, want, what):
    got, want = got.to(torch.float64).reshape(-1), want.to(torch.float64).reshape(-1)
    both_nan = torch.isnan(got) & torch.isnan(want)
    same = (got == want) & (torch.signbit(got) == torch.signbit(want))
    assert bool((same | both_nan).all()), f"{what}: {int((~(same | both_nan)).sum())} values differ"


NV_AMAXES = [0.0, 1e-38, 7e-36, 1.0, 2688.0, 3.5e5, 1e36, float("inf")]


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("name,shape", [(n, s) for n in NAMES[1:] for s in [(128, 128), (130, 160), (64, 32),
                                                                             (256, 384), (48, 80)] if _valid(n, s)])
def test_host_decode_matches_ref(name, columnwise, shape):
    m, k = shape
    gen = torch.Generator().manual_seed(hash((name, columnwise, shape)) % 2**31)
    for code_type in REFERENCE[name][0]:
        fmt_name = "e4m3" if code_type == E4M3 else "e5m2"
        codes, scales, _ = _random_copy(name, m, k, columnwise, code_type, gen)
        R, C = codes.shape
        what = f"{name} {'col' if columnwise else 'row'} {shape} {code_type}"
        if name == "fp8_per_tensor":
            s = torch.tensor([0.37], dtype=torch.float32)
            want = fp8_decode(codes, fmt_name) * s
            _assert_same(_core_decode(name, columnwise, code_type, codes, s, 0.0, m, k), want, what)
        elif name == "mxfp8":
            want = dequantize_mxfp8_ref(codes, scales, fmt_name, columnwise, torch.float64)
            _assert_same(_core_decode(name, columnwise, code_type, codes, scales, 0.0, m, k), want, what)
        elif name == "nvfp4":
            for amax in NV_AMAXES:
                want = dequantize_nvfp4_ref(codes, scales, amax, torch.float64)
                got = _core_decode(name, columnwise, code_type, codes, scales, amax, m, k)
                _assert_same(got, want, f"{what} amax {amax}")
        else:
            block_dim = 2 if name.endswith("128x128") else 1
            r = SimpleNamespace(row=codes, row_scale=scales, col=codes, col_scale=scales)
            want = dequantize_fp8_block_ref(r, fmt_name, block_dim, (m, k), torch.float64, columnwise)
            if columnwise:   # the ref transposes the columnwise copy back; the core returns it as stored
                want = want.t()
            _assert_same(_core_decode(name, columnwise, code_type, codes, scales, 0.0, m, k), want.reshape(R, -1), what)


def test_core_decode_refuses_wrong_sizes():
    with pytest.raises(ValueError, match="code bytes"):
        _C.format_decode(2, False, E4M3, b"\0" * 10, b"\0" * 512, 0.0, 1, 32)
    with pytest.raises(ValueError, match="format id"):
        _C.format_scale_shapes(6, 1, 1)


# ---- the JAX frontend reads the same table ---------------------------------------------------------------------
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def test_tej_reads_the_same_table():
    from transformer_engine_jax import _ffi
    from transformer_engine_jax.quantizers import FORMATS, ScalingMode

    assert tuple(_ffi.format_table()) == tuple(FORMATS) == tex_table.FORMATS
    for m, k in SHAPES:
        for fmt in range(len(NAMES)):
            assert _ffi.format_scale_shapes(fmt, m, k) == _C.format_scale_shapes(fmt, m, k)
            assert _ffi.format_data_shapes(fmt, m, k) == _C.format_data_shapes(fmt, m, k)
    assert {m: FORMATS[m.format]["name"] for m in ScalingMode} == {
        ScalingMode.NO_SCALING: "plain", ScalingMode.DELAYED_TENSOR_SCALING: "fp8_per_tensor",
        ScalingMode.CURRENT_TENSOR_SCALING: "fp8_per_tensor", ScalingMode.MXFP8_1D_SCALING: "mxfp8",
        ScalingMode.NVFP4_1D_SCALING: "nvfp4", ScalingMode.NVFP4_2D_SCALING: "nvfp4",
        ScalingMode.BLOCK_SCALING_1x128: "fp8_block_1x128", ScalingMode.BLOCK_SCALING_128x128: "fp8_block_128x128"}


def test_tej_rows_at_from_the_table():
    """tej's sharding layout per mode, derived from the table, against the layouts spelled out (SPEC §4.8)."""
    from transformer_engine_jax.cpp_extensions import _ROWS_AT, _rows_group
    from transformer_engine_jax.quantizers import ScalingMode as S

    assert _ROWS_AT == {S.NO_SCALING: (0, None, None, None), S.DELAYED_TENSOR_SCALING: (0, 1, None, None),
                        S.CURRENT_TENSOR_SCALING: (0, 1, None, None), S.MXFP8_1D_SCALING: (0, 0, 0, 0),
                        S.NVFP4_1D_SCALING: (0, 1, 0, 1), S.NVFP4_2D_SCALING: (0, 1, 0, 1),
                        S.BLOCK_SCALING_1x128: (0, 1, 1, 0), S.BLOCK_SCALING_128x128: (0, 1, 0, 1)}
    groups = {m: _rows_group(m.format_row) for m in (S.MXFP8_1D_SCALING, S.NVFP4_1D_SCALING,
                                                      S.BLOCK_SCALING_1x128, S.BLOCK_SCALING_128x128)}
    assert list(groups.values()) == [128, 128, 128, 512]


def ScalingMode_format(mode_name):  # noqa: N802  (the mode's format id, without importing tej at collection)
    return {"DELAYED_TENSOR_SCALING": 1, "MXFP8_1D_SCALING": 2, "NVFP4_1D_SCALING": 3, "BLOCK_SCALING_1x128": 4,
            "BLOCK_SCALING_128x128": 5}[mode_name]


JAX_MODES = ["DELAYED_TENSOR_SCALING", "MXFP8_1D_SCALING", "NVFP4_1D_SCALING", "BLOCK_SCALING_1x128",
             "BLOCK_SCALING_128x128"]


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("mode_name,shape", [(n, s) for n in JAX_MODES for s in [(128, 128), (130, 160), (256, 64)]
                                             if _valid(NAMES[ScalingMode_format(n)], s)])
def test_jnp_decode_matches_core_host_decode(mode_name, columnwise, shape):
    """tej's jnp dequantize (traced code, constants from the table) equals the core's host decode, bit for bit."""
    from transformer_engine_jax.dequantize import dequantize
    from transformer_engine_jax.quantizers import QuantizeLayout, ScalingMode
    from transformer_engine_jax.scaled_tensor import ScaledTensor

    mode = ScalingMode[mode_name]
    name = NAMES[mode.format]
    m, k = shape
    gen = torch.Generator().manual_seed(random.Random(str((mode_name, columnwise, shape))).randrange(2**31))
    code_type = REFERENCE[name][0][0]
    # Not the E8M0 code 0: its factor 2^-127 is subnormal, which XLA's CPU backend flushes to zero in tej's
    # fl(code * factor) (an FP32 multiply; the NVFP4 decode works on the bits and keeps subnormals).
    codes, scales, _ = _random_copy(name, m, k, columnwise, code_type, gen, edges=(254, 255))
    amaxes = NV_AMAXES if name == "nvfp4" else [0.0]
    if name == "fp8_per_tensor":
        scales = torch.tensor([0.37], dtype=torch.float32)
    for amax in amaxes:
        core = _core_decode(name, columnwise, code_type, codes, scales, amax, m, k)
        transposed = columnwise and REFERENCE[name][7][1]
        want = core.reshape((k, m) if transposed else (m, k))
        if transposed:
            want = want.t()
        data = jnp.asarray(codes.numpy())
        if name != "nvfp4":
            data = data.view(jnp.float8_e4m3fn)
        scale = jnp.asarray(scales.numpy())
        amax_arr = jnp.full((1,), amax, jnp.float32)
        pieces = dict(data=None, scale_inv=None, colwise_data=None, colwise_scale_inv=None, amax=None,
                      colwise_amax=None)
        if columnwise:
            pieces.update(colwise_data=data, colwise_scale_inv=scale, colwise_amax=amax_arr)
        else:
            pieces.update(data=data, scale_inv=scale, amax=amax_arr)
        layout = QuantizeLayout.COLWISE if columnwise else QuantizeLayout.ROWWISE
        t = ScaledTensor(**pieces, scaling_mode=mode, q_layout=layout, shape=(m, k), dq_dtype=jnp.float32)
        got = torch.from_numpy(np.asarray(dequantize(t, jnp.float32)).copy())
        _assert_same(got, want, f"{mode_name} {'col' if columnwise else 'row'} {shape} amax {amax}")
